"""The HACPO loss of one mini-batch as the trainer computes it: which rows get a backward pass, the loss over them,
and per-row ratios and clip flags for the whole mini-batch. Pure torch over TRL's batch columns plus ours
(``hacpo_is_peer``, ``hacpo_valid``, ``hacpo_old_mean_logp``, ``hacpo_old_len``, ``hacpo_omega``,
``hacpo_taught``); every forward pass and every collective decision stays in :class:`~hacpo_trl.trainer.HACPOTrainer`.

Taught rows (not in the paper): the rows of a peer on the prompts where it did better than the learner
(`peer_prompts: better`) are what the learner cannot produce itself, so their ratio is often far below the band, which
would drop them. They get :func:`taught_weight` instead: a bounded weight that does not vanish at low ratios, down
to a floor (`taught_ratio_floor`) below which a trace is taken to be in a format the learner cannot write, and dropped.

The floor comes with the learner's other sharing options: ``sharing`` below is its
:class:`~hacpo_trl.sharing.settings.SharingSettings` (the trainer's), whose ``taught_ratio_floor`` is read here; left
out, the paper's defaults.

``clipped`` below is what :func:`score_peer_rows` returns: ``(dropped, objective, ratio, bound)`` for the peer rows
left out of the gradient pass (their mask, their summed constant objective, their ratio on the whole mini-batch,
zero elsewhere, and the lower bound applied), or None when every row gets a backward pass.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

from ..algorithm import (
    HACPOLossConfig,
    LossOutput,
    hacpo_loss,
    in_band,
    peer_objective,
    sequence_log_ratio,
    stepwise_lower_bound,
)
from ..run.padding import length_order
from .decision import peers_in_band
from .settings import SharingSettings

__all__ = [
    "TAUGHT_GAMMA",
    "band_counts",
    "band_order",
    "band_ratios",
    "batch_row_flags",
    "gradient_rows",
    "has_gradient_rows",
    "peer_log_ratios",
    "rows_loss",
    "score_peer_rows",
    "taught_objective",
    "taught_weight",
]

Clipped = tuple[torch.Tensor, float, torch.Tensor, float]
# LUFFY's shaping constant (Yan et al., 2025, "Learning to Reason under Off-Policy Guidance")
TAUGHT_GAMMA = 0.1
_PAPER = SharingSettings()  # a learner's sharing settings where a caller gives none: the paper's rule


def taught_weight(ratio: torch.Tensor, gamma: float = TAUGHT_GAMMA) -> torch.Tensor:
    """A taught row's weight (1 + γ)·s / (s + γ), at most 1: LUFFY's shaping scaled to 1 at s = 1, so it stays large
    where the band gives 0 (0.55 at s = 0.1, 0.10 at 0.01)."""
    return ((1 + gamma) * ratio / (ratio + gamma)).clamp(max=1.0)


def taught_objective(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    coefficient: torch.Tensor,
    gamma: float = TAUGHT_GAMMA,
    floor: float = 0.0,
) -> torch.Tensor:
    """Per taught row: A · ω · w(s), w = :func:`taught_weight` held constant, whose gradient is A · ω · w(s) · ∇ log s
    (the peer trace's mean log-prob under the learner, weighted, as CISPO keeps every row's gradient with a clipped
    weight). No band and no stepwise bound; a row with s below ``floor`` gets weight 0."""
    ratio = log_ratio.detach().exp()
    weight = taught_weight(ratio, gamma) * (ratio >= floor)
    return advantages * coefficient * weight * (1 + log_ratio - log_ratio.detach())


def peer_log_ratios(logps: torch.Tensor, inputs: dict, rows: torch.Tensor, config: HACPOLossConfig) -> torch.Tensor:
    """log s of the peer rows ``rows`` (a mask over the mini-batch) whose per-token log-probs are ``logps``: the
    learner's mean log-prob of its view of each completion minus the generator's (Eq. 11). The trainer's scoring of
    a peer row, shared with ``hacpo-probe``."""
    return sequence_log_ratio(
        logps,
        inputs["completion_mask"][rows],
        inputs["hacpo_old_mean_logp"][rows].to(logps.dtype),
        inputs["hacpo_old_len"][rows],
        mode=config.ratio_mode,
        max_abs_log_ratio=config.max_abs_log_ratio,
    )


@torch.no_grad()
def score_peer_rows(
    logps: torch.Tensor,
    inputs: dict,
    candidates: torch.Tensor,
    update_index: int,
    config: HACPOLossConfig,
    sharing: SharingSettings = _PAPER,
) -> Clipped | None:
    """The peer rows (of ``candidates``, whose per-token log-probs are ``logps``) whose ratio is outside the band
    ``[lb_m, 1]`` now, or for a taught row below the learner's ``sharing.taught_ratio_floor``: they get no gradient,
    so they need no backward pass. None when every candidate is inside."""
    ratio = peer_log_ratios(logps, inputs, candidates, config).exp()
    bound = stepwise_lower_bound(update_index, config.delta, config.delta_step)
    outside = ~in_band(ratio, bound)
    taught = inputs["hacpo_taught"][candidates] if "hacpo_taught" in inputs else torch.zeros_like(outside)
    outside = torch.where(taught, ratio < sharing.taught_ratio_floor, outside)
    if not outside.any():
        return None
    omega = inputs["hacpo_omega"][candidates].to(ratio.dtype)
    coefficient = omega if config.capability_coefficient else torch.ones_like(omega)
    objective = peer_objective(
        ratio, inputs["advantages"][candidates].to(ratio.dtype), coefficient, bound, config.alpha
    )
    objective = torch.where(taught, torch.zeros_like(objective), objective)  # a floored taught row's weight is 0
    rows = torch.nonzero(candidates).flatten()[outside]
    dropped = torch.zeros_like(candidates)
    dropped[rows] = True
    full_ratio = torch.zeros(candidates.shape[0], dtype=ratio.dtype, device=ratio.device)
    full_ratio[rows] = ratio[outside]
    return dropped, float(objective[outside].sum()), full_ratio, bound


def has_gradient_rows(valid: torch.Tensor, clipped: Clipped | None) -> bool:
    """Whether any valid row is left undropped (`gradient_rows`' stand-in row of an all-dropped batch has no gradient)."""
    return bool((valid if clipped is None else valid & ~clipped[0]).any())


def gradient_rows(is_peer: torch.Tensor, clipped: Clipped | None) -> torch.Tensor:
    """The rows of the gradient pass: all but the dropped ones. When every row is dropped, the first row alone, for
    a zero-gradient pass that keeps DDP's ranks in step."""
    keep = torch.ones_like(is_peer) if clipped is None else ~clipped[0]
    if not keep.any():
        keep = torch.zeros_like(is_peer)
        keep[0] = True
    return keep


def rows_loss(
    logps: torch.Tensor,
    inputs: dict,
    rows: torch.Tensor,
    update_index: int,
    clipped: Clipped | None,
    config: HACPOLossConfig,
    self_on_policy: bool = False,
    sharing: SharingSettings = _PAPER,
) -> LossOutput:
    """:func:`~hacpo_trl.algorithm.hacpo_loss` over the mini-batch rows ``rows`` (indices), whose per-token
    log-probs are ``logps``; the dropped rows of ``clipped`` enter as their constant objective. With
    ``self_on_policy`` the self rows' old log-prob is the current one (TRL skips old log-probs when a generation
    batch is used for exactly one update: the self ratio is 1 in value). TRL's importance-sampling weights apply to
    self rows only. A taught row below ``sharing.taught_ratio_floor`` gets weight 0 (:func:`taught_objective`)."""
    is_peer, valid = inputs["hacpo_is_peer"], inputs["hacpo_valid"]
    mask = inputs["completion_mask"][rows]
    sub_peer = is_peer[rows]
    sub_valid = valid[rows] & (clipped is None or ~clipped[0][rows])
    old_mean = inputs["hacpo_old_mean_logp"][rows].to(logps.dtype)
    if self_on_policy:
        with torch.no_grad():
            current = (logps * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        old_mean = torch.where(sub_peer, old_mean, current.detach())
    weights = None
    if "importance_sampling_ratio" in inputs:
        ratio = inputs["importance_sampling_ratio"][rows]
        if ratio.dim() == 2 and ratio.shape[1] > 1:
            ratio = (ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        weights = torch.where(sub_peer, torch.ones_like(ratio.reshape(-1)), ratio.reshape(-1))
    ref = inputs.get("ref_per_token_logps")
    outside_rows = 0 if clipped is None else int(clipped[0].sum())
    outside_objective = 0.0 if clipped is None else clipped[1]
    taught = inputs["hacpo_taught"][rows] & sub_valid if "hacpo_taught" in inputs else None
    # taught rows get their own objective and enter the paper's loss as constants, like the dropped rows
    if taught is not None and bool(taught.any()):
        log_ratio = sequence_log_ratio(
            logps[taught], mask[taught], old_mean[taught], inputs["hacpo_old_len"][rows][taught],
            mode=config.ratio_mode, max_abs_log_ratio=config.max_abs_log_ratio,
        )  # fmt: skip
        omega = inputs["hacpo_omega"][rows][taught].to(logps.dtype)
        coefficient = omega if config.capability_coefficient else torch.ones_like(omega)
        advantages = inputs["advantages"][rows][taught].to(logps.dtype)
        taught_obj = taught_objective(log_ratio, advantages, coefficient, floor=sharing.taught_ratio_floor)
        sub_valid = sub_valid & ~taught
        outside_rows += int(taught.sum())
        outside_objective = outside_objective + taught_obj.sum()
    out = hacpo_loss(
        logps,
        mask,
        old_mean,
        inputs["advantages"][rows],
        sub_peer,
        update_index=update_index,
        omega=inputs["hacpo_omega"][rows],
        old_lengths=inputs["hacpo_old_len"][rows],
        ref_logps=None if ref is None else ref[rows],
        valid=sub_valid,
        weights=weights,
        outside_rows=outside_rows,
        outside_objective=outside_objective,
        config=config,
    )
    if taught is None or not bool(taught.any()):
        return out
    ratio, objective = out.ratio.clone(), out.objective.clone()
    ratio[taught], objective[taught] = log_ratio.detach().exp().to(ratio.dtype), taught_obj.detach().to(objective.dtype)
    return dataclasses.replace(out, ratio=ratio, objective=objective)


def batch_row_flags(
    out: LossOutput, rows: torch.Tensor, is_peer: torch.Tensor, clipped: Clipped | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every mini-batch row's ratio and its clipped-below, clipped-above (peer) and self-clipped flags, the rows
    left out of the gradient pass included: a dropped row's come from its ratio alone (the one kept for a
    zero-gradient pass is also in ``out``)."""
    ratio = torch.zeros(is_peer.shape[0], dtype=out.ratio.dtype, device=out.ratio.device)
    ratio[rows] = out.ratio
    low = torch.zeros_like(is_peer)
    high = torch.zeros_like(is_peer)
    self_clipped = torch.zeros_like(is_peer)
    low[rows], high[rows], self_clipped[rows] = out.peer_clipped_low, out.peer_clipped_high, out.self_clipped
    if clipped is not None:
        dropped, _, dropped_ratio, bound = clipped
        ratio = torch.where(dropped, dropped_ratio.to(ratio.dtype), ratio)
        low = torch.where(dropped, dropped_ratio < bound, low)
        high = torch.where(dropped, dropped_ratio > 1.0, high)
    return ratio, low, high, self_clipped


# ------------------------------------------------------------------------------------- the band gate's scoring


def band_order(batch: dict) -> torch.Tensor:
    """The valid peer rows of a generation batch with its peer rows appended, in order of length, so that rows of
    similar length share a forward of :func:`band_ratios`."""
    candidates = batch["hacpo_is_peer"] & batch["hacpo_valid"]
    index = candidates.nonzero().flatten()
    return index[length_order(torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)[index])]


def band_ratios(
    batch: dict, index: torch.Tensor, score: Callable, size: int, most: int, config: HACPOLossConfig
) -> torch.Tensor:
    """The sequence ratio s of each valid peer row of ``batch`` (in batch order) under the learner now: the rows
    ``index`` (:func:`band_order`), ``size`` per forward; ``score(rows)`` is the learner's no-gradient forward over a
    row mask, returning per-token log-probs. Every rank of an agent runs the forwards that ``most``, the most rows any
    of its ranks holds, needs (under FSDP / ZeRO-3 each forward is a collective): one past the end of ``index``
    scores row 0 and drops it. A forward of ``size`` rows holds no more activations than TRL's no-gradient passes."""
    candidates = batch["hacpo_is_peer"] & batch["hacpo_valid"]
    ratio = torch.full((len(candidates),), float("nan"), device=candidates.device)
    for k in range(max(1, math.ceil(most / size))):
        chunk = index[k * size : (k + 1) * size]
        scored = torch.zeros_like(candidates)
        scored[chunk if len(chunk) else 0] = True
        logps = score(scored)
        if len(chunk):
            ratio[scored] = peer_log_ratios(logps, batch, scored, config).exp().float()
    return ratio[candidates]


def band_counts(
    ratio: torch.Tensor, rows, peers: Sequence[str], config: HACPOLossConfig, sharing: SharingSettings = _PAPER
) -> list[int]:
    """How many valid rows of each of ``peers`` have their ``ratio`` (:func:`band_ratios`) in the band [lb_0, 1], or
    for a taught row at or above ``sharing.taught_ratio_floor`` (:func:`hacpo_trl.sharing.decision.peers_in_band`); ``rows``
    is the :class:`~hacpo_trl.sharing.peer_rows.PeerRows` appended."""
    valid = [k for k, ok in enumerate(rows.valid) if ok]
    sources = [rows.sources[k] for k in valid]
    taught = [bool(rows.taught[k]) for k in valid]
    bound = stepwise_lower_bound(0, config.delta, config.delta_step)
    counts = peers_in_band(ratio, sources, peers, bound, taught, sharing.taught_ratio_floor)
    return [counts[p] for p in peers]
