"""`hacpo_trl.sharing.peer_loss`: which rows of a mini-batch get a backward pass, the loss over them, per-row flags.
Hand-built mini-batches; no trainer, no process group."""

import math
from pathlib import Path

import pytest
import torch

from hacpo_trl.algorithm import HACPOLossConfig, hacpo_loss
from hacpo_trl.run.schedule import current_update, self_on_policy
from hacpo_trl.sharing.peer_loss import batch_row_flags, gradient_rows, has_gradient_rows, rows_loss, score_peer_rows
from hacpo_trl.sharing.settings import SharingSettings

FLOORED, UNFLOORED = (SharingSettings(peer_prompts="failed", taught_ratio_floor=f) for f in (0.2, 0.0))


def _inputs(ratios):
    """Row 0 is a self row, rows 1.. peer rows whose ratio s (per-token means, every token log-prob -1) is given."""
    n = 1 + len(ratios)
    old = [-1.0] + [-1.0 - math.log(s) for s in ratios]
    return {
        "completion_mask": torch.ones(n, 2, dtype=torch.long),
        "hacpo_is_peer": torch.tensor([False] + [True] * len(ratios)),
        "hacpo_valid": torch.ones(n, dtype=torch.bool),
        "hacpo_old_mean_logp": torch.tensor(old),
        "hacpo_old_len": torch.full((n,), 2),
        "hacpo_omega": torch.tensor([1.0, 1.0, 3.0, 0.5])[:n],
        "advantages": torch.tensor([0.5, 1.0, 2.0, -1.0])[:n],
    }


def test_peer_rows_outside_the_band_are_dropped_with_their_constant_objective():
    inputs = _inputs([0.9, 1.5, math.exp(-3)])
    candidates = inputs["hacpo_is_peer"] & inputs["hacpo_valid"]
    logps = torch.full((3, 2), -1.0)
    dropped, objective, ratio, bound = score_peer_rows(logps, inputs, candidates, 0, HACPOLossConfig())
    assert bound == pytest.approx(0.8)  # lb_0 = 1 - δ
    assert dropped.tolist() == [False, False, True, True]  # 1.5 > 1 and e^-3 < 0.8 are outside, 0.9 inside
    torch.testing.assert_close(ratio, torch.tensor([0.0, 0.0, 1.5, math.exp(-3)]))
    # A·ω·c·sg(c)^α, c = clamp(s, 0.8, 1): 2·3·1·1 + (-1)·0.5·0.8·0.8 = 6 - 0.32
    assert objective == pytest.approx(5.68, rel=1e-5)
    no_omega = score_peer_rows(logps, inputs, candidates, 0, HACPOLossConfig(capability_coefficient=False))
    assert no_omega[1] == pytest.approx(2 - 0.64, rel=1e-5)
    # after 8 updates the bound is min(1, 0.8 + 8·0.025) = 1: 0.9 is outside too
    assert score_peer_rows(logps, inputs, candidates, 8, HACPOLossConfig())[0].tolist() == [False, True, True, True]


def test_nothing_is_dropped_when_every_peer_ratio_is_inside_the_band():
    inputs = _inputs([0.9, 1.0])
    candidates = inputs["hacpo_is_peer"]
    assert score_peer_rows(torch.full((2, 2), -1.0), inputs, candidates, 0, HACPOLossConfig()) is None


def test_gradient_rows_are_all_but_the_dropped_ones_and_never_none():
    is_peer = torch.tensor([False, True, True])
    assert gradient_rows(is_peer, None).tolist() == [True, True, True]
    clipped = (torch.tensor([False, True, False]), 1.0, torch.zeros(3), 0.8)
    assert gradient_rows(is_peer, clipped).tolist() == [True, False, True]
    everything = (torch.tensor([True, True, True]), 1.0, torch.zeros(3), 0.8)
    assert gradient_rows(is_peer, everything).tolist() == [True, False, False]  # one zero-gradient row


