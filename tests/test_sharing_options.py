"""Sharing options that protect a learner: whom it learns from (`learn_from`) and the capability gate
(`capability_gate`). Hand-worked unit tests of the pure pieces, then real two-agent launches on CPU."""

from collections import Counter

import pytest
import torch

from hacpo_trl import HACPOConfig
from hacpo_trl.algorithm import CapabilityTracker, HACPOLossConfig, capability_aware_advantages, hacpo_loss
from hacpo_trl.config import parse_learn_from
from hacpo_trl.run.exchange import RolloutBatch
from hacpo_trl.sharing.decision import gate_evidence, open_peers, peer_fade_weight, peers_in_band, rescued_prompts
from hacpo_trl.sharing.peer_rows import build_peer_rows
from hacpo_trl.training.metrics import learns_from_metrics
from helpers import BPE, CAPS, NAN, SELF_IDS, SELF_REWARDS, accelerate_launch, records, seeded, settings, summaries

COMMON = dict(use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False)
AGENTS = ["A", "B", "C"]


# ------------------------------------------------------------------------------------------ whom to learn from


def test_open_peers_by_hand():
    caps = {"A": 0.5, "B": 0.25, "C": 0.75}  # the learner A sits between a weaker B and a stronger C
    assert open_peers("A", AGENTS, caps) == ["B", "C"]  # default: every other agent, never itself
    assert open_peers("A", AGENTS, caps, ["C"]) == ["C"]
    assert open_peers("A", AGENTS, caps, []) == []  # learns from no one
    assert open_peers("A", AGENTS, caps, ["A", "B"]) == ["B"]  # its own name is not a peer
    # gate: P̂_j >= gate x P̂_A = gate x 0.5
    assert open_peers("A", AGENTS, caps, None, 0.5) == ["B", "C"]  # 0.25 >= 0.25: open at the boundary
    assert open_peers("A", AGENTS, caps, None, 0.6) == ["C"]  # 0.25 < 0.3
    assert open_peers("A", AGENTS, caps, None, 1.0) == ["C"]  # only peers at least as capable
    assert open_peers("A", AGENTS, caps, None, 1.5) == ["C"]  # 0.75 >= 0.75
    assert open_peers("A", AGENTS, caps, None, 2.0) == []
    assert open_peers("A", AGENTS, caps, ["B"], 1.0) == []  # both conditions must hold
    # the strongest learner with gate 1 learns from no one, the weakest from everyone
    assert open_peers("C", AGENTS, caps, None, 1.0) == []
    assert open_peers("B", AGENTS, caps, None, 1.0) == ["A", "C"]


def test_gate_switches_as_capabilities_cross():
    """Window K = 2, gate 1: the gate follows P̂ as it crosses, for each learner in opposite directions."""
    tracker = CapabilityTracker(["A", "B"], window=2)
    rewards = [
        ([1, 1, 1, 0], [1, 0, 0, 0]),  # P̂_A = 0.75, P̂_B = 0.25
        ([1, 0, 0, 0], [1, 1, 1, 1]),  # P̂_A = (0.75 + 0.25) / 2 = 0.5, P̂_B = (0.25 + 1) / 2 = 0.625
        ([1, 1, 1, 1], [0, 0, 0, 0]),  # P̂_A = (0.25 + 1) / 2 = 0.625, P̂_B = (1 + 0) / 2 = 0.5
    ]
    opened = []
    for a, b in rewards:
        caps = tracker.update({"A": a, "B": b})
        opened.append((open_peers("A", ["A", "B"], caps, None, 1.0), open_peers("B", ["A", "B"], caps, None, 1.0)))
    assert tracker.capabilities() == pytest.approx({"A": 0.625, "B": 0.5})  # a 0 step counts as the floor 1e-8
    assert opened == [([], ["A"]), (["B"], []), ([], ["A"])]


def test_gate_warmup_keeps_every_peer_closed_for_the_first_batches():
    """The validation split's case: after one batch the stronger A reads P̂ 0.08 and its weaker peer B 0.12, so a
    gate of 1 alone would open B to A. With a warm-up of 5 batches no peer opens before 5 batches were seen (the
    weakest learner's neither), and from then on the gate decides as without it. No gate: the warm-up has nothing to
    keep closed."""
    caps = {"A": 0.08, "B": 0.12, "C": 0.5}
    assert open_peers("A", AGENTS, caps, None, 1.0) == ["B", "C"]
    for seen in range(5):
        assert open_peers("A", AGENTS, caps, None, 1.0, gate_warmup=5, batches_seen=seen) == []
        assert open_peers("B", AGENTS, caps, None, 1.0, gate_warmup=5, batches_seen=seen) == []
    assert open_peers("A", AGENTS, caps, None, 1.0, gate_warmup=5, batches_seen=5) == ["B", "C"]
    assert open_peers("C", AGENTS, caps, None, 1.0, gate_warmup=5, batches_seen=9) == []
    assert open_peers("A", AGENTS, caps, None, 0.0, gate_warmup=5, batches_seen=0) == ["B", "C"]


def test_gate_evidence_by_hand():
    """z = (P̂_j − g·P̂_k) / sqrt(P̂_j(1 − P̂_j)/N_j + g²·P̂_k(1 − P̂_k)/N_k)."""
    # 0.28 vs 0.11 on 64 completions each: sqrt(0.2016/64 + 0.0979/64) = sqrt(0.0046797) = 0.068408; 0.17 / it
    assert gate_evidence(0.28, 64, 0.11, 64) == pytest.approx(0.17 / 0.0684081, rel=1e-5)  # 2.4851
    # the validation split's one batch: 0.12 vs 0.08: sqrt(0.1056/64 + 0.0736/64) = 0.052915; 0.04 / it = 0.7559
    assert gate_evidence(0.12, 64, 0.08, 64) == pytest.approx(0.7559289, rel=1e-6)
    assert gate_evidence(0.08, 64, 0.12, 64) == pytest.approx(-0.7559289, rel=1e-6)
    # the gate scales the learner: 0.5 vs 0.8 x 0.5 = 0.4, N 100 and 400: sqrt(0.0025 + 0.64 x 0.25 / 400) = 0.0538516
    assert gate_evidence(0.5, 100, 0.5, 400, gate=0.8) == pytest.approx(0.1 / 0.0538516, rel=1e-6)
    # more completions behind the same P̂: more evidence (a window of 5 batches of 64 against one)
    assert gate_evidence(0.28, 320, 0.11, 320) == pytest.approx(5**0.5 * gate_evidence(0.28, 64, 0.11, 64))
    assert gate_evidence(0.5, 0, 0.1, 64) == float("-inf")  # nothing behind P̂ (before any batch)
    assert gate_evidence(1.0, 8, 1.0, 8) == 0.0 and gate_evidence(1.0, 8, 0.0, 8) == float("inf")


def test_gate_confidence_opens_a_clearly_stronger_peer_and_keeps_close_ones_closed():
    """Gate 1 at 95% (z = 1.6449): on one batch of 64 completions each, the weaker A (0.11) opens to B (0.28, z 2.49)
    at once, while C (0.12) and D (0.08) stay closed to each other both ways (z ±0.76), which the point estimates
    alone would open one way. With five batches behind the same P̂ (N = 320, z = 0.76 x √5 = 1.69) C opens to D."""
    agents = ["A", "B", "C", "D"]
    caps = {"A": 0.11, "B": 0.28, "C": 0.08, "D": 0.12}
    one, five = dict.fromkeys(agents, 64), dict.fromkeys(agents, 320)
    assert open_peers("C", agents, caps, None, 1.0) == ["A", "B", "D"]  # the point estimates
    assert open_peers("A", agents, caps, None, 1.0, gate_confidence=0.95, rows=one) == ["B"]
    assert open_peers("C", agents, caps, None, 1.0, gate_confidence=0.95, rows=one) == ["B"]  # not A (0.4), not D
    assert open_peers("D", agents, caps, None, 1.0, gate_confidence=0.95, rows=one) == ["B"]
    assert open_peers("C", agents, caps, None, 1.0, gate_confidence=0.95, rows=five) == ["B", "D"]
    assert open_peers("B", agents, caps, None, 1.0, gate_confidence=0.95, rows=five) == []  # the strongest
    # before any batch (P̂ = 1 for all, nothing behind it) every peer is closed; confidence 0.5 is the plain gate
    assert open_peers("A", agents, dict.fromkeys(agents, 1.0), None, 1.0, 0, 0, 0.95, dict.fromkeys(agents, 0)) == []
    assert open_peers("C", agents, caps, None, 1.0, gate_confidence=0.5, rows=one) == ["A", "B", "D"]
    # no gate: nothing to judge (the config refuses a confidence without one)
    assert open_peers("B", agents, caps, None, 0.0, gate_confidence=0.95, rows=one) == ["A", "C", "D"]


def test_gate_evidence_metrics_log_each_peers_z_clipped():
    from hacpo_trl.training.metrics import gate_evidence_metrics

    caps, rows = {"A": 0.11, "B": 0.28, "C": 1.0, "D": 1.0}, dict.fromkeys("ABCD", 64)
    logged = gate_evidence_metrics("A", caps, rows, 1.0)
    assert logged["hacpo/gate_z/B"] == pytest.approx(2.4850807, rel=1e-6)
    assert logged["hacpo/gate_z/C"] == pytest.approx(0.89 / (0.11 * 0.89 / 64) ** 0.5)  # only the learner varies
    assert set(logged) == {"hacpo/gate_z/B", "hacpo/gate_z/C", "hacpo/gate_z/D"}
    assert gate_evidence_metrics("C", caps, rows, 0.5)["hacpo/gate_z/D"] == 100.0  # no variance: +inf, clipped


