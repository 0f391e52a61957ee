"""The peer-row pipeline on hand-built records: no trainer, no process group."""

import math

import pytest
import torch

from hacpo_trl.agents.tiny import char_tokenizer
from hacpo_trl.algorithm import capability_aware_advantages
from hacpo_trl.run.exchange import RolloutBatch
from hacpo_trl.sharing.peer_rows import (
    append_peer_rows,
    build_peer_rows,
    negative_cap_factor,
    self_prompt_tokens,
    taught_cap_factor,
)
from helpers import BPE, CAPS, LONG, NAN, SELF_IDS, SELF_REWARDS, records, settings

CHAR = char_tokenizer()


def build(tokenizer=BPE, **overrides):
    return build_peer_rows(
        SELF_IDS, SELF_REWARDS, records(), "A", ["A", "B", "C"], CAPS, settings(**overrides), tokenizer
    )


@pytest.mark.parametrize("tok", [CHAR, BPE], ids=["char", "bpe"])
def test_rows_in_the_learners_tokens_with_counts(tok):
    rows = build(tok)
    # B's rows before C's (agent order), each agent's in record order; NaN / inf / empty-unfinished rejected
    assert rows.sources == ["B", "B", "C", "C"] and rows.prompt_ids == ["p0", "p0", "p0", "p1"]
    assert (rows.rejected, rows.truncated, rows.filtered) == (3, 1, 0)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tok.eos_token_id
    assert rows.completion_ids == [ids("12 + 3 = 15") + [eos], ids("7"), ids(LONG)[:12], [eos]]
    assert rows.old_mean_logps == [-0.5, -0.4, -0.3, 0.0] and rows.old_lengths == [9, 2, 20, 0]
    assert rows.omega == pytest.approx([3.0, 3.0, 2.0, 2.0])  # ω(source, learner) = P̂_source / P̂_A
    # unfinished and truncated rows stay in the baseline without a loss; a 0-token record never gets one
    assert rows.valid == [True, False, False, False]
    assert build(tok, mask_truncated_completions=False).valid == [True, True, True, False]


def test_tokenizers_give_different_rows():
    assert build(CHAR).completion_ids[0] != build(BPE).completion_ids[0]


def test_joint_advantages_by_hand():
    rows = build()
    # p0: A [1, 0], B [1, 0], C [1]; peer rewards scaled by ω(A, source) = 1/3 (B), 1/2 (C)
    mu0, s0 = (1 + 0 + 1 / 3 + 0 + 1 / 2) / 5, math.sqrt(0.3)  # std([1, 0, 1, 0, 1]) with Bessel
    # p1: A [0] (its NaN row left out), B [0] (the empty row: rejected only after the advantages), C [1]
    mu1, s1 = (0 + 0 + 1 / 2) / 3, math.sqrt(1 / 3)
    eps = 1e-6
    expected_self = [(1 - mu0) / (s0 + eps), (0 - mu0) / (s0 + eps), 0.0, (0 - mu1) / (s1 + eps)]
    torch.testing.assert_close(rows.self_advantages, torch.tensor(expected_self))
    expected_peer = [(1 - mu0) / (s0 + eps), (0 - mu0) / (s0 + eps), (1 - mu0) / (s0 + eps), (1 - mu1) / (s1 + eps)]
    assert rows.advantages == pytest.approx(expected_peer, rel=1e-5)
    # and exactly what the algorithm module gives for the same joint groups
    joint = capability_aware_advantages(
        [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0],
        ["A", "A", "A", "B", "B", "B", "C", "C"],
        ["p0", "p0", "p1", "p0", "p0", "p1", "p0", "p1"],
        "A",
        CAPS,
    ).float()
    assert rows.advantages == joint[[3, 4, 6, 7]].tolist()
    assert rows.self_advantages[[0, 1, 3]].tolist() == joint[:3].tolist()


