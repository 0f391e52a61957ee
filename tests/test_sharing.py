"""`hacpo_trl.sharing.decision` and `hacpo_trl.run.schedule` without a trainer: a learner's settings, its decision at a generation
batch, and how that batch is cut into micro-batches and updates, all by hand."""

import pytest

from hacpo_trl.config import SHARED_SETTINGS
from hacpo_trl.launch.probe import SHARING_OPTIONS
from hacpo_trl.run.exchange import RolloutBatch
from hacpo_trl.run.schedule import BatchPlan, UpdateState, own_rows_chunk, plan_batch, solo_fits, updates_within_batches
from hacpo_trl.sharing.decision import (
    LEARNER_SETTINGS,
    PEER_LIMITS,
    RUN_WIDE_SETTINGS,
    PeerDecision,
    SharingSettings,
    decide,
    rescued_prompts,
    unsure_prompts,
)
from hacpo_trl.training.model_card import CARD_SETTINGS

AGENTS = ["A", "B", "C"]
CAPS = {"A": 0.5, "B": 0.25, "C": 0.75}
ROWS = dict.fromkeys(AGENTS, 64)


def _records(rows_by_agent):
    """One rank's records per agent, from (prompt id, reward) pairs."""
    out = []
    for rank, (agent, rows) in enumerate(rows_by_agent.items()):
        pids, rewards = map(list, zip(*rows, strict=True))
        n = len(pids)
        out.append(RolloutBatch(agent, rank, 0, pids, ["t"] * n, rewards, [-0.5] * n, [2] * n, [True] * n))
    return out


# A failed p0 at every completion and solved p1; B solved p0 once; C solved p1 only.
RECORDS = _records({
    "A": [("p0", 0.0), ("p0", 0.0), ("p1", 1.0), ("p1", 0.0)],
    "B": [("p0", 1.0), ("p0", 0.0), ("p1", 1.0), ("p1", 1.0)],
    "C": [("p0", 0.0), ("p0", 0.0), ("p1", 1.0), ("p1", 0.0)],
})  # fmt: skip


def _settings(**kwargs):
    return SharingSettings(**kwargs)


# ------------------------------------------------------------------------------------------ the settings


def test_the_settings_are_the_lists_other_modules_read():
    """The card lists every learner setting in the dataclass's order, the probe names the three that choose whom a
    learner learns from, and none of them has to agree across agents (the run-wide sharing settings must)."""
    assert LEARNER_SETTINGS == (
        "peer_filter", "learn_from", "capability_gate", "capability_gate_warmup", "capability_gate_confidence",
        "capability_gate_rescue", "peer_fade_steps", "solo_steps_per_generation", "skip_empty_updates", "band_gate",
        "peer_prompts", "taught_ratio_floor", "taught_schedule", "taught_baseline", "taught_scale", "taught_cap",
        "taught_failed_rate", "peer_negatives",
    )  # fmt: skip
    start = CARD_SETTINGS.index("peer_filter")
    assert CARD_SETTINGS[start : start + len(LEARNER_SETTINGS)] == LEARNER_SETTINGS
    assert PEER_LIMITS == SHARING_OPTIONS == ("learn_from", "capability_gate", "peer_fade_steps", "peer_prompts")
    assert not set(LEARNER_SETTINGS) & set(SHARED_SETTINGS)
    assert set(RUN_WIDE_SETTINGS) <= set(SHARED_SETTINGS)