def test_tracker_counts_the_completions_behind_each_capability():
    """rows(): completions in each agent's window, which slides with it; a state saved before rows were kept loads
    with 0 behind each entry (no evidence until the window refills)."""
    tracker = CapabilityTracker(["A", "B"], window=2)
    assert tracker.rows() == {"A": 0, "B": 0}
    tracker.update({"A": [1, 0, 0, 0], "B": [1, 1]})
    tracker.update({"A": [1, 1, 0], "B": [0, 1, 1, 1, 1]})
    assert tracker.rows() == {"A": 7, "B": 7}
    tracker.update({"A": [1], "B": [0, 0]})  # the first entries leave the window
    assert tracker.rows() == {"A": 4, "B": 7}
    restored = CapabilityTracker(["A", "B"], window=2)
    restored.load_state_dict(tracker.state_dict())
    assert restored.rows() == tracker.rows() and restored.capabilities() == tracker.capabilities()
    old = {k: v for k, v in tracker.state_dict().items() if k != "rows"}
    restored.load_state_dict(old)
    assert restored.rows() == {"A": 0, "B": 0} and restored.capabilities() == tracker.capabilities()
    restored.update({"A": [1, 1], "B": [0, 1]})
    assert restored.rows() == {"A": 2, "B": 2}
    with pytest.raises(ValueError, match="malformed `rows`"):
        restored.load_state_dict({**tracker.state_dict(), "rows": {"A": [1], "B": [1, 2]}})


@pytest.mark.parametrize(
    "args, match",
    [
        (("Z", AGENTS, {"A": 1, "B": 1, "C": 1}), r"unknown `learner` 'Z'"),
        (("A", AGENTS, {"A": 1, "B": 1, "C": 1}, ["B", "D"]), r"unknown agent\(s\) \['D'\]"),
        (("A", AGENTS, {"A": 1, "B": 1}), r"missing agents \['C'\]"),
        (("A", AGENTS, {"A": 1, "B": 1, "C": 1}, None, 1.0, 2, True), r"`batches_seen` .* got True"),
        (("A", AGENTS, {"A": 1, "B": 1, "C": 1}, None, 1.0, 0, 0, 0.9), r"`rows` .* is needed"),
        (("A", AGENTS, {"A": 1, "B": 1, "C": 1}, None, 1.0, 0, 0, 0.9, {"A": 1, "B": 1}), r"`rows` .* is needed"),
    ],
)
def test_open_peers_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        open_peers(*args)


def test_peers_in_band_by_hand():
    """Band [0.8, 1] (lb_0 with δ = 0.2), both ends inside: B has 0.9 and 0.8 in, 0.5 below; C has 1.0 in, 1.2 above;
    D sent no row. So B counts 2, C 1, D 0 (band_gate would close D only)."""
    ratio = torch.tensor([0.9, 0.5, 1.0, 1.2, 0.8])
    sources = ["B", "B", "C", "C", "B"]
    assert peers_in_band(ratio, sources, ["B", "C", "D"], 0.8) == {"B": 2, "C": 1, "D": 0}
    assert peers_in_band(ratio, sources, ["B", "C"], 0.95) == {"B": 0, "C": 1}  # a tighter band: B closes too
    assert peers_in_band(torch.zeros(0), [], ["B"], 0.8) == {"B": 0}


@pytest.mark.parametrize(
    "args, match",
    [
        ((torch.ones(2), ["B"], ["B"], 0.8), r"one entry per source, got \(2,\) for 1"),
        ((torch.ones(1), ["Z"], ["B"], 0.8), r"agent\(s\) \['Z'\] that are not open peers"),
        ((torch.ones(1), ["B"], ["B"], 1.5), "lower_bound"),
    ],
)
def test_peers_in_band_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        peers_in_band(*args)


def test_learns_from_metric():
    expected = {"hacpo/learns_from/B": 0.0, "hacpo/learns_from/C": 1.0, "hacpo/peer_weight": 0.5}
    assert learns_from_metrics("A", AGENTS, ["C"], 0.5) == expected


# ------------------------------------------------------------------------------------------ fading peers out


