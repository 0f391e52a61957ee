"""Reading and checking a recipe: one module that training (`hacpo_trl.train`), the plan (`hacpo_trl.plan_cli`) and
any other tool reading recipes import, so that none of them imports another for it.

Public functions (names are stable):

- ``load_recipe(path, argv=None) -> dict``: the YAML recipe as a mapping (a key given twice is refused); with
  ``argv``, command-line ``--key value`` flags override its keys, as they do for training.
- ``check_recipe(recipe, num_processes=None)``: everything that can be checked without loading a model (keys with
  typo suggestions, agents, output folders, process counts against the launch, rewards, task); raises `RecipeError`.
- ``config_path(argv) -> str | None``: the ``--config`` value of a command line.
- ``cli_overrides(argv) -> dict``: the ``--key value`` flags of a command line as recipe keys.

`RecipeError` (a `ValueError`) carries a message naming the key and the fix. `HACPOScriptArguments` holds the
script-level recipe keys (task, rewards, evaluation), next to `HACPOConfig`'s.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field

import yaml

__all__ = [
    "HACPOScriptArguments",
    "RecipeError",
    "check_recipe",
    "cli_overrides",
    "config_path",
    "load_recipe",
]


class RecipeError(ValueError):
    """A recipe that cannot run; the message names the key and the fix."""


@dataclass
class HACPOScriptArguments:
    """What to train on, how to score it, and what the script reports.

    Args:
        task: ``"arithmetic"`` (the built-in short-answer task), ``"arithmetic_trace"`` (the built-in worked-solution
            task, see `hacpo_trl.tasks`), ``"math"`` (MATH with the boxed-answer instruction) or ``"dataset"`` (any
            dataset with ``prompt`` and ``answer`` columns).
        dataset_name: dataset id or local path for ``"math"`` / ``"dataset"``.
        dataset_config: dataset configuration name.
        dataset_train_split: split to train on.
        reward_funcs: reward names from `hacpo_trl.rewards.REWARD_FUNCS` or import paths.
        eval_samples: held-out problems evaluated before and after training (built-in tasks only; 0 = skip).
        eval_split: ``"test"`` (held out) or ``"validation"`` (built-in ``arithmetic_trace`` only: carved from the RL
            side, for choosing settings without looking at the held-out split).
        eval_every: also evaluate every N optimizer steps, for learning curves in the summary (0 = off).
        plot: write a PNG of every agent's reward and capability curves next to the agents (global rank 0).
    """

    task: str = field(default="arithmetic", metadata={"help": "'arithmetic', 'math' or 'dataset'."})
    dataset_name: str | None = field(default=None, metadata={"help": "Dataset id or path."})
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    reward_funcs: list[str] = field(default_factory=lambda: ["arithmetic_exact"], metadata={"help": "Rewards."})
    eval_samples: int = field(default=300, metadata={"help": "Held-out problems to evaluate before and after."})
    eval_split: str = field(default="test", metadata={"help": "'test' or 'validation' (built-in tasks)."})
    eval_every: int = field(default=0, metadata={"help": "Also evaluate every N steps (learning curves); 0 = off."})
    plot: bool = field(default=True, metadata={"help": "Write reward and capability curves as a PNG."})


# ------------------------------------------------------------------------------------------ recipe checks


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML loader that refuses a key given twice (PyYAML would silently keep the last one)."""


def _construct_mapping(loader, node, deep=False):
    keys = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in keys:
            raise RecipeError(f"recipe key {key!r} is given twice (line {key_node.start_mark.line + 1})")
        keys.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_recipe(path: str, argv: list[str] | None = None) -> dict:
    """The recipe at ``path`` as a mapping; with ``argv``, its ``--key value`` flags override the recipe's keys
    (``--config`` itself is skipped), as the command line does for training."""
    if not os.path.isfile(path):
        raise RecipeError(f"recipe file {path!r} does not exist")
    with open(path) as f:
        recipe = yaml.load(f, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    if not isinstance(recipe, dict):
        raise RecipeError(f"recipe {path!r} must be a YAML mapping of settings")
    if argv:
        recipe = {**recipe, **{k: v for k, v in cli_overrides(argv).items() if k != "config"}}
    return recipe


def cli_overrides(argv: list[str]) -> dict:
    """``--key value`` / ``--key=value`` / bare ``--flag`` (true) pairs, each value read as a YAML scalar; several
    values after one key become a list (``--reward_funcs a b``)."""
    out, i = {}, 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ValueError(f"unexpected argument {arg!r}")
        key, eq, value = arg[2:].partition("=")
        i += 1
        if eq:
            out[key] = yaml.safe_load(value)
            continue
        values = []
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(yaml.safe_load(argv[i]))
            i += 1
        out[key] = True if not values else values[0] if len(values) == 1 else values
    return out


def _field_names() -> set[str]:
    from .config import HACPOConfig

    return {f.name for f in dataclasses.fields(HACPOConfig)} | {
        f.name for f in dataclasses.fields(HACPOScriptArguments)
    }


def check_recipe(recipe: dict, num_processes: int | None = None) -> None:
    """Everything that can be checked without loading a model: keys, agents, process counts, rewards.

    Raises :class:`RecipeError` naming the first problem.
    """
    from .config import AgentSpec, _as_specs, agent_output_dir
    from .rewards import get_reward_funcs

    valid = _field_names() | {"env"}
    for key in recipe:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise RecipeError(f"unknown recipe key {key!r}{hint}")
    if "agents" not in recipe or not recipe["agents"]:
        raise RecipeError("recipe key 'agents' is missing: name at least one agent with its model_name_or_path")
    try:
        specs: list[AgentSpec] = _as_specs(recipe["agents"])
    except (ValueError, TypeError) as exc:
        raise RecipeError(f"recipe key 'agents': {exc}") from None
    for spec in specs:
        if not spec.model_name_or_path:
            raise RecipeError(f"recipe key 'agents.{spec.name}.model_name_or_path' is missing")
    resolved: dict[str, str] = {}
    for spec in specs:
        folder = os.path.abspath(agent_output_dir(spec, recipe.get("output_dir"), len(specs) > 1) or ".")
        if folder in resolved:
            raise RecipeError(
                f"recipe key 'agents': agents {resolved[folder]!r} and {spec.name!r} would both save to {folder}; "
                "give each its own `output_dir`"
            )
        resolved[folder] = spec.name
    total = sum(s.num_processes for s in specs)
    if num_processes is not None and total != num_processes:
        counts = ", ".join(f"{s.name}: {s.num_processes}" for s in specs)
        raise RecipeError(
            f"recipe key 'agents': num_processes add up to {total} ({counts}) but the launch has {num_processes}"
        )
    try:
        get_reward_funcs(recipe.get("reward_funcs", HACPOScriptArguments().reward_funcs))
    except ValueError as exc:
        raise RecipeError(str(exc)) from None
    task = recipe.get("task", "arithmetic")
    if task not in ("arithmetic", "arithmetic_trace", "math", "dataset"):
        raise RecipeError(
            f"recipe key 'task' must be 'arithmetic', 'arithmetic_trace', 'math' or 'dataset', got {task!r}"
        )
    if recipe.get("eval_split", "test") not in ("test", "validation"):
        raise RecipeError(f"recipe key 'eval_split' must be 'test' or 'validation', got {recipe['eval_split']!r}")
    if task == "dataset" and not recipe.get("dataset_name"):
        raise RecipeError("recipe key 'dataset_name' is required with task: dataset")


def config_path(argv: list[str]) -> str | None:
    """The value of ``--config`` in ``argv`` (``--config R`` or ``--config=R``), or None."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None