def test_has_gradient_rows_counts_valid_rows_that_are_not_dropped():
    """The stand-in row `gradient_rows` keeps for an all-dropped mini-batch is not a row with a gradient, nor is an
    invalid (padding) row: such a mini-batch is what `skip_empty_updates` takes no optimizer step for."""
    valid = torch.tensor([True, True, False])
    assert has_gradient_rows(valid, None)
    assert has_gradient_rows(valid, (torch.tensor([True, False, True]), 1.0, torch.zeros(3), 0.8))
    assert not has_gradient_rows(valid, (torch.tensor([True, True, False]), 1.0, torch.zeros(3), 0.8))
    assert not has_gradient_rows(torch.tensor([False, False]), None)


def _hacpo_loss_by_hand(logps, inputs, self_old, weights, outside_objective, config):
    """hacpo_loss over rows 0 (self) and 1 (peer, s = 0.9) with the two dropped rows' objective, sliced by hand."""
    return hacpo_loss(
        logps,
        inputs["completion_mask"][:2],
        torch.tensor([self_old, -1.0 - math.log(0.9)]),
        torch.tensor([0.5, 1.0]),
        torch.tensor([False, True]),
        update_index=0,
        omega=torch.tensor([1.0, 1.0]),
        old_lengths=torch.tensor([2, 2]),
        valid=torch.tensor([True, True]),
        weights=weights,
        outside_rows=2,
        outside_objective=outside_objective,
        config=config,
    )


def test_rows_loss_is_hacpo_loss_over_the_kept_rows_with_the_dropped_objective_added():
    inputs = _inputs([0.9, 1.5, math.exp(-3)])
    inputs["hacpo_old_mean_logp"][0] = -1.2  # the self row's stored old log-prob: s = e^0.2 unless on-policy
    config = HACPOLossConfig()
    clipped = score_peer_rows(torch.full((3, 2), -1.0), inputs, inputs["hacpo_is_peer"], 0, config)
    rows = torch.tensor([0, 1])
    logps = torch.full((2, 2), -1.0)
    out = rows_loss(logps, inputs, rows, 0, clipped, config)
    torch.testing.assert_close(out.ratio, torch.tensor([math.exp(0.2), 0.9]))
    expected = _hacpo_loss_by_hand(logps, inputs, -1.2, None, clipped[1], config)
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-7)
    # on-policy self rows: the self ratio is 1 in value; TRL's importance weights apply to self rows only
    inputs["importance_sampling_ratio"] = torch.tensor([[2.0, 4.0], [5.0, 5.0], [1.0, 1.0], [1.0, 1.0]])
    on_policy = rows_loss(logps, inputs, rows, 0, clipped, config, self_on_policy=True)
    torch.testing.assert_close(on_policy.ratio, torch.tensor([1.0, 0.9]))
    # the self row's token-mean weight (2 + 4) / 2; 1 for the peer row
    weighted = _hacpo_loss_by_hand(logps, inputs, -1.0, torch.tensor([3.0, 1.0]), clipped[1], config)
    torch.testing.assert_close(on_policy.loss, weighted.loss, rtol=1e-5, atol=1e-7)


def test_batch_row_flags_cover_the_dropped_rows_from_their_ratio_alone():
    inputs = _inputs([0.9, 1.5, math.exp(-3)])
    config = HACPOLossConfig()
    clipped = score_peer_rows(torch.full((3, 2), -1.0), inputs, inputs["hacpo_is_peer"], 0, config)
    rows = torch.tensor([0, 1])
    out = rows_loss(torch.full((2, 2), -1.0), inputs, rows, 0, clipped, config, self_on_policy=True)
    ratio, low, high, self_clipped = batch_row_flags(out, rows, inputs["hacpo_is_peer"], clipped)
    torch.testing.assert_close(ratio, torch.tensor([1.0, 0.9, 1.5, math.exp(-3)]))
    assert low.tolist() == [False, False, False, True]
    assert high.tolist() == [False, False, True, False]
    assert self_clipped.tolist() == [False, False, False, False]
    unclipped = batch_row_flags(out, rows, inputs["hacpo_is_peer"][:2], None)
    torch.testing.assert_close(unclipped[0], torch.tensor([1.0, 0.9]))


