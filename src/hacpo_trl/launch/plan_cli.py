"""`hacpo-train --config R --plan [--accelerate_config A]`: print the launch plan and check it, loading no weights.

Reads the recipe, the accelerate config (or the launch environment) and every agent's ``config.json`` from a local
folder or the Hugging Face cache, then hands the numbers to `hacpo_trl.planning.plan`. Exit status: 0 when the plan passes,
1 when a rank will not fit or a setting is inconsistent (each reason printed), 2 when the inputs cannot be read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import yaml

from ..planning import balance
from ..planning.plan import (
    DATASET_ROWS,
    DEVICE_GIB,
    Launch,
    ModelDims,
    fixes,
    format_plan,
    launch_from_accelerate,
    launch_from_env,
    make_plan,
)
from .recipe import RecipeError, check_recipe, load_recipe

__all__ = ["build_plan", "main", "model_config"]


def model_config(name_or_path: str) -> dict:
    """A model's ``config.json`` as a mapping: a local folder, a built-in demo agent, or the Hub cache (offline)."""
    if name_or_path.startswith("builtin:"):
        return _builtin_config(name_or_path.split(":", 1)[1])
    local = os.path.join(name_or_path, "config.json")
    if os.path.isfile(local):
        with open(local) as f:
            return json.load(f)
    if os.path.isdir(name_or_path):
        raise ValueError(f"model folder {name_or_path!r} has no config.json")
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.constants import HF_HUB_CACHE

    try:
        cached = try_to_load_from_cache(name_or_path, "config.json")
    except ValueError:  # not a valid repository id either
        cached = None
    if not isinstance(cached, str):
        raise ValueError(
            f"cannot read config.json of {name_or_path!r}: not a local folder and not in the Hugging Face cache "
            f"({HF_HUB_CACHE}). Fetch only that file with `hf download {name_or_path} config.json` "
            "(a few KB) or point model_name_or_path at a local folder"
        )
    with open(cached) as f:
        return json.load(f)


def _builtin_config(name: str) -> dict:
    """A built-in model's architecture: a demo agent's from an untrained copy (tiny: no warm start, nothing cached);
    a real pretrained model's from its converted folder (converted first where it is not yet, as training would)."""
    from ..agents.demo import BUILTIN_AGENTS, untrained
    from ..agents.pretrained import PRETRAINED, build_pretrained
    from ..agents.shapes import SHAPES, shape_config

    if name in SHAPES:
        return shape_config(name).to_dict()
    if name in PRETRAINED:
        with open(os.path.join(build_pretrained(name), "config.json")) as f:
            return json.load(f)
    if name not in BUILTIN_AGENTS:
        known = sorted([*BUILTIN_AGENTS, *PRETRAINED, *SHAPES])
        raise ValueError(f"unknown built-in agent {name!r}; available: {known}")
    return untrained(BUILTIN_AGENTS[name])[0].config.to_dict()


def _trl_fuses_lm_head() -> bool:
    """TRL >= 1.16 computes log-probs with a fused LM head; older TRLs materialise the logits."""
    from importlib.metadata import version

    from packaging.version import Version

    return Version(version("trl")) >= Version("1.16")


def _defaults() -> dict:
    """`HACPOConfig`'s defaults (TRL's and ours) for what a recipe leaves out."""
    import dataclasses

    from ..config import HACPOConfig

    fields = dataclasses.fields(HACPOConfig)
    return {f.name: f.default for f in fields if f.default is not dataclasses.MISSING and f.default is not None}


def _dataset_rows(recipe: dict) -> int | None:
    task = recipe.get("task", "arithmetic")
    if task in ("arithmetic", "arithmetic_fewshot"):
        from ..tasks.data import TASKS

        return len(TASKS[task]()["train"])
    if task == "math":
        return DATASET_ROWS.get(recipe.get("dataset_name") or "DigitalLearningGmbH/MATH-lighteval")
    return DATASET_ROWS.get(recipe.get("dataset_name"))