def test_correct_filter_keeps_the_baseline():
    every, correct = build(), build(peer_filter="correct")
    # B's two zero-reward rows are filtered (the empty one before it could be rejected), after the advantages
    assert (correct.rejected, correct.truncated, correct.filtered) == (2, 1, 2)
    assert correct.sources == ["B", "C", "C"]
    assert correct.advantages == [every.advantages[i] for i in (0, 2, 3)]
    assert torch.equal(correct.self_advantages, every.self_advantages)


def test_no_peers_no_rows():
    own = records()[0]
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    rows = build_peer_rows(SELF_IDS, rewards, [own], "A", ["A", "B"], CAPS, settings(), BPE)
    assert len(rows) == 0 and (rows.rejected, rows.truncated, rows.filtered) == (0, 0, 0)
    s = torch.tensor([1.0, 0.0]).std()
    torch.testing.assert_close(rows.self_advantages, torch.tensor([0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.0, 0.0]))


def test_a_group_left_with_one_finite_reward_gets_no_advantage_instead_of_stopping_the_run():
    """p1: one self row unscorable and the only peer row unscorable too leaves a single finite reward, whose std is
    undefined; that group carries no signal (advantage 0) while p0 is computed as usual."""
    own = RolloutBatch("A", 0, 3, ["p0", "p0", "p1", "p1"], ["o"] * 4, [1.0, 0.0, NAN, 0.0], [-1.0] * 4, [1] * 4,
                       [True] * 4)  # fmt: skip
    peer = RolloutBatch("B", 1, 3, ["p0", "p1"], ["12", "7"], [1.0, NAN], [-0.5, -0.5], [2, 1], [True, True])
    rewards = torch.tensor([1.0, 0.0, NAN, 0.0])
    rows = build_peer_rows(SELF_IDS, rewards, [own, peer], "A", ["A", "B"], CAPS, settings(), BPE)
    assert rows.rejected == 1 and rows.prompt_ids == ["p0"]
    p0 = capability_aware_advantages([1.0, 0.0, 1.0], ["A", "A", "B"], ["p0"] * 3, "A", CAPS).float()
    assert rows.self_advantages.tolist() == [p0[0].item(), p0[1].item(), 0.0, 0.0]
    assert rows.advantages == [p0[2].item()]


def _self_batch():
    prompts = [[5, 6, 7], [5, 6, 7], [8, 9], [8, 9]]
    return {
        "prompt_ids": torch.tensor([[0] * (3 - len(p)) + p for p in prompts]),
        "prompt_mask": torch.tensor([[0] * (3 - len(p)) + [1] * len(p) for p in prompts]),
        "completion_ids": torch.tensor([[10, 11], [12, 0], [13, 14], [15, 0]]),
        "completion_mask": torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0]]),
        "advantages": torch.zeros(4),
        "ref_per_token_logps": torch.full((4, 2), -2.0),
        "importance_sampling_ratio": torch.full((4,), 0.5),
        "hacpo_is_peer": torch.zeros(4, dtype=torch.bool),
        "hacpo_old_mean_logp": torch.full((4,), -1.0),
        "hacpo_old_len": torch.tensor([2, 1, 2, 1]),
        "hacpo_omega": torch.ones(4),
        "hacpo_valid": torch.ones(4, dtype=torch.bool),
    }


def test_self_prompt_tokens_are_the_learners_unpadded_prompts():
    batch = _self_batch()
    tokens = self_prompt_tokens(SELF_IDS, batch["prompt_ids"], batch["prompt_mask"])
    assert {k: v.tolist() for k, v in tokens.items()} == {"p0": [5, 6, 7], "p1": [8, 9]}


