"""How a process of a launch starts, one way for every command that builds agents: `hacpo-train`, `hacpo-probe` and
the benchmark's worker (which reads its recipes itself, then runs `hacpo_trl.launch.train.run`).

:func:`start` is the command line's front: the recipe read once with the flags over it, every check that imports no
ML library (on every rank, before anything heavy), this process's placement (before anything imports trl, and maybe
CUDA), the arguments parsed into `HACPOConfig` and the command's own dataclasses, the trackers checked and the
reward functions loaded. :func:`build_trainer` then builds this process's agent: its model resolved (a built-in one
built by the agent's rank 0 while the others wait), the task's data loaded and `HACPOTrainer` built; an agent that
cannot start raises :class:`StartupError`, for the command's one error line.

Torch-free at import, like `bootstrap` below it: `hacpo-train --help` must not import trl.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from ..sharing.presets import describe_sharing
from .bootstrap import filter_library_warnings, parse_args, place, quiet_vllm, task_datasets
from .recipe import (
    HACPOScriptArguments,
    RecipeError,
    check_installed,
    check_output_dir,
    check_recipe,
    config_path,
    effective_recipe,
    numbers_as_values,
    preflight,
    read_recipe,
)
from .trackers import check_trackers

__all__ = ["Start", "StartupError", "build_trainer", "recipe_with_flags", "sharing_line", "start"]


class StartupError(Exception):
    """An agent could not start (its model, tokenizer or data did not load, its trainer refused its settings): the
    run ends with the command's one error line, not a traceback on every rank."""


@dataclass
class Start:
    """What a process starts from: the script arguments, this process's `HACPOConfig` (resolved to its agent), the
    reward functions, the command's own argument dataclasses (in the order :func:`start` was given them) and the
    line that says the run's sharing mode (None without a recipe)."""

    script_args: HACPOScriptArguments
    config: object
    reward_funcs: list
    tool_args: tuple = ()
    sharing_line: str | None = field(default=None, repr=False)


def _global_rank_zero() -> bool:
    """Global rank 0 of the launch (``RANK`` is agent-local once the agent worlds split)."""
    return os.environ.get("HACPO_GLOBAL_RANK", os.environ.get("RANK", "0")) == "0"


def without_flags(argv: Sequence[str], names: Collection[str]) -> list[str]:
    """``argv`` without the flags in ``names`` (``--prompts 16`` or ``--prompts=16``) and their values."""
    kept, i = [], 0
    while i < len(argv):
        if argv[i].split("=", 1)[0] in names:
            i += 1 if "=" in argv[i] else 2
            continue
        kept.append(argv[i])
        i += 1
    return kept


def recipe_with_flags(path: str, argv: Sequence[str], own: Collection[str] = ()) -> tuple[dict, dict]:
    """The recipe at ``path`` as written (the one read of the file), and with the command line's flags over it and
    its `sharing` mode expanded: what every check and the placement read. ``own``: the command's own flags
    (``--prompts``), left out. Flags that are not plain ``--key value`` are left to the argument parser, which names
    the problem; a malformed value or an unknown ``--sharing`` is a `RecipeError` here."""
    written = read_recipe(path)
    try:
        return written, effective_recipe(written, without_flags(argv, own))
    except RecipeError:
        raise
    except ValueError:
        return written, effective_recipe(written)


def sharing_line(recipe: dict, named: bool) -> str:
    """The run's first line about sharing: the mode it trains with and what that means, and where the recipe does
    not name one, that this is the default."""
    line = f"hacpo: {describe_sharing(recipe)}"
    if not named:
        line += " [not named in the recipe: the default; `sharing: recommended` is the preset, docs/settings.md]"
    return line


