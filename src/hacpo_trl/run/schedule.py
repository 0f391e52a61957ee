"""How a generation batch is cut into micro-batches and optimizer updates: plain arithmetic, no torch.

TRL generates one batch every ``steps_per_generation`` x ``num_iterations`` micro-steps (S·I) and makes an optimizer
update every ``gradient_accumulation_steps`` (GA) of them. HACPO adds two things on top: the stepwise peer bound
counts the updates already made on a batch (Eq. 14), and a batch a learner learns from no one at may be cut into
fewer micro-batches (`solo_steps_per_generation`), the rest skipped. :class:`BatchPlan` is one batch's cut, made
once when the batch is built; the trainer's steps read it. The config's and the launch plan's rules use the same
predicates, so they cannot drift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BatchPlan",
    "UpdateState",
    "batches_seen",
    "current_update",
    "ends_inside_batch",
    "generation_groups_problem",
    "own_rows_chunk",
    "plan_batch",
    "self_on_policy",
    "solo_fits",
    "solo_steps",
    "update_schedule_problem",
    "updates_within_batches",
]


def current_update(
    step: int,
    generate_every: int,
    gradient_accumulation_steps: int,
    steps_per_iteration: int | None = None,
    made_per_iteration: int | None = None,
) -> int:
    """m: the optimizer updates already made on the current generation batch, at micro-step ``step`` (Eq. 14). A
    batch on the solo schedule makes only the first ``made_per_iteration`` of each iteration's
    ``steps_per_iteration`` micro-batches (the others are skipped: no update), so with `num_iterations` > 1 only
    those count."""
    ga = max(gradient_accumulation_steps, 1)
    within = step % generate_every
    if made_per_iteration is None or steps_per_iteration is None:
        return within // ga
    iteration, micro = divmod(within, steps_per_iteration)
    if micro >= made_per_iteration:
        raise ValueError(
            f"micro-step {step} is a skipped one ({micro} >= {made_per_iteration} of {steps_per_iteration})"
        )
    return (iteration * made_per_iteration + micro) // ga


def self_on_policy(gradient_accumulation_steps: int, generate_every: int, vllm_weights: bool) -> bool:
    """Whether self rows take their current log-prob as the old one (ratio 1 in value), as TRL does for a batch used
    for one update without vLLM importance weights: so that one agent equals TRL's GSPO."""
    return gradient_accumulation_steps % generate_every == 0 and not vllm_weights


def batches_seen(global_step: int, step: int, gradient_accumulation_steps: int, generate_every: int) -> int:
    """Generation batches before the one starting at micro-step ``step``, after ``global_step`` finished updates
    (counted in micro-batches, since an update may span generation batches)."""
    ga = gradient_accumulation_steps
    return (global_step * ga + step % ga) // generate_every


def solo_steps(steps_per_generation: int, solo_steps_per_generation: int | None, sharing: bool) -> int:
    """Micro-batches of a generation batch of own rows only: `solo_steps_per_generation` when the learner shares
    rollouts but learns from no one at this batch (TRL's baselines and single agents: all of them)."""
    return solo_steps_per_generation if sharing and solo_steps_per_generation is not None else steps_per_generation


def own_rows_chunk(rows: int, solo_micro_batches: int, per_device_train_batch_size: int) -> int:
    """Rows per chunk of the no-gradient passes over a generation batch's own rows: the rows of one update of a solo
    batch, so that a learner gated off computes them in GSPO's chunks (TRL's mini-batch when they do not divide)."""
    if rows % solo_micro_batches == 0:
        return rows // solo_micro_batches
    return per_device_train_batch_size


def solo_fits(solo: int, steps_per_generation: int, gradient_accumulation_steps: int) -> bool:
    """Whether `solo_steps_per_generation` cuts a generation batch into whole optimizer updates (an update
    half-skipped would step on half its rows)."""
    return not (steps_per_generation % solo or solo % gradient_accumulation_steps)


def updates_within_batches(generate_every: int, gradient_accumulation_steps: int) -> bool:
    """Whether every optimizer update lies inside one generation batch (S·I a multiple of GA) or spans whole ones (GA
    a multiple of S·I: m = 0), the cases where m of Eq. 14 is exact."""
    return not (generate_every % gradient_accumulation_steps and gradient_accumulation_steps % generate_every)


def update_schedule_problem(
    steps_per_generation: int, num_iterations: int, gradient_accumulation_steps: int
) -> str | None:
    """Why a schedule that shares peer rows cannot run (None when it can): the stepwise peer bound needs
    `updates_within_batches` of S·I micro-steps per generation batch. The config refuses it, the plan reports it."""
    per_generation, ga = steps_per_generation * num_iterations, gradient_accumulation_steps
    if updates_within_batches(per_generation, ga):
        return None
    return (
        f"steps_per_generation x num_iterations = {per_generation} and gradient_accumulation_steps = {ga}: "
        "optimizer updates would straddle generation batches, so the stepwise peer bound would use the wrong "
        "update index. Make steps_per_generation x num_iterations a multiple of gradient_accumulation_steps "
        f"(e.g. steps_per_generation = {ga * max(1, round(steps_per_generation / ga))})."
    )


