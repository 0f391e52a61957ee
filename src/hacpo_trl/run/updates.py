"""Optimizer updates that change nothing: a solo batch's skipped updates (`solo_steps_per_generation`) and an update
no row of which had a gradient (`skip_empty_updates`).

The Trainer still counts such an update and steps its schedule, so the step count, the learning rate and the
checkpoints follow GSPO's; what it must not do is move a parameter or fail for want of a gradient. Each backend needs
its own care (torch's GradScaler, DeepSpeed's overflow flag and its engine-owned scheduler); the trainer calls these
functions at the update's last micro-batch, with the state it keeps in a :class:`~hacpo_trl.run.schedule.UpdateState`.
"""

from __future__ import annotations

from transformers import TrainerCallback

from .schedule import UpdateState

__all__ = [
    "ResumeGradScaler",
    "advance_engine_scheduler",
    "log_skipped_updates",
    "pause_for_no_gradients",
    "skipped_update",
]


class ResumeGradScaler(TrainerCallback):
    """Resumes the GradScaler that :func:`pause_for_no_gradients` paused, once that update's optimizer step is
    behind (before anything logs or saves the scaler's state)."""

    def __init__(self, state: UpdateState):
        self.state = state

    def on_optimizer_step(self, args, state, control, **kwargs):
        scaler, self.state.paused_scaler = self.state.paused_scaler, None
        if scaler is not None:
            scaler._enabled = True


def advance_engine_scheduler(lr_scheduler) -> None:
    """Step the schedule of a skipped update when DeepSpeed's engine owns it (an `optimizer` or `scheduler` block in
    its config): the engine steps it inside the backward a skipped update never makes, and every backend must advance
    the schedule at a skipped update as at any other."""
    from accelerate.utils.deepspeed import DeepSpeedSchedulerWrapper

    if isinstance(lr_scheduler, DeepSpeedSchedulerWrapper):
        lr_scheduler.scheduler.step()


def skipped_update(state: UpdateState, lr_scheduler) -> None:
    """At the last micro-batch of a skipped update: counted for the log, and the schedule advanced wherever the
    Trainer's own step would not advance it (:func:`advance_engine_scheduler`)."""
    state.skipped_since_log += 1
    state.last_skipped = True
    advance_engine_scheduler(lr_scheduler)


def pause_for_no_gradients(scaler, optimizer):
    """Make the coming optimizer step, with no parameter holding a gradient, change nothing and count as a step.

    An enabled GradScaler would fail it ("No inf checks were recorded"): it is paused (a plain AdamW step leaves
    parameters without a gradient alone), scale unchanged, and returned for :class:`ResumeGradScaler` (else None).
    DeepSpeed's fp16 overflow flag, left from the last real step, would make the Trainer skip its schedule step:
    cleared (every real step sets it anew)."""
    from accelerate.utils.deepspeed import DeepSpeedOptimizerWrapper

    paused = None
    if scaler is not None and scaler.is_enabled():
        scaler._enabled = False  # torch has no public switch; `ResumeGradScaler` sets it back
        paused = scaler
    engine_optimizer = getattr(optimizer, "optimizer", None)
    if isinstance(optimizer, DeepSpeedOptimizerWrapper) and getattr(engine_optimizer, "overflow", False):
        engine_optimizer.overflow = False
    return paused


def log_skipped_updates(logs: dict, state: UpdateState) -> None:
    """Add to a training log how many updates since the last one were skipped (their loss is logged as 0). When the
    last was, drop ``grad_norm``: transformers logs the last update's norm, and a skipped update has none (DeepSpeed
    would repeat the last real update's). Resets the count."""
    logs["hacpo/skipped_updates"] = float(state.skipped_since_log)
    if state.last_skipped:
        logs.pop("grad_norm", None)
    state.skipped_since_log, state.last_skipped = 0, False