def test_settings_from_a_configs_values_take_the_learner_fields_and_check_them_in_context():
    values = {**dict.fromkeys(LEARNER_SETTINGS), "peer_filter": "correct", "learn_from": "B", "capability_gate": 1.0}
    values.update(capability_gate_warmup=2, capability_gate_confidence=0.0, capability_gate_rescue=True)
    values.update(peer_fade_steps=0, band_gate=False, naive=False, peer_clipping=True, capability_metric="accuracy")
    values.update(peer_prompts="all", taught_ratio_floor=0.2, taught_schedule="sharing", taught_baseline="joint")
    values.update(taught_scale=1.0, taught_cap=0, taught_failed_rate=0.0, peer_negatives="none")
    settings = SharingSettings.from_values(values)
    assert (settings.peer_filter, settings.learn_from, settings.capability_gate_warmup) == ("correct", "B", 2)
    with pytest.raises(ValueError, match=r"^agent 'a': `band_gate` closes a peer .* no band"):
        SharingSettings.from_values({**values, "band_gate": True, "peer_clipping": False}, "agent 'a': ")
    with pytest.raises(ValueError, match=r"`capability_gate_confidence` tests accuracies"):
        SharingSettings.from_values({**values, "capability_gate_confidence": 0.9, "capability_metric": "mean_reward"})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"peer_filter": "best"}, r"`peer_filter` must be one of \('all', 'correct', 'positive'\), got 'best'"),
        ({"capability_gate": True}, r"`capability_gate` must be a finite number >= 0, got True"),
        ({"capability_gate_warmup": 3}, r"keeps the capability gate closed for the first 3 generation batches"),
        ({"capability_gate": 1.0, "capability_gate_confidence": 0.4}, r"must be 0 \(off\) or in \[0.5, 1\), got 0.4"),
        ({"capability_gate": 1.0, "capability_gate_rescue": "yes"}, r"must be true or false, got 'yes'"),
        ({"peer_fade_steps": -1}, r"`peer_fade_steps` must be an integer >= 0, got -1"),
    ],
)
def test_bad_settings_are_refused_where_they_are_made(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SharingSettings(**kwargs)


# ------------------------------------------------------------------------------------------ the decision


def test_decide_opens_peers_by_learn_from_and_the_gate_by_hand():
    """P̂: A 0.5, B 0.25, C 0.75. No gate: A learns from B and C. Gate 1: only C (0.75 >= 0.5); gate 0.5 also B
    (0.25 >= 0.25). `learn_from: B` with gate 1: no one, so A trains alone (solo)."""
    assert decide(_settings(), "A", AGENTS, CAPS, ROWS, 0, 0) == PeerDecision(("B", "C"), {}, 1.0)
    assert decide(_settings(capability_gate=1.0), "A", AGENTS, CAPS, ROWS, 0, 0).open == ("C",)
    assert decide(_settings(capability_gate=0.5), "A", AGENTS, CAPS, ROWS, 0, 0).open == ("B", "C")
    alone = decide(_settings(learn_from="B", capability_gate=1.0), "A", AGENTS, CAPS, ROWS, 0, 0)
    assert alone.open == () and alone.solo and not alone.few_prompts


def test_decide_keeps_every_peer_closed_during_the_warmup():
    settings = _settings(capability_gate=1.0, capability_gate_warmup=2)
    assert [decide(settings, "A", AGENTS, CAPS, ROWS, seen, 0).open for seen in (0, 1, 2)] == [(), (), ("C",)]


def test_decide_fades_the_peers_weight_and_closes_every_peer_at_zero():
    """`peer_fade_steps: 8`: weight 1 - t/8 after t optimizer steps (0.5 at 4); at 8 no peer is open, and nothing is
    rescued. Outside training the weight is 1."""
    settings = _settings(peer_fade_steps=8, capability_gate=1.0, capability_gate_rescue=True)
    half = decide(settings, "A", AGENTS, CAPS, ROWS, 5, 4, RECORDS)
    assert half.weight == 0.5 and half.open == ("C",)
    gone = decide(settings, "A", AGENTS, CAPS, ROWS, 5, 8, RECORDS)
    assert gone == PeerDecision((), {}, 0.0) and gone.solo
    assert decide(settings, "A", AGENTS, CAPS, ROWS, 5, 8, RECORDS, training=False).weight == 1.0


def test_decide_rescues_the_prompts_a_closed_peer_solved_and_the_learner_failed():
    """Gate 1 closes B for A (0.25 < 0.5). A failed p0 at both completions and B solved it once: B lends its rows on
    p0 only. C is open, so the batch is not a rescue-only one. With C outside `learn_from`, B's p0 is all A gets:
    rescue-only, on the solo schedule. Outside training nothing is rescued."""
    settings = _settings(capability_gate=1.0, capability_gate_rescue=True)
    both = decide(settings, "A", AGENTS, CAPS, ROWS, 0, 0, RECORDS)
    assert both.open == ("C",) and both.rescued == {"B": frozenset({"p0"})}
    assert both.involved == ("C", "B") and not both.few_prompts and both.only_prompts() == {"B": {"p0"}}
    assert both.rows_args() == (("C", "B"), {"B": {"p0"}}, 1.0, frozenset(), {})
    only_b = decide(_settings(learn_from="B", capability_gate=1.0, capability_gate_rescue=True), "A", AGENTS, CAPS,
                    ROWS, 0, 0, RECORDS)  # fmt: skip
    assert only_b.open == () and only_b.involved == ("B",) and only_b.few_prompts and not only_b.solo
    assert decide(settings, "A", AGENTS, CAPS, ROWS, 0, 0, RECORDS, training=False).rescued == {}
    # B is the weakest: A and C are open to it, and no closed peer is left to rescue from
    assert decide(settings, "B", AGENTS, CAPS, ROWS, 0, 0, RECORDS).rescued == {}


def test_the_band_gate_closes_the_involved_peers_with_no_row_in_the_band():
    """C open and B rescuing p0; C has 3 rows in the band, B none: B closes (its rescued prompts emptied, kept for the
    log). If C has none either, the learner learns from no one."""
    decision = PeerDecision(("C",), {"B": frozenset({"p0"})}, 0.5)
    closed = decision.close_outside_band({"C": 3, "B": 0})
    assert closed == PeerDecision(("C",), {"B": frozenset()}, 0.5)
    assert closed.involved == ("C",) and closed.only_prompts() == {}
    assert decision.close_outside_band({"C": 0, "B": 0}).solo
    assert decision.close_outside_band({"C": 0, "B": 1}).few_prompts


def test_a_peer_limited_to_some_prompts_enters_only_those():
    """`PeerDecision.prompts` limits an open peer to some prompts (the hook for per-prompt options)."""
    decision = PeerDecision(("B", "C"), {}, 1.0, {"C": frozenset({"p1"})})
    assert decision.only_prompts() == {"C": {"p1"}} and decision.involved == ("B", "C")
    assert decision.close_outside_band({"B": 2, "C": 0}).only_prompts() == {}


# ------------------------------------------------------------------------------------------ the schedule


def test_a_batch_plan_by_hand():
    """`steps_per_generation: 4`, 2 iterations (8 micro-steps per batch). With peers every micro-batch is made.
    Without peers and `solo_steps_per_generation: 2`: micro-steps 2, 3, 6, 7 are skipped, never 0 (it generates)."""
    shared = plan_batch(16, peers=True, few_prompts=False, steps_per_generation=4, solo_micro_batches=2, iterations=2)
    assert shared == BatchPlan(16, 4, 4, 2, solo=False, few_prompts=False)
    assert [s for s in range(16) if shared.skips(s)] == []
    solo = plan_batch(16, peers=False, few_prompts=False, steps_per_generation=4, solo_micro_batches=2, iterations=2)
    assert solo.solo and solo.micro_batches == 2 and solo.generate_every == 8
    assert [s for s in range(16) if solo.skips(s)] == [2, 3, 6, 7, 10, 11, 14, 15]
    assert [s for s in range(16) if solo.ends_batch(s)] == [7, 15]
    rescue = plan_batch(16, peers=True, few_prompts=True, steps_per_generation=4, solo_micro_batches=2, iterations=2)
    assert rescue.micro_batches == 2 and not rescue.solo
    assert [rescue.update_index(s, 1) for s in (0, 1, 4, 5, 8)] == [0, 1, 2, 3, 0]
    assert [shared.update_index(s, 2) for s in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_schedule_rules_by_hand():
    assert own_rows_chunk(32, 2, 8) == 16 and own_rows_chunk(30, 4, 8) == 8  # 30 rows do not cut into 4: TRL's 8
    assert solo_fits(2, 4, 2) and solo_fits(4, 4, 1)
    assert not solo_fits(3, 4, 1) and not solo_fits(1, 4, 2)  # 3 does not divide 4; 1 micro-batch is half an update
    assert updates_within_batches(4, 2) and updates_within_batches(4, 8) and updates_within_batches(4, 4)
    assert not updates_within_batches(4, 3) and not updates_within_batches(6, 4)


def test_update_state_says_whether_an_update_may_step_and_resets():
    state = UpdateState()
    assert state.take_has_rows()  # no HACPO loss ran (a solo batch): the update steps
    state.has_rows = False
    assert not state.take_has_rows() and state.has_rows is None
    state.has_rows = True
    assert state.take_has_rows()


# ------------------------------------------------------------------------------------------ per prompt


def test_better_prompts_by_hand():
    """Success rates per prompt over every rank's records (NaN rewards not scored): the peer's rows are kept only
    where its rate is above the learner's; ties and groups that both fail keep nothing."""
    from hacpo_trl.sharing.decision import better_prompts

    nan = float("nan")
    records = _records({
        "A": [("p0", 0.0), ("p0", 0.0), ("p1", 1.0), ("p1", 0.0), ("p2", 0.0), ("p2", 0.0), ("p3", 1.0), ("p3", nan)],
        "B": [("p0", 1.0), ("p0", 0.0), ("p1", 1.0), ("p1", 0.0), ("p2", 0.0), ("p2", 0.0), ("p3", 1.0), ("p3", 1.0)],
        "C": [("p0", 0.0), ("p0", 0.0), ("p1", 1.0), ("p1", 1.0), ("p2", 1.0), ("p2", nan), ("p3", 1.0), ("p3", 0.0)],
    })  # fmt: skip
    records += _records({"A": [("p4", 0.0)], "B": [("p4", 1.0)]})  # a second rank: A 0/1 and B 1/1 on p4
    # A's rates: p0 0, p1 1/2, p2 0, p3 1/1 (the NaN row unscored), p4 0; B: 1/2, 1/2, 0, 1, 1; C: 0, 1, 1/1, 1/2
    assert better_prompts(records, "A", ["B", "C"]) == {"B": {"p0", "p4"}, "C": {"p1", "p2"}}
    assert better_prompts(records, "B", ["A"]) == {"A": set()}  # A is never above B


def test_decide_with_peer_prompts_keeps_each_peer_only_where_it_did_better():
    """`peer_prompts: better`: B did better than A on p0 (1/2 against 0) and p1 (1 against 1/2), C on nothing (ties,
    RECORDS): B is open on those two
    with taught rows, C leaves, whatever the overall P̂ (B is the weaker). A gate still closes a peer; a batch where
    no peer does better is learned from no one; outside training every open peer enters everywhere."""
    settings = _settings(peer_prompts="better")
    decision = decide(settings, "A", AGENTS, CAPS, ROWS, 0, 0, RECORDS)
    assert decision.open == ("B",) and decision.prompts == {"B": frozenset({"p0", "p1"})}
    assert decision.taught == {"B"} and decision.batch_prompts == 2
    assert decision.rows_args() == (("B",), {"B": {"p0", "p1"}}, 1.0, frozenset({"B"}), {})
    assert not decision.solo and not decision.few_prompts
    gated = decide(_settings(peer_prompts="better", capability_gate=1.0), "A", AGENTS, CAPS, ROWS, 0, 0, RECORDS)
    assert gated.solo  # the gate closes B (0.25 < 0.5); C is open but better nowhere
    assert decide(settings, "C", AGENTS, CAPS, ROWS, 0, 0, RECORDS).open == ("B",)  # B also beats C on p0
    assert decide(settings, "A", AGENTS, CAPS, ROWS, 0, 0, RECORDS, training=False).open == ("B", "C")
    # the band gate counts a taught peer's rows at or above the floor (peers_in_band): none there closes it
    assert decision.close_outside_band({"B": 2}) == decision
    assert decision.close_outside_band({"B": 0}).solo
    with pytest.raises(ValueError, match="`peer_prompts` must be one of \\('all', 'better', 'failed'\\), got 'some'"):
        _settings(peer_prompts="some")
    for floor in (-0.1, 1.0, True, "0.2"):
        with pytest.raises(ValueError, match=r"`taught_ratio_floor` must be a number in \[0, 1\), got "):
            _settings(peer_prompts="better", taught_ratio_floor=floor)
    assert _settings(peer_prompts="better", taught_ratio_floor=0).taught_ratio_floor == 0


def test_decide_with_peer_prompts_failed_keeps_each_peer_only_where_the_learner_failed_entirely():
    """`peer_prompts: failed`: A failed p0 at both completions and B solved it once, so B teaches A p0 only; on p1
    B did better than A (1 against 1/2) but A solved it once, so A keeps GSPO's signal there (`better` would teach
    p1 too). C solved nothing A failed: it leaves. Taught rows as with `better`, on the solo schedule if asked."""
    decision = decide(_settings(peer_prompts="failed"), "A", AGENTS, CAPS, ROWS, 0, 0, RECORDS)
    assert decision.open == ("B",) and decision.prompts == {"B": frozenset({"p0"})} and decision.taught == {"B"}
    assert decision.batch_prompts == 2 and not decision.few_prompts
    assert decide(_settings(peer_prompts="better"), "A", AGENTS, CAPS, ROWS, 0, 0, RECORDS).prompts["B"] == {"p0", "p1"}
    assert decide(_settings(peer_prompts="failed"), "B", AGENTS, CAPS, ROWS, 0, 0, RECORDS).solo  # B failed nothing
    solo = decide(_settings(peer_prompts="failed", taught_schedule="solo"), "A", AGENTS, CAPS, ROWS, 0, 0, RECORDS)
    assert solo.few_prompts and solo.prompts == decision.prompts


def test_taught_schedule_solo_keeps_a_batch_of_taught_rows_on_the_solo_schedule():
    """`taught_schedule: solo`: the decision of the test above, now cut as a batch learned from no one (2 updates of
    own and taught rows interleaved, not 4 with own rows first); a batch with an open peer on every prompt, or a
    rescued prompt beside an open peer, keeps the sharing schedule as before. Refused without taught rows."""
    decision = decide(_settings(peer_prompts="better", taught_schedule="solo"), "A", AGENTS, CAPS, ROWS, 0, 0, RECORDS)
    assert decision.open == ("B",) and decision.taught == {"B"} and decision.few_prompts and not decision.solo
    assert decision.close_outside_band({"B": 1}).few_prompts and decision.close_outside_band({"B": 0}).solo
    plan = plan_batch(16, True, decision.few_prompts, steps_per_generation=4, solo_micro_batches=2, iterations=1)
    assert plan == BatchPlan(16, 2, 4, 1, solo=False, few_prompts=True)
    assert not decide(_settings(), "A", AGENTS, CAPS, ROWS, 0, 0, RECORDS).few_prompts  # B and C open everywhere
    with pytest.raises(
        ValueError,
        match=r"`taught_schedule: solo` acts on taught rows, and `peer_prompts` is 'all' .* or taught_schedule 'sharing'",
    ):
        _settings(taught_schedule="solo")
    with pytest.raises(ValueError, match=r"`taught_schedule` must be one of \('sharing', 'solo'\), got 'paper'"):
        _settings(peer_prompts="better", taught_schedule="paper")
    with pytest.raises(ValueError, match=r"`taught_baseline: own` acts on taught rows, and `peer_prompts` is 'all'"):
        _settings(taught_baseline="own")
    with pytest.raises(ValueError, match=r"`taught_baseline` must be one of \('joint', 'own'\), got 'self'"):
        _settings(peer_prompts="failed", taught_baseline="self")
    assert _settings(peer_prompts="failed", taught_baseline="own").taught_baseline == "own"
    for scale in (0, -0.5, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match=r"`taught_scale` must be a number in \(0, 1\], got "):
            _settings(peer_prompts="failed", taught_scale=scale)
    with pytest.raises(ValueError, match=r"`taught_scale: 0.5` acts on taught rows, .* or taught_scale 1$"):
        _settings(taught_scale=0.5)
    assert _settings(peer_prompts="failed", taught_scale=0.5).taught_scale == 0.5


def test_taught_failed_rate_counts_a_prompt_solved_at_most_that_often_as_failed():
    """`taught_failed_rate: 0.125`: A solved q0 once in 8 (a rate of 1/8, now failed), q1 twice (2/8, not), q2 never
    (failed at any rate), and q3 once in 4 scored completions (1/4: its 4 unscorable ones do not count). B solved
    each once, so it teaches q0 and q2; at 0 (the default) q2 alone, as before."""
    nan = float("nan")
    records = _records({
        "A": [("q0", 1.0)] + [("q0", 0.0)] * 7 + [("q1", 1.0)] * 2 + [("q1", 0.0)] * 6 + [("q2", 0.0)] * 8
        + [("q3", 1.0)] + [("q3", 0.0)] * 3 + [("q3", nan)] * 4,
        "B": [(q, 1.0) for q in ("q0", "q1", "q2", "q3")],
        "C": [(q, 0.0) for q in ("q0", "q1", "q2", "q3")],
    })  # fmt: skip
    assert rescued_prompts(records, "A", ["B", "C"], 0.125) == {"B": {"q0", "q2"}, "C": set()}
    assert rescued_prompts(records, "A", ["B", "C"]) == {"B": {"q2"}, "C": set()}
    assert rescued_prompts(records, "A", ["B"], 0.25) == {"B": {"q0", "q1", "q2", "q3"}}
    wide = decide(_settings(peer_prompts="failed", taught_failed_rate=0.125), "A", AGENTS, CAPS, ROWS, 0, 0, records)
    assert wide.open == ("B",) and wide.prompts == {"B": frozenset({"q0", "q2"})} and wide.taught == {"B"}
    assert decide(_settings(peer_prompts="failed"), "A", AGENTS, CAPS, ROWS, 0, 0, records).prompts["B"] == {"q2"}
    for rate in (-0.1, 1, 1.5, True, "0.1"):
        with pytest.raises(ValueError, match=r"`taught_failed_rate` must be a number in \[0, 1\), got "):
            _settings(peer_prompts="failed", taught_failed_rate=rate)
    for prompts in ("all", "better"):
        with pytest.raises(ValueError, match=rf"is '{prompts}': set peer_prompts 'failed', or taught_failed_rate 0$"):
            _settings(peer_prompts=prompts, taught_failed_rate=0.125)


def test_taught_cap_is_checked_with_the_other_taught_settings():
    assert _settings(peer_prompts="failed", peer_filter="correct", taught_cap=4).taught_cap == 4
    for cap in (-1, float("inf"), float("nan"), True, "4"):
        with pytest.raises(ValueError, match=r"`taught_cap` must be a finite number >= 0 \(0: no cap\), got "):
            _settings(peer_prompts="failed", taught_cap=cap)
    with pytest.raises(ValueError, match=r"`taught_cap: 4` acts on taught rows, .* or taught_cap 0$"):
        _settings(taught_cap=4)
    with pytest.raises(ValueError, match=r"`peer_filter: positive` picks rows by advantage: .* or taught_cap 0$"):
        _settings(peer_prompts="failed", peer_filter="positive", taught_cap=4)


def test_unsure_prompts_are_those_solved_sometimes_above_the_failed_rate():
    """`peer_negatives: unsure` at `taught_failed_rate: 0.125`: A solved q0 once in 8 (failed: taught, not unsure), q1
    twice (unsure), q2 never (failed), q3 at every completion (solved), q4 three times in 4 scored (its NaNs do not
    count). B wrote a wrong row on each; C only right rows, so it gives negatives nowhere."""
    nan = float("nan")
    records = _records({
        "A": [("q0", 1.0)] + [("q0", 0.0)] * 7 + [("q1", 1.0)] * 2 + [("q1", 0.0)] * 6 + [("q2", 0.0)] * 8
        + [("q3", 1.0)] * 8 + [("q4", 1.0)] * 3 + [("q4", 0.0)] + [("q4", nan)] * 4,
        "B": [(q, 0.0) for q in ("q0", "q1", "q2", "q3", "q4")] + [("q2", 1.0)],
        "C": [(q, 1.0) for q in ("q0", "q1", "q2", "q3", "q4")],
    })  # fmt: skip
    assert unsure_prompts(records, "A", ["B", "C"], 0.125) == {"B": {"q1", "q4"}, "C": set()}
    assert unsure_prompts(records, "A", ["B"]) == {"B": {"q0", "q1", "q4"}}  # at 0 one success is enough
    settings = _settings(peer_prompts="failed", taught_failed_rate=0.125, peer_negatives="unsure")
    decision = decide(settings, "A", AGENTS, CAPS, ROWS, 0, 0, records)
    # B teaches q2 (failed, it solved it once) and gives negatives on q1 and q4; C teaches q0 and q2
    assert decision.open == ("B", "C") and decision.taught == {"B", "C"}
    assert decision.prompts == {"B": {"q2"}, "C": {"q0", "q2"}} and decision.negatives == {"B": {"q1", "q4"}}
    assert decision.only_prompts() == {"B": {"q1", "q2", "q4"}, "C": {"q0", "q2"}}
    assert decision.rows_args()[4] == {"B": {"q1", "q4"}}
    # a peer that gives negatives only is open for them; the band gate closes it with its negatives
    only_negatives = decide(settings, "A", ["A", "B"], CAPS, ROWS, 0, 0, [r for r in records if r.agent != "C"])
    assert only_negatives.open == ("B",) and only_negatives.negatives == {"B": {"q1", "q4"}}
    closed = decision.close_outside_band({"B": 0, "C": 3})
    assert closed.open == ("C",) and closed.negatives == {} and closed.rows_args()[4] == {}
    # off (the default): exactly the preset's decision
    plain = decide(_settings(peer_prompts="failed", taught_failed_rate=0.125), "A", AGENTS, CAPS, ROWS, 0, 0, records)
    assert plain.negatives == {} and plain.prompts == decision.prompts and plain.open == ("B", "C")


def test_peer_negatives_is_checked():
    assert _settings(peer_prompts="failed", peer_negatives="unsure").peer_negatives == "unsure"
    assert _settings().peer_negatives == "none"
    with pytest.raises(ValueError, match=r"`peer_negatives` must be one of \('none', 'unsure'\), got 'all'"):
        _settings(peer_prompts="failed", peer_negatives="all")
    for prompts in ("all", "better"):
        with pytest.raises(ValueError, match=rf"is '{prompts}': set peer_prompts 'failed', or peer_negatives 'none'$"):
            _settings(peer_prompts=prompts, peer_negatives="unsure")
