"""What the trainer logs about a step, as pure functions from per-row tensors and counts to metric dicts.

The trainer sums the per-rank vectors over its agent's ranks (one gather: the glue) and appends the dicts to TRL's
metrics, so every value is over the agent's whole mini-batch, not one rank's share.
"""

from __future__ import annotations

import math
import time

import torch
from transformers import TrainerCallback

from ..algorithm import peer_ratio_stats
from ..run.padding import padding_ratio
from ..sharing.decision import gate_evidence, scored_rewards
from ..sharing.peer_loss import batch_row_flags

__all__ = [
    "LOSS_SUMS",
    "OptimizerTimer",
    "capability_metrics",
    "capability_step_metrics",
    "exchange_metrics",
    "gate_evidence_metrics",
    "learns_from_metrics",
    "loss_metric_sums",
    "loss_row_sums",
    "loss_metrics",
    "padding_metrics",
    "peer_ratio_metrics",
    "peer_row_metrics",
    "prompt_outcome_metrics",
    "sharing_metrics",
]

LOSS_SUMS = 9  # the length of :func:`loss_metric_sums`'s vector


def loss_metric_sums(ratio, low, high, self_clipped, peer, own, grad_rows: int) -> torch.Tensor:
    """This rank's sums behind :func:`loss_metrics` (summed over ranks before use): self and peer ratio sums and
    counts, peer rows clipped below / above, self rows clipped, rows with a backward pass, rows."""
    return torch.stack(
        [
            (ratio * own).sum(),
            own.sum(),
            (ratio * peer).sum(),
            peer.sum(),
            (low & peer).sum(),
            (high & peer).sum(),
            (self_clipped & own).sum(),
            torch.tensor(float(grad_rows), device=ratio.device),
            torch.tensor(float(ratio.shape[0]), device=ratio.device),
        ]
    ).float()


