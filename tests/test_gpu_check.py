"""`benchmarks/gpu_check.py` on CPU: `--help`, the clear refusal without a GPU, the worst-case recipe it launches, and
its report fed with measurements (what it cannot show here: the launch itself, CUDA synchronisation and the real
peak reserved memory, which need a GPU)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hacpo_trl.plan import GIB, Launch, ModelDims, make_plan
from hacpo_trl.plan_cli import build_plan
from hacpo_trl.recipe import check_recipe, load_recipe

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
FIXTURES = ROOT / "tests" / "fixtures" / "model_configs"
spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def _run(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.launch
def test_help_works_and_no_gpu_exits_with_a_message():
    helped = _run("--help")
    assert helped.returncode == 0 and "--accelerate_config" in helped.stdout
    refused = _run("--config", "recipes/qwen3_4b_x_qwen3_4b_instruct.yaml", "--accelerate_config", "a.yaml")
    assert refused.returncode == 2 and "gpu_check: no CUDA GPU here" in refused.stderr


def test_worst_case_recipe_is_one_generation_batch_at_full_length(tmp_path):
    recipe = load_recipe(str(ROOT / "recipes" / "qwen3_4b_x_qwen3_4b_instruct.yaml"))
    worst = gpu_check.worst_case_recipe(recipe, 4, str(tmp_path))
    assert worst["max_steps"] == 4 and worst["generation_kwargs"]["min_tokens"] == 4096  # vLLM: no early EOS
    assert worst["save_strategy"] == "no" and worst["eval_samples"] == 0 and worst["output_dir"] == str(tmp_path)
    check_recipe(worst, num_processes=8)  # the launch will accept it
    tiny = gpu_check.worst_case_recipe(load_recipe(str(ROOT / "recipes" / "tiny_model.yaml")), 4, str(tmp_path))
    assert tiny["generation_kwargs"] == {"min_new_tokens": 40}  # transformers generation


def test_report_of_the_4b_recipe_by_hand():
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3_4b_x_qwen3_4b_instruct.yaml").read_text())
    dims = {
        name: ModelDims.from_config(json.loads((FIXTURES / "Qwen" / repo / "config.json").read_text()))
        for name, repo in (("qwen3-4b", "Qwen3-4B"), ("qwen3-4b-instruct", "Qwen3-4B-Instruct-2507"))
    }
    plan = make_plan(recipe, dims, Launch("zero", num_processes=8, zero_stage=2, mixed_precision="bf16"), 79.2, 7500)
    times = {"generate": 300.0, "loss_and_backward": 200.0, "optimizer": 4.0, "score": 1.0}
    measured = [
        {"rank": r, "agent": "qwen3-4b" if r < 4 else "qwen3-4b-instruct", "device_used_gib": 70.0 + r / 10,
         "peak_reserved_gib": 60.0 + r, "times": {k: v + r for k, v in times.items()}}
        for r in range(8)
    ]  # fmt: skip
    report, lines = gpu_check.make_report(plan, measured, "qwen3_4b_x_qwen3_4b_instruct")
    a = report["agents"]["qwen3-4b"]
    # planned 71.355 GiB (tests/test_plan.py) minus the CUDA context 0.75 and NCCL 1.4 torch cannot see = 69.205;
    # the worst rank of the agent (rank 3) reserved 63.0 -> 63.0 / 69.205 = 0.910
    assert a["planned_peak_gib"] == pytest.approx(71.355, abs=0.001)
    assert a["planned_torch_visible_gib"] == pytest.approx(69.205, abs=0.001)
    assert a["measured_peak_reserved_gib"] == 63.0 and a["measured_over_planned"] == pytest.approx(0.9103, abs=1e-4)
    assert a["time_seconds"] == {"generate": 303.0, "loss_and_backward": 203.0, "optimizer": 7.0, "score": 4.0}
    assert a["ranks"] == {"0": 60.0, "1": 61.0, "2": 62.0, "3": 63.0} and a["device_used_at_end_gib"] == 70.3
    assert "| qwen3-4b | 0-3 | 71.4 | 69.2 | 63.0 | 0.91 | 70.3 | 303.0 | 203.0 | 7.0 | 4.0 |" in lines
    assert "| qwen3-4b-instruct | 4-7 | 71.4 | 69.2 | 67.0 | 0.97 | 70.7 | 307.0 | 207.0 | 11.0 | 8.0 |" in lines
    with pytest.raises(ValueError, match="no measurement for agent 'qwen3-4b-instruct'"):
        gpu_check.make_report(plan, measured[:4], "x")


def test_report_of_a_small_model_recipe():
    """The CPU miniature's own plan (built-in agents; no device allowances on CPU), fed with measurements."""
    recipe = load_recipe(str(ROOT / "recipes" / "tiny_model.yaml"))
    plan = build_plan(recipe, str(ROOT / "accelerate_configs" / "cpu_2agents.yaml"))
    peaks = {a.name: a.peak_gib for a in plan.agents}
    measured = [
        {"rank": i, "agent": a.name, "peak_reserved_gib": 2 * peaks[a.name], "times": {"generate": 1.5}}
        for i, a in enumerate(plan.agents)
    ]
    report, lines = gpu_check.make_report(plan, measured, "tiny_model")
    for a in plan.agents:
        entry = report["agents"][a.name]
        assert entry["planned_torch_visible_gib"] == pytest.approx(a.peak_gib)  # nothing invisible on CPU
        assert entry["measured_over_planned"] == pytest.approx(2.0) and entry["device_used_at_end_gib"] == 0.0
        assert 0 < a.peak_gib * GIB < 2**30  # a small model: well under 1 GiB planned
    assert lines[0] == "### gpu_check: tiny_model" and len([x for x in lines if x.startswith("| trace-")]) == 2
