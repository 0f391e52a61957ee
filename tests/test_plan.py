"""`hacpo-train --plan`: figures worked by hand for the paper recipes' models, every shipped recipe passing its own
plan, and the launches that would die (the old DDP recipes, a 262k-token vLLM context, mid-generation saves)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hacpo_trl.plan import GIB, Launch, ModelDims, launch_from_accelerate, launch_from_env, make_plan
from hacpo_trl.plan_cli import main as plan_main

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "model_configs"
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
CPU_RECIPES = [p for p in RECIPES if p.stem == "demo_cpu" or p.stem.startswith("tiny_")]  # the built-in agents
GPU_RECIPES = [p for p in RECIPES if p not in CPU_RECIPES]
H100 = 79.6  # GiB of an 80 GB card


def dims(repo: str) -> ModelDims:
    return ModelDims.from_config(json.loads((FIXTURES / repo / "config.json").read_text()))


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache holding only the fixtures' config.json files (as `huggingface-cli download` leaves it)."""
    cache = tmp_path / "hub"
    for config in FIXTURES.glob("*/*/config.json"):
        org, name = config.parts[-3], config.parts[-2]
        repo = cache / f"models--{org}--{name}"
        snapshot = repo / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True)
        shutil.copy(config, snapshot / "config.json")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("0" * 40)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def _accelerate_config(recipe: Path) -> Path:
    return ROOT / re.search(r"--config_file (\S+)", recipe.read_text()).group(1)


# ------------------------------------------------------------------------------------------ hand-worked figures


def test_parameter_counts_match_the_published_sizes():
    # Qwen3-4B: embeddings 151936 x 2560 (tied) + 36 layers x (q 2560x4096 + k,v 2 x 2560x1024 + o 4096x2560
    #   + MLP 3 x 2560x9728 + norms 2 x 2560 + q/k norms 2 x 128) + final norm 2560
    qwen4 = 151936 * 2560 + 36 * (2560 * 4096 + 2 * 2560 * 1024 + 4096 * 2560 + 3 * 2560 * 9728 + 2 * 2560 + 256) + 2560
    assert qwen4 == 4_022_468_096  # "4.0B"
    assert dims("Qwen/Qwen3-4B-Base").params == qwen4
    assert dims("Qwen/Qwen3-4B-Instruct-2507").params == qwen4
    # Qwen3-1.7B: 151936 x 2048 + 28 x (2048x2048 + 2 x 2048x1024 + 2048x2048 + 3 x 2048x6144 + 2 x 2048 + 256) + 2048
    assert dims("Qwen/Qwen3-1.7B-Base").params == 1_720_574_976  # "1.7B"
    # Llama-3.2-3B: 128256 x 3072 + 28 x (3072x3072 + 2 x 3072x1024 + 3072x3072 + 3 x 3072x8192 + 2 x 3072) + 3072
    assert dims("meta-llama/Llama-3.2-3B-Instruct").params == 3_212_749_824  # "3.21B"
    # KV cache per token (bf16): 2 (K, V) x layers x 8 KV heads x 128 x 2 bytes
    assert dims("Qwen/Qwen3-4B-Base").kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 144 * 1024
    # LoRA r=64 on all linears of Qwen3-4B: 64 x per-layer sum of (in + out) x 36 layers
    lin = (2560 + 4096) + 2 * (2560 + 1024) + (4096 + 2560) + 2 * (2560 + 9728) + (9728 + 2560)
    assert dims("Qwen/Qwen3-4B-Base").lora_params(64, "all-linear") == 64 * lin * 36 == 132_120_576


