"""Smoke runs of the benchmark scripts (a few steps) so they cannot rot; the full runs are not tests."""

import argparse
import json
import math
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the benchmark's scripts, and each study's (benchmarks/studies/<study>/), import as top-level modules
for _folder in [ROOT / "benchmarks", *sorted(p for p in (ROOT / "benchmarks" / "studies").iterdir() if p.is_dir())]:
    sys.path.insert(0, str(_folder))
pytestmark = pytest.mark.timeout(900)


@pytest.mark.launch
def test_reproduce_and_overhead_write_their_sections(tmp_path, builtin_cache):
    from helpers import seeded

    results, seeds = tmp_path / "RESULTS.md", [str(seeded(0)), str(seeded(1))]
    reproduce = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "reproduce.py"), "--pairs", "state", "--seeds", *seeds,
         "--steps", "2", "--eval_every", "1", "--methods", "GSPO", "HACPO", "--ablation_pair", "",
         "--out", str(tmp_path / "runs"), "--results", str(results)],
        capture_output=True, text=True, timeout=800,
    )  # fmt: skip
    assert reproduce.returncode == 0, reproduce.stderr[-3000:] + reproduce.stdout[-3000:]
    overhead = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--quick", "--pairs", "state", "--steps", "2",
         "--results", str(results)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert overhead.returncode == 0, overhead.stderr[-3000:]
    text = results.read_text()
    # both sections, each once, with measured rows
    assert text.count("<!-- reproduce -->") == 2 and text.count("<!-- overhead -->") == 2
    assert "### state (trace-instruct + trace-base)" in text
    assert re.search(r"\| GSPO \| 64 \| 2 \| [01]\.\d+ ± 0\.\d+ \| – \|", text)
    assert re.search(
        r"\| HACPO \| 64 \| 4 \| [01]\.\d+ ± 0\.\d+ \| [+-][01]\.\d+ \[[+-]\d+\.\d+, [+-]\d+\.\d+\] \| [01]\.\d+ / ",
        text,
    )
    # the schema other tools read: per-seed accuracies per pair, agent and method; a peer-ratio median per agent
    report = json.loads((tmp_path / "results.json").read_text())
    state = report["settings"]["state"]
    for agent in ("trace-instruct", "trace-base"):
        for method in ("GSPO", "HACPO"):
            accuracies = state["accuracy"][agent][method]
            assert len(accuracies) == 2 and all(0 <= a <= 1 for a in accuracies)
        assert 0 < state["peer_ratio_median"][agent] < math.inf
        paired = state["paired_vs_GSPO"][agent]["HACPO"]
        diffs = [
            h - g for h, g in zip(state["accuracy"][agent]["HACPO"], state["accuracy"][agent]["GSPO"], strict=True)
        ]
        assert paired["mean"] == pytest.approx(sum(diffs) / 2) and paired["ci95"][0] <= paired["mean"]
        # 64 self rows then 64 peer rows in 4 updates of 32: self-first peers see lb 0.85 and 0.875 only
        assert state["peer"][agent]["HACPO"]["lower_bound"] == pytest.approx(0.8625)
    assert state["rollouts_per_step"] == {"GSPO": 64, "HACPO": 64}
    # the curve per generation batch (GSPO 2, HACPO 4 updates per batch), starting at the pre-RL accuracy, and the
    # one-sample (after - before) with its interval; the preset is the one chosen on validation (reproduce.py)
    for agent in ("trace-instruct", "trace-base"):
        for method in ("GSPO", "HACPO"):
            curve = state["curve"][agent][method]
            assert [point[0] for point in curve] == [0, 1, 2]
            assert curve[0][1] == pytest.approx(state["accuracy_before"][agent]) and curve[0][2] == 0
            after = state["accuracy"][agent][method]
            assert curve[-1][1] == pytest.approx(sum(after) / 2)
            gain = state["vs_before"][agent][method]
            assert gain["mean"] == pytest.approx(sum(after) / 2 - state["accuracy_before"][agent], abs=1e-6)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce as script

    assert report["recommended"] == script.RECOMMENDED and report["methods"]["GSPO"]["share_rollouts"] is False
    assert "GSPO on the `test` split by generation batch" in text
    assert (tmp_path / "learning_curves.png").stat().st_size > 10_000
    # the cost of a step (issue 20): GSPO, HACPO and GSPO x2 side by side (on the state pair, whose agents reproduce
    # has built: the suite builds no more agents than it needs), per generation batch and per trained row, with the
    # shares of generating, waiting, exchange and loss+backward and the load
    for agent in ("trace-instruct", "trace-base"):
        for method in ("GSPO", "HACPO", "GSPO×2"):
            row = rf"\| state \| {agent} \| {re.escape(method)} \| \d+\.\d\d \| \d+\.\d \| \d+% \| \d+% \| \d+\.\d% \| \d+% \|"
            assert re.search(row, text), (agent, method)


