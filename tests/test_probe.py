"""`hacpo-probe`: the numbers it reports (hand-worked), its red flags, that its peer ratios are the trainer's own,
and two real launches: the state pair (every field) and SmolLM2 + tiny-llama (no peer row in the band)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from hacpo_trl.launch.probe import _my_prompts, agent_stats, flags, generation_backend, pair_stats, render
from hacpo_trl.sharing.presets import SHARING_PRESETS
from helpers import accelerate_launch, seeded

ROOT = Path(__file__).resolve().parents[1]


def test_pair_stats_by_hand():
    # band [0.8, 1]: 0.5 below; 0.8, 0.9, 1.0 in; 1.2 above; the row at 0.9 is not valid (no loss)
    ratios = [0.5, 0.8, 0.9, 1.0, 1.2]
    correct = [True, False, False, True, True]
    valid = [True, True, False, True, True]
    s = pair_stats(ratios, correct, valid, 0.8, omega=0.5)
    assert s["rows"] == 5 and s["omega"] == 0.5
    assert s["ratio"] == pytest.approx({"q1": 0.8, "median": 0.9, "q3": 1.0})
    assert s["all"] == pytest.approx({"rows": 5, "median": 0.9, "below": 0.2, "in_band": 0.6, "above": 0.2})
    assert s["correct"] == pytest.approx({"rows": 3, "median": 1.0, "below": 1 / 3, "in_band": 1 / 3, "above": 1 / 3})
    assert s["wrong"] == pytest.approx({"rows": 2, "median": 0.85, "below": 0.0, "in_band": 1.0, "above": 0.0})
    assert s["would_train"] == 2  # 0.8 (wrong) and 1.0 (correct); 0.9 is in band but invalid
    assert s["wrong_share_of_would_train"] == pytest.approx(0.5)
    empty = pair_stats([], [], [], 0.8, omega=1.0)
    assert empty["rows"] == 0 and empty["would_train"] == 0 and empty["wrong_share_of_would_train"] is None


def _report(pairs, agents):
    return {
        "prompts": 4,
        "num_generations": 8,
        "max_completion_length": 40,
        "backend": "transformers generate",
        "peer_filter": None,
        "band": [0.8, 1.0],
        "agents": agents,
        "pairs": pairs,
    }


def test_flags_are_sentences_with_their_numbers():
    far = {"learner": "smol", "generator": "tiny", **pair_stats([0.004, 0.003, 0.01], [1, 0, 0], [1, 1, 1], 0.8, 2.0)}
    wrong = {"learner": "big", "generator": "small", **pair_stats([0.9] * 4, [0, 0, 0, 1], [1] * 4, 0.8, 0.5)}
    fine = {"learner": "small", "generator": "big", **pair_stats([0.9] * 4, [1, 1, 0, 1], [1] * 4, 0.8, 2.0)}
    agents = {
        "smol": {"completions": 16, "accuracy": 0.0, "truncation_rate": 0.94},
        "big": {"completions": 16, "accuracy": 0.5, "truncation_rate": 0.05},
        "small": {"completions": 16, "accuracy": 1.0, "truncation_rate": 0.0},
        "partial": {"completions": 16, "accuracy": 1.0, "truncation_rate": 0.0, "distinct_rewards": 3},
    }
    found = flags(_report([far, wrong, fine], agents))
    assert found == [
        "smol <- tiny: no peer row in the band [0.80, 1] (median ratio 0.004 over 3 rows): smol learns nothing from "
        "tiny, yet its rewards still shift smol's baseline (`band_gate: true` closes such a peer); their tokenizers, "
        "chat templates or stop tokens disagree, the traces are written differently, or the models are too far apart "
        "(from 3 rows only: too few to tell; sample more with --prompts).",
        "big <- small: 75% of the 4 peer rows that would train are wrong answers, so big would train mostly on wrong "
        "peer rows (each pushed down); `peer_filter: correct` trains only on correct peer rows.",
        "smol: 94% of its 16 completions were cut at max_completion_length=40 without stopping; raise it, or those "
        "rows teach a cut-off answer.",
        "smol: own accuracy 0% on the sample of 16 completions: its groups have no reward spread, so it gets no "
        "learning signal from its own rows.",
        "small: own accuracy 100% on the sample of 16 completions: its groups have no reward spread, so it gets no "
        "learning signal from its own rows.",
    ]
    with_options = {**_report([wrong], {}), "sharing_options": ["learn_from", "capability_gate"]}
    assert flags(with_options)[0].endswith(
        "`peer_filter: correct` trains only on correct peer rows (`learn_from`, `capability_gate` also limit what a "
        "learner takes from its peers)."
    )
    closed = {**fine, "learner": "big", "generator": "small", "learns_from": False}
    assert "| big <- small (does not learn from it: learn_from / capability_gate) | 4 |" in render(
        {**_report([closed], {}), "flags": []}
    )
    report = _report([fine], {"small": agents["big"]})
    report["flags"] = flags(report)
    text = render(report)
    assert (
        "| small <- big | 4 | 0.9 [0.9, 0.9] | 0.00/1.00/0.00 | 3: 0.00/1.00/0.00 | 1: 0.00/1.00/0.00 | 4 | 0.25 |"
        in text
    )
    assert text.endswith("Red flags: none.")


def test_agent_stats_over_every_rank_of_an_agent():
    from hacpo_trl.run.exchange import RolloutBatch

    nan = float("nan")
    records = [
        RolloutBatch("a", 0, 0, ["p"] * 3, rewards=[1.0, 0.0, nan], terminated=[True, False, True]),
        RolloutBatch("b", 1, 0, ["p"] * 2, rewards=[0.5, 0.25], terminated=[True, True]),
        RolloutBatch("a", 2, 0, ["q"], rewards=[1.0], terminated=[False]),
    ]
    assert agent_stats(records, ["a", "b"]) == {
        "a": {"completions": 4, "accuracy": 2 / 3, "distinct_rewards": 2, "truncation_rate": 0.5},
        "b": {"completions": 2, "accuracy": 1.0, "distinct_rewards": 2, "truncation_rate": 0.0},
    }


def test_generation_backend_follows_the_recipe():
    assert generation_backend(SimpleNamespace(use_vllm=False)) == "transformers generate"
    assert generation_backend(SimpleNamespace(use_vllm=True, vllm_mode="colocate")) == "vLLM, colocate mode"
    assert generation_backend(SimpleNamespace(use_vllm=True, vllm_mode="server")) == "vLLM, server mode"


def test_an_agents_ranks_split_the_prompts_whole():
    from datasets import Dataset

    data = Dataset.from_dict({"prompt": [str(i) for i in range(5)]})
    parts = [[r["prompt"] for r in _my_prompts(data, 5, rank, 2)] for rank in range(2)]
    assert parts == [["0", "1", "2"], ["3", "4"]]
    assert [r["prompt"] for r in _my_prompts(data, 9, 0, 1)] == ["0", "1", "2", "3", "4"]


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.fixture(scope="module")
def state_pair(tmp_path_factory):
    """The probe on the state pair (4 prompts), then each trainer's own loss on the probe's generation batch."""
    out = tmp_path_factory.mktemp("probe_state")
    recipe = ROOT / "recipes" / "tiny_state.yaml"
    seed = seeded(yaml.safe_load(recipe.read_text())["seed"])  # the suite's seed knob (a script: no `--seed` added)
    proc = accelerate_launch(
        2, "probe_vs_trainer.py", str(out), "--config", str(recipe), "--prompts", "4", "--seed", str(seed),
        "--output", str(out / "probe.json"), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out, proc.stdout


@pytest.mark.launch
def test_probe_ratio_is_the_trainers_logged_ratio_for_the_same_row(state_pair):
    """The probe scores each peer row with the trainer's code: the ratio it reports for a fixed completion (the
    same generation batch) equals the ratio the trainer logs for that row in its first update, whether the row was in
    the band (the gradient pass) or out of it (left out of that pass; how many are in is a draw of the sampling), and
    the report's count of rows that would train is the count of those ratios in the band."""
    out, _ = state_pair
    results = [json.loads(p.read_text()) for p in sorted(out.glob("ratios-*.json"))]
    assert sorted(r["agent"] for r in results) == ["trace-base", "trace-instruct"]
    pairs = {p["learner"]: p for p in json.loads((out / "probe.json").read_text())["pairs"]}
    for r in results:
        assert r["lower_bound"] == pytest.approx(0.8)
        # every peer row is valid (no `mask_truncated_completions`): 4 prompts x 8 completions of the other agent
        assert len(r["probe"]) == len(r["trainer"]) == 32, r["agent"]
        assert r["probe"] == pytest.approx(r["trainer"], rel=1e-5), r["agent"]
        assert pairs[r["agent"]]["would_train"] == sum(0.8 <= x <= 1 for x in r["probe"]), r["agent"]