def test_paper_recipe_on_zero2_by_hand(hub_cache):
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3_1.7b_base_x_qwen3_4b_base.yaml").read_text())
    launch = launch_from_accelerate(yaml.safe_load((ROOT / "accelerate_configs" / "zero2_8gpu.yaml").read_text()))
    assert (launch.parallelism, launch.zero_stage, launch.num_processes) == ("zero", 2, 8)
    assert launch.mixed_precision == "bf16"
    dm = {"qwen3-1.7b-base": dims("Qwen/Qwen3-1.7B-Base"), "qwen3-4b-base": dims("Qwen/Qwen3-4B-Base")}
    plan = make_plan(recipe, dm, launch, H100, dataset_rows=7500)
    assert plan.ok, plan.problems
    small, big = plan.agents
    assert (small.ranks, big.ranks) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert big.devices == ["GPU 4", "GPU 5", "GPU 6", "GPU 7"]

    b = big.batch  # 2 rows x 4 ranks x 128 steps_per_generation = 1024 completions = 128 prompts x 8
    assert b["completions_per_generation"] == 1024 and b["prompts_per_generation"] == 128
    assert b["own_completions_per_rank"] == 256 and b["peer_rows_per_rank"] == 256
    assert b["rows_per_forward"] == (256 + 256) // 128 == 4
    assert b["updates_per_generation"] == 128 / 32 == 4
    # own rows come first: 32 micro-batches x 4 rows x 4 ranks = 512 rows per update
    assert b["rows_per_update"] == [{"own": 512, "peer": 0}] * 2 + [{"own": 0, "peer": 512}] * 2
    # 7500 // 128 = 58 generation batches x 4 updates = 232 steps; save every 40 -> 5 written, 2 kept
    assert plan.schedule["generations_per_epoch"] == 58 and plan.schedule["steps_per_epoch"] == 232
    assert plan.schedule["checkpoints_written"] == 5 and plan.schedule["checkpoints_kept"] == 2

    p = 4_022_468_096
    m = big.memory  # ZeRO-2 over 4 ranks, bf16
    assert m["weights"] == pytest.approx(2 * p / GIB)  # 7.49
    assert m["fp32 master weights"] == pytest.approx(4 * p / 4 / GIB)  # 3.75
    assert m["gradients"] == pytest.approx(4 * p / 4 / GIB)  # fp32 gradient partition
    assert m["optimizer state"] == pytest.approx(8 * p / 4 / GIB)  # Adam m, v
    assert m["gradient buckets"] == pytest.approx(2 * 2 * 5e8 / GIB)  # reduce + allgather buckets, bf16
    assert m["reference model"] == pytest.approx(2 * p / GIB)  # beta 0.001: a bf16 copy
    # 4 rows x 5120 tokens: checkpointed layer inputs (bf16), one recomputed layer, and 4 x 4096 x 151936 logits x 4 B
    act = 4 * 5120 * 2560 * 36 * 2 + 4 * 5120 * (6 * 2560 + 3 * 9728) * 2 + 4 * 4096 * 151936 * 4
    assert m["activations"] == pytest.approx(act / GIB)  # 14.5
    assert m["vLLM reservation"] == pytest.approx(0.3 * H100)
    assert big.peak_gib == pytest.approx(sum(m.values())) and 70 < big.peak_gib < H100
    # vLLM: 23.9 GiB - 7.5 GiB of weights - 2 GiB allowance; one 5120-token request = 5120 x 144 KiB
    assert big.vllm["kv_cache_gib"] == pytest.approx(0.3 * H100 - 2 * p / GIB - 2.0)
    assert big.vllm["one_request_gib"] == pytest.approx(5120 * 144 * 1024 / GIB)
    # checkpoint: bf16 weights + fp32 master + Adam = 14 bytes per parameter = 52.4 GiB
    assert big.checkpoint_gib == pytest.approx(14 * p / GIB)