def test_rows_appended_in_trls_layout():
    rows = build()
    batch = _self_batch()
    tokens = self_prompt_tokens(SELF_IDS, batch["prompt_ids"], batch["prompt_mask"])
    out = append_peer_rows(batch, rows, tokens, SELF_IDS, steps_per_generation=3, pad_id=0)
    # 4 self + 4 peer rows + 1 padding row: 9 rows split into 3 equal mini-batches
    assert out["prompt_ids"].shape == (9, 3)
    width = max(2, max(len(c) for c in rows.completion_ids))
    assert out["completion_ids"].shape == out["completion_mask"].shape == out["ref_per_token_logps"].shape == (9, width)
    for row, pid in zip(range(4, 9), rows.prompt_ids + ["p0"], strict=True):  # the padding row reuses p0
        assert out["prompt_ids"][row][out["prompt_mask"][row].bool()].tolist() == tokens[pid].tolist()
    for row, ids in zip(range(4, 8), rows.completion_ids, strict=True):
        assert out["completion_ids"][row][out["completion_mask"][row].bool()].tolist() == ids
    assert out["completion_ids"][8].tolist() == [0] * width and out["completion_mask"][8].tolist() == [1] + [0] * (
        width - 1
    )
    # self rows widened with padding, their values untouched
    assert out["completion_ids"][0, :2].tolist() == [10, 11] and out["completion_mask"][:4, 2:].sum() == 0
    assert (out["ref_per_token_logps"][:4, :2] == -2).all() and (out["ref_per_token_logps"][:4, 2:] == 0).all()
    assert (out["ref_per_token_logps"][4:] == 0).all()
    assert out["importance_sampling_ratio"].tolist() == [0.5] * 4 + [1.0] * 5
    # the HACPO columns
    assert out["hacpo_is_peer"].tolist() == [False] * 4 + [True] * 5
    assert out["hacpo_valid"].tolist() == [True] * 4 + rows.valid + [False]
    assert out["hacpo_old_len"].tolist() == [2, 1, 2, 1] + rows.old_lengths + [1]
    torch.testing.assert_close(out["hacpo_omega"], torch.tensor([1.0] * 4 + rows.omega + [1.0]))
    torch.testing.assert_close(out["hacpo_old_mean_logp"], torch.tensor([-1.0] * 4 + rows.old_mean_logps + [0.0]))
    torch.testing.assert_close(
        out["advantages"], torch.cat([rows.self_advantages, torch.tensor(rows.advantages + [0.0])])
    )
    assert out["hacpo_taught"].tolist() == [False] * 9  # no peer teaches here


def test_rows_of_a_teaching_peer_are_flagged_for_the_bounded_weight():
    rows = build_peer_rows(SELF_IDS, SELF_REWARDS, records(), "A", ["A", "B", "C"], CAPS, settings(), BPE, taught={"C"})
    assert rows.sources == ["B", "B", "C", "C"] and rows.taught == [False, False, True, True]
    batch = _self_batch()
    tokens = self_prompt_tokens(SELF_IDS, batch["prompt_ids"], batch["prompt_mask"])
    out = append_peer_rows(batch, rows, tokens, SELF_IDS, steps_per_generation=3, pad_id=0)
    assert out["hacpo_taught"].tolist() == [False] * 4 + [False, False, True, True] + [False]


def test_nothing_to_append_keeps_trls_tensors():
    batch = _self_batch()
    before = {k: v.clone() for k, v in batch.items()}
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    empty = build_peer_rows(SELF_IDS, rewards, records()[:1], "A", ["A", "B"], CAPS, settings(), BPE)
    tokens = self_prompt_tokens(SELF_IDS, batch["prompt_ids"], batch["prompt_mask"])
    out = append_peer_rows(batch, empty, tokens, SELF_IDS, steps_per_generation=2, pad_id=0)
    for key in ("prompt_ids", "completion_ids", "completion_mask", "ref_per_token_logps", "hacpo_valid"):
        assert torch.equal(out[key], before[key])
    torch.testing.assert_close(out["advantages"], empty.self_advantages)