def generation_groups_problem(
    per_device_train_batch_size: int, processes: int, steps_per_generation: int, num_generations: int
) -> str | None:
    """Why a generation batch cannot hold whole prompt groups (None when it can), with the values that would fit:
    the ``num_generations`` nearest the asked one that divide the batch, and the nearest micro-batch sizes whose
    batch ``num_generations`` divides."""
    per_device, g = per_device_train_batch_size, num_generations
    batch = per_device * processes * steps_per_generation
    if g < 1 or batch % g == 0:
        return None
    divisors = [d for d in range(2, batch + 1) if batch % d == 0]
    fits = sorted(sorted(divisors, key=lambda d: (abs(d - g), d))[:6])
    unit = g // math.gcd(g, processes * steps_per_generation)  # the micro-batch must be a multiple of it
    sizes = sorted({m for m in ((per_device // unit) * unit, (per_device // unit + 1) * unit) if m >= 1})
    batches = [m * processes * steps_per_generation for m in sizes]
    fixes = [f"num_generations {_either(fits)}"] if fits else []
    fixes.append(f"per_device_train_batch_size {_either(sizes)} (generation_batch_size {_either(batches)})")
    return (
        f"generation_batch_size {batch} (per_device_train_batch_size {per_device} x {processes} process(es) x "
        f"steps_per_generation {steps_per_generation}) must be a multiple of num_generations {g}, so that every "
        f"prompt's completions fall in one batch: use {', or '.join(fixes)}"
    )


def _either(values: list[int]) -> str:
    return " or ".join([", ".join(map(str, values[:-1])), str(values[-1])]) if len(values) > 1 else str(values[0])


def ends_inside_batch(
    steps: int, steps_per_generation: int, num_iterations: int, gradient_accumulation_steps: int
) -> bool:
    """Whether ``steps`` optimizer updates end inside a generation batch (a checkpoint there resumes out of phase)."""
    return (int(steps) * gradient_accumulation_steps) % (steps_per_generation * num_iterations) != 0


@dataclass(frozen=True)
class BatchPlan:
    """How one generation batch is trained: its ``own_rows`` come first; each of its ``num_iterations`` iterations
    makes the first ``micro_batches`` of ``steps_per_generation`` micro-batches and skips the rest. A ``solo`` batch
    holds own rows only (TRL's loss); a ``few_prompts`` one holds peer rows of some prompts only (rescued, or taught
    with `taught_schedule: solo`), on the solo schedule."""

    own_rows: int
    micro_batches: int
    steps_per_generation: int
    num_iterations: int = 1
    solo: bool = True
    few_prompts: bool = False

    @property
    def generate_every(self) -> int:
        """Micro-steps from one generation batch to the next (TRL's `steps_per_generation` x `num_iterations`)."""
        return self.steps_per_generation * self.num_iterations

    def skips(self, step: int) -> bool:
        """Whether micro-step ``step`` is one this batch leaves out (never the first, which generates a batch)."""
        return step % self.generate_every != 0 and step % self.steps_per_generation >= self.micro_batches

    def update_index(self, step: int, gradient_accumulation_steps: int) -> int:
        """m of Eq. 14 at micro-step ``step`` (a ``few_prompts`` batch does not count its skipped micro-batches)."""
        if not self.few_prompts:
            return current_update(step, self.generate_every, gradient_accumulation_steps)
        made = self.micro_batches
        return current_update(step, self.generate_every, gradient_accumulation_steps, self.steps_per_generation, made)

    def ends_batch(self, step: int) -> bool:
        """Whether micro-step ``step`` is the batch's last."""
        return (step + 1) % self.generate_every == 0


def plan_batch(
    own_rows: int, peers: bool, few_prompts: bool, steps_per_generation: int, solo_micro_batches: int, iterations: int
) -> BatchPlan:
    """The plan of a batch of ``own_rows`` own rows: the sharing schedule with peer rows, the solo schedule without
    them or with peer rows of some prompts only (``few_prompts``)."""
    micro = steps_per_generation if peers and not few_prompts else solo_micro_batches
    return BatchPlan(own_rows, micro, steps_per_generation, iterations, solo=not peers, few_prompts=few_prompts)


@dataclass
class UpdateState:
    """What the trainer gathers while an optimizer update (or, for ``peer_ratios``, a generation batch) runs, and
    hands on when it ends."""

    has_rows: bool | None = None  # a row of the update had a gradient, on any rank (None: no HACPO loss ran)
    paused_scaler: Any = None  # the GradScaler paused for an update without gradients, until its step is behind
    peer_ratios: list[tuple[float, float]] = field(default_factory=list)  # (ratio, bound) of each peer row
    skipped_since_log: int = 0  # updates skipped since the last training log
    last_skipped: bool = False  # whether the last update was skipped

    def take_has_rows(self) -> bool:
        """At an update's end: whether it may step (no HACPO loss ran, or a row had a gradient); reset."""
        has_rows, self.has_rows = self.has_rows, None
        return has_rows is not False