def test_the_old_ddp_recipe_is_refused_with_the_review_figures():
    """The recipes as they were (DDP, fp32 load, 16-row forwards, no vLLM context cap, save_steps 10): the review's
    ~114 GiB before activations for the 4B agent, a 262k-token KV cache vLLM cannot hold, and mid-generation saves."""
    recipe = {
        "agents": [
            {"name": "a", "model_name_or_path": "Qwen/Qwen3-4B", "num_processes": 4},
            {"name": "b", "model_name_or_path": "Qwen/Qwen3-4B-Instruct-2507", "num_processes": 4},
        ],
        **dict(num_generations=8, per_device_train_batch_size=8, gradient_accumulation_steps=8),
        **dict(steps_per_generation=32, max_completion_length=4096, num_train_epochs=1, beta=0.001, bf16=True),
        **dict(use_vllm=True, vllm_gpu_memory_utilization=0.3, gradient_checkpointing=True, save_steps=10),
    }
    launch = launch_from_accelerate(yaml.safe_load((ROOT / "accelerate_configs" / "single_node_8gpu.yaml").read_text()))
    dm = {"a": dims("Qwen/Qwen3-4B"), "b": dims("Qwen/Qwen3-4B-Instruct-2507")}
    plan = make_plan(recipe, dm, launch, H100, dataset_rows=7500)
    m = plan.agents[1].memory
    before_activations = sum(v for k, v in m.items() if k not in ("activations", "CUDA context, NCCL, slack"))
    # fp32 weights 15.0 + grads 15.0 + DDP buckets 15.0 + AdamW 30.0 + fp32 reference 15.0 + vLLM 23.9
    assert before_activations == pytest.approx(5 * 4 * 4_022_468_096 / GIB + 4 * 4_022_468_096 / GIB + 0.3 * H100)
    assert round(before_activations) == 114
    assert plan.agents[1].batch["rows_per_forward"] == 16
    text = "\n".join(plan.problems)
    assert "agent 'b' (global ranks 4-7): about" in text and "does not fit a 79.6 GiB device" in text
    assert "cannot hold one 262,144-token request (36.0 GiB)" in text
    assert "save_steps 10 is not a multiple of the 4 optimizer updates per generation batch" in text
    assert plan.schedule["checkpoints_written"] == 23 and plan.agents[1].checkpoint_gib == pytest.approx(45, abs=0.1)


def test_settings_that_disagree_are_problems():
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3_4b_x_qwen3_4b_instruct.yaml").read_text())
    dm = {"qwen3-4b": dims("Qwen/Qwen3-4B"), "qwen3-4b-instruct": dims("Qwen/Qwen3-4B-Instruct-2507")}
    zero = Launch("zero", num_processes=8, zero_stage=2, mixed_precision="fp16")
    problems = "\n".join(make_plan(recipe, dm, zero, H100, 7500).problems)
    assert "mixed_precision 'fp16' but the recipe says 'bf16'" in problems
    ddp = Launch("ddp", num_processes=8, mixed_precision="bf16")
    problems = "\n".join(make_plan(recipe, dm, ddp, H100, 7500).problems)
    assert "bf16 weights under DDP" in problems  # the recipe loads bf16: fine for ZeRO, not for a torch optimizer
    problems = "\n".join(make_plan(recipe, dm, Launch("zero", num_processes=6, zero_stage=2), H100, 7500).problems)
    assert "add up to 8 processes but the launch starts 6" in problems
    smaller = make_plan(recipe, dm, Launch("zero", num_processes=8, zero_stage=2, mixed_precision="bf16"), 39.4, 7500)
    assert any("does not fit a 39.4 GiB device" in p for p in smaller.problems)


def test_launch_environment_is_read():
    env = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "ACCELERATE_USE_DEEPSPEED": "true"}
    env |= {"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3", "ACCELERATE_MIXED_PRECISION": "bf16"}
    launch = launch_from_env(env)
    assert (launch.parallelism, launch.zero_stage, launch.num_processes, launch.num_machines) == ("zero", 3, 16, 2)
    assert launch_from_env({"WORLD_SIZE": "8", "ACCELERATE_USE_FSDP": "true"}).parallelism == "fsdp"
    assert launch_from_env({}) is None


# ----------------------------------------------------------------------------------------------- the command


@pytest.mark.parametrize("path", GPU_RECIPES, ids=[p.stem for p in GPU_RECIPES])
def test_every_gpu_recipe_passes_its_own_plan(path, hub_cache, capsys):
    code = plan_main(["--config", str(path), "--plan", "--accelerate_config", str(_accelerate_config(path))])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "plan: OK" in out and "device: 79.6 GiB per GPU" in out
    # the recipe's comment says how many rows each forward pass runs; the plan must agree
    said = int(re.search(r"rows per forward pass = [^=\n]*= (\d+)", path.read_text()).group(1))
    assert re.findall(r"rows per forward pass: (\d+)", out) == [str(said)] * 2
    recipe = yaml.safe_load(path.read_text())
    assert recipe["vllm_max_model_length"] and recipe["save_total_limit"] and recipe["bf16"]
    assert recipe["model_init_kwargs"]["dtype"] == "bfloat16"
    if not any(a.get("lora") for a in recipe["agents"]):  # full fine-tuning goes through ZeRO-2
        assert _accelerate_config(path).name.startswith("zero2_")


