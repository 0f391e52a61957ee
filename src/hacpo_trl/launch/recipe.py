"""Reading and checking a recipe: one module that training (`hacpo_trl.train`), the plan (`hacpo_trl.launch.plan_cli`) and
any other tool reading recipes import, so that none of them imports another for it.

Public functions (names are stable):

- ``load_recipe(path, argv=None) -> dict``: the YAML recipe as a mapping (a key given twice is refused); with
  ``argv``, command-line ``--key value`` flags override its keys, as they do for training. It is
  ``effective_recipe(read_recipe(path), argv)``: a caller that also needs the file as written reads it once.
- ``check_recipe(recipe, num_processes=None, checked=None)``: everything that can be checked without loading a model (keys with
  typo suggestions, agents, output folders, process counts against the launch, rewards, task); raises `RecipeError`,
  returns the agents resolved (`hacpo_trl.run.resolve`).
- ``resolve_agents(recipe, fields=None)``: the recipe's agents, each with its settings and output folder; a bad
  ``agents`` key raises `RecipeError`.
- ``config_path(argv) -> str | None``: the ``--config`` value of a command line.
- ``cli_overrides(argv) -> dict``: the ``--key value`` flags of a command line as recipe keys.
- ``preflight(recipe, num_processes=None)``: the checks that import no ML library (model folders, values, output
  folders, dataset, rewards, process counts), run by every rank of a launch before anything heavy; returns the
  agents resolved, for the steps after it.
- ``check_output_dir(recipe, resolved=None)``: refuse an output folder that already holds a run (unless overwrite or resume).
- ``numbers_as_values(argv) -> list[str]``: ``--flag -1e-4`` as ``--flag=-1e-4`` for argparse.

`RecipeError` (a `ValueError`) carries a message naming the key and the fix. `HACPOScriptArguments` holds the
script-level recipe keys (task, rewards, evaluation), next to `HACPOConfig`'s.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field

import yaml

from ..run.resolve import DEFAULT_OUTPUT_DIR, ResolvedRecipe, check_overrides, resolve
from ..sharing.presets import expand_sharing

__all__ = [
    "HACPOScriptArguments",
    "RecipeError",
    "check_installed",
    "check_output_dir",
    "check_recipe",
    "cli_overrides",
    "config_path",
    "load_recipe",
    "looks_local",
    "numbers_as_values",
    "preflight",
    "resolve_agents",
]


# what a recipe may train on: the built-in tasks with an RL split (`hacpo_trl.tasks.data`), MATH, or any dataset
RECIPE_TASKS = ("arithmetic", "arithmetic_fewshot", "arithmetic_trace", "arithmetic_trace_carries", "math", "dataset")


class RecipeError(ValueError):
    """A recipe that cannot run; the message names the key and the fix."""


@dataclass
class HACPOScriptArguments:
    """What to train on, how to score it, and what the script reports.

    Args:
        task: ``"arithmetic"`` (the built-in short-answer task), ``"arithmetic_fewshot"`` (its problems as a plain
            few-shot text, for real pretrained models), ``"arithmetic_trace"`` (the built-in worked-solution
            task, see `hacpo_trl.tasks.data`), ``"arithmetic_trace_carries"`` (the same on two halves of the problems,
            with and without carries, accuracy reported per half), ``"math"`` (MATH with the boxed-answer
            instruction) or ``"dataset"`` (any dataset with ``prompt`` and ``answer`` columns).
        dataset_name: dataset id or local path for ``"math"`` / ``"dataset"``.
        dataset_config: dataset configuration name.
        dataset_train_split: split to train on.
        dataset_test_split: for ``"dataset"`` and ``"math"``, the held-out rows evaluated before and after training:
            a split of ``dataset_name`` or a local data file (TRL's name for it); without it such a run has no
            held-out evaluation, and says so.
        reward_funcs: reward names from `hacpo_trl.tasks.rewards.REWARD_FUNCS` or import paths; without it, the task's own
            reward (`hacpo_trl.tasks.rewards.TASK_REWARDS`; ``dataset`` has none and must name one).
        eval_samples: held-out problems evaluated before and after training (0 = skip).
        eval_split: ``"test"`` (held out) or ``"validation"`` (built-in ``arithmetic_trace`` only: carved from the RL
            side, for choosing settings without looking at the held-out split).
        eval_every: also evaluate every N optimizer steps, for learning curves in the summary (0 = off).
        plot: write a PNG of every agent's reward and capability curves next to the agents (global rank 0).
        accelerate_config: the accelerate config file this recipe is meant to be launched with; `--plan` reads it
            when no ``--accelerate_config`` is given (training itself is launched with ``--config_file``).
        overwrite_output_dir: train into an output folder that already holds a run (a summary, a saved agent or a
            checkpoint); without it, or ``resume_from_checkpoint``, such a launch is refused so that two runs are
            never mixed (transformers 5 dropped `TrainingArguments.overwrite_output_dir`; this is HACPO's own).
    """

    task: str = field(
        default="arithmetic",
        metadata={
            "help": "'arithmetic', 'arithmetic_fewshot', 'arithmetic_trace', 'arithmetic_trace_carries', 'math' or "
            "'dataset'."
        },
    )
    dataset_name: str | None = field(default=None, metadata={"help": "Dataset id or path."})
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str | None = field(
        default=None,
        metadata={
            "help": "'dataset' / 'math': held-out rows, evaluated before and after training with the run's reward: a "
            "split of dataset_name, or a local .json/.jsonl/.csv/.parquet file (None: no held-out evaluation)."
        },
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward names (arithmetic_exact, arithmetic_trace, math_verify, boxed_format) or import paths "
            "'module:function'; None: the task's own (arithmetic, arithmetic_fewshot -> arithmetic_exact, "
            "arithmetic_trace -> arithmetic_trace, math -> math_verify)."
        },
    )
    eval_samples: int = field(default=300, metadata={"help": "Held-out problems to evaluate before and after."})
    eval_split: str = field(default="test", metadata={"help": "'test' or 'validation' (built-in tasks)."})
    eval_every: int = field(default=0, metadata={"help": "Also evaluate every N steps (learning curves); 0 = off."})
    plot: bool = field(default=True, metadata={"help": "Write reward and capability curves as a PNG."})
    accelerate_config: str | None = field(
        default=None, metadata={"help": "The accelerate config the recipe is launched with (read by --plan)."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Train into an output folder that already holds a run (refused otherwise; see README)."},
    )

    def __post_init__(self):
        # the task's own reward, never another task's (it would score every answer 0)
        if self.reward_funcs is None:
            from ..tasks.rewards import task_reward_funcs

            self.reward_funcs = task_reward_funcs(self.task)


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
    return effective_recipe(read_recipe(path), argv)


def read_recipe(path: str) -> dict:
    """The YAML file at ``path`` as written (a key given twice is refused): the one parse of a recipe per process."""
    if not os.path.isfile(path):
        raise RecipeError(f"recipe file {path!r} does not exist")
    with open(path) as f:
        try:
            recipe = yaml.load(f, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.MarkedYAMLError as exc:  # one line, file:line:col, as compilers print it
            mark = exc.problem_mark or exc.context_mark
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
            raise RecipeError(f"{where}: malformed YAML: {exc.problem or exc.context}") from None
        except yaml.YAMLError as exc:
            raise RecipeError(f"{path}: malformed YAML: {exc}") from None
    if not isinstance(recipe, dict):
        raise RecipeError(f"recipe {path!r} must be a YAML mapping of settings")
    return recipe


def effective_recipe(recipe: dict, argv: list[str] | None = None) -> dict:
    """A recipe as written with ``argv``'s ``--key value`` flags over its keys and its `sharing` mode expanded."""
    if argv:
        recipe = {**recipe, **{k: v for k, v in cli_overrides(argv).items() if k != "config"}}
    try:
        return expand_sharing(recipe)
    except ValueError as exc:
        raise RecipeError(f"recipe key 'sharing': {exc}") from None


def cli_overrides(argv: list[str]) -> dict:
    """``--key value`` / ``--key=value`` / bare ``--flag`` (true) pairs, each value read as a YAML scalar; several
    values after one key become a list (``--reward_funcs a b``). A value that is not YAML raises `RecipeError`
    naming the flag; a token that is no ``--key`` where one is due raises a plain `ValueError`, left to the argument
    parser to name."""
    out, i = {}, 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ValueError(f"unexpected argument {arg!r}")
        key, eq, value = arg[2:].partition("=")
        i += 1
        if eq:
            out[key] = _flag_value(key, value)
            continue
        values = []
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(_flag_value(key, argv[i]))
            i += 1
        out[key] = True if not values else values[0] if len(values) == 1 else values
    return out


def _flag_value(key: str, text: str):
    """One flag value read as YAML, as the recipe's own values are; malformed, a `RecipeError` naming the flag."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (column {mark.column + 1})" if mark else ""
        raise RecipeError(
            f"flag --{key}: malformed value {text!r}: {getattr(exc, 'problem', None) or exc}{where}"
        ) from None


def _field_names() -> set[str]:
    from ..config import HACPOConfig

    return {f.name for f in dataclasses.fields(HACPOConfig)} | {
        f.name for f in dataclasses.fields(HACPOScriptArguments)
    }


def resolve_agents(recipe: dict, fields: set[str] | None = None) -> ResolvedRecipe:
    """The recipe's agents (`hacpo_trl.run.resolve`), or a `RecipeError` naming the problem with the key."""
    if not recipe.get("agents"):
        raise RecipeError("recipe key 'agents' is missing: name at least one agent with its model_name_or_path")
    try:
        return resolve(recipe, fields)
    except (ValueError, TypeError) as exc:
        raise RecipeError(f"recipe key 'agents': {exc}") from None


def check_recipe(
    recipe: dict, num_processes: int | None = None, checked: ResolvedRecipe | None = None
) -> ResolvedRecipe:
    """Everything that can be checked without loading a model: keys, agents (their overrides included), output
    folders, then `preflight` (process counts, model folders, values, rewards) except the dataset, which a plan on
    paper does not need; ``checked``, what `preflight` returned for this recipe, says it ran already. Returns the
    recipe's agents, resolved.

    Raises :class:`RecipeError` naming the first problem.
    """
    from ..config import HACPOConfig

    valid = _field_names() | {"env"}
    for key in recipe:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise RecipeError(f"unknown recipe key {key!r}{hint}")
    fields = {f.name for f in dataclasses.fields(HACPOConfig)}
    if checked is None:
        resolved = resolve_agents(recipe, fields)
    else:  # resolved by `preflight`: only the overrides' field names are left to check
        resolved = checked
        try:
            check_overrides(resolved, fields)
        except ValueError as exc:
            raise RecipeError(f"recipe key 'agents': {exc}") from None
    for agent in resolved.agents:
        if not agent.spec.model_name_or_path:
            raise RecipeError(f"recipe key 'agents.{agent.name}.model_name_or_path' is missing")
    if recipe.get("eval_split", "test") not in ("test", "validation"):
        raise RecipeError(f"recipe key 'eval_split' must be 'test' or 'validation', got {recipe['eval_split']!r}")
    if checked is None:
        preflight(recipe, num_processes, data=False, resolved=resolved)
    from ..run.checkpoints import agent_checkpoints  # torch-free

    try:  # a resume that cannot work is refused here, before any model loads
        folders = {a.name: a.output_dir or DEFAULT_OUTPUT_DIR for a in resolved.agents}
        agent_checkpoints(recipe.get("resume_from_checkpoint"), folders)
    except ValueError as exc:
        raise RecipeError(f"recipe key 'resume_from_checkpoint': {exc}") from None
    return resolved


def check_installed(resolved: ResolvedRecipe) -> None:
    """Refuse, before any agent is built, a run that needs a package this environment lacks: vLLM for an agent with
    `use_vllm` (the run's or its own override). `--plan` does not call it: a plan for GPUs is made anywhere."""
    import importlib.util

    wanting = [a.name for a in resolved.agents if _true(a.get("use_vllm"))]
    if wanting and importlib.util.find_spec("vllm") is None:
        raise RecipeError(
            f"recipe key 'use_vllm': agent(s) {', '.join(map(repr, wanting))} generate with vLLM, which is not "
            "installed in this environment: `make install-vllm` then its venv (.venv-vllm) on the CPU, `pip install "
            "-e '.[vllm]'` on GPUs, or set `use_vllm: false`"
        )


def _true(value) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"))


def config_path(argv: list[str]) -> str | None:
    """The value of ``--config`` in ``argv`` (``--config R`` or ``--config=R``), or None."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


# ------------------------------------------------------------------------------- checks before heavy imports


def looks_local(name: str) -> bool:
    """Whether a model or dataset name is a local path rather than a Hub id (``org/name`` or ``name``): it starts
    with ``/``, ``.`` or ``~``, has more than one ``/``, or names something that exists here."""
    return (
        name.startswith(("/", ".", "~"))
        or name.count("/") > 1
        or os.sep != "/"
        and os.sep in name
        or os.path.exists(os.path.expanduser(name))
    )


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None  # not a number at all: left to the argument parser, which names the type


def _hub_offline(environ) -> bool:
    return any(
        str(environ.get(k, "")).lower() in ("1", "true", "yes", "on") for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _dataset_cached(name: str) -> bool:
    """Whether the Hub dataset ``name`` has a copy in the Hugging Face hub or datasets cache (offline use)."""
    from huggingface_hub.constants import HF_HOME, HF_HUB_CACHE

    datasets_cache = os.environ.get("HF_DATASETS_CACHE", os.path.join(HF_HOME, "datasets"))
    return os.path.isdir(os.path.join(HF_HUB_CACHE, "datasets--" + name.replace("/", "--"))) or os.path.isdir(
        os.path.join(datasets_cache, name.replace("/", "___"))
    )


def preflight(
    recipe: dict,
    num_processes: int | None = None,
    environ=os.environ,
    data: bool = True,
    resolved: ResolvedRecipe | None = None,
) -> ResolvedRecipe:
    """The checks that read only the recipe, the launch environment and the file system, importing no ML library:
    a deterministic function of those, so every rank of a launch reaches the same verdict in a second or two.

    Checks: the agents (`resolve_agents`, without the overrides' field names, which need TRL), process counts
    against the launch, model folders that do not exist (a local-looking path, see `looks_local`), learning rates
    < 0 (run and per agent), ``max_completion_length <= 0``, an output folder that is a file, the task name, a local
    dataset file that does not exist, a Hub dataset id while the Hub is offline and nothing is cached
    (``data=False`` skips the dataset), and reward names / import paths. Raises `RecipeError` naming the first
    problem; returns the agents resolved (``resolved``: this recipe's agents, where the caller has them already).
    """
    resolved = resolved or resolve_agents(recipe)
    agents = resolved.agents
    generations = recipe.get("num_generations")
    if _number(generations) is not None and _number(generations) < 2:
        raise RecipeError(
            f"recipe key 'num_generations' must be at least 2 (GRPO compares completions of one prompt), "
            f"got {generations!r}"
        )
    from ..run.placement import share_gpus  # torch-free

    try:
        share_gpus(recipe)
    except ValueError as exc:
        raise RecipeError(str(exc)) from None
    counts = resolved.process_counts
    if num_processes is not None and sum(counts) != num_processes:
        listed = ", ".join(f"{a.name}: {c}" for a, c in zip(agents, counts, strict=True))
        raise RecipeError(
            f"recipe key 'agents': num_processes add up to {sum(counts)} ({listed}) but the launch has {num_processes}"
        )
    for agent in agents:
        path = agent.spec.model_name_or_path
        if isinstance(path, str) and not path.startswith("builtin:") and looks_local(path):
            if not os.path.isdir(os.path.expanduser(path)):
                raise RecipeError(
                    f"recipe key 'agents.{agent.name}.model_name_or_path': model folder {path!r} does not exist "
                    "(a Hub id has the form 'org/name')"
                )
    rates = [("learning_rate", recipe.get("learning_rate"))] + [
        (f"agents.{a.name}.learning_rate", a.spec.learning_rate) for a in agents
    ]
    for key, value in rates:
        if _number(value) is not None and _number(value) < 0:
            raise RecipeError(f"recipe key {key!r} must be >= 0, got {value!r}")
    length = recipe.get("max_completion_length")
    if _number(length) is not None and _number(length) <= 0:
        raise RecipeError(f"recipe key 'max_completion_length' must be a positive number of tokens, got {length!r}")
    folders = [("output_dir", recipe.get("output_dir"))] + [
        (f"agents.{a.name}.output_dir" if a.spec.output_dir else "output_dir", a.output_dir) for a in agents
    ]
    for key, folder in folders:
        if isinstance(folder, str) and os.path.isfile(folder):
            raise RecipeError(f"recipe key {key!r}: {folder!r} is a file, not a folder")
    task = recipe.get("task", "arithmetic")
    if task not in RECIPE_TASKS:
        raise RecipeError(f"recipe key 'task' must be one of {', '.join(map(repr, RECIPE_TASKS))}, got {task!r}")
    if task == "dataset" and not recipe.get("dataset_name"):
        raise RecipeError("recipe key 'dataset_name' is required with task: dataset")
    if data and task in ("math", "dataset"):
        name = str(recipe.get("dataset_name") or "DigitalLearningGmbH/MATH-lighteval")
        if looks_local(name) or name.endswith((".json", ".jsonl", ".csv", ".parquet")):
            if not os.path.exists(os.path.expanduser(name)):
                raise RecipeError(f"recipe key 'dataset_name': {name!r} does not exist")
        elif _hub_offline(environ) and not _dataset_cached(name):
            raise RecipeError(
                f"recipe key 'dataset_name': {name!r} is a Hub dataset id, the Hub is offline (HF_HUB_OFFLINE) and "
                "it is not in the Hugging Face cache; download it where the Hub is reachable or give a local path"
            )
    from ..tasks.rewards import get_reward_funcs, task_reward_funcs  # light: no ML library; imports the user's module

    try:
        names = recipe.get("reward_funcs")
        get_reward_funcs(task_reward_funcs(task) if names is None else names)
    except ValueError as exc:
        raise RecipeError(str(exc)) from None
    return resolved


_RUN_FILES = ("hacpo_summary.json", "hacpo_task.json", "log_history.json", "config.json", "adapter_config.json")


def check_output_dir(recipe: dict, resolved: ResolvedRecipe | None = None) -> None:
    """Refuse an output folder that already holds a run (the run's summary, a saved agent or a checkpoint) unless
    the recipe sets ``overwrite_output_dir`` or ``resume_from_checkpoint``: a second run would silently mix its
    agents and summary with the first's. ``resolved``: the recipe's agents, if known."""
    if recipe.get("overwrite_output_dir") or recipe.get("resume_from_checkpoint"):
        return
    resolved = resolved or resolve_agents(recipe)
    for folder in [resolved.output_dir] + [a.output_dir for a in resolved.agents]:
        if not isinstance(folder, str) or not os.path.isdir(folder):
            continue
        held = [f for f in _RUN_FILES if os.path.isfile(os.path.join(folder, f))]
        held += sorted(f for f in os.listdir(folder) if f.startswith("checkpoint-"))[:1]
        if held:
            raise RecipeError(
                f"output folder {folder!r} already holds a run ({held[0]}); choose a new --output_dir, or pass "
                "--overwrite_output_dir to train into it anyway, or set `resume_from_checkpoint: true` in the recipe to continue it"
            )


def numbers_as_values(argv: list[str]) -> list[str]:
    """``--flag -1e-4`` as ``--flag=-1e-4``: argparse takes ``-1e-4`` for an option (it knows only ``-1`` and
    ``-.5`` as negative numbers), so a negative learning rate on the command line would fail with a page of usage."""
    out = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and arg.startswith("-") and _number(arg) is not None:
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out