def _tokenizer(name_or_path: str):
    """An agent's tokenizer without building or downloading its model (None where it cannot be had offline)."""
    from transformers import AutoTokenizer

    from ..agents.tiny import bpe_tokenizer, char_tokenizer

    if name_or_path.startswith("builtin:"):
        from ..agents.demo import BUILTIN_AGENTS
        from ..agents.shapes import SHAPES

        name = name_or_path.split(":", 1)[1]
        if name in SHAPES:
            return bpe_tokenizer()
        if name in BUILTIN_AGENTS:
            return char_tokenizer() if BUILTIN_AGENTS[name].architecture == "llama" else bpe_tokenizer()
        from ..agents.pretrained import converted_folder

        name_or_path = converted_folder(name)  # a built-in pretrained model, where it has been converted already
        if name_or_path is None:
            return None
    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except (OSError, ValueError):
        return None


def prompt_tokens(recipe: dict, specs) -> tuple[dict[str, int], list[str]]:
    """Each agent's longest training prompt in tokens, as its chat template makes it, for a built-in task; and a
    note for every agent whose prompts could not be measured (the plan then allows 1,024 tokens)."""
    from ..tasks.data import TASKS

    task = recipe.get("task", "arithmetic")
    found: dict[str, int] = {}
    missing: list[str] = []
    prompts = list(TASKS[task]()["train"]["prompt"]) if task in TASKS else None
    plain = prompts is not None and bool(prompts) and isinstance(prompts[0], str)  # no chat template: TRL's text
    for spec in specs:
        tok = _tokenizer(spec.model_name_or_path) if prompts is not None else None
        if tok is None or not (plain or getattr(tok, "chat_template", None)):
            missing.append(spec.name)
            continue
        kwargs = spec.chat_template_kwargs or recipe.get("chat_template_kwargs") or {}
        try:
            if plain:
                ids = tok(prompts)["input_ids"]
            else:
                ids = tok.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True, **kwargs)["input_ids"]
        except Exception:  # a template that needs other messages or arguments: the plan's allowance instead
            missing.append(spec.name)
            continue
        found[spec.name] = max(len(i) for i in ids)
    notes = []
    if missing and not recipe.get("vllm_max_model_length"):
        why = f"task {task!r} is not built in" if prompts is None else "no tokenizer with a chat template offline"
        notes.append(
            f"prompt length not measured for {', '.join(map(repr, missing))} ({why}): the plan allows 1,024 prompt "
            "tokens; set vllm_max_model_length to the longest prompt + max_completion_length to size it"
        )
    return found, notes


def _recipe_accelerate_config(recipe: dict, recipe_path: str) -> str | None:
    """The recipe's own ``accelerate_config`` key: a path as given (from the working directory), else relative to
    the folder above the recipe's (recipes/ and accelerate_configs/ sit side by side)."""
    name = recipe.get("accelerate_config")
    if not name or os.path.isfile(name) or os.path.isabs(name):
        return name
    beside = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(recipe_path))), name)
    return beside if os.path.isfile(beside) else name