def test_update_index_and_self_on_policy():
    # 2 mini-batches per generation x 2 iterations = 4 updates of 2 accumulation micro-steps each
    assert [current_update(step, 8, 2) for step in range(10)] == [0, 0, 1, 1, 2, 2, 3, 3, 0, 0]
    assert current_update(5, 4, 0) == 1  # no accumulation yet counts as 1
    # a solo batch (2 of 4 micro-batches made, 2 iterations): micro-steps 0, 1, 4, 5 are updates 0, 1, 2, 3, not 4, 5
    assert [current_update(step, 8, 1, 4, 2) for step in (0, 1, 4, 5, 8)] == [0, 1, 2, 3, 0]
    assert [current_update(step, 8, 2, 4, 2) for step in (0, 1, 4, 5)] == [0, 0, 1, 1]  # 2 micro-steps per update
    with pytest.raises(ValueError, match="micro-step 6 is a skipped one"):
        current_update(6, 8, 1, 4, 2)
    assert self_on_policy(4, 4, vllm_weights=False) and self_on_policy(8, 4, vllm_weights=False)
    assert not self_on_policy(2, 4, vllm_weights=False)  # a generation batch serves two updates
    assert not self_on_policy(4, 4, vllm_weights=True)  # vLLM importance weights need the stored log-probs


def test_taught_weight_by_hand():
    from hacpo_trl.sharing.peer_loss import taught_weight

    s = torch.tensor([0.01, 0.1, 0.5, 1.0, 3.0])
    # (1 + 0.1) s / (s + 0.1), at most 1: 0.011/0.11, 0.11/0.2, 0.55/0.6, 1, min(3.3/3.1, 1)
    torch.testing.assert_close(taught_weight(s), torch.tensor([0.1, 0.55, 0.55 / 0.6, 1.0, 1.0]))


def test_a_taught_row_at_ratio_half_carries_gradient_where_the_same_row_elsewhere_is_clipped():
    """Two peer rows with s = 0.5 (below lb_0 = 0.8), advantage 1, ω 1: the one from a peer that teaches its prompt
    gets the weight w(0.5) = 0.55/0.6 and a gradient; the other is dropped by the band and gets none."""
    from hacpo_trl.sharing.peer_loss import taught_weight

    inputs = _inputs([0.5, 0.5])
    inputs["hacpo_omega"] = torch.ones(3)
    inputs["advantages"] = torch.tensor([0.0, 1.0, 1.0])
    inputs["hacpo_taught"] = torch.tensor([False, True, False])
    config = HACPOLossConfig()
    candidates = inputs["hacpo_is_peer"] & inputs["hacpo_valid"]
    clipped = score_peer_rows(torch.full((2, 2), -1.0), inputs, candidates, 0, config)
    assert clipped[0].tolist() == [False, False, True]  # only the row that is not taught is dropped
    rows = gradient_rows(inputs["hacpo_is_peer"], clipped)
    logps = torch.full((3, 2), -1.0, requires_grad=True)
    out = rows_loss(logps[rows], inputs, rows, 0, clipped, config)
    out.loss.backward()
    w = 0.55 / 0.6
    assert float(taught_weight(torch.tensor(0.5))) == pytest.approx(w)
    # the taught row: objective A·ω·w = w; d(-loss)/d logp_t = A·ω·w / (2 tokens) / (3 rows in the mean)
    assert out.objective[1].item() == pytest.approx(w, rel=1e-5) and out.ratio[1].item() == pytest.approx(0.5)
    torch.testing.assert_close(logps.grad[1], torch.full((2,), -w / 2 / 3))
    # the clipped row and the self row (advantage 0): no gradient; the loss is -(0 + w + 0.8·0.8^1) / 3
    torch.testing.assert_close(logps.grad[2], torch.zeros(2))
    assert out.loss.item() == pytest.approx(-(w + 0.8 * 0.8) / 3, rel=1e-5)
    # without the flag both rows are dropped and nothing has a gradient
    inputs["hacpo_taught"] = torch.zeros(3, dtype=torch.bool)
    assert score_peer_rows(torch.full((2, 2), -1.0), inputs, candidates, 0, config)[0].tolist() == [False, True, True]


