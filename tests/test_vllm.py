"""The vLLM path on the CPU: each agent generating with its own colocated engine of vLLM's CPU build.

Runs with `make install-vllm` then `make test-vllm` (`-m vllm`); skipped where vLLM is not installed. Four
launches serve every test: the paper's rule (one agent fully fine-tuned, the other with LoRA) with a checkpoint,
its resume, the recommended preset through `hacpo_trl.train` and `recipes/tiny_vllm.yaml`, and `hacpo-probe`.
"""

import importlib.util
import json
import math
import re
import statistics
from pathlib import Path

import pytest

from hacpo_trl.tasks.rewards import arithmetic_exact_match
from helpers import accelerate_launch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.launch,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make install-vllm)"),
]
AGENTS = ("vllm-llama", "vllm-qwen2")
# Per-token log-prob, engine against trained model (both float32, different kernels): seen up to 2.3e-5. One update
# moves the tiny models' log-probs of the fixed completions by far more than this (asserted below), so an engine left
# with the initial weights (no sync, or the packed stale copy) or given the other agent's weights fails.
TOL = 1e-3


@pytest.fixture(scope="module", autouse=True)
def vllm_environment(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache (unset: sized from RAM)
        env.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # do not pin the shared cores
        env.setenv("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm_cache")))
        yield