@pytest.mark.launch
def test_probe_on_the_state_pair_prints_the_table_and_writes_every_field(state_pair):
    out, stdout = state_pair
    assert "| trace-instruct <- trace-base | 32 |" in stdout and "| trace-base <- trace-instruct | 32 |" in stdout
    report = json.loads((out / "probe.json").read_text())
    assert report["band"] == [0.8, 1.0] and report["prompts"] == 4 and report["num_generations"] == 8
    assert report["backend"] == "transformers generate"
    assert set(report["agents"]) == {"trace-instruct", "trace-base"}
    for a in report["agents"].values():
        assert a["completions"] == 32 and 0 <= a["accuracy"] <= 1 and 0 <= a["truncation_rate"] <= 1
    assert [(p["learner"], p["generator"]) for p in report["pairs"]] == [
        ("trace-instruct", "trace-base"),
        ("trace-base", "trace-instruct"),
    ]
    for p in report["pairs"]:
        assert p["rows"] == 32
        assert p["ratio"]["q1"] <= p["ratio"]["median"] <= p["ratio"]["q3"]
        assert sum(p["all"][k] for k in ("below", "in_band", "above")) == pytest.approx(1)
        assert p["correct"]["rows"] + p["wrong"]["rows"] == 32
        assert set(p) >= {"would_train", "wrong_share_of_would_train", "omega"} and p["learns_from"] is True
        # ω = clamp(P_generator / P_learner) from the sampled accuracies, each floored as the tracker floors P̂
        acc = report["agents"]
        floored = {a: max(acc[a]["accuracy"], 1e-8) for a in acc}
        expected = floored[p["generator"]] / floored[p["learner"]]
        assert p["omega"] == pytest.approx(min(max(expected, 0.1), 10.0))
    assert all(f in stdout for f in report["flags"])


