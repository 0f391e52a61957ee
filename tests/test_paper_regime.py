"""The CPU miniature in the paper's regime: built-in agents whose tokenizer is the one they are trained with, the
reasoning-trace task, the peer-row layout and the peer-ratio statistics."""

import dataclasses
import math
import os

import pytest
import torch
from transformers import AutoTokenizer

from hacpo_trl.agents import builtin, demo
from hacpo_trl.algorithm import deal_round_robin, peer_ratio_stats, peer_row_order
from hacpo_trl.tasks.data import HALVES, carry_half, carry_trace_splits, task_splits, trace_solution, trace_splits
from hacpo_trl.tasks.rewards import arithmetic_trace_answer

# ------------------------------------------------------------------------------------------ built-in agents


@pytest.mark.parametrize("name", sorted(demo.BUILTIN_AGENTS))
def test_builtin_agent_is_warm_started_with_the_tokenizer_it_loads_back_as(name, tmp_path, monkeypatch):
    """The trainer and hacpo-eval load an agent's tokenizer with AutoTokenizer; the warm-start must have seen the
    same token ids for the task's prompts and targets (a Qwen2 folder loads as Qwen2Tokenizer, which splits digits
    unlike the in-memory BPE tokenizer it was built from)."""
    seen = {}

    def record(model, tok, stages):  # the warm-start's own tokenizer; skip the training itself
        seen["tok"] = tok
        return [{"agent": name, "steps": 0, "validation_accuracy": 0.0, "band": [0, 1]} for name, _ in stages]

    monkeypatch.setattr(demo, "_warm_start", record)
    folder = demo.build_agent(name, str(tmp_path / name))
    loaded = AutoTokenizer.from_pretrained(folder, padding_side="left")
    rows = list(task_splits(demo.BUILTIN_AGENTS[name].task)["warmup"].select(range(100)))
    rows += list(task_splits(demo.BUILTIN_AGENTS[name].task)["test"].select(range(100)))
    differ = [r["prompt"][0]["content"] for r in rows if demo._encode(seen["tok"], r) != demo._encode(loaded, r)]
    assert not differ, f"{name}: {len(differ)} of {len(rows)} rows tokenize differently, e.g. {differ[:3]}"
    answers = [r["answer"] for r in rows]
    assert [seen["tok"](a)["input_ids"] for a in answers] == [loaded(a)["input_ids"] for a in answers]


class _ScriptedRun:
    """A stand-in for the warm-start: validation accuracy is a function of the steps taken."""

    curve = staticmethod(lambda steps: steps / 100)

    def __init__(self, model, tok, spec):
        self.steps, self.restored = 0, []

    def train(self, steps):
        self.steps += steps

    def accuracy(self, measure="greedy"):
        return self.curve(self.steps) / (2 if measure == "sampled" else 1)  # sampled: half greedy, to tell them apart

    def snapshot(self):
        return {"steps": self.steps}

    def restore(self, saved):
        self.restored.append(saved["steps"])
        self.steps = saved["steps"]


def _stage(band, max_steps=3000):
    return demo.DemoAgent("llama", hidden_size=8, layers=1, band=band, seed=0, max_steps=max_steps)


def test_warm_start_stops_at_the_first_check_inside_its_band(monkeypatch):
    monkeypatch.setattr(demo, "_WarmStart", _ScriptedRun)
    # accuracy = steps / 100, checked every 10 steps: 0.25 (step 25) is never a check, 0.30 (step 30) is
    (record,) = demo._warm_start(None, None, [("a", _stage((0.25, 0.35)))])
    assert (record["steps"], record["validation_accuracy"], record["refined"]) == (30, 0.30, False)
    # a second stage continues the same run from where the first stopped (the state pair)
    records = demo._warm_start(None, None, [("base", _stage((0.2, 0.25))), ("instruct", _stage((0.5, 0.55)))])
    assert [(r["agent"], r["steps"], r["band"]) for r in records] == [
        ("base", 20, [0.2, 0.25]),
        ("instruct", 50, [0.5, 0.55]),
    ]