def test_a_taught_row_below_the_floor_gets_no_gradient_one_above_keeps_its_weight():
    """Taught rows with s = 0.5 and s = 0.1 (advantage 1, ω 1) and `taught_ratio_floor` 0.2: the row at 0.1 (a trace
    the learner finds as unlikely as the benchmark's off-format peers') skips the backward pass with objective 0;
    the row at 0.5 keeps w(0.5). The same with no scoring pass: the floor zeroes the row's weight in the loss."""
    inputs = _inputs([0.5, 0.1])
    inputs["hacpo_omega"] = torch.ones(3)
    inputs["advantages"] = torch.tensor([0.0, 1.0, 1.0])
    inputs["hacpo_taught"] = torch.tensor([False, True, True])
    config = HACPOLossConfig()
    candidates = inputs["hacpo_is_peer"] & inputs["hacpo_valid"]
    w = 0.55 / 0.6
    clipped = score_peer_rows(torch.full((2, 2), -1.0), inputs, candidates, 0, config, FLOORED)
    assert clipped[0].tolist() == [False, False, True] and clipped[1] == 0.0
    assert clipped[2][2].item() == pytest.approx(0.1)
    rows = gradient_rows(inputs["hacpo_is_peer"], clipped)
    logps = torch.full((3, 2), -1.0, requires_grad=True)
    out = rows_loss(logps[rows], inputs, rows, 0, clipped, config, sharing=FLOORED)
    out.loss.backward()
    torch.testing.assert_close(logps.grad[1], torch.full((2,), -w / 2 / 3))
    torch.testing.assert_close(logps.grad[2], torch.zeros(2))
    assert out.loss.item() == pytest.approx(-w / 3, rel=1e-5)
    # no scoring pass (clipped None): both rows in the gradient pass, the floored one with weight 0
    logps = torch.full((3, 2), -1.0, requires_grad=True)
    every = torch.arange(3)
    out = rows_loss(logps, inputs, every, 0, None, config, sharing=FLOORED)
    out.loss.backward()
    torch.testing.assert_close(logps.grad[2], torch.zeros(2))
    assert out.objective[2].item() == 0.0 and out.loss.item() == pytest.approx(-w / 3, rel=1e-5)
    # floor 0: the row at 0.1 teaches with w(0.1) = 0.55
    assert score_peer_rows(torch.full((2, 2), -1.0), inputs, candidates, 0, config, UNFLOORED) is None
    logps = torch.full((3, 2), -1.0, requires_grad=True)
    out = rows_loss(logps, inputs, every, 0, None, config, sharing=UNFLOORED)
    out.loss.backward()
    torch.testing.assert_close(logps.grad[2], torch.full((2,), -0.55 / 2 / 3))


def test_the_floor_travels_in_the_learners_settings():
    """The trainer hands the loss its learner's SharingSettings, the only floor it takes: its `taught_ratio_floor`
    acts (the row at s = 0.1 is dropped at 0.2, kept with the floor 0), and the trainer reads no floor. A caller that
    gives none has the paper's rule (0.2)."""
    inputs = _inputs([0.5, 0.1])
    inputs["hacpo_omega"], inputs["hacpo_taught"] = torch.ones(3), torch.tensor([False, True, True])
    config, candidates = HACPOLossConfig(), inputs["hacpo_is_peer"] & inputs["hacpo_valid"]
    floored = FLOORED
    clipped = score_peer_rows(torch.full((2, 2), -1.0), inputs, candidates, 0, config, floored)
    assert clipped[0].tolist() == [False, False, True]
    unfloored = UNFLOORED
    assert score_peer_rows(torch.full((2, 2), -1.0), inputs, candidates, 0, config, unfloored) is None
    logps = torch.full((3, 2), -1.0)
    every = torch.arange(3)
    assert rows_loss(logps, inputs, every, 0, None, config, False, floored).objective[2].item() == 0.0
    assert rows_loss(logps, inputs, every, 0, None, config, False, unfloored).objective[2].item() != 0.0
    assert score_peer_rows(torch.full((2, 2), -1.0), inputs, candidates, 0, config)[0].tolist() == [False, False, True]
    with pytest.raises(AttributeError):  # a bare number is not a learner's settings
        score_peer_rows(torch.full((2, 2), -1.0), inputs, candidates, 0, config, 0.2)
    trainer = (Path(__file__).resolve().parents[1] / "src" / "hacpo_trl" / "trainer.py").read_text()
    assert "taught_ratio_floor" not in trainer