def start(
    argv: Sequence[str], tool_args: Sequence[type] = (), check_output: bool = True, announce: bool = True
) -> Start:
    """This process's start, from its command line (``--config RECIPE`` and ``--key value`` flags over it).

    ``tool_args``: the command's own argument dataclasses, parsed with the rest (their flags are not recipe keys).
    ``check_output``: refuse an output folder that already holds a run (a command that saves nothing skips it).
    ``announce``: global rank 0 prints the allocator's setting and, once every check passed, the sharing mode.
    Raises `RecipeError` (a `ValueError`) naming the first problem, alike on every rank."""
    argv = numbers_as_values(list(argv))
    path, written, line = config_path(argv), None, None
    if os.environ.get("RANK", "0") != "0":  # one console for the launch: vLLM logs from global rank 0 only
        quiet_vllm()
    if path is not None:  # the recipe read once, the flags over it: what every check and the placement see
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        launched = world if "RANK" in os.environ else None
        own = {f"--{f.name}" for cls in tool_args for f in dataclasses.fields(cls)}
        written, recipe = recipe_with_flags(path, argv, own)
        resolved = preflight(recipe, num_processes=launched)  # every rank, before any ML library is imported
        if check_output:
            check_output_dir(recipe, resolved)
        said = place(recipe, world, resolved)  # before anything imports trl (and maybe CUDA)
        check_recipe(recipe, num_processes=launched, checked=resolved)
        check_installed(resolved)
        if announce and said and os.environ.get("RANK", "0") == "0":
            print(said, file=sys.stderr, flush=True)
        line = sharing_line(recipe, named="sharing" in written or "--sharing" in argv)
        filter_library_warnings(recipe, argv)
    from trl import TrlParser

    from ..config import HACPOConfig
    from ..tasks.rewards import get_reward_funcs

    parser = TrlParser((HACPOScriptArguments, HACPOConfig, *tool_args))
    script_args, config, *others = parse_args(parser, argv, written)  # the file as read above, not read again
    if not config.agents:
        raise RecipeError("recipe key 'agents' is missing: name at least one agent with its model_name_or_path")
    check_trackers(config.report_to, warn=os.environ.get("RANK", "0") == "0")  # before any download or vLLM start
    started = Start(script_args, config, get_reward_funcs(script_args.reward_funcs), tuple(others), line)
    if announce and line is not None and _global_rank_zero():
        print(line, file=sys.stderr, flush=True)  # every check passed: the mode this run trains with
    return started


@contextlib.contextmanager
def _starting(agent: str):
    try:
        yield
    except (OSError, ImportError, ValueError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        named = text if text.startswith(f"agent {agent!r}") else f"agent {agent!r} could not start: {text}"
        raise StartupError(named) from exc


def build_trainer(script_args, config, reward_funcs):
    """This process's agent as training builds it: ``(trainer, held-out rows or None)``. Processes other than global
    rank 0 keep quiet on the console; a built-in model is built by the agent's rank 0 while its other ranks wait; an
    agent that cannot start raises :class:`StartupError` naming it."""
    from ..run.topology import current_topology
    from .progress import quiet_replica

    topology = current_topology()  # RANK is agent-local by now
    global_rank = topology.global_rank if topology is not None else 0
    if global_rank != 0:
        quiet_replica()
    spec = config.agent_spec
    with _starting(spec.name):
        import torch

        from ..agents.builtin import resolve_model
        from ..trainer import HACPOTrainer

        if global_rank == 0 and config.use_vllm:
            print(
                f"hacpo: loading the agents and starting each one's vLLM engine ({config.vllm_mode} mode); on vLLM's "
                "CPU build this takes a minute or more before the first step",
                file=sys.stderr,
                flush=True,
            )
        if spec.model_name_or_path.startswith("builtin:"):
            if topology is None or topology.agent_rank == 0:
                resolve_model(spec.model_name_or_path)  # one process per agent builds it
            if torch.distributed.is_initialized():
                torch.distributed.barrier()  # this agent's world only
        model_path = resolve_model(spec.model_name_or_path)
        train, test = task_datasets(script_args)
        trainer = HACPOTrainer(model=model_path, reward_funcs=reward_funcs, args=config, train_dataset=train)
    return trainer, test