def test_a_band_on_sampled_accuracy_stops_on_it_and_records_greedy_beside(monkeypatch):
    """The trace agents' bands are on sampled accuracy (here half the greedy one): [0.1, 0.2] is first reached at the
    check of step 20 (sampled 0.10), where greedy is 0.20, which alone would have stopped at step 10 in that band."""
    monkeypatch.setattr(demo, "_WarmStart", _ScriptedRun)
    (record,) = demo._warm_start(None, None, [("a", dataclasses.replace(_stage((0.1, 0.2)), measure="sampled"))])
    assert (record["steps"], record["validation_accuracy"], record["greedy_accuracy"]) == (20, 0.1, 0.2)
    assert record["measure"] == "sampled" and record["band"] == [0.1, 0.2]
    (greedy,) = demo._warm_start(None, None, [("a", _stage((0.1, 0.2)))])
    assert (greedy["steps"], greedy["measure"]) == (10, "greedy") and "greedy_accuracy" not in greedy
    trace = [n for n, a in demo.BUILTIN_AGENTS.items() if a.task.startswith("arithmetic_trace")]
    paper = [n for n in trace if n not in demo.PAIRS["complement"]]  # the complement pair's band is on greedy
    assert len(paper) == 7 and all(demo.BUILTIN_AGENTS[n].measure == "sampled" for n in paper)


def test_warm_start_passing_its_band_between_checks_goes_back_one_check_and_steps_singly(monkeypatch):
    monkeypatch.setattr(demo, "_WarmStart", _ScriptedRun)
    # checks at 20 (0.20) and 30 (0.60) jump over [0.4, 0.5]; from 20, one step at a time: 0.45 first at step 25
    monkeypatch.setattr(
        _ScriptedRun,
        "curve",
        staticmethod(
            lambda steps: 0.2 if steps <= 20 else min(0.6, 0.45 + (steps - 25) * 0.05) if steps >= 25 else 0.3
        ),
    )
    (record,) = demo._warm_start(None, None, [("a", _stage((0.4, 0.5)))])
    assert (record["steps"], record["validation_accuracy"], record["refined"]) == (25, 0.45, True)
    # a band no single step lands in: a clear error naming the agent, its steps and accuracy
    monkeypatch.setattr(_ScriptedRun, "curve", staticmethod(lambda steps: 0.1 if steps < 25 else 0.9))
    with pytest.raises(
        RuntimeError,
        match=r"'a': the warm-start passed it in one step .* 0\.900 outside its band \[0\.4, 0\.5\] after 25 steps",
    ):
        demo._warm_start(None, None, [("a", _stage((0.4, 0.5)))])


def test_warm_start_that_reaches_its_step_cap_outside_its_band_fails(monkeypatch):
    monkeypatch.setattr(demo, "_WarmStart", _ScriptedRun)
    monkeypatch.setattr(_ScriptedRun, "curve", staticmethod(lambda steps: 0.05))
    with pytest.raises(RuntimeError, match=r"'a': the warm-start reached the cap of 95 steps .* after 95 steps"):
        demo._warm_start(None, None, [("a", _stage((0.2, 0.3), max_steps=95))])


def test_a_killed_build_leaves_nothing_behind_for_the_next_one(tmp_path):
    """A build writes to ``<folder>.tmp-PID-...`` and renames it when complete; a killed build's leftover (its process
    gone) is removed by the next build of that agent, a live build's is left alone."""
    folder = tmp_path / "tiny-qwen2-0123456789"
    dead, live = tmp_path / f"{folder.name}.tmp-999999999-1", tmp_path / f"{folder.name}.tmp-{os.getpid()}-2"
    for tmp in (dead, live):
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
    demo._remove_stale_builds(str(folder))
    assert not dead.exists() and live.is_dir()