def test_peer_fade_weight_by_hand():
    assert [peer_fade_weight(t, 8) for t in (0, 2, 4, 6, 8, 12)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert peer_fade_weight(0, 0) == peer_fade_weight(10**6, 0) == 1.0  # 0: no fade
    for bad in ((-1, 4), (1.5, 4), (1, -2), (1, 2.0), (True, 4)):
        with pytest.raises(ValueError, match="must be an integer >= 0"):
            peer_fade_weight(*bad)


def test_faded_peer_rows_keep_the_baseline_and_scale_the_peer_objective():
    every = build_peer_rows(SELF_IDS, SELF_REWARDS, records(), "A", AGENTS, CAPS, settings(), BPE)
    half = build_peer_rows(SELF_IDS, SELF_REWARDS, records(), "A", AGENTS, CAPS, settings(), BPE, peer_weight=0.5)
    assert half.advantages == pytest.approx([0.5 * a for a in every.advantages], rel=1e-6)
    assert torch.equal(half.self_advantages, every.self_advantages)  # the learner's own rows are untouched
    assert half.completion_ids == every.completion_ids and half.valid == every.valid
    # by hand, one peer row with s = 0.9 in the band [0.8, 1], ω = 2, α = 1: objective A·ω·s·s = 1.62·A, so
    # halving A halves the loss: -(1.62 x 1.0) -> -(1.62 x 0.5)
    logps = torch.full((1, 2), -1.0 + torch.tensor(0.9).log().item(), requires_grad=True)
    args = (torch.ones(1, 2), torch.tensor([-1.0]))
    kwargs = dict(omega=torch.tensor([2.0]), config=HACPOLossConfig())
    full = hacpo_loss(logps, *args, torch.tensor([1.0]), torch.tensor([True]), **kwargs).loss
    faded = hacpo_loss(logps, *args, torch.tensor([0.5]), torch.tensor([True]), **kwargs).loss
    assert float(full) == pytest.approx(-1.62, rel=1e-5) and float(faded) == pytest.approx(-0.81, rel=1e-5)


@pytest.mark.parametrize(
    "value, expected",
    [(None, None), ("all", None), ("ALL", None), ("none", []), ("B", ["B"]), ("B, C", ["B", "C"]), (["C"], ["C"]),
     ([], [])],
)  # fmt: skip
def test_parse_learn_from(value, expected):
    assert parse_learn_from(value, AGENTS) == expected


@pytest.mark.parametrize(
    "value, match",
    [("B,D", r"unknown agent\(s\) \['D'\]; the run's agents are \['A', 'B', 'C'\]"), (",", "got ','"),
     (3, "got 3"), ([1], r"got \[1\]")],
)  # fmt: skip
def test_parse_learn_from_errors_name_the_value(value, match):
    with pytest.raises(ValueError, match=match):
        parse_learn_from(value, AGENTS)


# ------------------------------------------------------------------------------------------ config


def test_learn_from_and_gate_resolve_per_agent(tmp_path):
    cfg = HACPOConfig(output_dir=str(tmp_path), agents={"solo": {"learn_from": "none"}}, **COMMON)
    assert cfg.learn_from == "none" and cfg.learn_from_agents() == []
    cfg = HACPOConfig(output_dir=str(tmp_path), agents={"solo": {"learn_from": ["solo"]}}, **COMMON)
    assert cfg.learn_from == "none"  # its own name is not a peer
    cfg = HACPOConfig(output_dir=str(tmp_path), agents={"solo": {}}, learn_from="solo", **COMMON)
    assert cfg.learn_from == "none"  # run-wide: the teacher named in it learns from no one
    cfg = HACPOConfig(output_dir=str(tmp_path), agents={"solo": {}}, **COMMON)
    assert cfg.learn_from == "all" and cfg.learn_from_agents() is None and cfg.capability_gate == 0.0
    overrides = {"capability_gate": 0.9, "peer_filter": "correct"}
    cfg = HACPOConfig(output_dir=str(tmp_path), agents={"solo": {"overrides": overrides}}, **COMMON)
    assert cfg.capability_gate == 0.9 and cfg.peer_filter == "correct"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"agents": {"solo": {"learn_from": ["teacher"]}}}, r"agent 'solo': `learn_from` names unknown .*'teacher'"),
        ({"agents": {"solo": {"overrides": {"learn_from": "x"}}}}, r"`overrides.learn_from` names unknown .*'x'"),
        ({"agents": {"solo": {}}, "learn_from": "teacher"}, r"`learn_from` names unknown agent\(s\) \['teacher'\]"),
        ({"agents": {"solo": {}}, "capability_gate": -1.0}, r"`capability_gate` must be .* got -1.0"),
        ({"agents": {"solo": {"overrides": {"capability_gate": "high"}}}}, r"agent 'solo': `capability_gate`.*'high'"),
        ({"agents": {"solo": {"overrides": {"peer_filter": "best"}}}}, r"agent 'solo': `peer_filter` .* 'best'"),
        ({"peer_fade_steps": -3}, r"`peer_fade_steps` must be an integer >= 0, got -3"),
        ({"capability_gate": 1.0, "capability_gate_warmup": -1}, r"`capability_gate_warmup` must be .* got -1"),
        ({"capability_gate_warmup": 5}, r"`capability_gate_warmup` keeps .* `capability_gate` is 0"),
        (
            {"agents": {"solo": {"overrides": {"capability_gate_warmup": 5}}}},
            r"agent 'solo': `capability_gate_warmup` keeps",
        ),
        ({"capability_gate": 1.0, "capability_gate_confidence": 1.0}, r"`capability_gate_confidence` must be .* 1.0"),
        ({"capability_gate": 1.0, "capability_gate_confidence": True}, r"`capability_gate_confidence` .* True"),
        ({"capability_gate_confidence": 0.95}, r"`capability_gate_confidence` asks .* `capability_gate` is 0"),
        (
            {"agents": {"solo": {"overrides": {"capability_gate_confidence": 0.9}}}},
            r"agent 'solo': `capability_gate_confidence` asks",
        ),
        (
            {"capability_gate": 1.0, "capability_gate_confidence": 0.95, "capability_metric": "mean_reward"},
            r"`capability_gate_confidence` tests accuracies .* 'mean_reward'",
        ),
        ({"capability_gate_rescue": 1}, r"`capability_gate_rescue` must be true or false, got 1"),
        ({"capability_gate_rescue": True}, r"`capability_gate_rescue` lends a peer .* `capability_gate` is 0"),
        (
            {"agents": {"solo": {"overrides": {"capability_gate_rescue": True}}}},
            r"agent 'solo': `capability_gate_rescue` lends",
        ),
        ({"band_gate": "yes"}, r"`band_gate` must be true or false, got 'yes'"),
        ({"band_gate": True, "naive": True}, r"`band_gate` closes a peer .* there is no band"),
        (
            {"agents": {"solo": {"overrides": {"band_gate": True, "peer_clipping": False}}}},
            r"agent 'solo': `band_gate`",
        ),
        ({"agents": {"solo": {"overrides": {"peer_fade_steps": 2.5}}}}, r"agent 'solo': `peer_fade_steps` .* 2.5"),
        ({"steps_per_generation": 4, "solo_steps_per_generation": 3}, r"divides `steps_per_generation` \(4\).* got 3"),
        ({"steps_per_generation": 4, "solo_steps_per_generation": 0}, r"`solo_steps_per_generation` .* got 0"),
        (
            {"steps_per_generation": 4, "gradient_accumulation_steps": 2, "solo_steps_per_generation": 1},
            r"multiple of `gradient_accumulation_steps` \(2\), got 1",
        ),
    ],
)
def test_bad_sharing_options_are_refused_naming_the_value(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        HACPOConfig(output_dir=str(tmp_path), **kwargs, **COMMON)


def test_learner_choices_need_not_be_equal_across_agents():
    from hacpo_trl.config import SHARED_SETTINGS

    assert not {"peer_filter", "learn_from", "capability_gate", "peer_fade_steps"} & set(SHARED_SETTINGS)
    assert "share_rollouts" in SHARED_SETTINGS  # every agent still exchanges at every generation batch


# ------------------------------------------------------------------------------------------ peer rows


def test_peer_rows_from_the_chosen_peers_only():
    """Learner A learns from B only: C's rows are neither trained on nor in A's baseline (its joint groups are A's
    and B's rows alone), exactly as if C were not in the run."""
    rows = build_peer_rows(SELF_IDS, SELF_REWARDS, records(), "A", ["A", "B"], CAPS, settings(), BPE)
    assert rows.sources == ["B", "B"] and rows.prompt_ids == ["p0", "p0"]
    without_c = [r for r in records() if r.agent != "C"]
    alone = build_peer_rows(SELF_IDS, SELF_REWARDS, without_c, "A", ["A", "B", "C"], CAPS, settings(), BPE)
    assert rows.advantages == alone.advantages and torch.equal(rows.self_advantages, alone.self_advantages)
    # by hand, p0: A [1, 0], B [1, 0] scaled by ω(A, B) = 1/3: μ̂ = (1 + 0 + 1/3 + 0) / 4, σ = std([1, 0, 1, 0])
    joint = capability_aware_advantages([1.0, 0.0, 1.0, 0.0], ["A", "A", "B", "B"], ["p0"] * 4, "A", CAPS).float()
    mu, sigma = (4 / 3) / 4, torch.tensor([1.0, 0.0, 1.0, 0.0]).std().item()
    assert joint.tolist() == pytest.approx([(1 - mu) / (sigma + 1e-6), -mu / (sigma + 1e-6)] * 2, rel=1e-6)
    assert rows.advantages == joint[2:].tolist()
    assert rows.self_advantages[:2].tolist() == joint[:2].tolist()


def test_a_learners_choice_never_changes_what_another_receives():
    """B's peer rows come from the records every agent shares; A learning from no one does not remove A's record
    (the trainer still sends it), so what B builds is the same whatever A chose."""
    shared = records()  # A's own record is among them whether A learns from anyone or not
    b_ids = ["p0", "p0"]
    b_rewards = torch.tensor([1.0, 0.0])
    caps = {"A": 0.25, "B": 0.75, "C": 0.5}
    b_rows = build_peer_rows(b_ids, b_rewards, shared, "B", AGENTS, caps, settings(), BPE)
    assert b_rows.sources.count("A") == 2  # A's two p0 completions reach B
    own_b = RolloutBatch("B", 1, 3, b_ids, ["x", "y"], [1.0, 0.0], [-0.5, -0.5], [1, 1], [True, True])
    a_rows = build_peer_rows(SELF_IDS, SELF_REWARDS, [shared[0], own_b], "A", ["A"], CAPS, settings(), BPE)
    assert len(a_rows) == 0  # A learns from no one ...
    again = build_peer_rows(b_ids, b_rewards, shared, "B", AGENTS, caps, settings(), BPE)
    assert again.completion_ids == b_rows.completion_ids and again.advantages == b_rows.advantages  # ... B unchanged


def _batch(agent, rank, rows):
    pids, rewards = map(list, zip(*rows, strict=True))
    n = len(pids)
    return RolloutBatch(agent, rank, 0, pids, [str(i) for i in range(n)], rewards, [-0.5] * n, [2] * n, [True] * n)


def test_rescued_prompts_by_hand():
    """K failed p0 (its group split over two ranks) and p2 (one unscorable row); it solved p1 and p4 (p4 on its
    second rank only); p3 it could not score at all. W solved p0, p1, p3 and p4; C solved p2. So W rescues p0 and
    C rescues p2: prompts K solved once, or never scored, are not rescued."""
    records = [
        _batch("K", 0, [("p0", 0.0), ("p0", 0.0), ("p1", 1.0), ("p1", 0.0), ("p4", 0.0)]),
        _batch("W", 2, [("p0", 1.0), ("p0", 0.0), ("p1", 1.0), ("p1", 1.0), ("p2", 0.0), ("p3", 1.0), ("p4", 1.0)]),
        _batch("K", 1, [("p2", 0.0), ("p2", NAN), ("p3", NAN), ("p3", NAN), ("p0", 0.0), ("p4", 1.0)]),
        _batch("C", 3, [("p2", 1.0), ("p0", 0.0)]),
    ]
    assert rescued_prompts(records, "K", ["W", "C"]) == {"W": {"p0"}, "C": {"p2"}}
    assert rescued_prompts(records, "K", ["W"]) == {"W": {"p0"}}
    assert rescued_prompts(records, "K", []) == {}
    assert rescued_prompts(records, "W", ["K"]) == {"K": set()}  # W failed p2 only, which K did not solve


def test_a_rescued_peer_enters_only_the_joint_groups_of_its_rescued_prompts():
    """Learner K (P̂ 0.5) with W (P̂ 0.25) rescuing q0, which K failed: on q0 the joint group is K's [0, 0] and W's
    [1, 0] with W's rewards scaled by ω(K, W) = 2, so μ̂ = (0 + 0 + 2 + 0) / 4 = 0.5 and σ = std([0, 0, 1, 0]) = 0.5:
    K's rows get (0 - 0.5) / 0.5 = -1, W's correct row +1 (its wrong row, -1, stays in the baseline only with
    `peer_filter: correct`). On q1, which K solved, W's row is left out, rows and reward: K's advantages are its
    own group's alone, (1 - 0.5) / std([1, 0]) and the opposite."""
    caps = {"K": 0.5, "W": 0.25}
    own = _batch("K", 0, [("q0", 0.0), ("q0", 0.0), ("q1", 1.0), ("q1", 0.0)])
    peer = _batch("W", 1, [("q0", 1.0), ("q0", 0.0), ("q1", 1.0)])
    rescue = rescued_prompts([own, peer], "K", ["W"])
    assert rescue == {"W": {"q0"}}
    ids, rewards = own.prompt_ids, torch.tensor(own.rewards)
    rows = build_peer_rows(
        ids, rewards, [own, peer], "K", ["K", "W"], caps, settings(peer_filter="correct"), BPE, only_prompts=rescue
    )
    assert rows.prompt_ids == ["q0"] and rows.sources == ["W"] and rows.filtered == 1
    assert rows.advantages == pytest.approx([0.5 / (0.5 + 1e-6)], rel=1e-6)
    half = 0.5 / (2**-0.5 + 1e-6)
    expected = [-0.5 / (0.5 + 1e-6)] * 2 + [half, -half]
    assert rows.self_advantages.tolist() == pytest.approx(expected, rel=1e-6)
    alone = build_peer_rows(ids, rewards, [own], "K", ["K"], caps, settings(), BPE)
    assert rows.self_advantages[2:].tolist() == alone.self_advantages[2:].tolist()  # q1 exactly as without W


# ------------------------------------------------------------------------------------------ through the trainer


def _metric(summary: dict, key: str) -> list:
    return [entry[key] for entry in summary["log_history"] if key in entry]


def _has_digit(completions, **kwargs):  # the launched agents' reward (tests/scripts/train_agents.py)
    return [1.0 if any(ch.isdigit() for ch in c[0]["content"]) else 0.0 for c in completions]


def _first_of_group(completions, **kwargs):  # train_agents.py's `--first_of_group` (groups of 2 completions)
    return [float(i % 2 == 0) for i in range(len(completions))]


# every launch whose agent is compared with GSPO: a reward spread in every group whatever was sampled, so the compared
# models trained at every generation batch (and the reference TRL run scores its completions alike, `_trl_gspo`)
SPREAD = "--first_of_group"


def _trl_gspo(base: str, out, steps: int):
    """TRL's own `GRPOTrainer` with GSPO settings and the launched agents' schedule and reward (train_agents.py with
    `--first_of_group`), from the launches' seed."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    prompts = [[{"role": "user", "content": f"{a}+{b}="}] for a in range(4) for b in range(4)]
    dataset = Dataset.from_dict({"prompt": prompts, "answer": [str(a + b) for a in range(4) for b in range(4)]})
    args = GRPOConfig(
        output_dir=str(out), importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-4, epsilon_high=4e-4,
        num_generations=2, steps_per_generation=2, per_device_train_batch_size=4, max_completion_length=8,
        max_steps=steps, learning_rate=0.2, lr_scheduler_type="constant", seed=seeded(0), logging_steps=1,
        save_strategy="no", **COMMON,
    )  # fmt: skip
    tok = AutoTokenizer.from_pretrained(base, padding_side="left")
    trainer = GRPOTrainer(
        model=base, reward_funcs=_first_of_group, args=args, train_dataset=dataset, processing_class=tok
    )
    trainer.train()
    return trainer


def _load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder)


def _assert_trained_as(folder, reference, base_folder, exact: bool = False) -> None:
    """The model saved in ``folder`` has ``reference``'s parameters (``exact``: bit for bit), and they moved from the
    base model's (certain: the launches compared have a reward spread in every group, `SPREAD`)."""
    trained, base = _load(folder), _load(base_folder)
    moved = 0
    for (name, a), (_, b), (_, start) in zip(
        trained.named_parameters(), reference.named_parameters(), base.named_parameters(), strict=True
    ):
        moved += not torch.equal(a, start)
        torch.testing.assert_close(a, b, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6, msg=name)
    assert moved > 0  # trained models are compared, not two copies of the base


@pytest.fixture(scope="module")
def gspo_run(tmp_path_factory):
    """Both agents as independent GSPO baselines (`share_rollouts: false`), launched as the sharing runs are (same
    processes and threads, so bit-for-bit comparisons hold on any CPU): 8 optimizer steps, 2 per generation batch of
    8 rows, 4 rows per update; llama0 with TRL's padded forwards (`trim_padding: false`)."""
    out = tmp_path_factory.mktemp("gspo")
    proc = accelerate_launch(2, "train_agents.py", "--out", str(out), "--steps", "8", "--learning_rate", "0.2",
                             "--no_share", "--override", "0:trim_padding=false", SPREAD)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out, summaries(out)


@pytest.fixture(scope="module")
def learns_from_none(tmp_path_factory):
    """llama0 learns from no one, qwen1 from llama0: 8 optimizer steps, 4 generation batches of 2 updates."""
    out = tmp_path_factory.mktemp("learns_from_none")
    proc = accelerate_launch(
        2,
        "train_agents.py",
        "--out",
        str(out),
        "--steps",
        "8",
        "--learning_rate",
        "0.2",
        "--record_peers",
        "--override",
        '0:learn_from="none"',
        "--override",
        "0:trim_padding=false",  # TRL's padded forwards, so that it can equal TRL's GSPO bit for bit
        SPREAD,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out, summaries(out)


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_an_agent_that_learns_from_no_one_trains_exactly_as_gspo(learns_from_none, gspo_run, tmp_path):
    """Same schedule = the agent's own per_device_train_batch_size, steps_per_generation and gradient accumulation
    (here 4 rows per update, 2 updates per generation batch, 8 updates): the parameters after training equal TRL's
    GSPO run from the same base model with the same seed (up to the thread counts of two processes), and bit for bit
    those of the GSPO baseline launched the same way, although its peer learned from its rollouts all along."""

    out, (llama, qwen) = learns_from_none
    assert _metric(llama, "hacpo/learns_from/qwen1") == [0.0] * 4 and _metric(llama, "hacpo/peer_rows") == [0] * 4
    assert llama["peer_rows_here"] == []  # no peer row was ever built for it
    assert _metric(qwen, "hacpo/learns_from/llama0") == [1.0] * 4
    assert _metric(qwen, "hacpo/peer_rows") == [8] * 4  # all of llama0's completions: 4 prompts x 2
    assert _metric(llama, "hacpo/capability/qwen1") == _metric(qwen, "hacpo/capability/qwen1")  # still exchanged

    reference = _trl_gspo(llama["base"], tmp_path, steps=8)
    _assert_trained_as(out / "llama0", reference.model, llama["base"])
    # TRL's clip cut the same share of own rows at every update (whether it cut any is a draw of the sampling)
    trl_clipped = [e["clip_ratio/region_mean"] for e in reference.state.log_history if "clip_ratio/region_mean" in e]
    assert len(trl_clipped) == 8 and _metric(llama, "clip_ratio/region_mean") == pytest.approx(trl_clipped, abs=1e-6)
    trl_losses = [e["loss"] for e in reference.state.log_history if "loss" in e]
    assert _metric(llama, "loss") == pytest.approx(trl_losses, rel=1e-5, abs=1e-7)
    # bit for bit: the GSPO baseline launched the same way (TRL's loss and old log-probs in the same chunks)
    gspo_out, (gspo_llama, _) = gspo_run
    _assert_trained_as(out / "llama0", _load(gspo_out / "llama0"), llama["base"], exact=True)
    assert _metric(llama, "loss") == _metric(gspo_llama, "loss")


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_a_learner_that_keeps_no_prompt_of_its_peer_trains_exactly_as_gspo(tmp_path, launch, gspo_run):
    """`peer_prompts: better` with a peer that solves nothing (qwen1's every reward 0): qwen1 never does better on
    a prompt, so llama0 keeps none of its rows at any batch and learns from no one, bit for bit the GSPO baseline
    launched the same way."""
    launch(2, "train_agents.py", "--out", str(tmp_path / "run"), "--steps", "8", "--learning_rate", "0.2",
           "--zero_reward", "1", "--override", '0:peer_prompts="better"', "--override", "0:trim_padding=false",
           SPREAD)  # fmt: skip
    llama, qwen = summaries(tmp_path / "run")
    assert _metric(llama, "hacpo/learns_from/qwen1") == [0.0] * 4 and _metric(llama, "hacpo/peer_rows") == [0] * 4
    assert _metric(llama, "hacpo/taught_prompts/qwen1") == [0.0] * 4
    assert _metric(qwen, "hacpo/peer_rows") == [8] * 4  # qwen1 still learns from all of llama0's completions
    gspo_out, (gspo_llama, _) = gspo_run
    _assert_trained_as(tmp_path / "run" / "llama0", _load(gspo_out / "llama0"), llama["base"], exact=True)
    assert _metric(llama, "loss") == _metric(gspo_llama, "loss")


# rule 16's former preset: `recommended` without the cap and the failed rate, its taught rows at a quarter weight
QUARTER = [f"{i}:{kv}" for i in (0, 1) for kv in ("taught_scale=0.25", "taught_cap=0", "taught_failed_rate=0.0")]


@pytest.mark.launch
@pytest.mark.timeout(900)
@pytest.mark.parametrize("overrides", [[], QUARTER], ids=["recommended", "quarter weight"])
def test_the_preset_on_gspos_schedule_skips_nothing_and_an_untaught_learner_trains_exactly_as_gspo(
    tmp_path, launch, gspo_run, overrides
):
    """`sharing: recommended` on the GSPO run's schedule, with a peer that solves nothing (qwen1): llama0 is never
    taught, so it makes GSPO's 8 optimizer steps (2 per generation batch, none skipped, no `solo_steps_per_generation`)
    and ends bit for bit as the GSPO baseline launched the same way; qwen1 is taught by llama0 within its own 2
    updates per batch: llama0 solves each prompt once (`--first_of_group`), so it teaches qwen1 every prompt at
    every batch. The same with rule 16's preset (`taught_scale: 0.25`, no cap or failed rate)."""
    launch(2, "train_agents.py", "--out", str(tmp_path / "run"), "--steps", "8", "--learning_rate", "0.2",
           "--zero_reward", "1", "--sharing", "recommended", "--override", "0:trim_padding=false", SPREAD,
           *(f for o in overrides for f in ("--override", o)))  # fmt: skip
    llama, qwen = summaries(tmp_path / "run")
    assert _metric(llama, "hacpo/taught_prompts/qwen1") == [0.0] * 4 and _metric(llama, "hacpo/peer_rows") == [0] * 4
    assert not _metric(llama, "hacpo/skipped_updates") and not _metric(qwen, "hacpo/skipped_updates")
    assert len(_metric(llama, "loss")) == len(_metric(qwen, "loss")) == 8  # GSPO's optimizer steps, every one made
    # llama0 teaches every prompt at each batch (qwen1 failed it, llama0 solved it), so the band gate counted its rows
    # at each; it closes llama0 at a batch where no taught row reaches the floor (a draw of the sampling)
    counted = _metric(qwen, "hacpo/band_rows/llama0")
    assert len(counted) == 4 and _metric(qwen, "hacpo/taught_prompts/llama0") == [float(n > 0) for n in counted]
    gspo_out, (gspo_llama, _) = gspo_run
    _assert_trained_as(tmp_path / "run" / "llama0", _load(gspo_out / "llama0"), llama["base"], exact=True)
    assert _metric(llama, "loss") == _metric(gspo_llama, "loss")


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_a_solo_learner_with_the_papers_mini_batch_trains_exactly_as_gspo_with_the_papers_schedule(
    tmp_path, launch, gspo_run
):
    """`solo_steps_per_generation: 2` with the sharing schedule (4 updates of 2 rows per generation batch of 8): a
    learner that learns from no one makes 2 updates of 4 own rows per batch, and the other 2 take no optimizer
    step at all (no AdamW momentum step). Its parameters after 4 generation batches (16 micro-steps) equal TRL's
    GSPO with `steps_per_generation: 2` and 4 rows per update (8 updates) from the same base and seed, and its
    logged losses are TRL's at the updates it made and 0 at the skipped ones."""

    launch(2, "train_agents.py", "--out", str(tmp_path / "run"), "--steps", "16", "--steps_per_generation", "4",
           "--learning_rate", "0.2", "--override", '0:learn_from="none"',
           "--override", "0:solo_steps_per_generation=2", "--override", "0:trim_padding=false", SPREAD)  # fmt: skip
    llama, qwen = summaries(tmp_path / "run")
    assert _metric(llama, "hacpo/learns_from/qwen1") == [0.0] * 4 and _metric(qwen, "hacpo/peer_rows") == [8] * 4
    reference = _trl_gspo(llama["base"], tmp_path / "trl", steps=8)
    _assert_trained_as(tmp_path / "run" / "llama0", reference.model, llama["base"])
    trl_losses = [e["loss"] for e in reference.state.log_history if "loss" in e]
    losses = _metric(llama, "loss")
    assert len(losses) == 16 and losses[2::4] == losses[3::4] == [0.0] * 4  # micro-steps 3 and 4 of each batch
    made = [x for i, x in enumerate(losses) if i % 4 < 2]
    assert made == pytest.approx(trl_losses, rel=1e-5, abs=1e-7)
    # bit for bit the GSPO baseline launched the same way: the old log-probs in GSPO's chunks of 4 rows, not the
    # sharing schedule's 2, and TRL's own loss on a batch without peer rows
    gspo_out, (gspo_llama, _) = gspo_run
    _assert_trained_as(tmp_path / "run" / "llama0", _load(gspo_out / "llama0"), llama["base"], exact=True)
    assert made == _metric(gspo_llama, "loss")


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_an_update_without_a_row_with_a_gradient_takes_no_step_with_skip_empty_updates(tmp_path, launch):
    """A band of width 1e-6 keeps no peer row, so in every generation batch (2 updates: own rows, then peer rows)
    the second update has no row with a gradient. llama0 (`skip_empty_updates`) keeps its weights through it;
    qwen1 (the official code's behaviour) still moves them: AdamW steps on its momentum. The first update of each
    batch has a gradient whatever was sampled (own rows with a reward spread in every group, `--first_of_group`)."""
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "8", "--delta", "1e-6", "--trace_params",
           "--override", "0:skip_empty_updates=true", SPREAD)  # fmt: skip
    llama, qwen = summaries(tmp_path)
    for s in (llama, qwen):  # every peer completion of its 4 prompts is a row (the paper's rule), none in the band
        assert _metric(s, "hacpo/peer_rows") == [8] * 4 and _metric(s, "hacpo/peer_ratio_in_band") == [0.0] * 4
        assert len(s["param_trace"]) == 8
    empty = (1, 3, 5, 7)  # the second update of each generation batch (0-based optimizer steps)
    trace = llama["param_trace"]
    assert all(trace[i] == trace[i - 1] for i in empty) and llama["trainable_changed"]  # its own updates trained
    trace = qwen["param_trace"]  # once AdamW has momentum, an empty update still moves the weights
    assert any(trace[i] != trace[i - 1] for i in empty)


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_band_gate_closes_a_peer_with_no_row_in_the_band_and_the_learner_trains_as_gspo(
    learns_from_none, tmp_path, launch
):
    """llama0 with `band_gate` and a band of width 1e-6: no row of qwen1 is ever in it, so llama0 learns from no one
    at every batch, and its weights equal those of the run in which it learns from no one by `learn_from` (itself
    TRL's GSPO, see above): the band-gate forward leaves the RNG and everything else as it was. qwen1, whose own band
    is [0, 1] (`peer_delta: 1.0`), learns from llama0 at exactly the batches where some row is in the band (which
    batches those are is a draw of the sampling)."""
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "8", "--learning_rate", "0.2", "--delta", "1e-6",
           "--override", "0:band_gate=true", "--override", "1:band_gate=true",
           "--override", "1:peer_delta=1.0", "--override", "0:trim_padding=false", SPREAD)  # fmt: skip
    llama, qwen = summaries(tmp_path)
    assert (
        _metric(llama, "hacpo/band_rows/qwen1") == [0.0] * 4 and _metric(llama, "hacpo/learns_from/qwen1") == [0.0] * 4
    )
    assert _metric(llama, "hacpo/peer_rows") == [0] * 4 and llama["peer_rows_here"] == []
    out, _ = learns_from_none
    _assert_trained_as(tmp_path / "llama0", _load(out / "llama0"), llama["base"], exact=True)

    in_band = _metric(qwen, "hacpo/band_rows/llama0")
    opened = _metric(qwen, "hacpo/learns_from/llama0")
    assert len(in_band) == 4 and opened == [float(n > 0) for n in in_band]
    assert [n > 0 for n in _metric(qwen, "hacpo/peer_rows")] == [n > 0 for n in in_band]


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_band_gate_closes_a_taught_peer_none_of_whose_rows_reaches_the_floor(tmp_path, launch):
    """qwen1 with `peer_prompts: better`, `band_gate`, floor 0.99 and a band of width 1e-6 (no row is ever in it):
    its taught rows count for the gate by the floor alone. qwen1 solves nothing and llama0 each prompt once
    (`--zero_reward 1`, `--first_of_group`), so llama0 teaches every prompt at every batch (the gate runs and logs
    its count). llama0's traces are far less likely under qwen1 than under llama0 (ratios about 0.3 here), so no row
    reaches the floor, and the gate closes llama0: qwen1 learns from no one."""
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "8", "--delta", "1e-6", "--zero_reward", "1", SPREAD,
           "--override", '1:peer_prompts="better"', "--override", "1:band_gate=true",
           "--override", "1:taught_ratio_floor=0.99")  # fmt: skip
    _, qwen = summaries(tmp_path)
    assert _metric(qwen, "hacpo/band_rows/llama0") == [0.0] * 4  # taught (better on every prompt) and counted
    assert _metric(qwen, "hacpo/learns_from/llama0") == [0.0] * 4 and _metric(qwen, "hacpo/peer_rows") == [0] * 4


