"""How every process of a launch starts, before any trainer exists: shared by `hacpo-train` and `hacpo-probe`.

Torch-free at import: `place` must run before anything imports trl (and maybe CUDA). The task's datasets, the
warnings a user of these commands cannot act on, the argument parse and the one error line per launch live here too.
"""

from __future__ import annotations

import os
import sys

from ..run.last_line import repeat_after_launcher
from .recipe import HACPOScriptArguments, RecipeError

__all__ = ["filter_library_warnings", "parse_args", "place", "refuse", "task_datasets"]


def task_datasets(script_args: HACPOScriptArguments):
    from ..tasks.data import TASKS, load_any_dataset, math_dataset

    if script_args.task in TASKS:
        splits = TASKS[script_args.task]()
        if script_args.eval_split not in splits:
            raise RecipeError(f"task {script_args.task!r} has no {script_args.eval_split!r} split")
        return splits["train"], splits[script_args.eval_split]
    held_out = script_args.dataset_test_split
    if script_args.task == "math":
        name = script_args.dataset_name or "DigitalLearningGmbH/MATH-lighteval"
        return math_dataset(name), (
            math_dataset(held_out if _is_file(held_out) else name, held_out) if held_out else None
        )
    name, config = script_args.dataset_name, script_args.dataset_config
    data = load_any_dataset(name, config, script_args.dataset_train_split)
    if held_out is None:
        return data, None
    return data, load_any_dataset(held_out) if _is_file(held_out) else load_any_dataset(name, config, held_out)


def _is_file(split: str | None) -> bool:
    """Whether `dataset_test_split` names a local data file rather than a split of `dataset_name`."""
    return isinstance(split, str) and split.endswith((".json", ".jsonl", ".csv", ".parquet"))


def place(recipe: dict, world: int, resolved=None) -> str | None:
    """Give this process its agent's GPUs and the CUDA allocator's settings while CUDA cannot have been initialised
    yet (see `hacpo_trl.run.placement`); returns the line that says the allocator was set, for the caller to print once
    the recipe has passed its checks (a refused recipe gets its one error line only). A recipe whose process counts
    do not fit the launch is left to `check_recipe`. ``resolved``: the recipe's agents, if known."""
    from ..run.placement import place_process, process_counts, set_cuda_allocator, share_gpus

    counts = resolved.process_counts if resolved is not None else process_counts(recipe)
    if world > 1 and counts is not None and sum(counts) == world:
        place_process(counts, share_gpus(recipe))
    return set_cuda_allocator(recipe, resolved=resolved)


def quiet_vllm() -> None:
    """A process other than global rank 0: vLLM's warnings are the same on every process, so only rank 0 shows them.
    Before vLLM is imported: it logs on import through Python's default handler, then by ``VLLM_LOGGING_LEVEL``."""
    import logging

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)


def filter_library_warnings(recipe: dict, argv: list[str]) -> None:
    """Hide library warnings a user of this script cannot act on (each one says why)."""
    import warnings

    # TRL 1.16 reads `model.is_gradient_checkpointing` and calls `gradient_checkpointing_enable/disable` around every
    # generation, which transformers 5 deprecates (activation_checkpointing_*); only a TRL release fixes it.
    for name in ("is_gradient_checkpointing", "gradient_checkpointing_enable", "gradient_checkpointing_disable"):
        warnings.filterwarnings("ignore", message=rf"`{name}` is deprecated", category=FutureWarning)
    # vLLM 0.31's kernel dispatcher reads torch's deprecated alias on import; only a vLLM release fixes it
    warnings.filterwarnings("ignore", message=r"`torch.distributed.reduce_op` is deprecated", category=FutureWarning)
    if "gradient_checkpointing" not in recipe and not any(a.startswith("--gradient_checkpointing") for a in argv):
        # GRPOConfig's own default sets the deprecated `gradient_checkpointing` field (to True) when the user set
        # neither name; a user who wrote `gradient_checkpointing` still sees the warning telling them the new name.
        warnings.filterwarnings("ignore", message=r"`gradient_checkpointing` is deprecated", category=FutureWarning)


def refuse(exc: Exception, prog: str = "hacpo-train", environ=os.environ) -> int:
    """Print ``prog: error: <exc>`` exactly once per launch, however the ranks race; return exit status 2.

    The checks before this depend only on the recipe and the launch, so every rank fails alike. Global rank 0 (not
    ``RANK``, which is agent-local once the agent worlds split) prints and exits, and the launcher stops the rest.
    Any other rank first waits ``HACPO_ERROR_WAIT`` seconds (60) for that stop, so that it never exits first and
    gets rank 0 killed before it printed; still alive after the wait, it prints the line itself. Under a launcher
    the line is repeated after the launcher's traceback (`repeat_after_launcher`), to be the console's last line too.
    """
    if environ.get("HACPO_GLOBAL_RANK", environ.get("RANK", "0")) != "0":
        import signal
        import time

        # the launcher's stop is expected (rank 0 says why): no "stopped by the launcher" line of our own
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(float(environ.get("HACPO_ERROR_WAIT", "60")))
    line = f"{prog}: error: {exc}"
    print(line, file=sys.stderr, flush=True)
    repeat_after_launcher(line, environ)
    return 2


def parse_args(parser, argv: list[str], recipe: dict | None = None):
    """TrlParser's parse, with argparse's usage page (1,300 lines of fields) folded into one `RecipeError` line.
    ``recipe``: the ``--config`` file as already read (`hacpo_trl.launch.recipe.read_recipe`), given to the parser as
    TrlParser gives the file it reads (``env`` into the environment, the rest as defaults under the flags)."""
    import contextlib
    import io

    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            if recipe is None:
                parsed = parser.parse_args_and_config(argv)
            else:
                parsed = _parse_with_recipe(parser, argv, recipe)
    except SystemExit as exc:
        if not exc.code:
            raise
        lines = [line for line in captured.getvalue().splitlines() if ": error: " in line]
        raise RecipeError(lines[-1].split(": error: ", 1)[1] if lines else captured.getvalue().strip()) from None
    sys.stderr.write(captured.getvalue())  # warnings of a good parse are the user's to see
    return parsed


def _parse_with_recipe(parser, argv: list[str], recipe: dict):
    """`TrlParser.parse_args_and_config` with its config file's mapping given, not read again."""
    recipe, flags = dict(recipe), list(argv)
    at = flags.index("--config") if "--config" in flags else None
    if at is not None:
        del flags[at : at + 2]
    flags = [f for f in flags if not f.startswith("--config=")]
    env = recipe.pop("env", {})
    if not isinstance(env, dict):
        raise ValueError("`env` field should be a dict in the YAML file.")
    os.environ.update({key: str(value) for key, value in env.items()})
    unknown = parser.set_defaults_with_config(**recipe)
    if unknown:
        raise ValueError(
            f"Unknown arguments from config file: {unknown}. Please remove them, add them to the dataclass."
        )
    return parser.parse_args_into_dataclasses(args=flags)