def test_pairs_name_builtin_agents_of_the_four_kinds():
    agents = demo.BUILTIN_AGENTS
    assert set(demo.PAIRS) == {"state", "size", "model", "style", "complement", "vllm"}
    strong, weak = (agents[n] for n in demo.PAIRS["state"])
    assert (strong.architecture, strong.hidden_size, strong.layers, strong.seed) == (
        weak.architecture, weak.hidden_size, weak.layers, weak.seed,
    ) and strong.after == demo.PAIRS["state"][1]  # fmt: skip
    # every pair of the paper's kinds: one agent's band lies wholly above the other's, and far below 1 (room for RL)
    for pair in (demo.PAIRS[p] for p in ("state", "size", "model", "style")):
        weaker, stronger = sorted(agents[n].band for n in pair)
        assert weaker[0] <= weaker[1] < stronger[0] <= stronger[1] < 0.7, pair
    big, small = (agents[n] for n in demo.PAIRS["size"])
    assert big.architecture == small.architecture and big.hidden_size * big.layers > small.hidden_size * small.layers
    a, b = (agents[n] for n in demo.PAIRS["model"])
    assert a.architecture != b.architecture
    # style: the same model shape and tokenizer, warm-started on two ways of writing the same worked solutions
    steps, bracket = (agents[n] for n in demo.PAIRS["style"])
    assert (steps.architecture, steps.hidden_size, steps.layers) == (
        bracket.architecture,
        bracket.hidden_size,
        bracket.layers,
    )
    assert (steps.task, bracket.task) == ("arithmetic_trace", "arithmetic_trace_bracket")
    same = ("model", "state", "size")
    assert all(agents[n].task == "arithmetic_trace" for pair in same for n in demo.PAIRS[pair])
    assert builtin.resolve_model("some/path") == "some/path"


def test_the_complement_pair_differs_only_in_the_half_it_is_warm_started_on():
    """One shape, tokenizer, task and band of overall greedy accuracy; each agent warm-started on 90% rows of its
    own half, the two halves different; the build fails unless it leads on its own half by 0.15 (the issue's bar)."""
    a, b = (demo.BUILTIN_AGENTS[n] for n in demo.PAIRS["complement"])
    assert isinstance(a, demo.HalfAgent) and isinstance(b, demo.HalfAgent)
    same = ("architecture", "hidden_size", "layers", "band", "task", "measure", "learning_rate", "own_share", "lead")
    assert all(getattr(a, f) == getattr(b, f) for f in same) and a.seed != b.seed
    assert {a.half, b.half} == set(HALVES) and a.task == "arithmetic_trace_carries" and a.measure == "greedy"
    assert a.band[1] - a.band[0] <= 0.05 and a.lead >= 0.15
    for spec in (a, b):
        rows = demo.warmup_rows(spec)
        own = sum(r["half"] == spec.half for r in rows)
        assert own == 2000 and len(rows) - own == round(2000 / 9)  # 90% own half
        assert len(demo.validation_rows(spec.task, spec.validation_size)) == 1000
    # the other agents' specs (and so their cache folders) are unchanged by the subclass
    others = [s for n, s in demo.BUILTIN_AGENTS.items() if n not in demo.PAIRS["complement"] + demo.PAIRS["vllm"]]
    assert all(type(s) is demo.DemoAgent for s in others)
    assert len(demo.warmup_rows(demo.BUILTIN_AGENTS["trace-base"])) == 4000


class _HalvesRun:
    """A stand-in warm-start run of a task with halves: fixed accuracy per half, greedy and sampled."""

    def __init__(self, greedy, sampled):
        self.results = {"greedy": greedy, "sampled": sampled}

    def evaluate(self, measure="greedy", by=None):
        from hacpo_trl.evaluation.evaluate import EvalResult

        halves = self.results[measure]
        return EvalResult(sum(halves.values()) / 2, 0.0, 1, 1000, halves if by else None)


def test_a_half_agent_records_its_halves_and_fails_without_its_lead():
    spec = demo.BUILTIN_AGENTS["trace-carry"]
    run = _HalvesRun({"carry": 0.66, "no_carry": 0.01}, {"carry": 0.12, "no_carry": 0.0})
    record = demo._half_record("trace-carry", spec, run)
    assert record == {
        "half": "carry",
        "greedy_accuracy_by_half": {"carry": 0.66, "no_carry": 0.01},
        "sampled_accuracy": 0.06,
        "sampled_accuracy_by_half": {"carry": 0.12, "no_carry": 0.0},
    }
    close = _HalvesRun({"carry": 0.40, "no_carry": 0.30}, {"carry": 0.1, "no_carry": 0.1})
    with pytest.raises(RuntimeError, match=r"leads on its own half 'carry' by 0\.100, less than the 0\.15"):
        demo._half_record("trace-carry", spec, close)
    # leading on the other half is no lead at all
    with pytest.raises(RuntimeError, match=r"by -0\.650"):
        demo._half_record("trace-nocarry", demo.BUILTIN_AGENTS["trace-nocarry"], run)


