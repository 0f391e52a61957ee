"""`hacpo_trl.metrics`: the logged loss and peer-row metrics from per-row tensors, summed over ranks by hand."""

import pytest
import torch

from hacpo_trl.metrics import LOSS_SUMS, loss_metric_sums, loss_metrics, peer_row_metrics


def test_loss_metrics_are_means_over_the_rows_they_are_about_across_ranks():
    # rank 0: 2 self rows (ratios 1.0, 1.2; the second clipped), 2 peer rows (0.5 low, 0.9 kept), 3 rows backward
    ratio = torch.tensor([1.0, 1.2, 0.5, 0.9])
    peer = torch.tensor([False, False, True, True])
    low, high = torch.tensor([False, False, True, False]), torch.zeros(4, dtype=torch.bool)
    self_clipped = torch.tensor([False, True, False, False])
    rank0 = loss_metric_sums(ratio, low, high, self_clipped, peer, ~peer, 3)
    assert rank0.tolist() == pytest.approx([2.2, 2, 1.4, 2, 1, 0, 1, 3, 4])
    # rank 1: one peer row above the band (1.5), one invalid row (neither self nor peer), both backward
    r1 = loss_metric_sums(
        torch.tensor([1.5, 7.0]),
        torch.zeros(2, dtype=torch.bool),
        torch.tensor([True, False]),
        torch.zeros(2, dtype=torch.bool),
        torch.tensor([True, False]),
        torch.zeros(2, dtype=torch.bool),
        2,
    )
    sums = torch.stack([rank0, r1]).view(-1, LOSS_SUMS).sum(0).tolist()
    metrics = loss_metrics(sums, 0.8, torch.tensor([0.1, 0.3]))
    assert metrics == pytest.approx(
        {
            "hacpo/lower_bound": 0.8,
            "hacpo/backward_rows_fraction": 5 / 6,
            "hacpo/self_ratio_mean": 1.1,
            "clip_ratio/region_mean": 0.5,
            "hacpo/peer_ratio_mean": (0.5 + 0.9 + 1.5) / 3,
            "hacpo/peer_clipped_low": 1 / 3,
            "hacpo/peer_clipped_high": 1 / 3,
            "hacpo/peer_kept": 1 / 3,
            "kl": 0.2,
        }
    )


def test_a_side_without_rows_logs_nothing():
    metrics = loss_metrics([0, 0, 0, 0, 0, 0, 0, 0, 0], 0.9, None)
    assert metrics == {"hacpo/lower_bound": 0.9, "hacpo/backward_rows_fraction": 0.0}


def test_peer_row_metrics_name_each_count():
    assert peer_row_metrics([5.0, 2.0, 1.0, 3.0]) == {
        "hacpo/peer_rows": 5.0,
        "hacpo/peer_rows_rejected": 2.0,
        "hacpo/peer_rows_truncated": 1.0,
        "hacpo/peer_rows_filtered": 3.0,
    }
