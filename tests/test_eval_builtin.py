"""`hacpo-eval` on the agents `hacpo-train` saved: it evaluates the task they were trained on, the way the run did,
and reports the run's own held-out accuracy; a built-in task they were not trained on is refused."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import accelerate_launch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.launch


def test_eval_reproduces_the_runs_held_out_accuracy_and_refuses_the_other_task(tmp_path):
    out = tmp_path / "demo"
    run = accelerate_launch(
        2, "-m", "hacpo_trl.train", "--config", str(ROOT / "recipes" / "tiny_state.yaml"),
        "--output_dir", str(out), "--max_steps", "1", "--eval_samples", "24", "--plot", "false", timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    summary = json.loads((out / "hacpo_summary.json").read_text())
    agents = sorted(summary)
    assert agents == ["trace-base", "trace-instruct"]
    record = json.loads((out / "trace-base" / "hacpo_task.json").read_text())
    assert record["task"] == "arithmetic_trace" and record["eval_samples"] == 24

    # the README's command, after the demo: no --benchmark, so each agent's own task and held-out problems
    cmd = [sys.executable, "-m", "hacpo_trl.evaluate", *[a for n in agents for a in ("--model", str(out / n))]]
    # one thread, as each process of the launch evaluated (accelerate sets OMP_NUM_THREADS=1): the same kernels, so
    # no near-tie of the greedy argmax can fall the other way
    one_thread = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*cmd, "--output_dir", str(tmp_path / "eval")], capture_output=True, text=True, timeout=900,
                          env=one_thread)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "trained on 'arithmetic_trace'" in proc.stdout
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    for name in agents:
        got = results[name]["arithmetic_trace"]
        assert got["n"] == 24
        # same agents, same problems, greedy, same batching: the run's number (to the printed 3 decimals)
        assert round(got["avg@k"], 3) == round(summary[name]["accuracy_after"], 3), (name, got, summary[name])

    wrong = subprocess.run([*cmd, "--benchmark", "arithmetic"], capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 2
    assert "was trained on 'arithmetic_trace', not 'arithmetic'" in wrong.stderr


REWARDS = '''def always(completions, **kwargs):
    """A reward unlike the task's: every completion is right, whatever it says."""
    return [1.0] * len(completions)


def never(completions, **kwargs):
    return [0.0] * len(completions)
'''


def test_eval_scores_with_the_runs_own_reward_functions(tmp_path, monkeypatch):
    """A run trained with a custom reward: `hacpo-eval` imports the run's recorded `reward_funcs`, as training did,
    so its number is the summary's (the task's built-in reward would give another); `--reward_funcs` overrides;
    without the module on PYTHONPATH one line names it, before any model loads."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_rewards.py").write_text(REWARDS)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'mine'}:{os.environ.get('PYTHONPATH', '')}")
    out = tmp_path / "run"
    run = accelerate_launch(
        2, "-m", "hacpo_trl.train", "--config", str(ROOT / "recipes" / "tiny_state.yaml"), "--output_dir", str(out),
        "--max_steps", "1", "--eval_samples", "8", "--plot", "false", "--reward_funcs", "my_rewards:always",
        timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stderr.count("hacpo: sharing: paper (the paper's rule") == 1  # the mode, said once at the start
    summary = json.loads((out / "hacpo_summary.json").read_text())
    assert summary["trace-base"]["accuracy_after"] == 1.0  # the task's own reward: trace-base solves 0.17
    cmd = [sys.executable, "-m", "hacpo_trl.evaluate", "--model", str(out / "trace-base")]
    proc = subprocess.run([*cmd, "--output_dir", str(tmp_path / "eval")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads((tmp_path / "eval" / "results.json").read_text())["trace-base"]["arithmetic_trace"]
    assert got["n"] == 8 and got["avg@k"] == 1.0, got
    flag = [*cmd, "--reward_funcs", "my_rewards:never", "--output_dir", str(tmp_path / "eval2")]
    assert subprocess.run(flag, capture_output=True, text=True, timeout=900).returncode == 0
    assert json.loads((tmp_path / "eval2" / "results.json").read_text())["trace-base"]["arithmetic_trace"]["avg@k"] == 0
    monkeypatch.setenv("PYTHONPATH", "")
    proc = subprocess.run([*cmd, "--output_dir", str(tmp_path / "eval3")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("hacpo-eval: error: --model") and "my_rewards" in line and "PYTHONPATH" in line, line


def test_a_dataset_task_is_evaluated_on_its_held_out_rows_or_says_it_has_none(tmp_path):
    """`task: dataset` with `dataset_test_split` (here a .jsonl of held-out rows): accuracy before and after training,
    scored with the run's reward on the first `eval_samples` rows; without it, one line says there is none."""
    rows = [
        {"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)} for a in range(6) for b in range(4)
    ]
    for name, part in (("train.jsonl", rows[:16]), ("held_out.jsonl", rows[16:])):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    common = ["--config", str(ROOT / "recipes" / "demo_cpu.yaml"), "--task", "dataset", "--dataset_name",
              str(tmp_path / "train.jsonl"), "--reward_funcs", "arithmetic_exact", "--max_steps", "1",
              "--eval_samples", "6", "--plot", "false"]  # fmt: skip
    out = tmp_path / "with"
    run = accelerate_launch(2, "-m", "hacpo_trl.train", *common, "--output_dir", str(out), "--dataset_test_split",
                            str(tmp_path / "held_out.jsonl"), timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    summary = json.loads((out / "hacpo_summary.json").read_text())
    for agent in ("tiny-llama", "tiny-qwen2"):
        before, after = summary[agent]["accuracy_before"], summary[agent]["accuracy_after"]
        assert before is not None and after is not None, summary[agent]
        assert all(abs(x * 6 - round(x * 6)) < 1e-4 for x in (before, after)), summary[agent]  # 6 rows scored
    assert "has no held-out rows" not in run.stderr
    run = accelerate_launch(2, "-m", "hacpo_trl.train", *common, "--output_dir", str(tmp_path / "without"),
                            timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stderr.count("hacpo: task 'dataset' has no held-out rows") == 1
    assert (
        json.loads((tmp_path / "without" / "hacpo_summary.json").read_text())["tiny-llama"]["accuracy_before"] is None
    )