# ------------------------------------------------------------------------------------------------- the task


def test_the_existing_tasks_splits_are_unchanged_byte_for_byte():
    """Other benchmarks depend on the built-in tasks' problems row for row: a new task must not move them."""
    import hashlib
    import json

    digests = {
        t: hashlib.sha256(json.dumps({k: v.to_list() for k, v in task_splits(t).items()}, sort_keys=True).encode())
        for t in ("arithmetic", "arithmetic_trace", "arithmetic_trace_bracket")
    }
    assert {t: d.hexdigest()[:16] for t, d in digests.items()} == {
        "arithmetic": "0615722a9042ec04",
        "arithmetic_trace": "992c8085915a4067",
        "arithmetic_trace_bracket": "b07b779e8fb39097",
    }


def test_carry_halves_by_hand():
    assert carry_half(347, 285) is None  # the last column does not carry: in neither half
    assert carry_half(995, 118) == "carry" and carry_half(5, 995) == "carry"
    assert carry_half(127, 571) == "no_carry" and carry_half(0, 0) == "no_carry"
    assert carry_half(45, 55) is None  # 045 + 055: the hundreds column does not carry
    assert trace_solution(995, 118) == "5+8=13, 9+1+1=11, 9+1+1=11, so 1113"
    assert trace_solution(127, 571) == "7+1=8, 2+7+0=9, 1+5+0=6, so 698"


def test_carry_trace_splits_mix_the_halves_50_50_and_are_disjoint():
    splits = carry_trace_splits()
    assert {k: len(v) for k, v in splits.items()} == {"test": 500, "validation": 1000, "warmup": 4000, "train": 4000}
    seen = set()
    for name, data in splits.items():
        halves = data["half"]
        assert halves == [HALVES[i % 2] for i in range(len(data))], name  # alternating: every even prefix is 50/50
        problems = [tuple(map(int, p[0]["content"].rstrip("=").split("+"))) for p in data["prompt"]]
        assert [carry_half(a, b) for a, b in problems] == halves, name
        assert data["solution"] == [trace_solution(a, b) for a, b in problems]
        assert data["answer"] == [str(a + b) for a, b in problems]
        assert not seen & set(problems) and len(set(problems)) == len(problems), name
        seen |= set(problems)
    assert carry_trace_splits()["test"][:4] == splits["test"][:4]  # from a seed
    assert task_splits("arithmetic_trace_carries")["train"][:4] == splits["train"][:4]
    assert arithmetic_trace_answer(splits["test"]["solution"], splits["test"]["answer"]) == [1.0] * 500
    with pytest.raises(ValueError, match="sizes must be even"):
        carry_trace_splits(test_size=5)


def test_trace_solution_by_hand():
    assert trace_solution(347, 285) == "7+5=12, 4+8+1=13, 3+2+1=6, so 632"
    assert trace_solution(5, 995) == "5+5=10, 0+9+1=10, 0+9+1=10, so 1000"
    assert trace_solution(12, 34, digits=2) == "2+4=6, 1+3+0=4, so 46"
    assert trace_solution(347, 285, style="bracket") == "[5+7=12][8+4+1=13][2+3+1=6] so 632"
    assert trace_solution(5, 995, style="bracket") == "[5+5=10][9+0+1=10][9+0+1=10] so 1000"
    with pytest.raises(ValueError, match="unknown trace style 'prose'"):
        trace_solution(1, 2, style="prose")


def test_the_bracket_style_changes_the_warmup_solutions_only():
    """Same problems, answers and splits; only the worked solutions are written differently, and the reward grades
    both styles' solutions correct."""
    steps, bracket = task_splits("arithmetic_trace"), task_splits("arithmetic_trace_bracket")
    for name in ("warmup", "train", "validation", "test"):
        assert steps[name]["prompt"] == bracket[name]["prompt"] and steps[name]["answer"] == bracket[name]["answer"]
    rows = bracket["warmup"].select(range(50))
    originals = steps["warmup"]["solution"][:50]
    assert all(r["solution"].startswith("[") and r["solution"] != s for r, s in zip(rows, originals, strict=True))
    assert arithmetic_trace_answer(rows["solution"], rows["answer"]) == [1.0] * 50