def test_skip_empty_updates_is_refused_under_deepspeed(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ValueError, match="`skip_empty_updates` does not work with DeepSpeed"):
        HACPOConfig(output_dir=str(tmp_path), skip_empty_updates=True, **COMMON)


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_gate_and_fade_through_the_trainer_and_others_receive_the_same(learns_from_none, tmp_path, launch):
    """llama0 gated at 1.0 (learns from qwen1 only while P̂_qwen1 >= P̂_llama0): each generation batch it learns from
    qwen1 exactly when the logged capabilities say so, and builds no peer row otherwise. qwen1 fades its peer rows
    out over 4 steps. qwen1's first peer rows (llama0's first completions in qwen1's tokens) are the same whether
    llama0 learns from no one or is gated."""
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "8", "--record_peers",
           "--override", "0:capability_gate=1.0", "--override", "1:peer_fade_steps=4")  # fmt: skip
    llama, qwen = summaries(tmp_path)
    caps = zip(_metric(llama, "hacpo/capability/llama0"), _metric(llama, "hacpo/capability/qwen1"), strict=True)
    expected = [float(q >= a) for a, q in caps]
    assert len(expected) == 4 and _metric(llama, "hacpo/learns_from/qwen1") == expected
    assert [n > 0 for n in _metric(llama, "hacpo/peer_rows")] == [bool(e) for e in expected]
    # qwen1 fades llama0's rows out over 4 optimizer steps: generation batches start at steps 0, 2, 4, 6
    assert _metric(qwen, "hacpo/peer_weight") == [1.0, 0.5, 0.0, 0.0]
    assert _metric(qwen, "hacpo/learns_from/llama0") == [1.0, 1.0, 0.0, 0.0]
    assert _metric(qwen, "hacpo/peer_rows") == [8, 8, 0, 0]
    _, (_, qwen_none) = learns_from_none
    assert qwen["peers"]["rows"] == qwen_none["peers"]["rows"] and len(qwen["peers"]["rows"]) == 8


