"""What a user sees on the console of a launch: one progress bar (global rank 0) naming every agent's reward and
capability, no warning caused by our code or recipes, the full metrics in files, and errors from any rank."""

import json
import re
from pathlib import Path

import pytest
import yaml

from helpers import accelerate_launch

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "recipes" / "demo_cpu.yaml"
AGENTS = ["tiny-llama", "tiny-qwen2"]
STEPS = 4


def _demo(out: Path, *args: str):
    return accelerate_launch(
        2, "-m", "hacpo_trl.train", "--config", str(DEMO), "--output_dir", str(out), "--max_steps", str(STEPS),
        "--logging_steps", "2", "--eval_samples", "0", "--plot", "false", *args, timeout=300,
    )  # fmt: skip


def test_agents_line_names_each_agent_with_reward_and_capability():
    from hacpo_trl.launch.progress import agents_line

    logs = {"loss": 0.1, "hacpo/reward/a": 0.5, "hacpo/capability/a": 0.25, "hacpo/reward/b": 0.125}
    assert agents_line(logs, ["a", "b"]) == "a reward 0.500 P̂ 0.250"  # b has no capability yet: left out
    assert agents_line({"train_loss": 0.0}, ["a"]) == ""


@pytest.mark.launch
def test_one_bar_one_line_per_logging_step_and_no_warnings_of_ours(tmp_path, builtin_cache):
    out = tmp_path / "run"
    proc = _demo(out)
    assert proc.returncode == 0, proc.stderr[-5000:]
    # every rendering of a bar over the training steps is the HACPO bar, and it starts exactly once (HF's Trainer
    # would start one unnamed bar per agent)
    segments = [s.strip() for s in re.split(r"[\r\n]", proc.stderr)]
    training_bars = [s for s in segments if re.search(rf"\| \d+/{STEPS} \[", s)]
    assert training_bars and all(s.startswith("HACPO:") for s in training_bars), training_bars[:4]
    assert len([s for s in training_bars if f"| 0/{STEPS} [" in s]) == 1, training_bars
    # one compact line per logging step (from rank 0 only), naming every agent with its reward and capability
    lines = [line for line in proc.stdout.splitlines() if line.startswith("HACPO step")]
    assert [line.split(":")[0] for line in lines] == ["HACPO step 2", "HACPO step 4"], proc.stdout
    for line in lines:
        for agent in AGENTS:
            assert re.search(rf"{agent} reward \d\.\d{{3}} P̂ \d\.\d{{3}}", line), line
    assert "'loss':" not in proc.stdout  # TRL's metric dicts are not printed ...
    for agent in AGENTS:  # ... they are in each agent's files
        records = [json.loads(line) for line in (out / agent / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if "loss" in r] == [2, 4]
        assert all(f"hacpo/capability/{a}" in records[0] for a in AGENTS)
        history = json.loads((out / agent / "log_history.json").read_text())
        assert any(f"hacpo/reward/{agent}" in entry for entry in history)
    # no warning from our code, our recipe's keys or the settings it leaves to the libraries
    keys = set(yaml.safe_load(DEMO.read_text()))
    warnings = [line for line in proc.stderr.splitlines() if "Warning" in line]
    ours = [
        line
        for line in warnings
        if "hacpo_trl" in line or "find_unused_parameters" in line or any(f"`{k}`" in line for k in keys)
    ]
    assert not ours, ours
    assert not [w for w in warnings if "gradient_checkpointing" in w], warnings


@pytest.mark.launch
def test_a_run_in_which_no_agent_scores_warns_once(tmp_path, builtin_cache):
    """The short-answer task graded by the worked-solution reward (no completion writes `so N`): every completion of
    both agents scores 0 in both generation batches, and the console says so once, from global rank 0."""
    proc = _demo(tmp_path / "run", "--reward_funcs", "arithmetic_trace")
    assert proc.returncode == 0, proc.stderr[-5000:]
    warned = [line for line in proc.stderr.splitlines() if "every completion of every agent scored 0" in line]
    assert len(warned) == 1, proc.stderr[-5000:]
    assert "(tiny-llama: 64, tiny-qwen2: 64 completions)" in warned[0]
    assert "reward functions ['arithmetic_trace_answer']" in warned[0]


@pytest.mark.launch
def test_an_error_on_another_rank_still_reaches_the_console(tmp_path, builtin_cache, monkeypatch):
    """Global rank 1 is quiet, but not about its own failure."""
    (tmp_path / "rank1_reward.py").write_text(
        "from hacpo_trl.tasks.rewards import arithmetic_exact_match\n"
        "from hacpo_trl.run.topology import current_topology\n\n"
        "def reward(completions, **kwargs):\n"
        "    if current_topology().global_rank == 1:\n"
        "        raise RuntimeError('reward broke on global rank 1')\n"
        "    return arithmetic_exact_match(completions, **kwargs)\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT / 'src'}")
    proc = _demo(tmp_path / "run", "--reward_funcs", "rank1_reward:reward")
    assert proc.returncode != 0
    assert (
        "hacpo: agent 'tiny-qwen2' (its rank 0, global rank 1) failed: RewardError: reward function "
        "'rank1_reward.reward' raised RuntimeError: reward broke on global rank 1 during training" in proc.stderr
    )
    assert "Traceback" in proc.stderr
