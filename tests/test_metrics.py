"""`hacpo_trl.training.metrics`: the logged loss and peer-row metrics from per-row tensors, summed over ranks by hand."""

import pytest
import torch

from hacpo_trl.run.exchange import RolloutBatch
from hacpo_trl.training.metrics import (
    LOSS_SUMS,
    capability_metrics,
    exchange_metrics,
    loss_metric_sums,
    loss_metrics,
    peer_ratio_metrics,
    peer_row_metrics,
    prompt_outcome_metrics,
)


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


def test_peer_ratio_metrics_summarise_a_generation_batch():
    # ratios 0.5, 1.0, 2.0 with bounds 0.8, 0.8, 0.9: median 1, geometric mean 1, one of three in band
    metrics = peer_ratio_metrics([(0.5, 0.8), (1.0, 0.8), (2.0, 0.9)])
    assert metrics == pytest.approx(
        {
            "hacpo/peer_ratio_median": 1.0,
            "hacpo/peer_ratio_geomean": 1.0,
            "hacpo/peer_ratio_in_band": 1 / 3,
            "hacpo/peer_ratio_lower_bound": 2.5 / 3,
        }
    )
    assert peer_ratio_metrics([]) == {}


def test_capability_and_exchange_metrics():
    metrics = capability_metrics({"a": 0.25, "b": 0.75}, {"a": [1.0, 0.0], "b": [0.5]}, {"b": 3.0})
    assert metrics == {
        "hacpo/capability/a": 0.25,
        "hacpo/capability/b": 0.75,
        "hacpo/reward/a": 0.5,
        "hacpo/reward/b": 0.5,
        "hacpo/omega/b": 3.0,
    }

    class Exchange:
        last_transfer, last_wait, last_bytes = 0.25, 0.5, 1024

    assert exchange_metrics(Exchange(), 1.0, 0.125) == {
        "hacpo/exchange_time": 1.0,
        "hacpo/time/exchange_transfer": 0.25,
        "hacpo/time/exchange_wait": 0.5,
        "hacpo/exchange_bytes": 1024,
        "hacpo/retokenize_time": 0.125,
    }


def test_prompt_outcome_metrics_counts_by_hand():
    """Prompt p1 solved 2 of 2 by the learner, p2 unsure (1 of 2), p3 failed (0 of 2, a NaN not scored); the peer's
    wrong rows on p1, right rows on p2 and p3, counted over two ranks' records."""
    nan = float("nan")
    records = [
        RolloutBatch("A", 0, 0, ["p1", "p1", "p2", "p2"], rewards=[1.0, 1.0, 1.0, 0.0]),
        RolloutBatch("A", 1, 0, ["p3", "p3", "p3"], rewards=[0.0, 0.0, nan]),
        RolloutBatch("B", 2, 0, ["p1", "p1", "p1", "p2"], rewards=[0.0, 0.0, 1.0, 1.0]),
        RolloutBatch("B", 3, 0, ["p2", "p3", "p3", "p4"], rewards=[0.0, 1.0, nan, 1.0]),
    ]
    assert prompt_outcome_metrics(records, "A") == {
        "hacpo/prompts/solved": 1.0,
        "hacpo/prompts/unsure": 1.0,
        "hacpo/prompts/failed": 1.0,
        "hacpo/prompts/B_wrong_on_solved": 2.0,
        "hacpo/prompts/B_right_on_unsure": 1.0,
        "hacpo/prompts/B_right_on_failed": 1.0,
    }
    # from B's side: p1 unsure (1 of 3), p2 unsure (1 of 2), p3 solved (1 of 1 scored), p4 solved
    assert prompt_outcome_metrics(records, "B") == {
        "hacpo/prompts/solved": 2.0,
        "hacpo/prompts/unsure": 2.0,
        "hacpo/prompts/failed": 0.0,
        "hacpo/prompts/A_wrong_on_solved": 2.0,
        "hacpo/prompts/A_right_on_unsure": 3.0,
        "hacpo/prompts/A_right_on_failed": 0.0,
    }