@pytest.mark.launch
@pytest.mark.timeout(900)
@pytest.mark.parametrize("accumulation", [1, 2])
def test_gate_warmup_closes_every_peer_for_the_first_batches_through_the_trainer(tmp_path, launch, accumulation):
    """llama0 with a gate of 1e-9 (open whenever qwen1 has any capability) and a warm-up of 2 generation batches:
    closed at batches 1 and 2 although the gate alone would open them, then as the gate says, with peer rows. With
    2 micro-batches per update (each generation batch is then 1 update, not 2) the warm-up still counts generation
    batches (it counted optimizer steps ÷ micro-batches per batch, so stayed closed twice as long)."""
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "8", "--gradient_accumulation_steps", str(accumulation),
           "--override", "0:capability_gate=1e-9", "--override", "0:capability_gate_warmup=2")  # fmt: skip
    llama, _ = summaries(tmp_path)
    caps = zip(_metric(llama, "hacpo/capability/llama0"), _metric(llama, "hacpo/capability/qwen1"), strict=True)
    by_gate = [float(q >= 1e-9 * a) for a, q in caps]
    # certain, whatever was sampled: P̂ is floored at 1e-8 > 1e-9 x P̂_llama0, so the gate alone opens every batch
    assert len(by_gate) > 2 and set(by_gate) == {1.0}
    assert _metric(llama, "hacpo/learns_from/qwen1") == [0.0, 0.0, *by_gate[2:]]
    assert [n > 0 for n in _metric(llama, "hacpo/peer_rows")] == [False, False, *(g > 0 for g in by_gate[2:])]


@pytest.mark.launch
@pytest.mark.timeout(900)
@pytest.mark.parametrize("task", ["digits", "arithmetic"])
def test_gate_confidence_opens_as_the_logged_evidence_says_through_the_trainer(tmp_path, launch, task):
    """Both agents with a gate of 1 at confidence 0.999999 (z = 4.75): at every generation batch each learner logs
    the z of its peer computed from the logged capabilities, each over its window's completions (8 per batch, window
    5), and learns from the peer exactly when z reaches 4.75, with peer rows then and only then (`digits`: the
    agents' P̂ differ, so z depends on the completions counted). With `arithmetic` no untrained tiny agent answers a
    sum, so both P̂ sit together near the floor: the plain gate (P̂_peer >= P̂_learner) is open for at least one
    learner at every batch, the evidence (z far below 4.75) for neither."""
    import statistics

    gate = ["--override", "0:capability_gate=1.0", "--override", "1:capability_gate=1.0"]
    conf = [
        "--override",
        "0:capability_gate_confidence=0.999999",
        "--override",
        "1:capability_gate_confidence=0.999999",
    ]
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "12", "--task", task, *gate, *conf)
    z = statistics.NormalDist().inv_cdf(0.999999)
    plain_only = 0
    for summary, (me, peer) in zip(summaries(tmp_path), [("llama0", "qwen1"), ("qwen1", "llama0")], strict=True):
        mine, theirs = _metric(summary, f"hacpo/capability/{me}"), _metric(summary, f"hacpo/capability/{peer}")
        assert len(mine) == 6
        rows = [8 * min(b, 5) for b in range(1, 7)]
        evidence = [
            max(-100.0, min(100.0, gate_evidence(p, n, m, n))) for m, p, n in zip(mine, theirs, rows, strict=True)
        ]
        assert _metric(summary, f"hacpo/gate_z/{peer}") == pytest.approx(evidence, rel=1e-9, abs=1e-12)
        expected = [float(e >= z) for e in evidence]
        assert _metric(summary, f"hacpo/learns_from/{peer}") == expected
        assert [n > 0 for n in _metric(summary, "hacpo/peer_rows")] == [e > 0 for e in expected]
        plain_only += sum(p >= m and not e for m, p, e in zip(mine, theirs, expected, strict=True))
    if task == "arithmetic":
        assert plain_only >= 6