def loss_row_sums(out, rows: torch.Tensor, inputs: dict, clipped, grad_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`loss_metric_sums` of a mini-batch's HACPO loss ``out`` over its gradient rows ``rows``, the rows left
    out of the gradient pass (``clipped``, :func:`hacpo_trl.sharing.peer_loss.score_peer_rows`) included; and the ratios of
    its valid peer rows (:func:`peer_ratio_metrics` collects them over a generation batch)."""
    is_peer, valid = inputs["hacpo_is_peer"], inputs["hacpo_valid"]
    ratio, low, high, self_clipped = batch_row_flags(out, rows, is_peer, clipped)
    peer, own = is_peer & valid, ~is_peer & valid
    return loss_metric_sums(ratio, low, high, self_clipped, peer, own, grad_rows), ratio[peer]


def loss_metrics(sums: list[float], lower_bound: float, kl: torch.Tensor | None) -> dict[str, float]:
    """The loss metrics of a mini-batch from the summed :func:`loss_metric_sums` (means over the rows they are
    about; a side with no rows logs nothing)."""
    s_own, n_own, s_peer, n_peer, low, high, self_clip, grad_rows, rows = sums
    metrics = {"hacpo/lower_bound": lower_bound, "hacpo/backward_rows_fraction": grad_rows / max(rows, 1)}
    if n_own:
        metrics["hacpo/self_ratio_mean"] = s_own / n_own
        metrics["clip_ratio/region_mean"] = self_clip / n_own
    if n_peer:
        metrics["hacpo/peer_ratio_mean"] = s_peer / n_peer
        metrics["hacpo/peer_clipped_low"] = low / n_peer
        metrics["hacpo/peer_clipped_high"] = high / n_peer
        metrics["hacpo/peer_kept"] = 1 - (low + high) / n_peer
    if kl is not None:
        metrics["kl"] = float(kl.mean())
    return metrics


def padding_metrics(sums: dict[str, list[float]]) -> dict[str, float]:
    """``hacpo/time/padding_ratio/<pass>`` (``old_logps``, ``ref_logps``, ``peer_scoring``, ``train``) since the last
    log, from this rank's ``{pass: [processed, real]}`` token sums: a ratio of sums, so chunks weigh by their tokens."""
    return {f"hacpo/time/padding_ratio/{name}": padding_ratio(p, r) for name, (p, r) in sorted(sums.items())}


def peer_row_metrics(counts: list[float]) -> dict[str, float]:
    """The peer-row counts of a step (appended, rejected, truncated, filtered), summed over the agent's ranks."""
    n_peer, rejected, truncated, filtered = counts
    return {
        "hacpo/peer_rows": n_peer,
        "hacpo/peer_rows_rejected": rejected,
        "hacpo/peer_rows_truncated": truncated,
        "hacpo/peer_rows_filtered": filtered,
    }


def peer_ratio_metrics(rows: list[tuple[float, float]]) -> dict[str, float]:
    """The median, geometric mean and share in band of a generation batch's peer ratios, and the mean bound
    applied, from its ``(ratio, lower bound)`` pairs (nothing without peer rows)."""
    if not rows:
        return {}
    stats = peer_ratio_stats(torch.tensor([r for r, _ in rows]), torch.tensor([b for _, b in rows]))
    return {f"hacpo/peer_ratio_{key}": stats[key] for key in ("median", "geomean", "in_band", "lower_bound")}


def capability_metrics(
    capabilities: dict[str, float], step_rewards: dict[str, list[float]], omegas: dict[str, float]
) -> dict[str, float]:
    """Every agent's capability estimate and mean reward of the step; ω of each peer (toward the learner)."""
    metrics = {f"hacpo/capability/{agent}": capabilities[agent] for agent in step_rewards}
    metrics.update({f"hacpo/reward/{agent}": sum(r) / len(r) for agent, r in step_rewards.items()})
    metrics.update({f"hacpo/omega/{agent}": omega for agent, omega in omegas.items()})
    return metrics


def capability_step_metrics(tracker, learner: str, step_rewards: dict[str, list[float]], low: float, high: float):
    """:func:`capability_metrics` once ``tracker`` (a :class:`~hacpo_trl.algorithm.CapabilityTracker`) took the
    step's rewards: ω of each peer toward ``learner``, its capability ratio clamped to [``low``, ``high``]."""
    omegas = {a: tracker.omega(a, learner, low, high) for a in tracker.agents if a != learner}
    return capability_metrics(tracker.capabilities(), step_rewards, omegas)


def learns_from_metrics(learner: str, agents: list[str], open_peers: list[str], weight: float) -> dict[str, float]:
    """Which peers the learner learns from at this generation batch: 1 open, 0 closed (`learn_from`,
    `capability_gate`), and the weight of its peer rows (`peer_fade_steps`)."""
    metrics = {f"hacpo/learns_from/{a}": float(a in open_peers) for a in agents if a != learner}
    metrics["hacpo/peer_weight"] = weight
    return metrics


def gate_evidence_metrics(
    learner: str, capabilities: dict[str, float], rows: dict[str, int], gate: float
) -> dict[str, float]:
    """The z of each peer against the learner (`capability_gate_confidence`): why a peer is open or closed. Clipped
    to ±100, so that a window with no variance (every completion right) logs a number, not infinity."""
    own = capabilities[learner]
    return {
        f"hacpo/gate_z/{a}": max(-100.0, min(100.0, gate_evidence(c, rows[a], own, rows[learner], gate)))
        for a, c in capabilities.items()
        if a != learner
    }


def sharing_metrics(
    learner: str, agents: list[str], decision, settings, capabilities: dict[str, float], rows: dict[str, int]
) -> dict[str, float]:
    """A learner's :class:`~hacpo_trl.sharing.decision.PeerDecision` at a generation batch: whom it learns from and its peers'
    weight; with `capability_gate_rescue` the prompts each peer rescued, with `peer_prompts` 'better' or 'failed' the
    share of prompts each peer teaches (with `peer_negatives`, also gives negatives on), with `capability_gate_confidence` each peer's evidence."""
    out = learns_from_metrics(learner, agents, list(decision.open), decision.weight)
    if settings.capability_gate_rescue:
        others = [a for a in agents if a != learner]
        out.update({f"hacpo/rescued_prompts/{p}": float(len(decision.rescued.get(p, ()))) for p in others})
    if settings.peer_prompts != "all":
        others = [a for a in agents if a != learner]
        share = {p: len(decision.prompts.get(p, ())) / max(decision.batch_prompts, 1) for p in others}
        out.update({f"hacpo/taught_prompts/{p}": share[p] for p in others})
    if settings.peer_negatives != "none":
        others = [a for a in agents if a != learner]
        share = {p: len(decision.negatives.get(p, ())) / max(decision.batch_prompts, 1) for p in others}
        out.update({f"hacpo/negative_prompts/{p}": share[p] for p in others})
    if settings.capability_gate and settings.capability_gate_confidence:
        out.update(gate_evidence_metrics(learner, capabilities, rows, settings.capability_gate))
    return out


def prompt_outcome_metrics(records, learner: str) -> dict[str, float]:
    """Where the learner's own groups carry a signal at this generation batch, and what each other agent wrote there,
    over every rank's ``records`` (:class:`~hacpo_trl.run.exchange.RolloutBatch`, prompt ids and rewards; a positive
    reward is right). A prompt the learner got right at every scored completion is *solved* and one it got right at
    none is *failed*: GSPO's advantages there are all 0. Any other scored prompt is *unsure*. Logged per batch: the
    count of each kind (``hacpo/prompts/solved``, ``unsure``, ``failed``) and, per other agent, its wrong rows on the
    solved prompts and its right rows on the unsure and failed ones (``hacpo/prompts/<peer>_wrong_on_solved``, ...)."""
    own = scored_rewards(records, learner)
    kind = {pid: "solved" if all(x > 0 for x in rs) else "failed" if not any(x > 0 for x in rs) else "unsure"
            for pid, rs in own.items()}  # fmt: skip
    out = {f"hacpo/prompts/{k}": float(sum(v == k for v in kind.values())) for k in ("solved", "unsure", "failed")}
    for peer in dict.fromkeys(r.agent for r in records if r.agent != learner):
        counts = {"wrong_on_solved": 0, "right_on_unsure": 0, "right_on_failed": 0}
        for r in (r for r in records if r.agent == peer):
            for pid, reward in zip(r.prompt_ids, r.rewards, strict=True):
                if not math.isfinite(reward) or pid not in kind:
                    continue
                right, where = reward > 0, kind[pid]
                if where == "solved" and not right:
                    counts["wrong_on_solved"] += 1
                elif where != "solved" and right:
                    counts[f"right_on_{where}"] += 1
        out.update({f"hacpo/prompts/{peer}_{k}": float(n) for k, n in counts.items()})
    return out


def exchange_metrics(exchange, exchange_time: float, retokenize_seconds: float) -> dict[str, float]:
    """Where a step's exchange time went (``exchange`` is the :class:`~hacpo_trl.run.exchange.Exchange`)."""
    return {
        "hacpo/exchange_time": exchange_time,
        "hacpo/time/exchange_transfer": exchange.last_transfer,
        "hacpo/time/exchange_wait": exchange.last_wait,
        "hacpo/exchange_bytes": exchange.last_bytes,
        "hacpo/retokenize_time": retokenize_seconds,
    }


class OptimizerTimer(TrainerCallback):
    """Times the optimizer step (between `on_pre_optimizer_step` and `on_optimizer_step`)."""

    def __init__(self, trainer):
        self.trainer, self.start = trainer, 0.0

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.trainer._metrics["train"]["hacpo/time/optimizer"].append(time.perf_counter() - self.start)
