"""Joint checkpointing: which checkpoints are complete, which to delete, and which step every agent resumes from.

A HACPO checkpoint is TRL's folder plus ``hacpo_state.json`` (the capability tracker), written last and atomically,
so a folder without it was interrupted while saving and is never resumed from or counted. The agents must resume
together, from a step every one of them saved completely. Plain functions over folders and over what every process
reported, through the all-gather over the exchange group the trainer hands in (:func:`resume_together`), so they are
testable without a trainer.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from contextlib import contextmanager

__all__ = [
    "STATE_FILE",
    "agent_checkpoints",
    "check_same_start",
    "chosen_checkpoint",
    "complete_checkpoints",
    "deferred_limit",
    "prune_checkpoints",
    "read_state",
    "restore_state",
    "resume_checkpoint",
    "resume_together",
    "save_state",
    "save_together",
    "write_state",
]

logger = logging.getLogger(__name__)

STATE_FILE = "hacpo_state.json"
PREFIX_CHECKPOINT_DIR = "checkpoint"  # transformers' (`trainer_utils.PREFIX_CHECKPOINT_DIR`), without importing it


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


def _requested(requested):
    """``resume_from_checkpoint`` as a recipe or the command line give it: ``"true"`` / ``"last"`` mean True,
    ``"false"`` or empty nothing (None), anything else a path."""
    if isinstance(requested, str) and requested.strip().lower() in ("true", "false", "last", ""):
        return requested.strip().lower() in ("true", "last") or None
    return requested or None


def _step(path: str) -> int | None:
    name = os.path.basename(os.path.normpath(path))
    prefix = f"{PREFIX_CHECKPOINT_DIR}-"
    return int(name[len(prefix) :]) if name.startswith(prefix) and name[len(prefix) :].isdigit() else None


_FIX = "pass `true` to resume every agent from the newest step all of them saved"


def agent_checkpoints(requested, output_dirs: dict[str, str]) -> dict[str, str | None]:
    """Each agent's checkpoint that ``resume_from_checkpoint`` names, checked on disk before anything loads.

    ``output_dirs``: each agent's output folder. True (``"true"``, ``"last"``): the newest step every agent saved
    completely. A path: a ``checkpoint-<step>`` folder of one agent of the run means that step for every agent, each
    resuming from its own ``<output_dir>/checkpoint-<step>`` (one agent's weights are never loaded into another); a
    single agent may also resume from a checkpoint outside its folder, as in TRL. Refused with one line naming the
    problem and the fix: a path that is not a checkpoint, a step an agent has no complete checkpoint of, no step
    every agent saved, or a checkpoint that another agent saved (its ``hacpo_state.json``). None: from scratch."""
    requested = _requested(requested)
    if requested is None:
        return dict.fromkeys(output_dirs)
    folders = {a: complete_checkpoints(d) for a, d in output_dirs.items()}
    if requested is True:
        common = set.intersection(*(set(f) for f in folders.values()))
        if not common:
            saved = {a: sorted(f) for a, f in folders.items()}
            raise ValueError(
                f"resume_from_checkpoint is true, but no step was saved completely by every agent (complete "
                f"checkpoints per agent: {saved}, in {sorted(set(output_dirs.values()))}); start without "
                "resume_from_checkpoint, or pass the output_dir the checkpoints were saved under"
            )
        return {a: f[max(common)] for a, f in folders.items()}
    path = os.path.normpath(os.path.expanduser(str(requested)))
    step = _step(path)
    if step is None:
        held = sorted(complete_checkpoints(path)) if os.path.isdir(path) else []
        where = f"it holds checkpoint-{held[-1]}, pass {os.path.join(path, f'checkpoint-{held[-1]}')}" if held else (
            "it does not exist" if not os.path.exists(path) else "it holds no complete checkpoint-<step> folder"
        )  # fmt: skip
        raise ValueError(
            f"resume_from_checkpoint {requested!r} is not a checkpoint folder (<output_dir>/<agent>/checkpoint-<step>): "
            f"{where}; or {_FIX}"
        )
    if len(output_dirs) > 1:
        inside = any(os.path.dirname(path) == os.path.normpath(d) for d in output_dirs.values())
        if not inside:
            raise ValueError(
                f"resume_from_checkpoint {requested!r} is outside every agent's output folder "
                f"({', '.join(sorted(output_dirs.values()))}): a run of several agents resumes each from its own "
                f"checkpoint-<step>; pass one of them, or {_FIX}"
            )
        chosen = {a: os.path.join(d, os.path.basename(path)) for a, d in output_dirs.items()}
    else:
        chosen = dict.fromkeys(output_dirs, path)
    for agent, folder in chosen.items():
        if not os.path.isfile(os.path.join(folder, STATE_FILE)):
            saved = sorted(folders[agent])
            raise ValueError(
                f"agent {agent!r}: resume_from_checkpoint names step {step}, but {folder} is not a complete "
                f"checkpoint (no {STATE_FILE}; this agent's complete steps: {saved or 'none'}); {_FIX}"
            )
        owner = read_state(folder, agent).get("agent")
        if owner not in (None, agent):
            raise ValueError(
                f"agent {agent!r}: {folder} is a checkpoint of agent {owner!r}; an agent resumes only from its own "
                f"checkpoints: give each agent its own output_dir, or {_FIX}"
            )
    return chosen


def chosen_checkpoint(
    requested,
    agent: str,
    complete: dict[int, str],
    everyone: Sequence[tuple],
    describe_rank: Callable[[int], str],
    output_dirs: dict[str, str] | None = None,
) -> str | None:
    """The checkpoint `resume_from_checkpoint` (``requested``) names for ``agent``: with True or ``"last"`` the newest
    step every agent saved completely (:func:`resume_checkpoint`), else this agent's own checkpoint of the step the
    path names (:func:`agent_checkpoints`; ``output_dirs``: every agent's folder); None: training starts afresh. The
    command line gives strings: ``"true"`` means True and ``"false"`` nothing, as in a recipe."""
    requested = _requested(requested)
    if requested is True:
        return resume_checkpoint(agent, complete, everyone, describe_rank)
    if requested is None or output_dirs is None:
        return requested
    return agent_checkpoints(requested, output_dirs)[agent]


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


def resume_together(
    requested,
    agent: str,
    output_dir: str,
    is_main: bool,
    gather: Callable[..., list],
    describe_rank: Callable[[int], str],
    capability,
) -> str | None:
    """Where this process's agent resumes, decided with every other process (each must call it): every process
    reports its agent's complete checkpoints over ``gather`` (the exchange's all-gather, ``gather(obj, what=...)``),
    the checkpoint `resume_from_checkpoint` (``requested``) names is chosen (:func:`chosen_checkpoint`), the
    capability tracker restored from it, the agent's main process (``is_main``) says so, and every agent is checked
    to start from the same step. Returns what TRL's ``train(resume_from_checkpoint=...)`` takes (None: afresh)."""
    complete = complete_checkpoints(output_dir)
    report = (agent, is_main, sorted(complete), requested, output_dir)
    everyone = gather(report, what="checkpoints to resume from")
    folders = {entry[0]: entry[4] for entry in everyone if entry[1]}
    checkpoint = chosen_checkpoint(requested, agent, complete, everyone, describe_rank, folders)
    step = restore_state(checkpoint, agent, capability)
    if (line := resumed_line(agent, checkpoint, step)) and is_main:
        print(line, flush=True)
    check_same_start(gather((agent, step), what="resume steps"))
    return checkpoint


def save_together(
    run_dir: str,
    agent: str,
    global_step: int,
    capability: dict,
    should_save: bool,
    gather: Callable[..., list],
    limit: int | None = None,
    keep: str | None = None,
) -> None:
    """The end of a joint checkpoint, once TRL saved its folder (every process calls it): the agent's saving process
    (``should_save``) writes the capability tracker (:func:`save_state`, last, which makes the folder complete), every
    process waits over ``gather`` until every agent has saved this step, and only then are old checkpoints pruned to
    ``limit`` (`save_total_limit`, held back by :func:`deferred_limit`; ``keep``: the best model's), so that a crash
    while saving leaves every agent's previous step."""
    if should_save:
        save_state(run_dir, agent, global_step, capability)
    gather((agent, global_step), what="checkpoint saved by every agent")
    if limit and should_save:
        prune_checkpoints(run_dir, limit, keep=keep)