def _failed_by_llama0_and_solved_by_qwen1(batch) -> tuple[set[str], int]:
    """From one generation batch's recorded (agent, prompt id, reward) rows: the prompts llama0 failed at every
    completion and qwen1 solved at least once, and how many prompts llama0 answered."""
    own, peer = {}, set()
    for agent, pid, reward in batch:
        if agent == "llama0":
            own.setdefault(pid, []).append(reward)
        elif reward > 0:
            peer.add(pid)
    return {pid for pid, rs in own.items() if max(rs) <= 0} & peer, len(own)


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_gate_rescue_lends_a_closed_peers_rows_on_failed_prompts_only_through_the_trainer(tmp_path, launch):
    """llama0 gated at 100 (qwen1 closed unless P̂_llama0 is 0) with the rescue, the solo schedule (2 of 4 updates)
    and a band [0, 1]; 8 generation batches of 16 rows. At every batch it logs as rescued exactly the prompts that
    the recorded rewards show it failed at every completion and qwen1 solved once (none while qwen1 is open), builds
    peer rows then and only then, and keeps the solo schedule (updates 3 and 4 leave the weights alone, and updates 1
    and 2 hold the own rows as GSPO's do, with half the rescued rows each) at a batch whose peer rows are rescued ones
    only. The same run without the rescue trains bit for bit alike until the first
    rescued prompt, and differently from its update on: the rescue changes nothing else.

    The rewards are chosen, whatever was sampled: each agent solves each prompt once (`--first_of_group`), and from
    the third batch (step 8) on llama0 fails every completion of half its prompts (`--fail_odd_groups`). So P̂_llama0
    stays >= 1/4 (qwen1 closed at every batch), nothing is rescued at batches 1 and 2, and 4 prompts at each later
    one."""
    common = ["--steps", "32", "--steps_per_generation", "4", "--generation_batch", "16", "--trace_params",
              "--override", "0:capability_gate=100.0", "--override", "0:solo_steps_per_generation=2",
              "--override", "0:peer_delta=1.0", "--override", '0:peer_filter="correct"',
              SPREAD, "--fail_odd_groups", "0:8"]  # fmt: skip
    launch(2, "train_agents.py", "--out", str(tmp_path / "rescue"), *common, "--record_layout",
           "--override", "0:capability_gate_rescue=true")  # fmt: skip
    launch(2, "train_agents.py", "--out", str(tmp_path / "plain"), *common)
    llama, _ = summaries(tmp_path / "rescue")
    plain, _ = summaries(tmp_path / "plain")
    caps = zip(_metric(llama, "hacpo/capability/llama0"), _metric(llama, "hacpo/capability/qwen1"), strict=True)
    opened = [float(q >= 100.0 * a) for a, q in caps]
    assert _metric(llama, "hacpo/learns_from/qwen1") == opened and len(opened) == 8
    expected = []
    for batch, is_open in zip(llama["batch_rewards"], opened, strict=True):
        rescued, _ = _failed_by_llama0_and_solved_by_qwen1(batch)
        expected.append(0.0 if is_open else float(len(rescued)))
    rescued = _metric(llama, "hacpo/rescued_prompts/qwen1")
    assert opened == [0.0] * 8 and rescued == expected == [0.0] * 2 + [4.0] * 6
    peer_rows = _metric(llama, "hacpo/peer_rows")
    assert [n > 0 for n in peer_rows] == [o > 0 or r > 0 for o, r in zip(opened, rescued, strict=True)]
    assert len(_metric(llama, "hacpo/peer_ratio_in_band")) == sum(n > 0 for n in peer_rows)  # logged per batch
    for layout, is_open, rows in zip(llama["layouts"], opened, peer_rows, strict=True):
        if not is_open and rows:  # rescued rows only: each of the 2 updates holds GSPO's 8 of the 16 own rows and
            # half the rescued rows, padded to an even count (not to the 4 micro-batches of the sharing schedule)
            assert layout[2:] == [None, None] and [mb[0] for mb in layout[:2]] == [8, 8], layout
            assert layout[0][1] + layout[0][2] == layout[1][1] + layout[1][2] == (rows + 1) // 2, layout
    trace = llama["param_trace"]
    for b, is_open in enumerate(opened):
        if not is_open:  # learned from no one, or from rescued rows only: 2 updates, the other 2 take no step
            assert trace[4 * b + 2] == trace[4 * b + 1] == trace[4 * b + 3]
            assert b == 0 or trace[4 * b + 1] != trace[4 * b - 1]  # its own 2 updates did train
    first = 4 * next(b for b, r in enumerate(rescued) if r > 0)
    assert trace[:first] == plain["param_trace"][:first]
    assert trace[first + 1] != plain["param_trace"][first + 1]


@pytest.mark.launch
def test_taught_rows_of_failed_prompts_keep_the_solo_schedule_through_the_trainer(tmp_path, launch):
    """llama0 with per-prompt sharing (`peer_prompts: failed`, the correct filter, `taught_schedule: solo`, the solo
    schedule of 2 of 4 updates, `taught_baseline: own`); 8 generation batches of 16 rows. At every batch it is taught
    exactly the prompts the recorded rewards show it failed at every completion and qwen1 solved once (logged as a
    share of the batch's prompts), builds peer rows then and only then, and keeps GSPO's schedule and advantages:
    updates 1 and 2 hold GSPO's 8 own rows each and half the taught rows, updates 3 and 4 leave the weights alone,
    and every own row's advantage is GSPO's, from its own group's recorded rewards (0 on a taught prompt, where the
    joint baseline would push each one down). The rewards are chosen, whatever was sampled: each agent solves each
    prompt once (`--first_of_group`), except that llama0 fails every completion of half its prompts
    (`--fail_odd_groups`): it is taught 4 of its 8 prompts at every batch, and its other groups have a spread."""
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "32", "--steps_per_generation", "4",
           "--generation_batch", "16", "--trace_params", "--record_layout", SPREAD, "--fail_odd_groups", "0:0",
           "--override", '0:peer_prompts="failed"', "--override", '0:taught_schedule="solo"',
           "--override", '0:taught_baseline="own"',
           "--override", "0:solo_steps_per_generation=2", "--override", '0:peer_filter="correct"')  # fmt: skip
    llama, _ = summaries(tmp_path)
    expected = []
    for batch in llama["batch_rewards"]:
        taught, prompts = _failed_by_llama0_and_solved_by_qwen1(batch)
        expected.append(len(taught) / prompts)
    taught = _metric(llama, "hacpo/taught_prompts/qwen1")
    assert taught == pytest.approx(expected) and taught == [0.5] * 8
    peer_rows = _metric(llama, "hacpo/peer_rows")
    assert [n > 0 for n in peer_rows] == [t > 0 for t in taught]
    trace = llama["param_trace"]
    for b, (layout, rows) in enumerate(zip(llama["layouts"], peer_rows, strict=True)):
        if rows:  # taught rows only: each of the 2 updates holds GSPO's 8 of the 16 own rows and half the taught rows
            assert layout[2:] == [None, None] and [mb[0] for mb in layout[:2]] == [8, 8], layout
            assert layout[0][1] + layout[0][2] == layout[1][1] + layout[1][2] == (rows + 1) // 2, layout
        assert trace[4 * b + 2] == trace[4 * b + 1] == trace[4 * b + 3]  # updates 3 and 4 take no step
        assert b == 0 or trace[4 * b + 1] != trace[4 * b - 1]  # its own 2 updates did train
    assert [b for b, _ in llama["own_advantages"]] == [b for b, rows in enumerate(peer_rows) if rows]
    for b, advantages in llama["own_advantages"]:
        taught_prompts, _ = _failed_by_llama0_and_solved_by_qwen1(llama["batch_rewards"][b])
        own = {}
        for agent, pid, reward in llama["batch_rewards"][b]:
            if agent == "llama0":
                own.setdefault(pid, []).append(reward)
        gspo = {pid: (rs - rs.mean()) / (rs.std() + 1e-6) for pid, rs in ((p, torch.tensor(r)) for p, r in own.items())}
        seen = Counter()
        for pid, advantage in advantages:
            assert advantage == pytest.approx(float(gspo[pid][seen[pid]]), abs=1e-5), (b, pid)
            assert pid not in taught_prompts or advantage == 0
            seen[pid] += 1


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_negatives_on_unsure_prompts_through_the_trainer(tmp_path, launch):
    """llama0 as in the test above, with `peer_negatives: unsure`. Each agent solves each prompt once in its 2
    completions (`--first_of_group`) and llama0 fails every completion of its odd groups (`--fail_odd_groups`): at
    every batch it is taught its 4 failed prompts (qwen1's right row on each) and takes qwen1's wrong row on each of
    its 4 unsure ones as a negative taught row, whose advantage is llama0's own wrong row's there, from its own
    group's recorded rewards: (0 − 0.5) / (std([1, 0]) + 1e-6). Its own rows on the unsure prompts keep GSPO's
    advantages, and the batch keeps the solo schedule (2 updates of GSPO's 8 own rows)."""
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "32", "--steps_per_generation", "4",
           "--generation_batch", "16", "--record_layout", SPREAD, "--fail_odd_groups", "0:0",
           "--override", '0:peer_prompts="failed"', "--override", '0:taught_schedule="solo"',
           "--override", '0:peer_negatives="unsure"', "--override", "0:solo_steps_per_generation=2",
           "--override", '0:peer_filter="correct"')  # fmt: skip
    llama, _ = summaries(tmp_path)
    assert _metric(llama, "hacpo/taught_prompts/qwen1") == [0.5] * 8
    assert _metric(llama, "hacpo/negative_prompts/qwen1") == [0.5] * 8
    assert _metric(llama, "hacpo/prompts/unsure") == _metric(llama, "hacpo/prompts/failed") == [4.0] * 8
    assert _metric(llama, "hacpo/prompts/qwen1_wrong_on_solved") == [0.0] * 8
    wrong_advantage = -0.5 / (torch.tensor([1.0, 0.0]).std().item() + 1e-6)
    assert [b for b, _ in llama["peer_advantages"]] == list(range(8))
    for b, rows in llama["peer_advantages"]:
        own = {}
        for agent, pid, reward in llama["batch_rewards"][b]:
            if agent == "llama0":
                own.setdefault(pid, []).append(reward)
        failed = {pid for pid, rs in own.items() if max(rs) <= 0}
        negatives = [(pid, a) for pid, a, taught in rows if pid not in failed]
        assert all(taught for _, _, taught in rows)
        assert {pid for pid, _ in negatives} <= set(own) - failed and negatives, (b, rows)
        assert all(a == pytest.approx(wrong_advantage, rel=1e-5) for _, a in negatives), (b, rows)
        assert all(a > 0 for pid, a, _ in rows if pid in failed)  # qwen1's right rows where llama0 failed
        gspo = {pid: (rs - rs.mean()) / (rs.std() + 1e-6) for pid, rs in ((p, torch.tensor(r)) for p, r in own.items())}
        seen = Counter()
        for pid, advantage in dict(llama["own_advantages"])[b]:  # on an unsure prompt, GSPO's own advantages
            if pid not in failed:
                assert advantage == pytest.approx(float(gspo[pid][seen[pid]]), abs=1e-5), (b, pid)
            seen[pid] += 1
    for layout in llama["layouts"]:  # the solo schedule: 2 updates of GSPO's 8 own rows, the other 2 skipped
        assert layout[2:] == [None, None] and [mb[0] for mb in layout[:2]] == [8, 8], layout