def test_commands_are_recorded_with_paths_relative_to_the_repository(tmp_path):
    """A record must read the same in every checkout: a path inside the repository is written relative to its root
    (and a relative one read back against it), anything else as given."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _common

    argv = ["--out", str(ROOT / "benchmarks" / "runs" / "x"), f"--results={ROOT / 'benchmarks' / 'RESULTS.md'}",
            "--methods", "HACPO correct + gate 1.0", "--steps", "48", "--grid", "benchmarks/studies/grid/results.json",
            "--elsewhere", str(tmp_path / "runs")]  # fmt: skip
    assert _common.command("reproduce.py", argv) == (
        "python benchmarks/reproduce.py --out benchmarks/runs/x --results=benchmarks/RESULTS.md --methods HACPO correct "
        f"+ gate 1.0 --steps 48 --grid benchmarks/studies/grid/results.json --elsewhere {tmp_path / 'runs'}"
    )
    assert "--out benchmarks/runs/x " in _common.provenance("reproduce.py", argv, 60.0)
    assert _common.resolved("benchmarks/runs/x") == ROOT / "benchmarks" / "runs" / "x"
    assert _common.resolved(tmp_path) == tmp_path


def test_method_settings_name_the_pairs_stronger_agent_and_the_run_length(tmp_path):
    """Directed sharing makes the pair's stronger agent learn from no one, the fade spans the run's optimizer steps,
    and validation runs default to seeds the held-out grid never uses."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    args = argparse.Namespace(out=tmp_path, steps=12, eval_every=6, split="validation", learning_rate=None)
    args.pair_steps, args.device = {"size": 20}, "cpu"  # the size pair's own horizon: 20 generation batches x 4 updates
    settings, _, updates = reproduce.METHODS["HACPO directed (stronger learns from none)"]
    argv = reproduce._argv("size", "HACPO directed (stronger learns from none)", settings, updates, 100, args)
    assert argv[argv.index("--learn_from") + 1] == "trace-large" and argv[argv.index("--max_steps") + 1] == "80"
    settings, _, updates = reproduce.METHODS["HACPO peer fade"]
    argv = reproduce._argv("state", "HACPO peer fade", settings, updates, 100, args)
    assert argv[argv.index("--peer_fade_steps") + 1] == "48" and argv[argv.index("--eval_split") + 1] == "validation"
    assert set(reproduce.STRONGER) == set(reproduce.GRID_PAIRS)
    from hacpo_trl.agents.demo import BUILTIN_AGENTS

    bands = {name: agent.band for name, agent in BUILTIN_AGENTS.items()}
    assert all(bands[reproduce.STRONGER[p]] == max(bands[n] for n in reproduce.PAIRS[p]) for p in reproduce.GRID_PAIRS)
    assert all(m.startswith("HACPO") for m in reproduce.CANDIDATES)
    assert reproduce.RECOMMENDED is None or reproduce.RECOMMENDED.startswith("HACPO")


