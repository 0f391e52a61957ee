"""`benchmarks/gpu_check.py` on CPU: `--help`, the clear refusal without a GPU (`make gpu-check` too), the worst-case
recipe it launches, what each rank records (CUDA simulated), and its report fed with measurements. What it cannot
show here: the launch itself on a GPU, CUDA synchronisation and real peak memory."""

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from hacpo_trl.launch.plan_cli import build_plan
from hacpo_trl.launch.recipe import check_recipe, load_recipe
from hacpo_trl.planning.plan import GIB, Launch, ModelDims, make_plan

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


@pytest.mark.launch
def test_make_gpu_check_without_a_gpu_exits_2_with_one_line():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(["make", "-s", "gpu-check", f"GPU_PYTHON={sys.executable}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0].startswith("gpu_check: no CUDA GPU here")


def test_worst_case_recipe_is_one_generation_batch_at_full_length(tmp_path):
    recipe = load_recipe(str(ROOT / "recipes" / "qwen3_4b_x_qwen3_4b_instruct.yaml"))
    worst = gpu_check.worst_case_recipe(recipe, 4, str(tmp_path))
    assert worst["max_steps"] == 4 and worst["generation_kwargs"]["min_tokens"] == 4096  # vLLM: no early EOS
    assert gpu_check.worst_case_recipe(recipe, 2, str(tmp_path), generation_batches=3)["max_steps"] == 6
    assert worst["save_strategy"] == "no" and worst["eval_samples"] == 0 and worst["output_dir"] == str(tmp_path)
    check_recipe(worst, num_processes=8)  # the launch will accept it
    tiny = gpu_check.worst_case_recipe(load_recipe(str(ROOT / "recipes" / "tiny_model.yaml")), 4, str(tmp_path))
    assert tiny["generation_kwargs"] == {"min_new_tokens": 40}  # transformers generation


def _plan_4b():
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3_4b_x_qwen3_4b_instruct.yaml").read_text())
    dims = {
        name: ModelDims.from_config(json.loads((FIXTURES / "Qwen" / repo / "config.json").read_text()))
        for name, repo in (("qwen3-4b", "Qwen3-4B"), ("qwen3-4b-instruct", "Qwen3-4B-Instruct-2507"))
    }
    return make_plan(recipe, dims, Launch("zero", num_processes=8, zero_stage=2, mixed_precision="bf16"), 79.2, 7500)


def test_report_of_the_4b_recipe_by_hand():
    plan = _plan_4b()
    times = {"generate": 300.0, "loss_and_backward": 200.0, "optimizer": 4.0, "score": 1.0, "exchange_wait": 2.0}
    measured = [
        {"rank": r, "agent": "qwen3-4b" if r < 4 else "qwen3-4b-instruct", "device_used_gib": 70.0 + r / 10,
         "peak_reserved_gib": 60.0 + r, "peak_allocated_gib": 50.0 + r, "times": {k: v + r for k, v in times.items()},
         "batch_seconds": [100.0 + r, 50.0, 40.0 + r]}
        for r in range(8)
    ]  # fmt: skip
    report, lines = gpu_check.make_report(plan, measured, "qwen3_4b_x_qwen3_4b_instruct")
    a = report["agents"]["qwen3-4b"]
    # planned 71.355 GiB (tests/test_plan.py) minus the CUDA context 0.75 and NCCL 1.4 torch cannot see = 69.205
    # reserved, minus the 3 GiB fragmentation allowance = 66.205 allocated; the agent's worst rank (3) reserved 63.0
    # and allocated 53.0 -> 63.0 / 69.205 = 0.910 and 53.0 / 66.205 = 0.801
    assert a["planned_peak_gib"] == pytest.approx(71.355, abs=0.001)
    assert a["planned_reserved_gib"] == pytest.approx(69.205, abs=0.001)
    assert a["planned_allocated_gib"] == pytest.approx(66.205, abs=0.001)
    assert (a["measured_peak_reserved_gib"], a["measured_peak_allocated_gib"]) == (63.0, 53.0)
    assert a["reserved_over_planned"] == pytest.approx(0.9103, abs=1e-4)
    assert a["allocated_over_planned"] == pytest.approx(0.8005, abs=1e-4)
    assert a["time_seconds"] == {"generate": 303.0, "score": 4.0, "loss_and_backward": 203.0, "optimizer": 7.0,
                                 "exchange_wait": 5.0}  # fmt: skip
    # per generation batch, the slowest rank's: 103, 50, 43 -> the first 103, the rest 46.5 on average
    assert a["batch_seconds"] == [103.0, 50.0, 43.0] and a["seconds_per_batch_after_first"] == 46.5
    assert a["ranks"] == {"0": 60.0, "1": 61.0, "2": 62.0, "3": 63.0} and a["device_used_at_end_gib"] == 70.3
    assert "| qwen3-4b | 0-3 | 71.4 | 69.2 / 66.2 | 63.0 / 53.0 | 0.91, 0.80 | 70.3 | 303.0 | 4.0 | 203.0 | 7.0 | " \
           "5.0 | 103.0; 46.5 |" in lines  # fmt: skip
    assert "| qwen3-4b-instruct | 4-7 | 71.4 | 69.2 / 66.2 | 67.0 / 57.0 | 0.97, 0.86 | 70.7 | 307.0 | 8.0 | " \
           "207.0 | 11.0 | 9.0 | 107.0; 48.5 |" in lines  # fmt: skip
    with pytest.raises(ValueError, match="no measurement for agent 'qwen3-4b-instruct'"):
        gpu_check.make_report(plan, measured[:4], "x")


def test_hacpo_over_gspo_time_per_generation_batch():
    def report(*seconds):
        return {
            "agents": {a: {"seconds_per_batch_after_first": s} for a, s in zip(("q4b", "q17b"), seconds, strict=True)}
        }

    reports = {"gspo": report(43.0, 43.0), "hacpo": report(48.0, 47.3)}
    lines = gpu_check.compare(reports, {"gspo": False, "hacpo": True})
    assert (
        "- hacpo / gspo, q4b: 48.0 s / 43.0 s = 1.12" in lines
        and "- hacpo / gspo, q17b: 47.3 s / 43.0 s = 1.10" in lines
    )
    assert gpu_check.compare(reports, {"gspo": True, "hacpo": True}) == []  # no GSPO run: nothing to compare


def test_report_of_a_small_model_recipe():
    """The CPU miniature's own plan (built-in agents; no device allowances on CPU), fed with measurements."""
    recipe = load_recipe(str(ROOT / "recipes" / "tiny_model.yaml"))
    plan = build_plan(recipe, str(ROOT / "accelerate_configs" / "cpu_2agents.yaml"))
    peaks = {a.name: a.peak_gib for a in plan.agents}
    measured = [
        {"rank": i, "agent": a.name, "peak_reserved_gib": 2 * peaks[a.name], "peak_allocated_gib": peaks[a.name],
         "times": {"generate": 1.5}, "batch_seconds": [3.0]}
        for i, a in enumerate(plan.agents)
    ]  # fmt: skip
    report, lines = gpu_check.make_report(plan, measured, "tiny_model")
    for a in plan.agents:
        entry = report["agents"][a.name]
        assert entry["planned_reserved_gib"] == entry["planned_allocated_gib"] == pytest.approx(a.peak_gib)
        assert entry["reserved_over_planned"] == pytest.approx(2.0) and entry["allocated_over_planned"] == 1.0
        assert entry["device_used_at_end_gib"] == 0.0 and entry["seconds_per_batch_after_first"] is None
        assert 0 < a.peak_gib * GIB < 2**30  # a small model: well under 1 GiB planned
    assert lines[0] == "### gpu_check: tiny_model" and len([x for x in lines if x.startswith("| trace-")]) == 2


# --------------------------------------------------------------------- what each rank records (CUDA simulated)


def test_each_rank_records_its_global_rank_and_the_timers_before_trl_averages_them(tmp_path, monkeypatch):
    """Three bugs of the first real run: every agent's rank 0 wrote `gpu_check_rank0.json` (RANK is agent-local),
    the timers were read after TRL had averaged and cleared them (none were seen), and ratios were summed as seconds."""
    import torch

    from hacpo_trl.trainer import HACPOTrainer

    def trl_log(self, values, *args, **kwargs):  # what GRPOTrainer.log does to the metric lists
        values.update({k: sum(v) / len(v) for k, v in self._metrics["train"].items()})
        self._metrics["train"].clear()

    def train(self, *args, **kwargs):
        for generate, losses in ((4.0, [1.0, 1.5]), (3.0, [0.5])):
            HACPOTrainer._generate(self, ["prompt"])
            self._metrics["train"].update({"hacpo/time/generate": [generate], "hacpo/time/loss_and_backward": losses,
                                           "hacpo/time/padding_ratio/train": [1.2]})  # fmt: skip
            HACPOTrainer.log(self, {})

    monkeypatch.setattr(HACPOTrainer, "log", trl_log)
    monkeypatch.setattr(HACPOTrainer, "train", train)
    monkeypatch.setattr(HACPOTrainer, "_generate", lambda self, prompts: None)
    for name, value in (("synchronize", lambda: None), ("reset_peak_memory_stats", lambda: None),
                        ("max_memory_reserved", lambda: 3 * 2**30), ("max_memory_allocated", lambda: 2 * 2**30),
                        ("mem_get_info", lambda: (100 * 2**30, 139 * 2**30))):  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setenv("RANK", "0")  # agent-local
    monkeypatch.setenv("HACPO_GLOBAL_RANK", "1")
    import time

    for name, module in list(sys.modules.items()):  # the instrumented clocks are put back after the test
        if name.startswith("hacpo_trl.") and getattr(module, "time", None) is time:
            monkeypatch.setattr(module, "time", time)
    gpu_check._instrument(str(tmp_path))
    trainer = types.SimpleNamespace(agent="q17b", _metrics={"train": {}}, model=types.SimpleNamespace(training=True))
    HACPOTrainer.train(trainer)
    record = json.loads((tmp_path / "gpu_check_rank1.json").read_text())
    assert record["agent"] == "q17b" and record["rank"] == 1
    assert record["times"] == {"generate": 7.0, "loss_and_backward": 3.0}  # sums, no padding ratio
    assert (record["peak_reserved_gib"], record["peak_allocated_gib"], record["device_used_gib"]) == (3.0, 2.0, 39.0)
    assert len(record["batch_seconds"]) == 2 and all(s >= 0 for s in record["batch_seconds"])


FAKE_BITSANDBYTES = """
import json, os
json.dump({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}, open(os.environ["FAKE_BNB_OUT"], "w"))
os._exit(0)
"""


@pytest.mark.launch
def test_a_rank_is_placed_before_the_instrumentation_imports_trl(tmp_path):
    """The fourth bug: `_instrument` imported the trainer (trl -> transformers -> peft -> bitsandbytes, which
    initialises CUDA) before the process was placed. A bitsandbytes stand-in records CUDA_VISIBLE_DEVICES then."""
    (tmp_path / "bitsandbytes").mkdir()
    (tmp_path / "bitsandbytes" / "__init__.py").write_text(FAKE_BITSANDBYTES)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("agents:\n  - {name: a, model_name_or_path: x}\n  - {name: b, model_name_or_path: y}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")]),
           "FAKE_BNB_OUT": str(tmp_path / "seen.json"), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
           "LOCAL_WORLD_SIZE": "2"}  # fmt: skip
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--worker", str(tmp_path), "--config", str(recipe)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and (tmp_path / "seen.json").exists(), proc.stderr[-3000:]
    assert json.loads((tmp_path / "seen.json").read_text()) == {"CUDA_VISIBLE_DEVICES": "1"}


def test_vllm_mode_without_the_vllm_package_exits_2_with_one_line(monkeypatch, capsys):
    """`make gpu-check GPU_CHECK_VLLM=1` measures with the real `vllm` (the CUDA distribution): without it, one line
    and exit 2, before anything else; with it, each recipe runs with one colocated engine per agent process."""
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: (_ for _ in ()).throw(metadata.PackageNotFoundError(name))
                        if name == "vllm" else real(name))  # fmt: skip
    code = gpu_check.main(["--config", "recipes/one_gpu_qwen3_shapes.yaml", "--accelerate_config", "a.yaml", "--vllm"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--vllm needs the vllm package" in err
    recipe = gpu_check.with_vllm(load_recipe(str(ROOT / "recipes" / "one_gpu_qwen3_shapes.yaml")))
    assert recipe["use_vllm"] is True and recipe["vllm_mode"] == "colocate"
    assert gpu_check.worst_case_recipe(recipe, 4, "out")["generation_kwargs"]["min_tokens"] > 0  # vLLM's setting