def test_options_are_recipe_settings(tmp_path, capsys):
    """YAML keys (run-wide, per agent) and command-line flags, parsed as `hacpo-train` parses a recipe."""
    from trl import TrlParser

    from hacpo_trl.launch.recipe import HACPOScriptArguments, check_recipe, load_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "agents:\n"
        "  - name: solo\n"
        "    model_name_or_path: unused\n"
        "    learn_from: [solo]\n"
        "    overrides: {peer_filter: correct}\n"
        "capability_gate: 0.9\n"
        f"output_dir: {tmp_path / 'out'}\n"
        "use_cpu: true\nbf16: false\nreport_to: none\n"
    )
    check_recipe(load_recipe(str(recipe)))
    parser = TrlParser((HACPOScriptArguments, HACPOConfig))
    _, cfg = parser.parse_args_and_config(["--config", str(recipe)])
    assert (cfg.learn_from, cfg.capability_gate, cfg.peer_filter) == ("none", 0.9, "correct")
    _, cfg = parser.parse_args_and_config(["--config", str(recipe), "--capability_gate", "0.5"])
    assert cfg.capability_gate == 0.5
    recipe.write_text(recipe.read_text().replace("    learn_from: [solo]\n", "") + "learn_from: all\n")
    _, cfg = parser.parse_args_and_config(["--config", str(recipe), "--learn_from", "none"])
    assert cfg.learn_from == "none"
    recipe.write_text(recipe.read_text().replace("learn_from: all\n", "learn_from: [solo]\n"))  # a YAML list
    _, cfg = parser.parse_args_and_config(["--config", str(recipe)])
    assert cfg.learn_from == "none"
    from hacpo_trl.launch.train import main

    assert main(["--config", str(recipe), "--learn_from", "solo,teacher"]) == 2  # stops before any model loads
    assert "hacpo-train: error: `learn_from` names unknown agent(s) ['teacher']" in capsys.readouterr().err


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_a_two_process_agent_that_learns_from_no_one(tmp_path, launch):
    """The learn-from-none path on an agent of 2 data-parallel ranks: both ranks take it together (the capability
    every decision reads is the same on all ranks), so no collective of the agent's world is left waiting. The
    other agent filters its peer rows (`peer_filter` differs per agent: no longer refused at start-up)."""
    launch(3, "train_agents.py", "--agents", "llama:2,qwen:1", "--out", str(tmp_path), "--steps", "4",
           "--override", '0:learn_from="none"', "--override", '1:peer_filter="correct"', SPREAD)  # fmt: skip
    runs = summaries(tmp_path)
    llama, qwen = [s for s in runs if s["agent"] == "llama0"], [s for s in runs if s["agent"] == "qwen1"]
    assert len(llama) == 2 and llama[0]["param_sum"] == llama[1]["param_sum"]  # DDP kept the ranks together
    for s in llama:
        assert s["trainable_changed"] == s["trainable"] and s["peer_rows_here"] == []
        assert _metric(s, "hacpo/learns_from/qwen1") == [0.0, 0.0]
    # both llama0 ranks' completions still reach qwen1, which (its own peer_filter) trains on the correct ones only:
    # the first of each group (`--first_of_group`), so 4 of the 8 of each batch, whatever was sampled
    kept, filtered = _metric(qwen[0], "hacpo/peer_rows"), _metric(qwen[0], "hacpo/peer_rows_filtered")
    assert kept == filtered == [4, 4]


def test_own_old_logps_leave_the_rng_untouched(tmp_path):
    """With one update per generation batch TRL computes no old log-probs, so HACPO runs a forward of its own for
    the records it shares; with dropout that forward draws random numbers, and the generations after it would no
    longer be GSPO's. It must leave the RNG as it found it."""
    from datasets import Dataset

    from hacpo_trl import HACPOTrainer
    from hacpo_trl.agents.tiny import char_tokenizer, tiny_llama

    tok = char_tokenizer()
    model = tiny_llama(tok, seed=1)
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    args = HACPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, **COMMON)
    trainer = HACPOTrainer(
        model=model, reward_funcs=_has_digit, args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 2}),
        processing_class=tok,
    )  # fmt: skip
    trainer.model.train()
    ids = torch.tensor([[5, 6, 7], [6, 7, 8]])
    batch = {"prompt_ids": ids, "prompt_mask": torch.ones_like(ids), "completion_ids": ids, "completion_mask": ids > 0}
    batch["completion_mask"] = batch["completion_mask"].long()
    state = torch.get_rng_state()
    first = trainer._own_old_logps(batch)
    assert torch.equal(torch.get_rng_state(), state)
    second = trainer._own_old_logps(batch)
    torch.testing.assert_close(first, second)  # the same draws: the RNG did not move
    with torch.no_grad():  # the same forward without the guard does draw (the test would catch a missing one)
        trainer._get_per_token_logps_and_entropies(trainer.model, torch.cat([ids, ids], 1), torch.ones(2, 6), 3)
    assert not torch.equal(torch.get_rng_state(), state)