def test_learner_records_keep_the_learner_and_its_peers_only():
    """Learner A learns from C alone: B's records stay out (their rewards too), records in exchange order, the
    learner's view in launch order."""
    from hacpo_trl.sharing.peer_rows import learner_records

    def rec(agent, rank):
        return RolloutBatch(agent, rank, 0, ["p0"], ["x"], [1.0], [-1.0], [1], [True])

    by_agent = {"C": [rec("C", 2)], "A": [rec("A", 0), rec("A", 3)], "B": [rec("B", 1)]}
    records, view = learner_records(by_agent, "A", ["A", "B", "C"], ["C"])
    assert [(r.agent, r.global_rank) for r in records] == [("A", 0), ("A", 3), ("C", 2)]
    assert view == ["A", "C"]
    assert learner_records(by_agent, "A", ["A", "B", "C"], ["D"])[1] == ["A"]  # a peer without records adds nothing


def _taught_and_rescued(taught_baseline: str, taught_scale: float = 1.0, **overrides):
    """Learner A on three prompts: q0 failed by A and solved by C, q1 solved once by A and twice by C (C teaches
    both), q2 failed by A and solved by B, a peer that rescues it without teaching (not in ``taught``)."""

    def batch(agent, rank, rows):
        pids, rewards = map(list, zip(*rows, strict=True))
        n = len(pids)
        return RolloutBatch(agent, rank, 3, pids, ["7"] * n, rewards, [-1.0] * n, [2] * n, [True] * n)

    own_rows = [("q0", 0.0)] * 3 + [("q1", 1.0), ("q1", 0.0), ("q1", 0.0)] + [("q2", 0.0)] * 3
    own = batch("A", 0, own_rows)
    c = batch("C", 1, [("q0", 1.0), ("q0", 0.0), ("q1", 1.0), ("q1", 1.0), ("q2", 1.0)])
    b = batch("B", 2, [("q2", 1.0), ("q2", 0.0)])
    ids, rewards = [p for p, _ in own_rows], torch.tensor([r for _, r in own_rows])
    only = {"C": {"q0", "q1"}, "B": {"q2"}}
    chosen = settings(taught_baseline=taught_baseline, taught_scale=taught_scale, **overrides)
    return build_peer_rows(ids, rewards, [own, c, b], "A", ["A", "B", "C"], CAPS, chosen, BPE, 1.0, only, {"C"})


def test_own_baseline_on_taught_prompts_gives_the_learner_gspos_advantages():
    """`taught_baseline: own`: on C's taught prompts A's rows get its own group's advantages (0 on the failed q0,
    where the joint baseline pushes each of them down); q2, where B rescues without teaching, keeps the joint
    baseline; every peer row keeps the joint group's advantage either way."""
    joint, own = _taught_and_rescued("joint"), _taught_and_rescued("own")
    eps, sd = 1e-6, math.sqrt(0.2)  # std([0, 0, 0, 1, 0]) with Bessel: q0 and q2's joint groups
    # q0 joint: C's rewards scaled by ω(A, C) = 0.25 / 0.5, so μ = (1 / 2) / 5; q2 by ω(A, B) = 1 / 3, μ = (1 / 3) / 5
    failed_q0, failed_q2 = -0.1 / (sd + eps), -(1 / 15) / (sd + eps)
    gspo_q1 = [(1 - 1 / 3) / (math.sqrt(1 / 3) + eps), (0 - 1 / 3) / (math.sqrt(1 / 3) + eps)]
    assert own.self_advantages.tolist() == pytest.approx([0.0] * 3 + gspo_q1 + gspo_q1[1:] + [failed_q2] * 3)
    assert joint.self_advantages[:3].tolist() == pytest.approx([failed_q0] * 3)
    assert joint.self_advantages[6:].tolist() == own.self_advantages[6:].tolist()
    assert joint.self_advantages[3:6].tolist() != pytest.approx(gspo_q1 + gspo_q1[1:])  # C's rewards moved q1's
    assert own.advantages == joint.advantages and own.sources == ["B", "B", "C", "C", "C", "C"]
    assert own.advantages[2] == pytest.approx((1 - 0.1) / (sd + eps))  # C's correct row on q0