def _summaries(out: Path) -> dict[str, dict]:
    return {a: json.loads((out / f"vllm-{a}.json").read_text()) for a in AGENTS}


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory):
    """The paper's rule, 4 steps = 2 generation batches, a checkpoint every 2 steps; vllm-qwen2 trains LoRA."""
    out = tmp_path_factory.mktemp("vllm_paper")
    proc = accelerate_launch(2, "vllm_agents.py", "--out", str(out), "--steps", "4", "--save_steps", "2", timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out, _summaries(out)


@pytest.fixture(scope="module")
def resumed_run(paper_run):
    """The same run resumed from its last checkpoint (step 4) for one more generation batch."""
    out, _ = paper_run
    proc = accelerate_launch(2, "vllm_agents.py", "--out", str(out), "--steps", "6", "--resume", timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return _summaries(out)


def _gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def _generation_steps(history: list[dict]) -> list[dict]:
    return [h for h in history if "sampling/sampling_logp_difference/max" in h]


def _check_parity(summary: dict) -> None:
    moved = _gap(summary["after"], summary["before"])
    assert moved > 20 * TOL, f"{summary['agent']}: training moved its log-probs by {moved} only"
    gap = _gap(summary["engine"], summary["after"])
    assert gap < TOL, f"{summary['agent']}: engine vs trained model {gap:.4g} (initial vs trained {moved:.4g})"


def test_each_engine_gives_its_own_agents_trained_log_probs(paper_run):
    """Parity after 4 updates, full fine-tuning (vllm-llama) and LoRA (vllm-qwen2): every completion token's
    log-prob from the agent's engine equals its trained model's within TOL."""
    _, runs = paper_run
    assert [runs[a]["lora"] for a in AGENTS] == [False, True]
    for summary in runs.values():
        assert summary["engine_dtype"] == "torch.float32"
        _check_parity(summary)


def test_trl_samples_from_the_current_weights_at_every_generation_batch(paper_run):
    """TRL's own check of the sampled tokens (trainer vs vLLM log-probs) at each generation batch, the second one
    after two updates: the sync TRL triggers reached the engine."""
    _, runs = paper_run
    for agent, summary in runs.items():
        steps = _generation_steps(summary["log_history"])
        gaps = [(h["step"], h["sampling/sampling_logp_difference/max"]) for h in steps]
        assert [step for step, _ in gaps] == [1, 3] and all(gap < TOL for _, gap in gaps), (agent, gaps)


def _rewards(record: dict) -> list[float]:
    """Each own row's reward as TRL sums it: the reward functions weighted by the script's REWARD_WEIGHTS."""
    return [0.25 * right + 0.75 * first for right, first in record["rewards_per_func"]]


def test_two_agents_share_rollouts_with_their_own_engines_seeds_and_rewards(paper_run):
    """Whatever was sampled: each engine has its own seed; the logged reward and its spread are those of the rows'
    rewards, which score each completion's answer; every batch has a spread (by construction of the script's
    reward) and trains; both agents answer the same prompts, and each learner trains on every non-empty completion
    of its peer (the paper's rule takes every peer row)."""
    _, runs = paper_run
    assert sorted(runs[a]["engine_seed"] for a in AGENTS) == [0, 1]  # the agent offset (vllm_seed)
    for agent, summary in runs.items():
        batches = [h for h in summary["log_history"] if "reward" in h]
        records = summary["importance_sampling"]
        assert len(batches) == len(records) == 2, agent
        for logged, record in zip(batches, records, strict=True):
            ids = record["prompt_ids"]
            assert all(ids[i] == ids[i - i % 4] for i in range(len(ids))), agent  # groups of 4, as the reward assumes
            rewards = _rewards(record)
            right = arithmetic_exact_match(record["completions"], record["answers"])
            assert [r[0] for r in record["rewards_per_func"]] == right, agent  # the answer, from each completion
            assert logged["reward"] == pytest.approx(statistics.fmean(rewards), abs=1e-6), agent
            assert logged["reward_std"] == pytest.approx(statistics.stdev(rewards), abs=1e-6), agent
            assert logged["reward_std"] > 0, agent  # by construction: the first of each group scores more
    peer_of = dict(zip(AGENTS, reversed(AGENTS), strict=True))
    for agent in AGENTS:
        mine, theirs = runs[agent]["importance_sampling"], runs[peer_of[agent]]["importance_sampling"]
        for k, (record, peer) in enumerate(zip(mine, theirs, strict=True)):
            assert record["prompt_ids"] == peer["prompt_ids"], (agent, k)  # one data seed: the same prompts
            assert sum(record["hacpo_is_peer"]) == sum(1 for text in peer["completions"] if text), (agent, k)


def test_vllm_importance_sampling_weighs_own_rows_by_hand_and_peer_rows_by_one(paper_run):
    """TRL's `sequence_mask` mode: ratio = exp(sum over completion tokens of (trainer - vLLM) log-prob), 0 outside
    [clip_min, clip_max] = [-inf, 3]; HACPO passes it on for the own rows and gives peer rows (another agent's
    samples, not this engine's) weight 1."""
    _, runs = paper_run
    for agent, summary in runs.items():
        for r in summary["importance_sampling"]:
            own = len(r["importance_sampling_ratio"])
            for i, (old, sampled, mask) in enumerate(
                zip(r["old_per_token_logps"], r["sampling_per_token_logps"], r["completion_mask"], strict=True)
            ):
                diff = sum((o - s) * m for o, s, m in zip(old, sampled, mask, strict=True) if not math.isnan(s))
                expected = math.exp(diff) if math.exp(diff) <= 3.0 else 0.0
                assert r["importance_sampling_ratio"][i][0] == pytest.approx(expected, abs=1e-6), (agent, i)
            flat = [v[0] for v in r["importance_sampling_ratio"]]
            assert r["hacpo_is_peer"][:own] == [False] * own and all(r["hacpo_is_peer"][own:])
            assert r["hacpo_ratio"][:own] == pytest.approx(flat, abs=0) and set(r["hacpo_ratio"][own:]) == {1.0}


def test_a_resumed_run_generates_from_the_checkpoint_weights(paper_run, resumed_run):
    """The engine starts from the base model; the first generation after the resume (step 5) must already use the
    checkpoint's weights, and the engines hold the final weights after it."""
    for agent, summary in resumed_run.items():
        steps = _generation_steps(summary["log_history"])
        assert steps[-1]["step"] == 5 and summary["log_history"][-1]["step"] == 6, agent
        assert steps[-1]["sampling/sampling_logp_difference/max"] < TOL, (agent, steps[-1])
        _check_parity(summary)


def _makefile_flags(name: str) -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return re.search(rf"^{name} = (.*)$", text, flags=re.M).group(1).split()


def test_the_recommended_preset_trains_with_vllm_through_the_recipe(tmp_path):
    """`hacpo_trl.train` on recipes/tiny_vllm.yaml with the preset's flags (Makefile PRESET_ARGS), 2 generation
    batches: both agents finish, log a reward at each generation batch and sample from their current weights."""
    out = tmp_path / "preset"
    recipe = str(ROOT / "recipes" / "tiny_vllm.yaml")
    args = ["--config", recipe, "--output_dir", str(out), "--max_steps", "8", "--eval_samples", "20"]
    proc = accelerate_launch(2, "-m", "hacpo_trl.train", *args, *_makefile_flags("PRESET_ARGS"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    # one console for the launch: start-up said, each engine warning once, every agent's numbers after the bar
    assert proc.stderr.count("hacpo: loading the agents and starting each one's vLLM engine") == 1
    for warning in ("Triton is installed", "NUMA binding", "torch.distributed.reduce_op"):
        assert proc.stderr.count(warning) <= 1, (warning, proc.stderr[-3000:])
    lines = proc.stdout.splitlines()
    assert [line.split("]")[0] for line in lines if "before training:" in line] == ["[vllm-llama", "[vllm-qwen2"]
    assert not any("after training" in line for line in lines)  # the summary gives both agents' numbers
    for agent in AGENTS:
        history = json.loads((out / agent / "log_history.json").read_text())
        gaps = [(h["step"], h["sampling/sampling_logp_difference/max"]) for h in _generation_steps(history)]
        assert [step for step, _ in gaps] == [1, 5] and all(gap < TOL for _, gap in gaps), (agent, gaps)
        rewards = [h["reward"] for h in history if "reward" in h]
        assert len(rewards) == 2 and all(0 <= r <= 1 for r in rewards), (agent, rewards)


def test_probe_generates_with_vllm(tmp_path):
    out = tmp_path / "probe.json"
    recipe = str(ROOT / "recipes" / "tiny_vllm.yaml")
    proc = accelerate_launch(
        2, "-m", "hacpo_trl.probe", "--config", recipe, "--prompts", "4", "--output", str(out), timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    report = json.loads(out.read_text())
    assert report["backend"] == "vLLM, colocate mode" and set(report["agents"]) == set(AGENTS)
    assert all(p["rows"] == 16 for p in report["pairs"]), report["pairs"]