def test_positive_filter_keeps_peer_rows_with_a_positive_advantage():
    """F-TIS-like: only peer rows the learner's baseline scores above 0. p0 is all-correct (advantage 0 by the
    uniform-group guard: `correct` keeps B's row, `positive` drops it); in p1, A has [1, 0] and B [1, 0]: with
    P̂_A = 0.25, P̂_B = 0.75, μ̂ = (1 + 0 + 1/3 + 0) / 4 = 1/3, so B's correct row has A > 0, its wrong one A < 0."""
    own = RolloutBatch("A", 0, 3, ["p0", "p0", "p1", "p1"], ["o"] * 4, [1.0, 1.0, 1.0, 0.0], [-1.0] * 4, [1] * 4,
                       [True] * 4)  # fmt: skip
    peer = RolloutBatch("B", 1, 3, ["p0", "p1", "p1"], ["12", "7", "8"], [1.0, 1.0, 0.0], [-0.5] * 3, [2] * 3,
                        [True] * 3)  # fmt: skip
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0])

    def rows(kind):
        return build_peer_rows(SELF_IDS, rewards, [own, peer], "A", ["A", "B"], CAPS, settings(peer_filter=kind), BPE)

    every, correct, positive = rows("all"), rows("correct"), rows("positive")
    sigma = torch.tensor([1.0, 0.0, 1.0, 0.0]).std().item()
    assert every.advantages == pytest.approx([0.0, (1 - 1 / 3) / (sigma + 1e-6), -1 / 3 / (sigma + 1e-6)], rel=1e-6)
    assert (correct.prompt_ids, correct.filtered) == (["p0", "p1"], 1)
    assert (positive.prompt_ids, positive.filtered) == (["p1"], 2)
    assert positive.advantages == [every.advantages[1]]
    assert torch.equal(positive.self_advantages, every.self_advantages)  # the baseline kept every row


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_skipped_updates_through_an_evaluation_and_an_engine_owned_schedule(tmp_path, launch):
    """A gated-off llama0 (P̂ 0.5 against qwen1's 0) skips updates 3 and 4 of each generation batch:

    - TRL's own evaluation (`eval_strategy: steps`, after every update) leaves the model in eval mode until TRL's
      training_step calls model.train(); the updates after it must still be skipped (they hold no rows: reaching
      TRL's loss was a TypeError);
    - with the schedule owned by the engine (DeepSpeed with a scheduler block, emulated: the Trainer's step is a
      no-op, the real one steps inside the update's backward call) a skipped update still advances it, as the
      Trainer's own schedule does on every other backend;
    - the logs say which updates were skipped (`hacpo/skipped_updates`) and give them no gradient norm."""
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "8", "--steps_per_generation", "4",
           "--zero_reward", "1", "--correct_on_rank0", "--eval_steps", "1", "--engine_scheduler",
           *[f"--override={i}:{k}={v}" for i in (0, 1) for k, v in [("capability_gate", "1.0"),
             ("capability_gate_confidence", "0.95"), ("solo_steps_per_generation", "2")]])  # fmt: skip
    llama, qwen = summaries(tmp_path)
    assert len(_metric(llama, "eval_loss")) == 8  # evaluated after every update, the skipped ones included
    assert _metric(llama, "hacpo/learns_from/qwen1") == [0.0, 0.0]
    assert _metric(qwen, "hacpo/learns_from/llama0") == [1.0, 1.0]
    losses = _metric(llama, "loss")
    assert len(losses) == 8 and losses[2::4] == losses[3::4] == [0.0, 0.0] and llama["global_step"] == 8
    assert _metric(llama, "hacpo/skipped_updates") == [0.0, 0.0, 1.0, 1.0] * 2
    assert [("grad_norm" in e) for e in llama["log_history"] if "loss" in e] == [True, True, False, False] * 2
    assert _metric(qwen, "hacpo/skipped_updates") == [0.0] * 8  # it learns from llama0: no update skipped
    assert llama["engine_schedule_steps"] == qwen["engine_schedule_steps"] == 8  # as the Trainer's 8 steps


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_a_log_that_ends_on_a_skipped_update_has_no_grad_norm(tmp_path, launch):
    """transformers logs the gradient norm of a log window's last update. llama0, gated off, skips updates 3 and 4
    of each generation batch; logged every 3 updates, the first window (updates 1–3) ends on a skipped update, whose
    norm would read 0 (DeepSpeed: the previous update's), so it has none; the second (4–6) ends on a real one."""
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "8", "--steps_per_generation", "4",
           "--zero_reward", "1", "--correct_on_rank0", "--logging_steps", "3",
           *[f"--override={i}:{k}={v}" for i in (0, 1) for k, v in [("capability_gate", "1.0"),
             ("capability_gate_confidence", "0.95"), ("solo_steps_per_generation", "2")]])  # fmt: skip
    llama, _ = summaries(tmp_path)
    assert _metric(llama, "hacpo/learns_from/qwen1") == [0.0, 0.0]
    windows = [e for e in llama["log_history"] if "loss" in e]
    assert [e["step"] for e in windows] == [3, 6]
    assert [e["hacpo/skipped_updates"] for e in windows] == [1.0, 1.0]
    assert ["grad_norm" in e for e in windows] == [False, True]


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_a_solo_learner_computes_reference_log_probs_in_the_gspo_baselines_chunks(tmp_path, launch):
    """With `beta` > 0 TRL's reference pass chunks a generation batch by `per_device_train_batch_size`: 2 rows in
    the sharing schedule (4 updates of 8 own rows), 4 in the GSPO baseline's (2 updates). A learner with
    `solo_steps_per_generation: 2` computes it in GSPO's 4-row chunks, as its old log-probs (on a GPU a forward's
    shape can change the last bits); a learner without it keeps TRL's 2."""
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "8", "--steps_per_generation", "4",
           "--record_forwards", "--override", '0:learn_from="none"', "--override", "0:solo_steps_per_generation=2",
           *[f"--override={i}:beta=0.04" for i in (0, 1)])  # fmt: skip
    llama, qwen = summaries(tmp_path)
    assert _metric(llama, "hacpo/learns_from/qwen1") == [0.0, 0.0]
    for summary, rows in ((llama, 4), (qwen, 2)):
        ref = [f[1] for f in summary["forwards"] if f[0] == "ref_logps"]
        assert ref == [rows] * (2 * 8 // rows), summary["agent"]  # 2 generation batches of 8 own rows
        assert [f[1] for f in summary["forwards"] if f[0] == "old_logps"] == ref


@pytest.mark.launch
@pytest.mark.timeout(900)
@pytest.mark.parametrize("accumulation", [1, 2])
def test_a_solo_batch_keeps_old_log_probs_exactly_when_the_gspo_baseline_computes_them(tmp_path, launch, accumulation):
    """TRL computes old log-probs unless a generation batch makes exactly one update (no vLLM weights). The sharing
    schedule here (4 micro-batches) makes 4 or 2 updates, so TRL computes them; a solo batch of llama0 (learns from
    no one, `solo_steps_per_generation: 2`) makes 2 updates of 1 micro-batch, where GSPO with that schedule computes
    them too, or with 2 micro-batches per update 1 update, where GSPO computes none and its ratio is exactly 1: then
    its micro-batches hold none either."""
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", str(8 // accumulation),
           "--steps_per_generation", "4", "--gradient_accumulation_steps", str(accumulation), "--record_layout",
           "--override", '0:learn_from="none"', "--override", "0:solo_steps_per_generation=2")  # fmt: skip
    llama, _ = summaries(tmp_path)
    assert _metric(llama, "hacpo/learns_from/qwen1") == [0.0, 0.0]
    kept = int(accumulation == 1)
    assert llama["layouts"] == [[[4, 0, 0, kept], [4, 0, 0, kept], None, None]] * 2


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_updates_without_gradients_step_through_a_grad_scaler(tmp_path, launch):
    """fp16 mixed precision (on an accelerator, without DeepSpeed) steps through torch's GradScaler, which fails an
    optimizer step that has no gradient to check ("No inf checks were recorded for this optimizer"). With the scaler
    accelerate would make (set by the test: accelerate refuses fp16 on the CPU):

    - llama0, gated off (P̂ 0.5 against qwen1's 0), skips updates 3 and 4 of each generation batch: they leave its
      weights alone;
    - qwen1 learns from llama0 but its band (width 1e-6) keeps no peer row, so with `skip_empty_updates` its updates
      of peer rows only (3 and 4: own rows first) have no gradient and take no step.

    Both finish all 8 steps, qwen1's own rows train (below llama0's rewards in its joint baseline), and the scaler is
    enabled again with its scale as it started (no inf was ever found)."""
    launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "8", "--steps_per_generation", "4",
           "--zero_reward", "1", "--correct_on_rank0", "--trace_params", "--grad_scaler",
           "--override", "1:peer_delta=1e-6", "--override", "1:skip_empty_updates=true",
           *[f"--override={i}:{k}={v}" for i in (0, 1) for k, v in [("capability_gate", "1.0"),
             ("capability_gate_confidence", "0.95"), ("solo_steps_per_generation", "2")]])  # fmt: skip
    llama, qwen = summaries(tmp_path)
    assert _metric(llama, "hacpo/learns_from/qwen1") == [0.0, 0.0]
    assert _metric(qwen, "hacpo/learns_from/llama0") == [1.0, 1.0]
    # every completion of llama0 on qwen1's 4 prompts is a row (the paper's rule), none in the band
    assert _metric(qwen, "hacpo/peer_ratio_in_band") == [0.0, 0.0] and _metric(qwen, "hacpo/peer_rows") == [8, 8]
    for s in (llama, qwen):
        assert s["global_step"] == 8 and s["grad_scaler"] == {"enabled": True, "scale": 2.0**10}
        trace = s["param_trace"]
        for b in (0, 1):  # updates 3 and 4 of each batch take no step
            assert trace[4 * b + 1] == trace[4 * b + 2] == trace[4 * b + 3], (s["agent"], trace)
    assert qwen["param_trace"][4] != qwen["param_trace"][3]  # the next batch's first update trains


def test_an_update_without_gradients_clears_deepspeeds_stale_overflow_flag():
    """Under DeepSpeed fp16 the Trainer reads `optimizer_step_was_skipped` from the engine optimizer's `overflow`,
    which only a real step sets: after an overflowed update, a skipped one would read as skipped too and the
    Trainer's schedule would not step. `_update_without_gradients` clears it (DeepSpeed's optimizer wrapper, emulated
    around a plain object); any other optimizer, and a flag already clear, are left alone."""
    from types import SimpleNamespace

    from accelerate.utils.deepspeed import DeepSpeedOptimizerWrapper

    from hacpo_trl.trainer import HACPOTrainer

    engine_optimizer = SimpleNamespace(overflow=True)
    wrapper = object.__new__(DeepSpeedOptimizerWrapper)  # its __init__ needs an initialized Accelerator
    wrapper.optimizer, wrapper.__has_overflow__ = engine_optimizer, True  # as __init__ sets them
    trainer = object.__new__(HACPOTrainer)
    trainer.accelerator = SimpleNamespace(scaler=None)
    trainer.optimizer = wrapper
    assert trainer.optimizer.step_was_skipped  # what the Trainer would read at the skipped update
    trainer._update_without_gradients()
    assert engine_optimizer.overflow is False and not trainer.optimizer.step_was_skipped
    other = SimpleNamespace(optimizer=SimpleNamespace(overflow=True))  # not DeepSpeed's: untouched
    trainer.optimizer = other
    trainer._update_without_gradients()
    assert other.optimizer.overflow is True


def test_a_rescue_batch_counts_only_the_updates_it_makes_in_the_stepwise_bound():
    """m of Eq. 14 in the trainer: 4 micro-batches per iteration, 2 iterations, 1 micro-batch per update. A batch
    with peer rows makes every update (m = micro-step); a rescue batch on the solo schedule (2 of 4) makes micro-steps
    0, 1, 4, 5, which are its updates 0, 1, 2, 3."""
    from hacpo_trl.run.schedule import plan_batch

    for rescue, expected in ((False, [0, 1, 4, 5]), (True, [0, 1, 2, 3])):
        plan = plan_batch(8, peers=True, few_prompts=rescue, steps_per_generation=4, solo_micro_batches=2, iterations=2)
        got = []
        for step in (0, 1, 4, 5):
            got.append(plan.update_index(step, gradient_accumulation_steps=1))
        assert got == expected


@pytest.mark.parametrize(
    "accumulation, steps_per_generation, expected",
    [(2, 4, [0, 1, 2]), (8, 4, [0, 1, 2, 3, 4, 5]), (1, 2, [0, 1, 2])],
    ids=["2-updates-per-batch", "2-batches-per-update", "no-accumulation"],
)
def test_the_gate_warmup_counts_generation_batches_whatever_the_accumulation(
    accumulation, steps_per_generation, expected
):
    """`schedule.batches_seen` gives the gate the generation batches seen before this one, at each new batch (TRL's
    micro-step `_step` a multiple of `steps_per_generation`, `global_step` the updates finished): with 8 micro-batches
    per update and 4 per batch, two batches share an update, and the second has seen one batch, not zero."""
    from hacpo_trl.run.schedule import batches_seen

    seen = []
    for batch in range(len(expected)):
        step = batch * steps_per_generation  # TRL's micro-step when this batch is generated
        seen.append(batches_seen(step // accumulation, step, accumulation, steps_per_generation))
    assert seen == expected