@pytest.mark.launch
def test_a_taught_pair_is_flagged_by_the_band_gates_verdict_never_by_the_band():
    """With taught rows (`peer_prompts: failed`) the band does not apply: a pair the band gate keeps open gets no
    "no peer row in the band" flag (the README's own pair said both), and one it closes is flagged with its taught
    rows' numbers, saying when they are too few to tell."""
    stats = pair_stats([0.1, 0.2, 0.3, 0.5], [1, 1, 1, 1], [1] * 4, 0.8, 1.0)  # no row in the band
    taught = {"prompts": ["p1"], "rows": 4, "median": 0.4, "at_floor": 3, "floor": 0.2}
    kept = {"learner": "large", "generator": "small", "peer_prompts": "failed", "taught": taught,
            "band_gate_keeps": True, **stats}  # fmt: skip
    assert flags(_report([kept], {})) == []
    closed = {**kept, "taught": {**taught, "at_floor": 0, "median": 0.1}, "band_gate_keeps": False}
    assert flags(_report([closed], {})) == [
        "large <- small: none of its 4 taught rows reaches the floor 0.2 (median ratio 0.1): the band gate closes "
        "small at such a batch, so large is not taught by it; their formats, tokenizers or chat templates differ "
        "(from 4 rows only: too few to tell; sample more with --prompts)."
    ]
    many = {**closed, "taught": {**closed["taught"], "rows": 40}}
    assert "too few" not in flags(_report([many], {}))[0]