def test_band_gate_scores_peer_rows_by_length_in_as_many_forwards_as_the_busiest_rank():
    """Rows 0-1 self, 2-4 valid peer rows of 3, 1 and 2 completion tokens, 5 an invalid one. By length: 3, 4, 2. Two
    rows per forward and 5 rows on the busiest rank: 3 forwards, the last scoring row 0 for nothing. Every token
    log-prob is -1, so a row's ratio s is exp(-1 - old mean log-prob); B's rows at 0.9 and 1.5, C's at 0.7."""
    from types import SimpleNamespace

    from hacpo_trl.sharing.peer_loss import band_counts, band_order, band_ratios

    lengths, ratios = [2, 2, 3, 1, 2, 2], [1.0, 1.0, 0.9, 1.5, 0.7, 1.0]
    batch = {
        "prompt_mask": torch.ones(6, 1, dtype=torch.long),
        "completion_mask": (torch.arange(3) < torch.tensor(lengths)[:, None]).long(),
        "hacpo_is_peer": torch.tensor([False, False, True, True, True, True]),
        "hacpo_valid": torch.tensor([True, True, True, True, True, False]),
        "hacpo_old_mean_logp": torch.tensor([-1.0 - math.log(s) for s in ratios]),
        "hacpo_old_len": torch.tensor(lengths),
    }
    index = band_order(batch)
    assert index.tolist() == [3, 4, 2]
    scored = []

    def score(rows):
        scored.append(rows.nonzero().flatten().tolist())
        return torch.full((int(rows.sum()), 3), -1.0)

    ratio = band_ratios(batch, index, score, size=2, most=5, config=HACPOLossConfig())
    assert scored == [[3, 4], [2], [0]]
    torch.testing.assert_close(ratio, torch.tensor([0.9, 1.5, 0.7]))
    rows = SimpleNamespace(
        sources=["B", "B", "C", "C"], valid=[True, True, True, False], taught=[False] * 4
    )  # the appended peer rows
    assert band_counts(ratio, rows, ["B", "C"], HACPOLossConfig()) == [1, 0]  # only 0.9 is in [0.8, 1]
    # taught rows have no band: they count at or above the floor (0.7 and 1.5 do at 0.5, only 1.5 at 0.95)
    rows.taught = [True, True, True, True]
    floor = {f: SharingSettings(peer_prompts="failed", taught_ratio_floor=f) for f in (0.5, 0.95, 0.8)}
    assert band_counts(ratio, rows, ["B", "C"], HACPOLossConfig(), floor[0.5]) == [2, 1]
    assert band_counts(ratio, rows, ["B", "C"], HACPOLossConfig(), floor[0.95]) == [1, 0]
    rows.taught = [False, True, True, True]  # B's 0.9 by the band, B's 1.5 and C's 0.7 by the floor
    assert band_counts(ratio, rows, ["B", "C"], HACPOLossConfig(), floor[0.8]) == [2, 0]
    no_peers = {**batch, "hacpo_valid": torch.tensor([True, True, False, False, False, False])}
    assert band_ratios(no_peers, band_order(no_peers), score, size=2, most=3, config=HACPOLossConfig()).numel() == 0
    assert scored[3:] == [[0], [0]]  # a rank with no peer row still runs the busiest rank's 2 forwards