@pytest.mark.parametrize("path", CPU_RECIPES, ids=[p.stem for p in CPU_RECIPES])
def test_cpu_recipe_plan(path, capsys):
    """The CPU recipes (the demo and the benchmark's pairs): expectations from each recipe's own numbers."""
    recipe = yaml.safe_load(path.read_text())
    code = plan_main(["--config", str(path), "--plan", "--accelerate_config", str(_accelerate_config(path))])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "device: CPU (no device memory check)" in out
    n_agents, per_device = len(recipe["agents"]), recipe["per_device_train_batch_size"]
    ranks = recipe["agents"][0].get("num_processes", 1)
    prompts = per_device * ranks * recipe["steps_per_generation"] // recipe["num_generations"]
    assert out.count(f"rows per forward pass: {n_agents * per_device}") == n_agents
    assert out.count(f"generation batch: {prompts} prompts x {recipe['num_generations']}") == n_agents
    if "max_steps" in recipe:  # with the dataset's size known the plan also counts epochs
        steps = recipe["max_steps"]
        assert f"{steps} steps in the run" in out or f"schedule: {steps} optimizer steps (max_steps)" in out
    assert f"global ranks 0-{ranks - 1} on cpu" in out


def test_plan_command_exits_nonzero_with_the_reason(tmp_path, hub_cache):
    """Through `python -m hacpo_trl.train`: a recipe that does not fit exits 1 naming the agent; a model whose
    config.json is nowhere exits 2 saying how to fetch it. No weights, no process group."""
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3_4b_x_qwen3_4b_instruct.yaml").read_text())
    recipe.pop("vllm_max_model_length")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "PYTHONPATH": str(ROOT / "src")}
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "hacpo_trl.train", "--config", str(path), "--plan"]
    cmd += ["--accelerate_config", str(ROOT / "accelerate_configs" / "zero2_8gpu.yaml")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "plan: PROBLEM: agent 'qwen3-4b-instruct': vLLM's KV cache" in proc.stdout
    assert "262,144-token request" in proc.stdout
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**env, "HF_HUB_CACHE": str(tmp_path)})
    assert proc.returncode == 2
    assert "cannot read config.json of 'Qwen/Qwen3-4B'" in proc.stderr
    assert "huggingface-cli download Qwen/Qwen3-4B config.json" in proc.stderr


def test_plan_refuses_two_agents_on_one_vllm_server(tmp_path, capsys):
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3_1.7b_base_x_qwen3_4b_base_server.yaml").read_text())
    recipe["agents"][1]["vllm_server_base_url"] = recipe["agents"][0]["vllm_server_base_url"]
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert plan_main(["--config", str(path), "--plan"]) == 2
    err = capsys.readouterr().err
    assert "agents 'qwen3-1.7b-base' and 'qwen3-4b-base' would share the vLLM server http://localhost:8000" in err


def test_plan_reads_the_recipes_own_accelerate_config_and_hints_at_hf_download(tmp_path):
    root = Path(__file__).resolve().parents[1]
    recipe = yaml.safe_load((root / "recipes" / "tiny_size.yaml").read_text())
    for agent in recipe["agents"]:
        agent["num_processes"] = 4
    recipe.update(accelerate_config="accelerate_configs/zero2_8gpu.yaml", use_cpu=False)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "accelerate_configs").mkdir()
    (tmp_path / "accelerate_configs" / "zero2_8gpu.yaml").write_text(
        (root / "accelerate_configs" / "zero2_8gpu.yaml").read_text()
    )
    path = tmp_path / "recipes" / "r.yaml"  # the key is relative to the folder above recipes/
    path.write_text(yaml.safe_dump(recipe))
    proc = subprocess.run(
        [sys.executable, "-m", "hacpo_trl.train", "--config", str(path), "--plan"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path / "recipes",
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert "zero2_8gpu.yaml" in proc.stdout and "assumed" not in proc.stdout
    from hacpo_trl.plan_cli import model_config

    with pytest.raises(ValueError, match=r"`hf download someorg/no-such-model config.json`"):
        model_config("someorg/no-such-model")