def test_finished_runs_are_reused_only_with_the_agents_they_were_trained_from(tmp_path, monkeypatch):
    """Built-in agents are built to a band, so another machine builds other agents from the same recipe (and
    `HACPO_AGENTS` may name other copies): committed runs must not be paired with runs from those."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    here = {"trace-instruct": {"folder": "trace-instruct-1", "steps": 451, "validation_accuracy": 0.46, "band": [0.45, 0.55]},
            "trace-base": {"folder": "trace-base-2", "steps": 330, "validation_accuracy": 0.25, "band": [0.2, 0.3]}}  # fmt: skip
    monkeypatch.setattr(reproduce, "_built_agents", lambda pair: json.loads(json.dumps(here)))
    reproduce.check_reused_agents(tmp_path, "state", finished=0)  # nothing to reuse: nothing to check
    with pytest.raises(SystemExit, match=r"3 finished runs in .*state have no agents\.json"):
        reproduce.check_reused_agents(tmp_path, "state", finished=3)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "agents.json").write_text(json.dumps(here))
    reproduce.check_reused_agents(tmp_path, "state", finished=3)  # the same agents: reused
    elsewhere = json.loads(json.dumps(here))
    elsewhere["trace-base"] |= {"steps": 340, "validation_accuracy": 0.27}
    (tmp_path / "state" / "agents.json").write_text(json.dumps(elsewhere))
    with pytest.raises(
        SystemExit, match=r"trained from other agents than the ones loaded here .*'steps': 340.*set HACPO_AGENTS"
    ):
        reproduce.check_reused_agents(tmp_path, "state", finished=3)


def _finished_run(folder: Path, steps: int, rate: float) -> None:
    folder.mkdir(parents=True)
    summary = {}
    for agent in ("trace-instruct", "trace-base"):
        (folder / agent).mkdir()
        (folder / agent / "log_history.json").write_text(json.dumps([{"step": 1, "learning_rate": rate}]))
        summary[agent] = {"curve": [[0, 0.5], [steps, 0.6]]}
    (folder / "hacpo_summary.json").write_text(json.dumps(summary))


def test_finished_runs_are_reused_only_with_this_commands_horizon_and_learning_rate(tmp_path):
    """A run finished at another horizon (`--steps`, `--pair_steps`) or learning rate (`--learning_rate` or the
    recipe's) is refused by name, not paired with new runs; bad `--pair_steps` are refused before anything runs."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    args = argparse.Namespace(steps=12, pair_steps={}, learning_rate=None)
    run = tmp_path / "state" / "a"
    _finished_run(run, steps=24, rate=1e-4)  # 12 batches x 2 updates at the state recipe's 1e-4
    reproduce.check_run_schedule(run, "state", 2, args)
    with pytest.raises(SystemExit, match=r"'optimizer steps': 24.*'optimizer steps': 32"):
        reproduce.check_run_schedule(run, "state", 2, argparse.Namespace(**{**vars(args), "steps": 16}))
    with pytest.raises(SystemExit, match=r"'optimizer steps': 24.*'optimizer steps': 40"):
        reproduce.check_run_schedule(run, "state", 2, argparse.Namespace(**{**vars(args), "pair_steps": {"state": 20}}))
    with pytest.raises(SystemExit, match=r"'learning rate': 0\.0001.*'learning rate': 0\.0003"):
        reproduce.check_run_schedule(run, "state", 2, argparse.Namespace(**{**vars(args), "learning_rate": 3e-4}))
    assert reproduce.pair_learning_rate("size", args) == 5e-5  # the size pair's recipe rate (RESULTS.md rule 5)
    for bad in (["size"], ["sizes=3"], ["size=0"], ["size=x"]):
        with pytest.raises(SystemExit) as stop:
            reproduce.main(["--pair_steps", *bad, "--out", str(tmp_path / "never")])
        assert stop.value.code == 2
    assert not (tmp_path / "never").exists()


def test_device_cuda_runs_each_pair_from_a_one_gpu_copy_of_its_recipe(tmp_path, monkeypatch, capsys):
    """`--device cuda`: every run's recipe is the pair's with both agents on one GPU (`use_cpu: false`, `share_gpus:
    true`, fp32), written beside the runs and accepted by `hacpo-train`'s recipe check; launched with the one-GPU
    accelerate config. Without a CUDA GPU the command exits 2 naming what it needs."""
    import yaml

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    from hacpo_trl.launch.recipe import check_recipe, load_recipe

    args = argparse.Namespace(out=tmp_path, steps=4, eval_every=0, split="test", learning_rate=None, pair_steps={})
    args.device = "cuda"
    argv = reproduce._argv("complement", "GSPO", *reproduce.METHODS["GSPO"][::2], 0, args)
    copy = Path(argv[argv.index("--config") + 1])
    assert copy == tmp_path / "tiny_complement_cuda.yaml"
    cpu = yaml.safe_load(reproduce.recipe("complement").read_text())
    assert yaml.safe_load(copy.read_text()) == {**cpu, "use_cpu": False, "share_gpus": True, "bf16": False}
    check_recipe(load_recipe(str(copy)), num_processes=2)
    launch = yaml.safe_load((ROOT / "accelerate_configs" / reproduce.LAUNCH_CONFIGS["cuda"]).read_text())
    assert (launch["num_processes"], launch["use_cpu"]) == (2, False)
    monkeypatch.setattr(reproduce, "_cuda_available", lambda: False)
    assert reproduce.main(["--device", "cuda", "--pairs", "complement", "--out", str(tmp_path)]) == 2
    assert "--device cuda needs a CUDA GPU" in capsys.readouterr().err


def test_every_pair_runs_the_recipe_of_its_agents():
    """Each pair of reproduce.py (the paper's four and `equal`) trains exactly its two agents, from its recipe."""
    import yaml

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    assert list(reproduce.PAIR_AGENTS)[: len(reproduce.PAIRS)] == list(reproduce.PAIRS)
    assert "equal" in reproduce.PAIR_AGENTS and "complement" in reproduce.PAIRS
    # the default grid: the paper's four (`complement` runs apart; the vllm pair is for the vLLM path's tests)
    assert set(reproduce.GRID_PAIRS) == set(reproduce.PAIRS) - {"complement", "vllm"}
    for pair, agents in reproduce.PAIR_AGENTS.items():
        recipe = yaml.safe_load(reproduce.recipe(pair).read_text())
        assert tuple(a["name"] for a in recipe["agents"]) == agents, pair
        assert [a["model_name_or_path"] for a in recipe["agents"]] == [f"builtin:{a}" for a in agents], pair


def test_each_pair_names_its_weaker_agent_by_capability_at_the_start():
    """The agent built to the lower band; for two agents of one band, the lower sampled validation accuracy at build
    (a greedy-band agent records it beside), which needs the pair's build records."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    for pair in reproduce.GRID_PAIRS:
        (weaker,) = set(reproduce.PAIRS[pair]) - {reproduce.STRONGER[pair]}
        assert reproduce.weaker_agent(pair, None) == weaker, pair
    assert reproduce.weaker_agent("size", None) == "trace-small"  # though greedy accuracy ranks it higher
    built = {"trace-carry": {"measure": "greedy", "validation_accuracy": 0.42, "sampled_accuracy": 0.21},
             "trace-nocarry": {"measure": "greedy", "validation_accuracy": 0.40, "sampled_accuracy": 0.25}}  # fmt: skip
    assert reproduce.weaker_agent("complement", built) == "trace-carry"  # higher greedy, lower sampled
    built["trace-nocarry"]["sampled_accuracy"] = 0.20
    assert reproduce.weaker_agent("complement", built) == "trace-nocarry"
    equal = {"trace-instruct": {"measure": "sampled", "validation_accuracy": 0.292},
             "trace-qwen2": {"measure": "sampled", "validation_accuracy": 0.279}}  # fmt: skip
    assert reproduce.weaker_agent("equal", equal) == "trace-qwen2"
    with pytest.raises(ValueError, match="share a band: their build records are needed"):
        reproduce.weaker_agent("complement", None)


def test_a_task_with_halves_is_reported_per_half(tmp_path):
    """results.json and the markdown give each agent's accuracy per half before and after, after − before and the
    paired difference from GSPO per half; a pair without halves gets none of it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    def run(after_carry, after_nocarry, before=(0.6, 0.0)):
        halves = {"carry": after_carry, "no_carry": after_nocarry}
        agent = {"accuracy_before": sum(before) / 2, "accuracy_after": sum(halves.values()) / 2, "curve": [[0, 0.3]]}
        agent |= {"accuracy_before_by_half": dict(zip(halves, before, strict=True)), "accuracy_after_by_half": halves}
        return {"trace-carry": agent, "trace-nocarry": {**agent}}

    by_method = {
        "GSPO": {0: run(0.7, 0.0), 1: run(0.8, 0.1)},
        "HACPO": {0: run(0.6, 0.3), 1: run(0.6, 0.3)},
    }
    out = reproduce._by_half(by_method, ("trace-carry", "trace-nocarry"))
    assert out["accuracy_before_by_half"]["trace-carry"] == {"carry": 0.6, "no_carry": 0.0}
    assert out["accuracy_by_half"]["trace-carry"]["GSPO"] == {"carry": [0.7, 0.8], "no_carry": [0.0, 0.1]}
    gain = out["vs_before_by_half"]["trace-carry"]["GSPO"]
    assert gain["carry"]["mean"] == pytest.approx(0.15) and gain["no_carry"]["mean"] == pytest.approx(0.05)
    paired = out["paired_vs_GSPO_by_half"]["trace-carry"]
    assert set(paired) == {"HACPO"} and paired["HACPO"]["carry"]["mean"] == pytest.approx(-0.15)
    assert paired["HACPO"]["no_carry"]["mean"] == pytest.approx(0.25) and paired["HACPO"]["no_carry"]["seeds"] == [0, 1]
    entry = {"agents": ["trace-carry", "trace-nocarry"], "task": "arithmetic_trace_carries", "weaker": "trace-carry"}
    lines = reproduce._half_lines({**entry, **out})
    text = "\n".join(lines)
    assert "Before RL: trace-carry carry 0.600, no_carry 0.000;" in text and "`weaker`): trace-carry" in text
    assert (
        "| method | trace-carry: carry | trace-carry: no_carry | trace-nocarry: carry | trace-nocarry: no_carry |"
        in text
    )
    assert re.search(r"\| GSPO \| 0\.750 \(\+0\.150 \[[^]]+\]\) \| 0\.050 \(\+0\.050 \[", text)
    assert re.search(r"\| HACPO \| -0\.150 \[[^]]+\] \| \+0\.250 \[", text)
    assert reproduce._half_lines(entry) == []  # no halves: no lines


def test_two_looks_corrects_each_look_by_hand(tmp_path):
    """`two_looks.py`: t quantiles equal the table `reproduce.py` uses (0.975) and the textbook 0.9875 values (2.841
    for 7 degrees of freedom, 2.490 for 15); on hand-made looks of 4 seeds, differences 1, 2, 3, 4 (mean 2.5, sd
    1.291, t(3, 0.9875) = 4.177) give the 97.5% interval 2.5 ± 2.696 (not above 0), and 3, 4, 5, 6 give 4.5 ± 2.696
    (above 0), in hundredths; overlapping seeds are refused."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import t_quantile
    from reproduce import FORMER_PRESET, T_975
    from two_looks import main

    for dof, t in T_975.items():
        assert t_quantile(0.975, dof) == pytest.approx(t, abs=1.5e-3)
    assert t_quantile(0.9875, 7) == pytest.approx(2.841, abs=1e-3)
    assert t_quantile(0.9875, 15) == pytest.approx(2.490, abs=1e-3)

    def look(path, seeds, diffs):
        gspo = [0.5] * len(seeds)
        acc = {"trace-small": {"GSPO": gspo, FORMER_PRESET: [g + d for g, d in zip(gspo, diffs, strict=True)]}}
        path.write_text(json.dumps({"seeds": seeds, "settings": {"size": {"accuracy": acc}}}))

    look(tmp_path / "a.json", [0, 1, 2, 3], [0.03, 0.04, 0.05, 0.06])
    look(tmp_path / "b.json", [4, 5, 6, 7], [0.01, 0.02, 0.03, 0.04])
    out = tmp_path / "RESULTS.md"
    files = ["--grid", str(tmp_path / "a.json"), "--replication", str(tmp_path / "b.json"), "--results", str(out)]
    assert main(files) == 0
    half = 4.177 * statistics.stdev([1, 2, 3, 4]) / 2 / 100
    rows = [r for r in out.read_text().splitlines() if r.startswith("| look")]
    assert "| +0.0450 |" in rows[0] and f"[{0.045 - half:+.4f}, {0.045 + half:+.4f}] | yes |" in rows[0], rows[0]
    assert "| +0.0250 |" in rows[1] and f"[{0.025 - half:+.4f}, {0.025 + half:+.4f}] | no |" in rows[1], rows[1]
    for name in ("a", "b"):  # another method of the same runs, by `--method`: the same rows, the section rewritten
        data = json.loads((tmp_path / f"{name}.json").read_text())
        data["settings"]["size"]["accuracy"]["trace-small"]["M"] = data["settings"]["size"]["accuracy"]["trace-small"][
            FORMER_PRESET
        ]
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    assert main([*files, "--method", "M"]) == 0
    text = out.read_text()
    assert text.count("<!-- two_looks/size/trace-small -->") == 2 and "`M` − GSPO" in text
    assert [r for r in text.splitlines() if r.startswith("| look")][-2:] == rows[:2]
    look(tmp_path / "b.json", [3, 4, 5, 6], [0.01] * 4)
    with pytest.raises(SystemExit, match=r"share seeds \[3\]"):
        main(files)


def test_heldout_look_judges_rule_19s_bars_by_hand_and_refuses_a_baseline_that_does_not_learn(tmp_path):
    """`heldout_look.py`, by hand: an upper end below 0 is "below GSPO" (0 is not); the weaker agents of state, size
    and model must all be above 0, the stronger of two of them, both complement agents; a table where GSPO − before
    has a lower end at or below 0 for any agent is refused, naming it. Reports of one pair on other seeds pool; a
    seed in two reports is refused; the intervals are t-intervals at 95% by hand."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from heldout_look import judge, main, paired_gains

    above, edge = (0.02, 0.001, 0.04), (-0.01, -0.03, 0.0)
    gains = {("state", "trace-instruct"): above, ("state", "trace-base"): above,
             ("size", "trace-large"): above, ("size", "trace-small"): above,
             ("model", "trace-qwen2"): edge, ("model", "trace-llama"): above,
             ("style", "trace-bracket"): edge, ("style", "trace-llama"): edge,
             ("complement", "trace-carry"): above, ("complement", "trace-nocarry"): above,
             ("equal", "trace-instruct"): edge, ("equal", "trace-qwen2"): edge}  # fmt: skip
    bars = list(judge(gains))
    assert list(judge(gains).values()) == [True, True, True, True]
    assert judge({**gains, ("equal", "trace-qwen2"): (-0.02, -0.04, -0.001)})[bars[0]] is False
    assert judge({**gains, ("model", "trace-llama"): edge})[bars[1]] is False
    assert judge({**gains, ("size", "trace-large"): edge})[bars[2]] is False  # one stronger agent above 0
    assert judge({**gains, ("complement", "trace-carry"): edge})[bars[3]] is False

    def report(path, seeds, diffs, learned=(0.1, 0.12, 0.11, 0.13)):
        gspo = [0.5 + x for x in learned[: len(seeds)]]
        acc = {"a": {"GSPO": gspo, "M": [g + d for g, d in zip(gspo, diffs, strict=True)]}}
        entry = {"agents": ["a"], "seeds": seeds, "accuracy": acc, "accuracy_before": {"a": 0.5}}
        path.write_text(json.dumps({"seeds": seeds, "settings": {"complement": entry}}))
        return json.loads(path.read_text())

    first = report(tmp_path / "a.json", [0, 1], [0.03, 0.04])
    second = report(tmp_path / "b.json", [2, 3], [0.05, 0.06], learned=(0.11, 0.13))
    diffs, learned, seeds = paired_gains([first, second], "M")
    assert diffs["complement", "a"] == pytest.approx([0.03, 0.04, 0.05, 0.06]) and seeds["complement"] == [0, 1, 2, 3]
    assert learned["complement", "a"] == pytest.approx([0.1, 0.12, 0.11, 0.13])
    out = tmp_path / "RESULTS.md"
    runs = ["--runs", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--method", "M", "--results", str(out)]
    assert main(runs) == 0
    half = 3.182 * statistics.stdev([3, 4, 5, 6]) / 2 / 100  # t(3, 0.975)
    row = next(r for r in out.read_text().splitlines() if r.startswith("| complement"))
    assert (
        "| 0–3 | 0.500 | +0.115 [" in row and f"+0.045 [{0.045 - half:+.3f}, {0.045 + half:+.3f}] | yes | no |" in row
    )
    report(tmp_path / "b.json", [2, 3], [0.05, 0.06], learned=(-0.3, 0.0))  # GSPO flat on seeds 2-3: refused
    with pytest.raises(SystemExit, match=r"GSPO does not improve complement:a \(-0\.020 \[.*change the pair's steps"):
        main(runs)
    report(tmp_path / "b.json", [1, 2], [0.05, 0.07])
    with pytest.raises(SystemExit, match=r"complement: seeds \[1\] in two reports"):
        main(runs)


def test_same_runs_flags_a_run_that_differs_or_is_missing(tmp_path):
    """`same_runs.py`: two outputs with equal per-run accuracies are the same (exit 0); one accuracy changed in the
    last digit, or a seed missing on one side, is flagged (exit 1) on that run's line only."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from same_runs import compare, main

    def output(gspo, before=0.5, seeds=(0, 1)):
        acc = {"a": {"GSPO": list(gspo)}}
        return {"settings": {"size": {"seeds": list(seeds), "accuracy": acc, "accuracy_before": {"a": before}}}}

    lines, differ = compare(output([0.25, 0.5]), output([0.25, 0.5]))
    assert differ == 0 and lines == ["same  size / a / GSPO / 0: 0.25 -> 0.25", "same  size / a / GSPO / 1: 0.5 -> 0.5",
                                     "same  size / a / before: 0.5 -> 0.5"]  # fmt: skip
    lines, differ = compare(output([0.25, 0.5]), output([0.25, 0.5000001]))
    assert differ == 1 and lines[1] == "DIFFERS  size / a / GSPO / 1: 0.5 -> 0.5000001"
    lines, differ = compare(output([0.25, 0.5]), output([0.25], seeds=(0,)))
    assert differ == 1 and lines[1] == "DIFFERS  size / a / GSPO / 1: 0.5 -> None"
    for name, data in (("x.json", output([0.25, 0.5])), ("y.json", output([0.25, 0.75]))):
        (tmp_path / name).write_text(json.dumps(data))
    assert main([str(tmp_path / "x.json"), str(tmp_path / "x.json")]) == 0
    assert main([str(tmp_path / "x.json"), str(tmp_path / "y.json")]) == 1


def test_taught_prompts_counts_batches_and_prompts_from_a_log_by_hand():
    """`taught_prompts.py`: a learner's log with three batches, taught on 2 and 0 of 8 prompts by one peer and on 1 + 1
    by two, and entries without the metric (updates in between): 3 batches, 2 with a taught prompt, 4 prompts."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from taught_prompts import taught_counts

    log = [
        {"hacpo/taught_prompts/b": 0.25, "loss": 0.1},
        {"loss": 0.2},
        {"hacpo/taught_prompts/b": 0.0},
        {"hacpo/taught_prompts/b": 0.125, "hacpo/taught_prompts/c": 0.125},
    ]
    assert taught_counts(log) == (3, 2, 4.0)


def test_taught_rows_counts_rows_per_taught_batch_and_a_caps_weight_by_hand():
    """`taught_rows.py`: four batches with 2, 0, 6 and 1 taught rows (2, 0, 2 and 1 of 8 prompts): 3 of 4 batches
    taught, 5/3 prompts and 3 rows per taught batch (90th percentile 2 + 0.8 x 4); at cap 2 one batch in three is
    damped and a taught row weighs (2 + 2 + 1) / 9 on average, at cap 8 none and 1."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from taught_rows import batch_rows, row

    log = [
        {"hacpo/taught_prompts/b": 0.25, "hacpo/peer_rows": 2.0},
        {"loss": 0.2},
        {"hacpo/taught_prompts/b": 0.0, "hacpo/peer_rows": 0.0},
        {"hacpo/taught_prompts/b": 0.125, "hacpo/taught_prompts/c": 0.125, "hacpo/peer_rows": 6.0},
        {"hacpo/taught_prompts/b": 0.125, "hacpo/peer_rows": 1.0},
    ]
    batches = batch_rows(log)
    assert batches == [(2.0, 2.0), (0.0, 0.0), (2.0, 6.0), (1.0, 1.0)]
    line = row("state", "a", batches, 1, [2, 8])
    assert line == "| state | `a` | 3 of 4 (0.75) | 1.67 | 3.00 | 2 | 5.2 | 6 | 9 | 0.33 | 0.00 | 0.56 | 1.00 |"
    assert row("state", "a", [(0.0, 0.0)], 1, [2]).count("–") == 8


def test_overhead_preset_times_each_batch_and_splits_the_batches_without_a_taught_prompt():
    """`overhead.py --preset`: a log of 3 batches of 4 steps (the first warm-up; skipped steps log only the optimizer)
    gives each batch's step + optimizer time and whether it taught; the ratios compare the same batches, and a batch
    at which either agent was taught leaves the untaught ratio of both."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from overhead import PRESET, PRESET_RUN, batch_times, preset_ratios
    from reproduce import METHODS

    # the preset runs as a user runs it: GSPO's recipe, its batching unchanged, plus the one line
    gspo_settings, _, gspo_updates = METHODS["GSPO"]
    assert PRESET_RUN == ({**gspo_settings, "share_rollouts": True, "sharing": PRESET}, gspo_updates)

    def batch(step, seconds, taught):
        return [
            {"step": step, "step_time": seconds - 0.1, "hacpo/time/optimizer": 0.05, "hacpo/taught_prompts/b": taught},
            {"step": step + 1, "hacpo/time/optimizer": 0.05, "loss": 0.0},
            {"step": step + 2, "hacpo/time/optimizer": 0.0},
            {"step": step + 3, "hacpo/time/optimizer": 0.0},
        ]

    log = batch(1, 9.0, 0.0) + batch(5, 2.0, 0.125) + batch(9, 3.0, 0.0) + [{"step": 12, "train_runtime": 30.0}]
    assert batch_times(log, 4) == [(pytest.approx(2.0), True), (pytest.approx(3.0), False)]
    gspo = [(1.0, False), (2.0, False), (4.0, False)]
    reps = [
        {"GSPO": {"a": gspo, "b": gspo}, PRESET: {"a": [(2.0, True), (2.2, False), (4.0, False)], "b": gspo}},
        {"GSPO": {"a": gspo, "b": gspo}, PRESET: {"a": gspo, "b": [(1.5, False), (2.0, True), (4.0, False)]}},
    ]
    ratios = preset_ratios(reps)
    # rep 0: a's batches 1 and 2 untaught (2.2 + 4.0 against 2 + 4); rep 1: b taught at batch 1, so only 0 and 2
    assert ratios["a"]["overall"] == pytest.approx([8.2 / 7, 1.0])
    assert ratios["a"]["untaught"] == pytest.approx([6.2 / 6, 1.0])
    assert ratios["b"]["overall"] == pytest.approx([1.0, 7.5 / 7])
    assert ratios["b"]["untaught"] == pytest.approx([1.0, 5.5 / 5])
    assert ratios["a"]["batches"] == [4, 6] and ratios["a"]["preset_s"] == pytest.approx([8.2 / 3, 7 / 3])


def test_carry_errors_counts_a_lost_carry_by_hand():
    """`carry_errors.py`: a carry-half solution with a column carried 0 (`+0=`) is the no-carry marker leaking in;
    one that carries every column, or adds a 0 digit and its carry (`9+0+1=10`), is not."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from carry_errors import writes_no_carry

    assert writes_no_carry("7+5=12, 4+8+0=12, 3+6+1=10, so 1022")
    assert not writes_no_carry("7+5=12, 4+8+1=13, 3+6+1=10, so 1032")
    assert not writes_no_carry("5+7=12, 9+0+1=10, 6+8+1=15, so 1502")


# what reproduce.py computes from the runs (the rest of a results.json comes from its command and the recipes)
RUN_FIELDS = ("accuracy", "accuracy_before", "paired_vs_GSPO", "vs_before", "curve", "peer", "peer_ratio_median",
              "accuracy_before_by_half", "accuracy_by_half", "vs_before_by_half", "paired_vs_GSPO_by_half")  # fmt: skip
# its folder's runs of the model pair were made again after this screen (the full logs give the same difference)
REMADE = {"benchmarks/screens/validation-48steps-b3-preset/results.json"}


def _committed(pattern: str) -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z", pattern], cwd=ROOT, capture_output=True, check=True).stdout
    return [name for name in listed.decode().split("\0") if name and not name.startswith("benchmarks/runs/")]


def _regenerated(reproduce, report: dict, out: Path) -> dict | None:
    """A results.json's `settings` made again from the run records in ``out``, for its pairs, methods and seeds (None
    when one of its runs is not recorded there: moved to another folder since)."""
    steps = {p: e["steps"] for p, e in report["settings"].items() if e.get("steps", report["steps"]) != report["steps"]}
    args = argparse.Namespace(out=out, split=report["split"], steps=report["steps"], pair_steps=steps,
                              learning_rate=report["learning_rate"], seeds=report["seeds"])  # fmt: skip
    results: dict = {}
    for pair, entry in report["settings"].items():
        for method, accuracies in entry["accuracy"][entry["agents"][0]].items():
            for seed in entry["seeds"][: len(accuracies)]:
                run = reproduce._runs.record(reproduce._folder(out, pair, method, seed))
                if run is None:
                    return None
                results.setdefault(pair, {}).setdefault(method, {})[seed] = run["summary"]
    rollouts = {m: per_prompt * reproduce.PROMPTS_PER_STEP for m, (_, per_prompt, _) in reproduce.METHODS.items()}
    rollouts |= {m: 8 * reproduce.PROMPTS_PER_STEP for m in reproduce.ABLATIONS}
    methods = {m: reproduce.METHODS.get(m) for m in report["methods"]}
    return reproduce._report(results, args, methods, rollouts)["settings"]


def _records_only(monkeypatch):
    """The run folders' files (summaries, full logs) are not read: what follows must come from the records."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _runs

    def unread(folder):
        raise AssertionError(f"read the run folder {folder}, not its record")

    monkeypatch.setattr(_runs, "from_folder", unread)


def test_committed_results_regenerate_from_the_run_records(monkeypatch):
    """Every committed results.json whose runs are recorded (`<out>/runs.jsonl.gz`) regenerates, field by field and
    byte for byte, from the records alone: accuracies, curves, halves and the peer-ratio statistics of the logs."""
    _records_only(monkeypatch)
    import reproduce

    checked, dump = 0, {"ensure_ascii": False, "indent": 2}
    for name in _committed("benchmarks/*results*.json"):
        report = json.loads((ROOT / name).read_text())
        words = report.get("command", "").split()
        out = ROOT / words[words.index("--out") + 1] if "--out" in words else None
        if name in REMADE or out is None or not (out / reproduce._runs.RECORDS).exists():
            continue
        settings = _regenerated(reproduce, report, out)
        if settings is None:
            continue
        for pair, entry in report["settings"].items():
            for field in set(RUN_FIELDS) & set(entry):
                regenerated, committed = json.dumps(settings[pair][field], **dump), json.dumps(entry[field], **dump)
                assert regenerated == committed, (name, pair, field)
        checked += 1
    assert checked >= 52, checked


def _section(path: Path, name: str) -> list[str]:
    """A section of a RESULTS.md without its `Command:` line (machine and wall time vary)."""
    text = path.read_text().split(f"<!-- {name} -->\n")[1]
    return [line for line in text.splitlines() if not line.startswith("Command: ")]


def _command(path: Path, name: str) -> list[str]:
    line = next(x for x in path.read_text().split(f"<!-- {name} -->\n")[1].splitlines() if x.startswith("Command: "))
    return shlex.split(line.split("`")[1])[2:]


def test_committed_log_tables_regenerate_from_the_run_records(tmp_path, monkeypatch):
    """The tables made from the training logs (RESULTS.md's held-out looks, the grid's summary, taught prompts, the
    preset's open batches at a longer horizon, the three-agent runs) regenerate byte for byte from the run records."""
    _records_only(monkeypatch)
    import heldout_look
    import preset_horizon
    import summary
    import taught_prompts
    import three_agents

    grid = ROOT / "benchmarks" / "studies" / "grid"
    report = json.loads((grid / "results.json").read_text())
    assert summary.lines_for(report) == _section(grid / "RESULTS.md", "summary")
    page = ROOT / "benchmarks" / "RESULTS.md"
    for name in ("heldout_look", "paper_rule"):  # the figure is left as committed (--figure dropped)
        argv = _command(page, name)
        if "--figure" in argv:
            del argv[argv.index("--figure") : argv.index("--figure") + 2]
        heldout_look.main([*argv, "--results", str(tmp_path / "look.md")])
        assert _section(tmp_path / "look.md", name) == _section(page, name), name
    pages = [ROOT / name for name in _committed("benchmarks/*RESULTS.md")]
    taught = [page for page in pages if "<!-- taught_prompts -->" in page.read_text()]
    assert len(taught) == 6
    for page in taught:
        argv = _command(page, "taught_prompts")
        argv[argv.index("--results") + 1] = str(tmp_path / "taught.md")
        taught_prompts.main(argv)
        assert _section(tmp_path / "taught.md", "taught_prompts") == _section(page, "taught_prompts"), page
    horizon = ROOT / "benchmarks" / "screens" / "validation-96steps-b3" / "RESULTS.md"
    preset_horizon.main(["--results", str(tmp_path / "horizon.md")])
    assert _section(tmp_path / "horizon.md", "preset_horizon") == _section(horizon, "preset_horizon")
    three = ROOT / "benchmarks" / "studies" / "three-agents" / "RESULTS.md"
    rows = three_agents.rows(ROOT / "benchmarks" / "runs" / "test-48steps-b3", list(range(8)), 48)
    assert len(rows) == 3 and all(row in _section(three, "three_agents") for row in rows)


def test_a_run_record_keeps_what_the_tables_read_from_its_log(tmp_path):
    """A finished run is recorded once, with its summary and the log's sharing decisions and peer-ratio means, and is
    read back from the grid's records after its folder is gone; the records file is byte-stable."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import shutil

    import _runs

    log = [
        {"step": 1, "learning_rate": 1e-4, "hacpo/peer_ratio_median": 0.5, "loss": 0.1},
        {"step": 1, "hacpo/learns_from/b": 1.0, "hacpo/taught_prompts/b": 0.25, "hacpo/peer_rows": 12.0},
        {"step": 2, "hacpo/peer_ratio_median": 1.0, "hacpo/peer_rows": 3.0},
        {"step": 3, "hacpo/learns_from/b": 0.0, "hacpo/taught_prompts/b": 0.0},
    ]
    folder = tmp_path / "grid" / "state" / "HACPO-seed0"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "log_history.json").write_text(json.dumps(log))
    (folder / "hacpo_summary.json").write_text(json.dumps({"a": {"curve": [[0, 0.5]]}, "_wall_seconds": 9.5}))
    run = _runs.record(folder)
    assert run["summary"]["_wall_seconds"] == 9.5 and run["logs"]["a"]["first_learning_rate"] == 1e-4
    assert run["logs"]["a"]["peer_means"] == {"hacpo/peer_ratio_median": 0.75}
    assert _runs.batches(run["logs"]["a"]) == [
        {"hacpo/learns_from/b": 1.0, "hacpo/taught_prompts/b": 0.25, "hacpo/peer_rows": 12.0},
        {"hacpo/learns_from/b": 0.0, "hacpo/taught_prompts/b": 0.0},
    ]
    records = tmp_path / "grid" / _runs.RECORDS
    saved = records.read_bytes()
    shutil.rmtree(folder)
    _runs._loaded.clear()
    assert _runs.record(folder) == run and _runs.record(folder.parent / "HACPO-seed1") is None
    _runs.save(tmp_path / "grid", _runs.load(tmp_path / "grid"))
    assert records.read_bytes() == saved


def test_choose_applies_a_screen_rule_by_hand(tmp_path, capsys):
    """`choose.py`, rule 17's choice: worst gain over every agent, then the stronger agents' mean within the tie,
    an exact tie to the first candidate; a screen missing a declared seed chooses nothing."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from choose import ahead, choose, main

    # worst beyond the tie wins; within it the stronger mean decides; equal numbers keep the earlier one
    assert ahead((0.010, 0.0), (0.004, 0.5), 0.005) and not ahead((0.008, 0.0), (0.004, 0.5), 0.005)
    assert choose({"p": (0.0, 0.01), "A": (-0.004, 0.02), "B": (0.001, 0.015)}, "p", ["A", "B"], 0.005) == "A"
    assert choose({"p": (0.0, 0.01), "A": (-0.004, 0.02), "B": (0.006, 0.0)}, "p", ["A", "B"], 0.005) == "B"
    assert choose({"p": (0.0, 0.01), "A": (0.0, 0.02), "B": (0.0, 0.02)}, "p", ["A", "B"], 0.005) == "A"
    assert choose({"p": (0.0, 0.03), "A": (-0.006, 0.09), "B": (0.0, 0.02)}, "p", ["A", "B"], 0.005) == "p"

    def screen(name, seeds, gain_a, gain_b):
        gspo = [0.5] * len(seeds)
        acc = {
            "s": {"GSPO": gspo, "P": gspo, "MA": [g + gain_a for g in gspo], "MB": [g + gain_b for g in gspo]},
            "w": {"GSPO": gspo, "P": [g + 0.02 for g in gspo], "MA": [g + 0.03 for g in gspo], "MB": gspo},
        }
        path = tmp_path / name
        path.write_text(json.dumps({"settings": {"x": {"agents": ["s", "w"], "seeds": seeds, "accuracy": acc}}}))
        return str(path)

    args = ["--preset", "P", "--candidates", "A=MA", "B=MB", "--stronger", "x:s", "--seeds", "1", "2"]
    assert main(["--screens", screen("full.json", [1, 2], 0.01, 0.02), *args]) == 0
    out = capsys.readouterr().out
    # worst: P 0.000, A +0.010, B 0.000 (w gains nothing under B): A is ahead by more than the tie
    assert "| **worst** | +0.000 | +0.010 | +0.000 |" in out and "Chosen: A (MA)" in out
    assert main(["--screens", screen("part.json", [1], 0.01, 0.02), *args]) == 0
    assert "nothing is chosen" in capsys.readouterr().out


def test_vllm_pair_learning_reports_each_agents_gain_and_interval_by_hand(tmp_path):
    """`vllm_pair_learning.py`: from hand-made runs of 3 seeds (4 updates per generation batch, evaluated after 4 and
    12 batches), each agent's row gives before, after per seed, and the mean gain with its 95% t-interval (t(2) =
    4.303) at each point: gains 0.10, 0.12, 0.14 (sd 0.02) lie above 0, gains 0.1, 0.2, 0.3 (sd 0.1) do not."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce as rp
    from vllm_pair_learning import PAIR, rows

    def run(llama: float, qwen: float) -> dict:
        return {
            "vllm-llama": {"accuracy_before": 0.5, "accuracy_after": 0.5 + llama, "curve": [[16, 0.5], [48, 0.5 + llama]]},
            "vllm-qwen2": {"accuracy_before": 0.3, "accuracy_after": 0.3 + qwen, "curve": [[16, 0.3], [48, 0.3 + qwen]]},
        }  # fmt: skip

    results = {PAIR: {"HACPO": {0: run(0.10, 0.1), 1: run(0.12, 0.2), 2: run(0.14, 0.3)}}}
    grid = argparse.Namespace(out=tmp_path, split="test", steps=12, pair_steps={}, learning_rate=None, seeds=[0, 1, 2])
    entry = rp._report(results, grid, {"HACPO": rp.METHODS["HACPO"]}, {"HACPO": 32})["settings"][PAIR]
    llama, qwen = rows(entry, "HACPO", "paper")
    half = [4.303 * s / math.sqrt(3) for s in (0.02, 0.1)]
    assert llama == (
        f"| paper | vllm-llama | 0.50 | 0.60, 0.62, 0.64 | 4: +0.000 [+0.000, +0.000]; "
        f"12: +0.120 [{0.12 - half[0]:+.3f}, {0.12 + half[0]:+.3f}] | yes |"
    )
    assert qwen == (
        f"| paper | vllm-qwen2 | 0.30 | 0.40, 0.50, 0.60 | 4: +0.000 [+0.000, +0.000]; "
        f"12: +0.200 [{0.2 - half[1]:+.3f}, {0.2 + half[1]:+.3f}] | no |"
    )


def test_vllm_pair_learning_table_regenerates_from_the_run_records(monkeypatch):
    """The committed `vllm_pair_learning` section of RESULTS.md is what its command makes from the run records."""
    _records_only(monkeypatch)
    import reproduce as rp
    from vllm_pair_learning import METHODS, PAIR, lines_for, parse

    page = ROOT / "benchmarks" / "RESULTS.md"
    args = parse(_command(page, "vllm_pair_learning"))
    results = {}
    for m in args.methods:  # a preset renamed since the runs has none: rerun the script
        runs = {s: rp._runs.record(rp._folder(args.out, PAIR, METHODS[m], s)) for s in args.seeds}
        assert None not in runs.values(), (
            f"{m} ({METHODS[m]}): rerun python benchmarks/studies/vllm-pair/vllm_pair_learning.py"
        )
        results[METHODS[m]] = {s: run["summary"] for s, run in runs.items()}
    assert [*lines_for(args, results), ""] == _section(page, "vllm_pair_learning")


def test_the_presets_summed_cost_ratio_and_its_bootstrap_interval_by_hand():
    """`overhead.py --preset`: the summed ratio is every measured batch's seconds, preset over GSPO, over all
    repetitions (one slow batch weighs by its seconds); the bootstrap interval resamples whole repetitions, so with
    identical repetitions it is the point itself, and it always holds the point."""
    import overhead

    def rep(gspo, preset):  # one agent "a", batches of (seconds, taught)
        return {"GSPO": {"a": [(t, False) for t in gspo]}, overhead.PRESET: {"a": [(t, True) for t in preset]}}

    same = [rep([1.0, 1.0], [1.1, 1.3])] * 4
    assert overhead.summed_ratio(same) == pytest.approx((1.2, 1.2, 1.2))
    mixed = [rep([1.0, 1.0], [1.0, 1.0]), rep([1.0, 3.0], [2.0, 6.0])]
    ratio, low, high = overhead.summed_ratio(mixed, "a")
    assert ratio == pytest.approx(10.0 / 6.0) and 1.0 <= low <= ratio <= high <= 2.0
    longer = [rep([1.0, 1.0, 5.0], [1.0, 1.0])]  # batches beyond the shorter run's are left out of both
    assert overhead.summed_ratio(longer)[0] == pytest.approx(1.0)


def test_the_presets_cost_section_regenerates_from_its_committed_timings(tmp_path):
    import overhead

    page = ROOT / "benchmarks" / "RESULTS.md"
    overhead.main(["--preset", "--from_raw", "benchmarks/overhead-preset.json", "--results", str(tmp_path / "c.md")])
    assert _section(tmp_path / "c.md", "overhead-preset") == _section(page, "overhead-preset")


def test_the_vllm_generate_section_regenerates_from_its_committed_timings(tmp_path):
    """`vllm_generate.py --from_raw` writes the committed section again from the committed timings (it needs no vLLM:
    nothing is run), so the table is the measurement, not a transcription."""
    import vllm_generate

    page = ROOT / "benchmarks" / "RESULTS.md"
    vllm_generate.main(["--from_raw", "benchmarks/vllm_generate.json", "--results", str(tmp_path / "v.md")])
    assert _section(tmp_path / "v.md", "vllm_generate") == _section(page, "vllm_generate")