def test_trace_splits_are_disjoint_large_enough_and_long_for_every_tokenizer(tmp_path):
    splits = trace_splits()
    keys = {name: {r["prompt"][0]["content"] for r in data} for name, data in splits.items()}
    assert len(keys["test"]) == len(splits["test"]) >= 500
    names = list(keys)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not keys[a] & keys[b], (a, b)
    assert trace_splits()["test"][:5] == splits["test"][:5]  # from a seed
    for name in ("trace-llama", "trace-qwen2"):
        tok = demo._as_loaded(*_bare(name), str(tmp_path / name))
        lengths = [len(tok(r["solution"], add_special_tokens=False)["input_ids"]) for r in splits["test"]]
        assert min(lengths) >= 15, (name, min(lengths))


def _bare(name):
    spec = demo.BUILTIN_AGENTS[name]
    from hacpo_trl.agents.tiny import bpe_tokenizer, char_tokenizer, tiny_llama, tiny_qwen2

    tok = char_tokenizer() if spec.architecture == "llama" else bpe_tokenizer()
    model = (tiny_llama if spec.architecture == "llama" else tiny_qwen2)(tok, hidden_size=8, layers=1)
    return model, tok


def test_trace_reward_grades_the_final_answer_only():
    completions = [
        "7+5=12, 4+8+1=13, 3+2+1=6, so 632",  # right
        "7+5=11, 4+8+1=99, so 632",  # wrong steps, right final answer: still 1
        "7+5=12, 4+8+1=13, 3+2+1=6, so 633",  # right steps, wrong answer
        "632",  # no "so": no final answer
        "so 1, so 632",  # the last "so" counts
    ]
    assert arithmetic_trace_answer(completions, ["632"] * 5) == [1.0, 1.0, 0.0, 0.0, 1.0]


# --------------------------------------------------------------------------------------- layout and metrics


def test_deal_round_robin_by_hand():
    # self rows 0-3, peer rows 4-7, two updates: each update gets two self rows and two peer rows
    assert deal_round_robin(torch.arange(8), 2).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert deal_round_robin(torch.arange(6), 3).tolist() == [0, 3, 1, 4, 2, 5]


@pytest.mark.parametrize("n_self, n_total, chunks", [(64, 128, 4), (64, 96, 4), (10, 12, 2)])
def test_peer_row_order_layouts(n_self, n_total, chunks):
    gen = torch.Generator().manual_seed(0)
    first = peer_row_order(n_self, n_total, chunks, "self_first", gen)
    assert sorted(first.tolist()) == list(range(n_total))
    assert (first[:n_self] < n_self).all() and (first[n_self:] >= n_self).all()
    mixed = peer_row_order(n_self, n_total, chunks, "interleaved", torch.Generator().manual_seed(0))
    assert sorted(mixed.tolist()) == list(range(n_total))
    per_chunk = [int((c < n_self).sum()) for c in mixed.chunk(chunks)]
    assert max(per_chunk) - min(per_chunk) <= 1 and sum(per_chunk) == n_self  # every update: its share of self rows
    # the same shuffles, only dealt differently
    assert mixed.tolist() == deal_round_robin(first, chunks).tolist()
    with pytest.raises(ValueError, match="peer_layout"):
        peer_row_order(n_self, n_total, chunks, "random")
    with pytest.raises(ValueError, match="equal chunks"):
        peer_row_order(3, 7, 2, "interleaved")


def test_peer_ratio_stats_by_hand():
    s = torch.tensor([0.5, 0.9, 1.0, 2.0])
    lb = torch.tensor([0.8, 0.8, 0.85, 0.85])
    stats = peer_ratio_stats(s, lb)
    assert stats["mean"] == pytest.approx(1.1)
    assert stats["median"] == pytest.approx(0.9)  # torch: the lower middle value
    assert stats["geomean"] == pytest.approx(math.exp((math.log(0.5) + math.log(0.9) + math.log(2.0)) / 4))
    assert (stats["in_band"], stats["low"], stats["high"]) == (0.5, 0.25, 0.25)
    assert stats["lower_bound"] == pytest.approx(0.825)
    assert peer_ratio_stats(torch.tensor([]), torch.tensor([])) == {}
    with pytest.raises(ValueError, match="finite and > 0"):
        peer_ratio_stats(torch.tensor([0.0]), torch.tensor([0.8]))
