"""What the trainer logs about a step, as pure functions from per-row tensors and counts to metric dicts.

The trainer sums the per-rank vectors over its agent's ranks (one gather: the glue) and appends the dicts to TRL's
metrics, so every value is over the agent's whole mini-batch, not one rank's share.
"""

from __future__ import annotations

import torch

__all__ = ["LOSS_SUMS", "loss_metric_sums", "loss_metrics", "peer_row_metrics"]

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


def peer_row_metrics(counts: list[float]) -> dict[str, float]:
    """The peer-row counts of a step (appended, rejected, truncated, filtered), summed over the agent's ranks."""
    n_peer, rejected, truncated, filtered = counts
    return {
        "hacpo/peer_rows": n_peer,
        "hacpo/peer_rows_rejected": rejected,
        "hacpo/peer_rows_truncated": truncated,
        "hacpo/peer_rows_filtered": filtered,
    }