def build_plan(
    recipe: dict,
    accelerate_config: str | None,
    gpu_memory_gib: float | None = DEVICE_GIB,
    dataset_rows: int | None = None,
    gpus_per_node: int | None = None,
    environ=os.environ,
):
    """The `hacpo_trl.planning.plan.Plan` of a recipe (as `load_recipe` reads it) under an accelerate config file (or the
    launch environment). Raises RecipeError, ValueError or OSError when an input cannot be read."""
    import dataclasses

    from ..generation.vllm_servers import check_vllm_servers, vllm_servers
    from ..run.placement import allocator_expandable, node_gpu_count, share_gpus

    if accelerate_config:
        if not os.path.isfile(accelerate_config):
            raise RecipeError(f"accelerate config {accelerate_config!r} does not exist")
        with open(accelerate_config) as f:
            launch = launch_from_accelerate(yaml.safe_load(f), source=os.path.basename(accelerate_config))
    else:
        launch = launch_from_env(dict(os.environ)) or Launch(
            "cpu" if recipe.get("use_cpu") else "ddp",
            source="assumed: no --accelerate_config and no launch environment",
        )
    resolved = check_recipe(recipe, num_processes=launch.num_processes)
    shared = share_gpus(recipe)
    assumed = shared and not gpus_per_node and not launch.gpu_ids and not node_gpu_count()
    if shared and not launch.gpu_ids:  # the placement's round robin needs the node's GPU count
        gpus_per_node = gpus_per_node or node_gpu_count() or 1
    if gpus_per_node:
        launch = dataclasses.replace(launch, gpus_per_node=gpus_per_node)
    check_vllm_servers(resolved)
    specs = [a.spec for a in resolved.agents]
    dims = {s.name: ModelDims.from_config(model_config(s.model_name_or_path)) for s in specs}
    rows = dataset_rows if dataset_rows is not None else _dataset_rows(recipe)
    prompts, notes = prompt_tokens(recipe, specs)

    defaults = _defaults()

    def replan(changed: dict, agents=None):
        return make_plan(
            changed,
            dims,
            launch,
            gpu_memory_gib,
            rows,
            _trl_fuses_lm_head(),
            prompt_tokens=prompts,
            expandable_segments=allocator_expandable(recipe, environ, resolved),
            resolved=agents,
        )

    plan = replan({**defaults, **recipe}, resolved.under(defaults))  # the agents the checks read, not read again
    plan.fixes = fixes({**defaults, **recipe}, plan, replan)
    plan.notes.extend(notes)
    if assumed:
        plan.notes.append("share_gpus: the plan assumes one GPU per node (no GPU here); pass --gpus_per_node N")
    for name, (url, port) in vllm_servers(resolved).items():
        plan.notes.append(
            f"agent {name!r} generates on the vLLM server {url} (weight-sync port {port}): start it on its own "
            "GPU before the launch; its memory is not part of this plan"
        )
    return plan


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hacpo-train --plan", description=__doc__)
    parser.add_argument("--config", required=True, help="the recipe")
    parser.add_argument("--plan", action="store_true")
    parser.add_argument(
        "--accelerate_config",
        help="the accelerate config file the run will be launched with (default: the recipe's accelerate_config)",
    )
    parser.add_argument(
        "--gpu_memory_gib",
        type=float,
        default=DEVICE_GIB,
        help=f"memory torch can use on one GPU (80 GB cards: {DEVICE_GIB}; torch.cuda.mem_get_info()[1] / 2**30)",
    )
    parser.add_argument("--dataset_rows", type=int, default=None, help="prompts in the training split")
    parser.add_argument(
        "--gpus_per_node", type=int, default=None, help="GPUs of each node the agents share (with share_gpus)"
    )
    args, rest = parser.parse_known_args(argv)
    try:
        recipe = load_recipe(args.config, rest)
        accelerate_config = args.accelerate_config or _recipe_accelerate_config(recipe, args.config)
        plan = build_plan(recipe, accelerate_config, args.gpu_memory_gib, args.dataset_rows, args.gpus_per_node)
    except (RecipeError, ValueError, OSError, ImportError) as exc:  # ImportError: a built-in model's package
        print(f"hacpo-train --plan: error: {exc}", file=sys.stderr)
        return 2
    # inside a launch, one copy is enough
    if os.environ.get("RANK", "0") == "0":
        print(format_plan(plan), flush=True)
        if len(plan.agents) > 1:
            agents = [(a.name, a.params, len(a.ranks)) for a in plan.agents]
            prompt = sum(a.batch["prompt_tokens"] for a in plan.agents) / len(plan.agents)
            print("\n".join(balance.report({**_defaults(), **recipe}, agents, prompt)), flush=True)
    return 0 if plan.ok else 1