def test_taught_scale_multiplies_the_taught_rows_advantages_only():
    """`taught_scale: 0.25`: C's taught rows carry a quarter of their joint advantage; B's rescued rows and every own
    row are untouched, and so is the baseline (the scale acts after it)."""
    full, quarter = _taught_and_rescued("joint"), _taught_and_rescued("joint", 0.25)
    assert quarter.advantages == pytest.approx(full.advantages[:2] + [a / 4 for a in full.advantages[2:]])
    assert quarter.advantages[2] == pytest.approx((1 - 0.1) / (math.sqrt(0.2) + 1e-6) / 4)  # C's correct row on q0
    assert torch.equal(quarter.self_advantages, full.self_advantages)


def test_taught_cap_damps_many_taught_rows_and_keeps_a_few_at_full_weight():
    """`taught_cap: K`: C teaches q0 and q1 with 4 rows (q0 1, 0; q1 1, 1), so K = 2 halves each taught row's
    advantage, K = 4 or more leaves them whole; with `peer_filter: correct` 3 rows count (K = 2: two thirds). B's
    rescued rows, every own row and the baseline are untouched; the factor multiplies `taught_scale`'s."""
    full = _taught_and_rescued("joint")
    taught = full.advantages[2:]  # C's rows (B's two come first)
    half = _taught_and_rescued("joint", taught_cap=2)
    assert half.advantages[:2] == full.advantages[:2] and torch.equal(half.self_advantages, full.self_advantages)
    assert half.advantages[2:] == pytest.approx([a / 2 for a in taught])
    assert half.advantages[2] == pytest.approx((1 - 0.1) / (math.sqrt(0.2) + 1e-6) / 2)  # C's correct row on q0
    assert _taught_and_rescued("joint", taught_cap=4).advantages == full.advantages
    assert _taught_and_rescued("joint", taught_cap=8.5).advantages == full.advantages
    both = _taught_and_rescued("joint", 0.25, taught_cap=1)
    assert both.advantages[2:] == pytest.approx([a / 16 for a in taught])  # 0.25 x min(1, 1 / 4)
    correct = _taught_and_rescued("joint", peer_filter="correct", taught_cap=2)
    kept = _taught_and_rescued("joint", peer_filter="correct")
    assert correct.sources == ["B", "C", "C", "C"]  # the 0-reward rows filtered out
    assert correct.advantages == pytest.approx(kept.advantages[:1] + [a * 2 / 3 for a in kept.advantages[1:]])


def test_taught_cap_counts_the_batchs_taught_rows_over_every_rank():
    """n counts the taught peers' rows on their taught prompts in every rank's records (this process's prompts or
    not), leaving out rows with a non-finite reward or old log-prob and, with 'correct', rows without a positive
    reward; untaught peers and the learner's own rows never count. No cap, or no taught row: 1."""

    def batch(agent, rank, pids, rewards, logps=None):
        n = len(pids)
        return RolloutBatch(agent, rank, 0, pids, ["7"] * n, rewards, logps or [-1.0] * n, [2] * n, [True] * n)

    records = [
        batch("A", 0, ["q0", "q1"], [0.0, 0.0]),
        batch("C", 1, ["q0", "q0", "q1"], [1.0, 0.0, 1.0]),
        batch("C", 2, ["q1", "q2", "q0"], [1.0, 1.0, NAN]),  # another rank of C; q2 is not taught
        batch("C", 3, ["q0"], [1.0], [NAN]),
        batch("B", 4, ["q0", "q1"], [1.0, 1.0]),  # B rescues, it does not teach
    ]
    only = {"C": {"q0", "q1"}, "B": {"q0", "q1"}}
    # counted: C's q0 1.0, q0 0.0, q1 1.0 (rank 1) and q1 1.0 (rank 2): n = 4
    assert taught_cap_factor(records, {"C"}, only, settings(taught_cap=1)) == 0.25
    assert taught_cap_factor(records, {"C"}, only, settings(taught_cap=3, peer_filter="correct")) == 1.0  # n = 3
    assert taught_cap_factor(records, {"C"}, only, settings(taught_cap=1.5, peer_filter="correct")) == 0.5
    assert taught_cap_factor(records, {"C"}, {}, settings(taught_cap=1)) == 0.2  # every prompt of C's: q2 too
    assert taught_cap_factor(records, {"C"}, only, settings(taught_cap=0)) == 1.0
    assert taught_cap_factor(records, set(), only, settings(taught_cap=1)) == 1.0