def test_probe_flags_smollm2_and_tiny_llama_as_too_far_apart(tmp_path):
    recipe = {
        "task": "arithmetic", "reward_funcs": ["arithmetic_exact"], "eval_samples": 0,
        "agents": [{"name": "smollm2", "model_name_or_path": "builtin:smollm2-135m-instruct"},
                   {"name": "tiny-llama", "model_name_or_path": "builtin:tiny-llama"}],
        "output_dir": str(tmp_path / "never_written"), "num_generations": 4, "per_device_train_batch_size": 8,
        "steps_per_generation": 2, "max_completion_length": 12, "use_cpu": True, "bf16": False,
        "activation_checkpointing": False, "report_to": "none", "save_strategy": "no",
    }  # fmt: skip
    (tmp_path / "pair.yaml").write_text(yaml.safe_dump(recipe))
    out = tmp_path / "probe.json"
    cmd = [sys.executable, "-m", "hacpo_trl.probe", "--config", str(tmp_path / "pair.yaml"), "--prompts", "2",
           "--output", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    smol = next(p for p in report["pairs"] if p["learner"] == "smollm2")
    assert smol["rows"] == 8 and smol["all"]["in_band"] == 0 and smol["ratio"]["median"] < 0.1
    assert any(f.startswith("smollm2 <- tiny-llama: no peer row in the band [0.80, 1]") for f in report["flags"])
    assert "smollm2 <- tiny-llama: no peer row in the band" in proc.stdout
    assert not (tmp_path / "never_written").exists()  # the probe trains and saves nothing


@pytest.mark.launch
def test_probe_refuses_a_recipe_with_one_agent(tmp_path):
    (tmp_path / "one.yaml").write_text(yaml.safe_dump({"agents": [{"name": "a", "model_name_or_path": "x"}]}))
    proc = subprocess.run(
        [sys.executable, "-m", "hacpo_trl.probe", "--config", str(tmp_path / "one.yaml")],
        capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        "hacpo-probe: error: hacpo-probe needs a recipe with at least two agents: it measures what they share"
    )


@pytest.mark.launch
def test_probe_help_names_its_own_flags():
    proc = subprocess.run(
        [sys.executable, "-m", "hacpo_trl.probe", "--help"], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.startswith("usage: hacpo-probe")
    assert "--prompts PROMPTS" in proc.stdout and "--output OUTPUT" in proc.stdout


@pytest.mark.launch
def test_probe_with_the_preset_reports_taught_prompts_for_the_weaker_agent(tmp_path):
    """`sharing: recommended` on the size pair: the probe reads the trainer's decision on its batch, so the weaker
    agent is taught the prompts it solved at most 1 in 8 times and the larger one solved, with the taught rows' ratios against
    the floor and the band gate's verdict (it once labelled every pair "does not learn from it"). The rewards are
    chosen, whatever was sampled: the first completion of each prompt's group of 8 is right, the others wrong, so
    each agent solved each prompt 1 in 8 times, and each is taught every prompt, by the other's one right row."""
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "first_of_group.py").write_text(
        "def first(completions, **kwargs):  # a prompt's group of 8 (the recipe's) is scored consecutively\n"
        "    return [float(i % 8 == 0) for i in range(len(completions))]\n"
    )
    env = _env()
    env["PYTHONPATH"] = f"{tmp_path / 'rewards'}{os.pathsep}{env['PYTHONPATH']}"
    out = tmp_path / "probe.json"
    cmd = [sys.executable, "-m", "hacpo_trl.probe", "--config", str(ROOT / "recipes" / "tiny_size.yaml"),
           "--sharing", "recommended", "--prompts", "16", "--reward_funcs", "first_of_group:first",
           "--seed", str(seeded(yaml.safe_load((ROOT / "recipes" / "tiny_size.yaml").read_text())["seed"])),
           "--output", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert set(report["sharing"]) == {"trace-large", "trace-small"}
    assert all(s.startswith("sharing: recommended (") for s in report["sharing"].values())
    assert all(a["accuracy"] == 1 / 8 for a in report["agents"].values()), report["agents"]
    weak = next(p for p in report["pairs"] if p["learner"] == "trace-small")
    taught = weak["taught"]
    assert weak["learns_from"] and weak["peer_prompts"] == "failed" and taught["floor"] == 0.2
    assert len(taught["prompts"]) == 16 and weak["taught_failed_rate"] == 0.125
    # peer rows: taught only, trace-large's one right row of each prompt (the preset's `peer_filter: correct`)
    assert taught["rows"] == weak["rows"] == 16 and 0 <= taught["at_floor"] <= taught["rows"]
    assert weak["band_gate_keeps"] is (taught["at_floor"] > 0)
    which = "failed: solved at most 0.125 of the time"
    assert f"trace-small <- trace-large: {len(taught['prompts'])} of 16 prompts ({which}), {taught['rows']} taught" in (
        proc.stdout
    )
    assert "does not learn from it" not in proc.stdout


def _probe_report_of(sharing, decisions, rows_by_learner, records):
    """The probe's report (:func:`hacpo_trl.launch.probe._report`) from each learner's decision and peer rows, as one
    process per learner would send them."""
    from hacpo_trl.algorithm import HACPOLossConfig
    from hacpo_trl.launch.probe import ProbeArguments, _report, learner_view

    names = list(decisions)
    everyone = [
        {"learner": a, **learner_view(decisions[a]), "sharing": {}, "peer_prompts": sharing.peer_prompts,
         "band_gate": sharing.band_gate, "floor": sharing.taught_ratio_floor, "failed_rate": sharing.taught_failed_rate,
         "rows": rows_by_learner[a],
         "omega": dict.fromkeys(names, 1.0)}
        for a in names
    ]  # fmt: skip
    trainer = SimpleNamespace(
        hacpo_loss_config=HACPOLossConfig(), agent_names=names, train_dataset=[0] * 4, num_generations=2,
        args=SimpleNamespace(max_completion_length=8), sharing=sharing,
    )  # fmt: skip
    return _report(trainer, everyone, records, ProbeArguments())


@pytest.mark.parametrize("mode", list(SHARING_PRESETS))
def test_the_probes_decision_is_the_trainers_on_the_same_batch_in_every_sharing_mode(mode):
    """Per learner and peer, the probe's report (learns from it, taught prompts, band gate) equals what the trainer
    does with the same batch: `decide` with the batch's records, then the band gate over the valid peer rows
    (`peer_loss.band_counts`, `PeerDecision.close_outside_band`)."""
    import torch

    from hacpo_trl.algorithm import HACPOLossConfig, stepwise_lower_bound
    from hacpo_trl.run.exchange import RolloutBatch
    from hacpo_trl.sharing.decision import PeerDecision, decide
    from hacpo_trl.sharing.peer_loss import band_counts
    from hacpo_trl.sharing.presets import expand_sharing
    from hacpo_trl.sharing.settings import SharingSettings

    agents = ["weak", "mid", "strong"]
    outcomes = {  # each agent's rewards on p0, p1, p2 (two completions each)
        "weak": [0, 0, 1, 0, 0, 0], "mid": [1, 0, 1, 1, 0, 0], "strong": [1, 1, 1, 1, 1, 0],
    }  # fmt: skip
    pids = ["p0", "p0", "p1", "p1", "p2", "p2"]
    records = [
        RolloutBatch(a, r, 0, pids, ["t"] * 6, [float(x) for x in outcomes[a]], [-0.5] * 6, [2] * 6, [True] * 6)
        for r, a in enumerate(agents)
    ]
    caps, behind = {"weak": 0.2, "mid": 0.5, "strong": 0.8}, dict.fromkeys(agents, 64)
    values = expand_sharing({"sharing": mode, "naive": False, "peer_clipping": True})
    sharing = SharingSettings.from_values(values)
    cfg = HACPOLossConfig()
    lb = stepwise_lower_bound(0, cfg.delta, cfg.delta_step)
    # the trainer decides only when it shares rollouts; otherwise its `last_decision` stays None (learns from no one)
    shares = values["share_rollouts"]
    decisions = {a: decide(sharing, a, agents, caps, behind, 100, 0, records, True) if shares else None for a in agents}
    # each learner's peer rows: one valid row below every band and floor, one invalid row inside the band
    ratios = {"mid": [0.01, 0.9], "strong": [0.9, 0.95], "weak": [0.01, 0.9]}
    valid = {"mid": [True, False], "strong": [True, True], "weak": [True, False]}
    rows_by_learner, kept = {}, {}
    for a, d in decisions.items():
        d = decisions[a] = d or PeerDecision()
        peers = list(d.involved)
        rows_by_learner[a] = {
            p: [(ratios[p][k], True, valid[p][k], p in d.taught) for k in range(2)] for p in agents if p != a
        }
        if not peers:
            kept[a] = d
            continue
        sources = [p for p in peers for _ in range(2)]
        trainer_rows = SimpleNamespace(
            sources=sources, valid=[v for p in peers for v in valid[p]], taught=[p in d.taught for p in sources]
        )
        # `band_ratios` scores the valid rows only
        ratio = torch.tensor(
            [x for p in peers for x, ok in zip(ratios[p], valid[p], strict=True) if ok], dtype=torch.float64
        )
        in_band = dict(zip(peers, band_counts(ratio, trainer_rows, peers, cfg, sharing), strict=True))
        kept[a] = d.close_outside_band(in_band) if sharing.band_gate else d
    report = _probe_report_of(
        sharing, {a: d if shares else None for a, d in decisions.items()}, rows_by_learner, records
    )
    assert report["band"][0] == lb
    learned = 0
    for pair in report["pairs"]:
        d, learner, peer = decisions[pair["learner"]], pair["learner"], pair["generator"]
        assert pair["learns_from"] == (peer in d.involved), (learner, peer)
        if sharing.peer_prompts != "all":
            assert pair["taught"]["prompts"] == (sorted(d.prompts[peer]) if peer in d.taught else []), pair
        assert pair["rescued_prompts"] == sorted(d.rescued.get(peer, ())), pair
        if sharing.band_gate and pair["learns_from"]:
            assert pair["band_gate_keeps"] == (peer in kept[learner].involved), (learner, peer)
        learned += pair["learns_from"]
    if mode != "none":
        assert learned, "the batch must give every sharing mode a peer to learn from"
