"""Joint checkpointing: which checkpoints are complete, which to delete, and which step every agent resumes from.

A HACPO checkpoint is TRL's folder plus ``hacpo_state.json`` (the capability tracker), written last and atomically,
so a folder without it was interrupted while saving and is never resumed from or counted. The agents must resume
together, from a step every one of them saved completely. Plain functions over folders and over what every process
reported (gathered by the trainer over the exchange group), so they are testable without a trainer.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from contextlib import contextmanager

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

__all__ = [
    "STATE_FILE",
    "check_same_start",
    "chosen_checkpoint",
    "complete_checkpoints",
    "deferred_limit",
    "prune_checkpoints",
    "read_state",
    "restore_state",
    "resume_checkpoint",
    "save_state",
    "write_state",
]

logger = logging.getLogger(__name__)

STATE_FILE = "hacpo_state.json"


def _checkpoints(run_dir: str) -> dict[int, str]:
    """Every ``checkpoint-<step>`` folder in ``run_dir``, complete or not, by step."""
    found = {}
    for path in glob.glob(os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-*")):
        step = path.rsplit("-", 1)[-1]
        if step.isdigit():
            found[int(step)] = path
    return found


def complete_checkpoints(run_dir: str) -> dict[int, str]:
    """The checkpoints in ``run_dir`` that finished saving (they hold ``hacpo_state.json``), by step."""
    return {s: p for s, p in _checkpoints(run_dir).items() if os.path.isfile(os.path.join(p, STATE_FILE))}


def prune_checkpoints(run_dir: str, limit: int, keep: str | None = None) -> list[str]:
    """``save_total_limit`` counted in complete checkpoints only: keep the newest ``limit`` complete ones (and
    ``keep``, the best model's), delete older ones and any folder left incomplete before the newest complete one.
    Folders newer than the newest complete checkpoint are left alone. Returns the deleted paths."""
    complete = complete_checkpoints(run_dir)
    if limit < 1 or not complete:
        return []
    kept = set(sorted(complete)[-limit:])
    newest = max(complete)
    deleted = []
    for step, path in sorted(_checkpoints(run_dir).items()):
        if step >= newest or step in kept or (keep and os.path.abspath(path) == os.path.abspath(keep)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(path)
    return deleted


def write_state(folder: str, state: dict) -> None:
    """Write ``hacpo_state.json`` into ``folder`` atomically (a crash leaves the folder without it, never half)."""
    tmp = os.path.join(folder, STATE_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(folder, STATE_FILE))


def read_state(checkpoint: str, agent: str) -> dict:
    """The ``hacpo_state.json`` of ``checkpoint``; a clear error if it has none."""
    path = os.path.join(checkpoint, STATE_FILE)
    if not os.path.isfile(path):
        raise ValueError(
            f"agent {agent!r}: {checkpoint} has no {STATE_FILE}: it is not a HACPO checkpoint, or saving it was "
            "interrupted"
        )
    with open(path) as f:
        return json.load(f)


def resume_checkpoint(
    agent: str, complete: dict[int, str], everyone: Sequence[tuple], describe_rank: Callable[[int], str]
) -> str:
    """The checkpoint of ``agent`` (its ``complete`` ones, by step) to resume from with ``resume_from_checkpoint=True``.

    ``everyone`` holds one ``(agent, is_agent_main_process, complete_steps, ...)`` per process of the launch, in
    global-rank order. The step is the newest one every agent's main process saved completely; every process must
    see it too (each one loads the weights and its own RNG state), else the filesystem is not shared.
    """
    common = set.intersection(*(set(entry[2]) for entry in everyone if entry[1]))
    if not common:
        raise ValueError(
            f"agent {agent!r}: resume_from_checkpoint=True but no step was saved completely by every "
            f"agent (complete steps: { {e[0]: e[2] for e in everyone if e[1]} })"
        )
    step = max(common)
    lacking = [describe_rank(r) for r, entry in enumerate(everyone) if step not in entry[2]]
    if lacking:
        raise ValueError(
            f"resuming from step {step}, but {', '.join(lacking)} cannot see a complete checkpoint-{step} "
            "in its agent's output_dir. Every process of an agent reads the agent's checkpoints: without a "
            "filesystem shared by all nodes, copy each agent's checkpoint folder to the same path on every "
            "node that runs one of its processes (each node also keeps its own processes' rng_state files)."
        )
    newer = [s for s in complete if s > step]
    if newer:
        logger.warning(f"agent {agent!r}: resuming from step {step}, not from incomplete or unshared {newer}")
    return complete[step]


def check_same_start(starts: Sequence[tuple[str, int]]) -> None:
    """Every process's ``(agent, step)`` it resumes from (0: from scratch) must name one step."""
    if len({s for _, s in starts}) > 1:
        raise ValueError(f"agents would resume from different steps: {sorted(set(starts))}; resume them together")


def save_state(run_dir: str, agent: str, global_step: int, capability: dict) -> None:
    """Mark ``checkpoint-<global_step>`` of ``run_dir`` complete: its ``hacpo_state.json`` (the agent, the step and
    the capability tracker's state), written once the rest of the folder is on disk."""
    folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{global_step}")
    write_state(folder, {"agent": agent, "global_step": global_step, "capability": capability})


def chosen_checkpoint(
    requested, agent: str, complete: dict[int, str], everyone: Sequence[tuple], describe_rank: Callable[[int], str]
) -> str | None:
    """The checkpoint `resume_from_checkpoint` (``requested``) names: with True or ``"last"`` the newest step every
    agent saved completely (:func:`resume_checkpoint`), else the path given; None: training starts afresh. The
    command line gives strings: ``"true"`` means True and ``"false"`` nothing, as in a recipe."""
    if isinstance(requested, str) and requested.strip().lower() in ("true", "false", "last", ""):
        requested = requested.strip().lower() in ("true", "last")
    if requested is True:
        return resume_checkpoint(agent, complete, everyone, describe_rank)
    return requested or None


def resumed_line(agent: str, checkpoint: str | None, step: int) -> str | None:
    """What a resumed run prints once per agent: the checkpoint it continues from (None: it starts afresh)."""
    return f"hacpo: agent {agent!r} resumes from {checkpoint} (step {step})" if checkpoint else None


@contextmanager
def deferred_limit(args):
    """While TRL saves a checkpoint, ``args.save_total_limit`` is None, so TRL deletes nothing; yields the limit, to
    apply with :func:`prune_checkpoints` once every agent has saved the step (restored after, whatever happens)."""
    limit, args.save_total_limit = args.save_total_limit, None
    try:
        yield limit
    finally:
        args.save_total_limit = limit


def restore_state(checkpoint: str | None, agent: str, capability) -> int:
    """Load ``checkpoint``'s capability tracker state into ``capability``; the step it resumes from (0: no checkpoint,
    training starts afresh)."""
    if not checkpoint:
        return 0
    state = read_state(checkpoint, agent)
    capability.load_state_dict(state["capability"])
    return state["global_step"]