def _negatives_case(**overrides):
    """A solved q1 twice in 4 (unsure) and failed q2; B wrote two wrong rows and a right one on q1, a right and a
    wrong one on q2. B teaches q2 (its right row) and gives negatives on q1 (its wrong rows)."""
    ids = ["q1", "q1", "q1", "q1", "q2", "q2"]
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    own = RolloutBatch("A", 0, 3, ids, ["own"] * 6, rewards.tolist(), [-1.0] * 6, [3] * 6, [True] * 6)
    peer = RolloutBatch(
        "B", 1, 3, ["q1", "q1", "q1", "q2", "q2"], ["5", "6", "4", "7", "8"], [0.0, 0.0, 1.0, 1.0, 0.0],
        [-0.5] * 5, [2] * 5, [True] * 5,
    )  # fmt: skip
    only = {"B": {"q1", "q2"}}
    args = (ids, rewards, [own, peer], "A", ["A", "B"], CAPS, settings(peer_filter="correct", **overrides), BPE)
    with_negatives = build_peer_rows(*args, only_prompts=only, taught={"B"}, negatives={"B": {"q1"}})
    without = build_peer_rows(*args, only_prompts={"B": {"q2"}}, taught={"B"})
    return with_negatives, without


def test_negative_rows_by_hand():
    """`peer_negatives: unsure`: each wrong row of B on q1 gets the advantage A's own wrong rows have there in its
    own group, (0 − 0.5) / (std([1, 1, 0, 0]) + eps) = −0.5 / (sqrt(1/3) + 1e-6); B's right row on q1 is left out
    and q1's own advantages are GSPO's; q2 (taught) is as without negatives."""
    rows, without = _negatives_case()
    assert rows.sources == ["B", "B", "B"] and rows.prompt_ids == ["q2", "q1", "q1"]
    assert rows.filtered == 2  # B's wrong row on q2 (correct-only), its right row on q1 (no positives there)
    own_wrong = -0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert rows.advantages == pytest.approx([without.advantages[0], own_wrong, own_wrong], rel=1e-6)
    assert rows.taught == [True, True, True]
    assert rows.self_advantages[:4].tolist() == pytest.approx([-own_wrong, -own_wrong, own_wrong, own_wrong], rel=1e-6)
    torch.testing.assert_close(rows.self_advantages[4:], without.self_advantages[4:])


def test_negative_rows_are_capped_apart_from_the_taught_ones():
    """`taught_cap` 1: the two negative rows weigh one row's worth (each times 1/2); the one correct taught row keeps
    its weight. The counts by hand: B's right rows on a negative prompt are not taught rows, its wrong rows there are
    the negatives."""
    rows, without = _negatives_case(taught_cap=1)
    own_wrong = -0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert rows.advantages == pytest.approx([without.advantages[0], own_wrong / 2, own_wrong / 2], rel=1e-6)
    b = RolloutBatch("B", 1, 3, ["q1"] * 4, list("abcd"), [0.0, 1.0, 1.0, 0.0], [-0.5] * 4, [2] * 4, [True] * 4)
    capped = settings(peer_filter="correct", taught_cap=1)
    assert negative_cap_factor([b], {"B": {"q1"}}, capped) == 0.5  # two wrong rows
    assert negative_cap_factor([b], {"B": {"q1"}}, settings(taught_cap=0)) == 1.0
    assert negative_cap_factor([b], {}, capped) == 1.0
    assert taught_cap_factor([b], {"B"}, {"B": {"q1"}}, capped) == 0.5  # two right rows, as taught rows
    assert taught_cap_factor([b], {"B"}, {"B": {"q1"}}, capped, {"B": {"q1"}}) == 1.0  # none: q1 gives negatives
