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

from hacpo_trl.launch.plan_cli import main as plan_main
from hacpo_trl.planning.plan import (
    GIB,
    Launch,
    ModelDims,
    format_plan,
    launch_from_accelerate,
    launch_from_env,
    make_plan,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "model_configs"
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
CPU_RECIPES = [p for p in RECIPES if p.stem == "demo_cpu" or p.stem.startswith("tiny_")]  # the built-in agents
ONE_GPU_RECIPES = [p for p in RECIPES if p.stem.startswith("one_gpu_")]  # systems checks (tests/test_one_gpu.py)
REAL_PAIR_RECIPES = [p for p in RECIPES if p.stem.startswith("real_pair")]  # tests/test_real_pair.py
GPU_RECIPES = [p for p in RECIPES if p not in CPU_RECIPES + ONE_GPU_RECIPES + REAL_PAIR_RECIPES]  # the paper's settings
H100 = 79.2  # GiB torch can use on an 80 GB card


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
    # 7500 // 128 = 58 generation batches x 4 updates = 232 steps; save every 40 -> 40..200 and the final step 232:
    # 6 written, 2 kept, 3 on disk at once (HACPO prunes after saving)
    assert plan.schedule["generations_per_epoch"] == 58 and plan.schedule["steps_per_epoch"] == 232
    assert plan.schedule["checkpoints_written"] == 6 and plan.schedule["checkpoints_kept"] == 2

    p = 4_022_468_096
    m = big.memory  # ZeRO-2 over 4 ranks, bf16
    assert m["weights"] == pytest.approx(2 * p / GIB)  # 7.49
    assert m["fp32 master weights"] == pytest.approx(4 * p / 4 / GIB)  # 3.75
    assert m["gradients"] == pytest.approx(2 * 2 * p / 4 / GIB)  # two bf16 gradient partitions during accumulation
    assert m["optimizer state"] == pytest.approx(8 * p / 4 / GIB)  # Adam m, v
    assert m["gradient buckets"] == pytest.approx(2 * 5e8 / GIB)  # one bf16 reduce bucket (overlap_comm off)
    assert m["reference model"] == pytest.approx(2 * p / GIB)  # beta 0.001: a bf16 copy
    assert m["vLLM reservation"] == pytest.approx(0.3 * H100)
    assert (m["CUDA context"], m["NCCL communicators"], m["fragmentation allowance"]) == (0.75, 1.4, 3.0)

    # Activations, hand-worked for 4 rows x 5,120 tokens = 20,480 tokens, h 2560, L 36, I 9728, q 4096, kv 1024:
    #   checkpointed layer inputs: 20,480 x 2560 x 36 x 2 B                        = 3,774,873,600 B
    #   one recomputed layer per token: norms 16 x 2560 = 40,960; attention 10 x 4096 = 40,960;
    #     q/k norms 6 x (4096 + 1024) = 30,720; SwiGLU 8 x 9728 = 77,824           -> 190,464 B/token
    #     x 20,480 tokens x 1.5 (backward transients)                              = 5,851,054,080 B
    #   fused LM head: fp32 grad of 4 x 4096 completion hidden states 4 x 2560 x 16,384 = 167,772,160 B;
    #     one 4096 x 32768 bf16 tile = 268,435,456 B; fp32 V x h grad + bf16 cast 6 x 151,936 x 2560
    #     = 2,333,736,960 B                                                        = 2,769,944,576 B
    #   total 12,395,872,256 B = 11.545 GiB (the old model's materialised logits alone were 9.27 GiB)
    assert 20_480 * 2560 * 36 * 2 == 3_774_873_600 and 40_960 + 40_960 + 30_720 + 77_824 == 190_464
    assert dims("Qwen/Qwen3-4B-Base").layer_bytes_per_token() == 190_464
    assert m["activations"] * GIB == pytest.approx(3_774_873_600 + 5_851_054_080 + 2_769_944_576)
    # Peak: states 7.492 + 3.746 + 3.746 + 7.492 + 0.931 + 7.492 = 30.899; activations 11.545; vLLM 0.3 x 79.2 =
    # 23.760; allowances 0.75 + 1.4 + 3.0 = 5.15 -> 71.355 GiB (the audit's independent estimate: 64-73 GiB)
    assert big.peak_gib == pytest.approx(sum(m.values())) and big.peak_gib == pytest.approx(71.355, abs=0.001)
    # error bar: low 2 + 0.4 + 0.25 + 0.2 x layer (3.633 GiB saved) + one bf16 partition (2p / 4 = 1.873) = 5.25;
    # high 2 + 1 + 0.05 + 0.1 x 3.633 + 0.5 (vLLM) = 3.91
    assert big.error_gib == pytest.approx((5.250, 3.913), abs=0.001)
    # vLLM: 23.76 GiB - 7.49 GiB of weights - 2 GiB allowance = 14.27 GiB = 104,000 tokens of 144 KiB
    # -> 20 sequences of 5,120 tokens at once against 2 x 128 = 256 requests per rank
    assert big.vllm["kv_cache_gib"] == pytest.approx(0.3 * H100 - 2 * p / GIB - 2.0)
    assert big.vllm["one_request_gib"] == pytest.approx(5120 * 144 * 1024 / GIB)
    assert big.vllm["kv_tokens"] == int(big.vllm["kv_cache_gib"] * GIB // (144 * 1024))
    assert (big.vllm["concurrent_seqs"], big.vllm["requests"]) == (big.vllm["kv_tokens"] // 5120, 256) == (20, 256)
    assert any("'qwen3-4b-base': vLLM holds" in n and "20 sequences of 5,120 tokens" in n for n in plan.notes)
    # checkpoint: model.safetensors 2p + DeepSpeed's bf16 module states 2p + fp32 master 4p + Adam 8p = 16p = 59.9 GiB
    parts = ("model.safetensors", "DeepSpeed module states", "fp32 master weights", "Adam m, v")
    assert big.checkpoint_parts == pytest.approx({k: b * p / GIB for k, b in zip(parts, (2, 2, 4, 8), strict=True)})
    assert big.checkpoint_gib == pytest.approx(16 * p / GIB)
    # peak disk per agent: 3 checkpoints + the final bf16 model = (3 x 16 + 2) p = 187.3 GiB
    assert big.batch["peak_disk_gib"] == pytest.approx(50 * p / GIB)


def test_sleep_mode_takes_the_larger_phase_and_old_trl_materialises_logits():
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3_4b_x_qwen3_4b_instruct.yaml").read_text())
    dm = {"qwen3-4b": dims("Qwen/Qwen3-4B"), "qwen3-4b-instruct": dims("Qwen/Qwen3-4B-Instruct-2507")}
    zero = Launch("zero", num_processes=8, zero_stage=2, mixed_precision="bf16")
    base = make_plan(recipe, dm, zero, H100, 7500).agents[0]
    slept = make_plan({**recipe, "vllm_enable_sleep_mode": True, "vllm_gpu_memory_utilization": 0.5}, dm, zero, H100)
    a = slept.agents[0]
    # vLLM (0.5 x 79.2 = 39.6 GiB) is released for the training passes: peak = states + max(activations, vLLM)
    states = sum(v for k, v in a.memory.items() if k not in ("activations", "vLLM reservation"))
    assert a.peak_gib == pytest.approx(states + max(a.memory["activations"], 0.5 * H100)) and slept.ok
    # KV: 39.6 - 7.49 - 2 = 30.1 GiB / 144 KiB = 219,2xx tokens -> 42 sequences of 5,120 (20 at 0.3), still under
    # 256 / 4, so the plan still says the rest queue: the training states (36 GiB) cap the utilisation near 0.54
    assert a.vllm["sleep_mode"] and a.vllm["concurrent_seqs"] == 42 and base.vllm["concurrent_seqs"] == 20
    assert any("'qwen3-4b': vLLM holds" in n and "42 sequences" in n for n in slept.notes)
    assert "sleep mode: released during the training passes" in format_plan(slept)
    old = make_plan(recipe, dm, zero, H100, 7500, fused_lm_head=False).agents[0]
    logits = 4 * 4096 * 151936 * 4  # rows x completion tokens x vocab x (bf16 logits + saved log-softmax)
    head = (4 * 2560 * 4 * 4096 + 4096 * 32768 * 2 + 6 * 151936 * 2560) / GIB
    assert old.memory["activations"] - base.memory["activations"] == pytest.approx(logits / GIB - head)


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
    allowances = ("activations", "CUDA context", "NCCL communicators", "fragmentation allowance")
    before_activations = sum(v for k, v in m.items() if k not in allowances)
    # fp32 weights 15.0 + grads 15.0 + DDP buckets 15.0 + AdamW 30.0 + fp32 reference 15.0 + vLLM 23.9
    assert before_activations == pytest.approx(5 * 4 * 4_022_468_096 / GIB + 4 * 4_022_468_096 / GIB + 0.3 * H100)
    assert round(before_activations) == 114
    assert plan.agents[1].batch["rows_per_forward"] == 16
    text = "\n".join(plan.problems)
    assert "agent 'b' (global ranks 4-7): about" in text and "does not fit a 79.2 GiB device" in text
    assert "cannot hold one 262,144-token request (36.0 GiB)" in text
    assert "save_steps 10 is not a multiple of the 4 optimizer updates per generation batch" in text
    assert plan.schedule["checkpoints_written"] == 24 and plan.agents[1].checkpoint_gib == pytest.approx(45, abs=0.1)


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
    assert "plan: OK" in out and "device: 79.2 GiB per GPU" in out
    # the recipe's comment says how many rows each forward pass runs; the plan must agree
    said = int(re.search(r"rows per forward pass = [^=\n]*= (\d+)", path.read_text()).group(1))
    assert re.findall(r"rows per forward pass: (\d+)", out) == [str(said)] * 2
    recipe = yaml.safe_load(path.read_text())
    assert recipe["vllm_max_model_length"] and recipe["save_total_limit"] and recipe["bf16"]
    assert recipe["model_init_kwargs"]["dtype"] == ("float32" if path.stem.endswith("_fp32base") else "bfloat16")
    if not any(a.get("lora") for a in recipe["agents"]):  # full fine-tuning keeps fp32 master weights: ZeRO-2
        launch = yaml.safe_load(_accelerate_config(path).read_text())
        assert launch["distributed_type"] == "DEEPSPEED" and launch["deepspeed_config"]["zero_stage"] == 2
    # the paper's loss: no TRL vLLM importance-sampling correction (review N3), said in the recipe
    assert recipe["vllm_importance_sampling_correction"] is False
    assert "vllm_importance_sampling_correction: false  # the paper's loss" in path.read_text()
    # thinking mode stated for every Qwen3 agent (review N10); the hybrid Qwen3-4B runs without thinking (v1)
    assert "# Thinking mode:" in path.read_text()
    for agent in recipe["agents"]:
        if agent["model_name_or_path"] == "Qwen/Qwen3-4B":
            assert agent["chat_template_kwargs"] == {"enable_thinking": False}


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


def test_plan_reads_the_recipes_agents_once(monkeypatch, capsys):
    """One `--plan` resolves the recipe's agents once: the checks, the preflight and the plan read the same ones."""
    import hacpo_trl.run.resolve

    calls = []
    original = hacpo_trl.run.resolve.resolve

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    for module in ("run.resolve", "launch.recipe", "planning.plan", "run.placement", "config"):
        monkeypatch.setattr(f"hacpo_trl.{module}.resolve", counted)
    path = ROOT / "recipes" / "tiny_size.yaml"
    assert plan_main(["--config", str(path), "--plan", "--accelerate_config", str(_accelerate_config(path))]) == 0
    assert "agent " in capsys.readouterr().out and len(calls) == 1


@pytest.mark.launch
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
    assert "hf download Qwen/Qwen3-4B config.json" in proc.stderr  # the command huggingface_hub installs


def test_plan_refuses_two_agents_on_one_vllm_server(tmp_path, capsys):
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3_1.7b_base_x_qwen3_4b_base_server.yaml").read_text())
    recipe["agents"][1]["vllm_server_base_url"] = recipe["agents"][0]["vllm_server_base_url"]
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert plan_main(["--config", str(path), "--plan"]) == 2
    err = capsys.readouterr().err
    assert "agents 'qwen3-1.7b-base' and 'qwen3-4b-base' would share the vLLM server http://localhost:8000" in err


PAIRS = ["qwen3_4b_x_qwen3_4b_instruct", "qwen3_1.7b_base_x_qwen3_4b_base", "qwen3_4b_base_x_llama3.2_3b_instruct"]
HACPO_ONLY = {"output_dir", "alpha", "peer_delta", "peer_delta_step"}
# method -> (keys that differ from the pair's HACPO recipe, G, optimizer updates per generation batch and their rows)
BASELINES = {
    "gspo": (
        HACPO_ONLY | {"capability_window", "sharing", "per_device_train_batch_size", "steps_per_generation"}
        | {"save_steps"},
        8, ["512 own + 0 peer"] * 2,
    ),
    "gspo_x2": (
        HACPO_ONLY | {"capability_window", "sharing", "per_device_train_batch_size", "num_generations"},
        16, ["512 own + 0 peer"] * 4,
    ),
    "naive": (HACPO_ONLY | {"naive"}, 8, ["512 own + 0 peer"] * 2 + ["0 own + 512 peer"] * 2),
}  # fmt: skip


@pytest.mark.parametrize("pair", PAIRS)
def test_baseline_recipes_are_the_pairs_hacpo_recipe_with_the_papers_baseline_schedule(pair, hub_cache, capsys):
    """Review N8: GSPO = 2 updates of 512 rows per generation batch (not the 4 x 256 that `share_rollouts: false`
    on the HACPO recipe gives), GSPOx2 = G 16 with HACPO's 4 x 512, Naive = HACPO's sharing and schedule with
    `naive: true`; each is its pair's HACPO recipe with only those keys changed, and passes its own plan."""
    hacpo = yaml.safe_load((ROOT / "recipes" / f"{pair}.yaml").read_text())
    for method, (changed, generations, updates) in BASELINES.items():
        path = ROOT / "recipes" / f"{pair}_{method}.yaml"
        recipe = yaml.safe_load(path.read_text())
        assert {k for k in hacpo.keys() | recipe.keys() if hacpo.get(k) != recipe.get(k)} == changed, method
        assert recipe["sharing"] == ("paper" if method == "naive" else "none") and recipe.get("naive", False) is (
            method == "naive"
        )
        code = plan_main(["--config", str(path), "--plan", "--accelerate_config", str(_accelerate_config(path))])
        out = capsys.readouterr().out
        assert code == 0 and "plan: OK" in out, out
        assert out.count(f"generation batch: 128 prompts x {generations} = {128 * generations} completions") == 2
        assert out.count(f"{len(updates)} optimizer updates per generation batch: {', '.join(updates)}\n") == 2


@pytest.mark.launch
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
    from hacpo_trl.launch.plan_cli import model_config

    with pytest.raises(ValueError, match=r"`hf download someorg/no-such-model config.json`"):
        model_config("someorg/no-such-model")


def _paper_schedule_preset() -> dict:
    """The first pair's HACPO recipe with the preset as the benchmark ran it: the paper's schedule, GSPO's 64
    micro-batches at a batch learned from no one or taught (the other 2 updates skipped)."""
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3_1.7b_base_x_qwen3_4b_base.yaml").read_text())
    return {**recipe, "sharing": "recommended", "solo_steps_per_generation": 64, "vllm_gpu_memory_utilization": 0.28}


@pytest.mark.parametrize("pair", PAIRS)
def test_preset_recipes_are_the_pairs_gspo_recipe_with_the_preset_line(pair, hub_cache, capsys):
    """`<pair>_preset.yaml` is its pair's GSPO recipe with `sharing: recommended` instead of `sharing: none`,
    the HACPO recipe's peer settings and vLLM's share lower by 0.02 (a taught batch's forwards hold up to 8 rows, not
    4), and nothing else: its plan makes GSPO's 2 updates of 512 own rows per generation batch, none skipped."""
    hacpo = yaml.safe_load((ROOT / "recipes" / f"{pair}.yaml").read_text())
    gspo = yaml.safe_load((ROOT / "recipes" / f"{pair}_gspo.yaml").read_text())
    path = ROOT / "recipes" / f"{pair}_preset.yaml"
    recipe = yaml.safe_load(path.read_text())
    peer = {"alpha", "peer_delta", "peer_delta_step"}
    assert {k for k in gspo.keys() | recipe.keys() if gspo.get(k) != recipe.get(k)} == (
        {"output_dir", "sharing", "vllm_gpu_memory_utilization"} | peer
    )
    assert recipe["sharing"] == "recommended" and {k: recipe[k] for k in peer} == {k: hacpo[k] for k in peer}
    assert (gspo["vllm_gpu_memory_utilization"], recipe["vllm_gpu_memory_utilization"]) == (0.3, 0.28)
    outs = {}
    for name, p in (("preset", path), ("gspo", ROOT / "recipes" / f"{pair}_gspo.yaml")):
        assert plan_main(["--config", str(p), "--plan", "--accelerate_config", str(_accelerate_config(p))]) == 0
        outs[name] = capsys.readouterr().out
    assert "plan: OK" in outs["preset"], outs["preset"]
    assert outs["gspo"].count("2 optimizer updates per generation batch: 512 own + 0 peer, 512 own + 0 peer\n") == 2
    gspo_schedule = (
        "2 optimizer updates per generation batch, as GSPO with this recipe: 512 own rows each, none skipped"
    )
    assert outs["preset"].count(gspo_schedule) == 2 and "skipped (solo_steps_per_generation" not in outs["preset"]
    assert outs["preset"].count("rows per forward pass: 8\n") == 2 and "sharing: recommended (" in outs["preset"]
    steps = [line for line in outs["gspo"].splitlines() if line.startswith("schedule:")]
    assert steps == [line for line in outs["preset"].splitlines() if line.startswith("schedule:")]


def test_plan_counts_a_solo_batchs_larger_forward_and_refuses_a_solo_schedule_of_partial_updates(hub_cache, capsys):
    """A solo schedule of fewer micro-batches than the own rows' share runs larger forwards than the sharing
    schedule: the memory estimate is for the larger one (here it no longer fits). One that does not cut into whole
    updates is a problem."""
    recipe = _paper_schedule_preset()
    launch = launch_from_accelerate(yaml.safe_load((ROOT / "accelerate_configs" / "zero2_8gpu.yaml").read_text()))
    dm = {"qwen3-1.7b-base": dims("Qwen/Qwen3-1.7B-Base"), "qwen3-4b-base": dims("Qwen/Qwen3-4B-Base")}
    plans = {}
    for solo in (64, 32, 48):
        plans[solo] = make_plan({**recipe, "solo_steps_per_generation": solo}, dm, launch, H100, 7500)
    # 256 own rows per rank: 64 micro-batches of 4 rows (the sharing schedule's 4 = 2 own + 2 peer), or 32 of 8
    assert [a.batch["solo_rows_per_forward"] for a in plans[32].agents] == [8, 8]
    assert [a.batch["solo_updates"] for a in plans[32].agents] == [1, 1]
    assert all(b.peak_gib > a.peak_gib for a, b in zip(plans[64].agents, plans[32].agents, strict=True))
    assert not plans[64].problems  # the preset as the benchmark ran it
    # twice the rows per forward: the 4B agent no longer fits an 80 GB card (the sharing schedule's 4 rows did)
    assert [p for p in plans[32].problems if "does not fit" in p] == [
        next(p for p in plans[32].problems if p.startswith("agent 'qwen3-4b-base'"))
    ]
    assert any("solo_steps_per_generation 48 must divide steps_per_generation 128" in p for p in plans[48].problems)


def test_plan_sizes_a_batch_of_taught_or_rescued_rows_for_all_peer_rows_in_the_solo_micro_batches(hub_cache, capsys):
    """With `taught_schedule: solo` (the preset) or `capability_gate_rescue` on the paper's schedule, a batch whose
    peer rows are taught or rescued ones only keeps the solo schedule's 64 micro-batches, each with its 4 own rows
    and an equal share of the peer rows: up to all 256 of a rank's peer rows, 4 more per forward, 8 in all. At the
    HACPO recipe's vLLM share (0.3) the 4B agent does not fit an 80 GB card; at 0.28 it does. Without either option
    the bound is not computed."""
    preset = _paper_schedule_preset()
    launch = launch_from_accelerate(yaml.safe_load((ROOT / "accelerate_configs" / "zero2_8gpu.yaml").read_text()))
    dm = {"qwen3-1.7b-base": dims("Qwen/Qwen3-1.7B-Base"), "qwen3-4b-base": dims("Qwen/Qwen3-4B-Base")}
    plan = make_plan(preset, dm, launch, H100, 7500)
    assert [a.batch["few_prompts_rows_per_forward"] for a in plan.agents] == [4 + 256 // 64] * 2 and not plan.problems
    text = "rescued or taught peer rows only (capability_gate_rescue, taught_schedule: solo): up to 8 rows"
    assert text in format_plan(plan)
    at_03 = make_plan({**preset, "vllm_gpu_memory_utilization": 0.3}, dm, launch, H100, 7500)
    assert any(p.startswith("agent 'qwen3-4b-base'") and "does not fit" in p for p in at_03.problems)
    paper = {**preset, "sharing": "paper"}  # no taught rows (the preset's taught settings would be refused)
    rescue = make_plan({**paper, "capability_gate": 1.0, "capability_gate_rescue": True}, dm, launch, H100, 7500)
    assert [a.batch["few_prompts_rows_per_forward"] for a in rescue.agents] == [8, 8]
    neither = make_plan(paper, dm, launch, H100, 7500)
    assert [a.batch["few_prompts_rows_per_forward"] for a in neither.agents] == [None, None]


def test_plan_notes_a_max_steps_that_ends_inside_a_generation_batch(hub_cache):
    """The HACPO recipe makes 4 updates per generation batch: `--max_steps 10` (docs/training.md's short trial) is
    allowed, with a note that its final checkpoint is mid-batch; 8 gets no note."""
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3_1.7b_base_x_qwen3_4b_base.yaml").read_text())
    launch = launch_from_accelerate(yaml.safe_load((ROOT / "accelerate_configs" / "zero2_8gpu.yaml").read_text()))
    dm = {"qwen3-1.7b-base": dims("Qwen/Qwen3-1.7B-Base"), "qwen3-4b-base": dims("Qwen/Qwen3-4B-Base")}
    for steps, noted in ((10, True), (8, False)):
        plan = make_plan({**recipe, "max_steps": steps}, dm, launch, H100, 7500)
        said = [n for n in plan.notes if n.startswith(f"max_steps {steps} ends inside a generation batch (4 updates")]
        assert len(said) == int(noted) and not any("max_steps" in p for p in plan.problems)


def _pair(agents=None, **settings) -> dict:
    """Two small agents on a CPU launch: only the plan's batch arithmetic and its notes are looked at."""
    agents = agents or [{"name": n, "model_name_or_path": n} for n in ("a", "b")]
    return {"agents": agents, "per_device_train_batch_size": 2, "num_generations": 2, "save_strategy": "no", **settings}


def _schedule_problems(recipe: dict) -> list[str]:
    dm = {a["name"]: dims("Qwen/Qwen3-4B-Base") for a in recipe["agents"]}
    problems = make_plan(recipe, dm, Launch("cpu", num_processes=len(dm)), None).problems
    return [p for p in problems if "gradient_accumulation_steps" in p]


@pytest.mark.parametrize(
    "steps_per_generation, accumulation, num_iterations, ok",
    [(4, 2, 1, True), (2, 4, 1, True), (3, 3, 1, True), (3, 2, 1, False), (3, 2, 2, True), (2, 3, 1, False)],
)
def test_plan_and_config_refuse_the_same_update_schedules(steps_per_generation, accumulation, num_iterations, ok):
    """The table of `test_updates_must_not_straddle_generation_batches` (tests/test_config_and_single_agent.py): the
    plan refused S = 2 with GA = 4 and S = 3, GA = 2 with two iterations, which the config accepts (it counts S·I,
    the plan counted S alone), and refused S % GA for a single agent or without sharing, where no update index is
    needed. Both now ask `schedule.update_schedule_problem`."""
    schedule = dict(
        steps_per_generation=steps_per_generation,
        gradient_accumulation_steps=accumulation,
        num_iterations=num_iterations,
    )
    problems = _schedule_problems(_pair(**schedule))
    assert len(problems) == (0 if ok else 2), problems  # one per agent
    assert ok or problems[0].startswith("agent 'a': steps_per_generation x num_iterations = ")
    assert ok or "would straddle generation batches" in problems[0]
    assert _schedule_problems(_pair(share_rollouts=False, **schedule)) == []  # TRL's own loss: any schedule
    single = [{"name": "a", "model_name_or_path": "a"}]
    assert _schedule_problems(_pair(agents=single, **schedule)) == []  # one agent: no peer rows, no bound


def test_plan_refuses_a_solo_schedule_the_config_refuses_for_one_agent_too():
    """`solo_steps_per_generation` that does not cut the batch into whole updates is refused by the config for any
    agent (`_check_solo_schedule`); the plan only checked it for agents that share."""
    single = [{"name": "a", "model_name_or_path": "a"}]
    problems = _schedule_problems(_pair(agents=single, steps_per_generation=4, solo_steps_per_generation=3))
    assert problems == [
        "agent 'a': solo_steps_per_generation 3 must divide steps_per_generation 4 and be a multiple of "
        "gradient_accumulation_steps 1 (whole optimizer updates)"
    ]


def test_peer_filter_note_reads_each_agents_own_setting():
    """`peer_filter` may differ per agent (`overrides`): the note about filtered peer rows used to read only the
    run's value, so an agent filtering on its own got no note, and `positive` (which also drops rows) none at all."""
    agents = [{"name": "a", "model_name_or_path": "a", "overrides": {"peer_filter": "correct"}}]
    agents.append({"name": "b", "model_name_or_path": "b"})
    dm = {"a": dims("Qwen/Qwen3-4B-Base"), "b": dims("Qwen/Qwen3-4B-Base")}
    cpu = Launch("cpu", num_processes=2)
    notes = [n for n in make_plan(_pair(agents=agents), dm, cpu, None).notes if "peer_filter" in n]
    assert notes == ["agent 'a': peer_filter 'correct': its peer rows and rows per forward pass are upper bounds"]
    notes = [n for n in make_plan(_pair(agents=agents, peer_filter="positive"), dm, cpu, None).notes if "peer_f" in n]
    assert notes == [
        "agent 'a': peer_filter 'correct': its peer rows and rows per forward pass are upper bounds",
        "agent 'b': peer_filter 'positive': its peer rows and rows per forward pass are upper bounds",
    ]


def test_plan_imports_no_torch():
    """`--plan` checks a GPU recipe on a laptop: the plan and the sharing settings it reads import no torch."""
    code = "import sys, hacpo_trl.planning.plan, hacpo_trl.sharing.settings; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_plan_reads_each_learners_sharing_settings_from_their_one_declaration(monkeypatch):
    """The plan reads an agent's sharing settings through `SharingSettings`, as the config does: a default changed
    in that one declaration reaches the plan, and a combination the config refuses is refused, naming the agent."""
    import dataclasses

    import hacpo_trl.planning.plan as plan_module
    from hacpo_trl.sharing.settings import SharingSettings

    agents = [{"name": "a", "model_name_or_path": "a", "overrides": {"peer_prompts": "failed"}}]
    agents.append({"name": "b", "model_name_or_path": "b"})
    dm = {"a": dims("Qwen/Qwen3-4B-Base"), "b": dims("Qwen/Qwen3-4B-Base")}
    cpu = Launch("cpu", num_processes=2)
    plan = make_plan(_pair(agents=agents), dm, cpu, None)
    assert [a.batch["solo_steps_per_generation"] for a in plan.agents] == [None, None]

    @dataclasses.dataclass(frozen=True)
    class OneSoloUpdate(SharingSettings):
        solo_steps_per_generation: int | None = 1  # as if SharingFields' default were 1

    monkeypatch.setattr(plan_module, "SharingSettings", OneSoloUpdate)
    plan = make_plan(_pair(agents=agents), dm, cpu, None)
    assert [a.batch["solo_steps_per_generation"] for a in plan.agents] == [1, 1]
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"^agent 'b': `taught_scale: 0.5` acts on taught rows"):
        make_plan(_pair(agents=agents, taught_scale=0.5), dm, cpu, None)


def test_plan_reads_an_agents_own_vllm_setting():
    """`use_vllm` may be set for one agent (`overrides`), as `HACPOConfig` and the vLLM-server check read it: the
    plan used to read only the run's value, so that agent's vLLM memory was left out."""
    agents = [{"name": "a", "model_name_or_path": "a", "overrides": {"use_vllm": True, "vllm_mode": "colocate"}}]
    agents.append({"name": "b", "model_name_or_path": "b"})
    dm = {"a": dims("Qwen/Qwen3-4B-Base"), "b": dims("Qwen/Qwen3-4B-Base")}
    plan = make_plan(_pair(agents=agents, vllm_gpu_memory_utilization=0.3), dm, Launch("zero", 2, zero_stage=2), H100)
    a, b = plan.agents
    assert a.memory["vLLM reservation"] == pytest.approx(0.3 * H100) and a.vllm["mode"] == "colocate"
    assert b.memory["vLLM reservation"] == 0.0 and not b.vllm
    assert b.memory["generation KV cache"] > 0 == a.memory["generation KV cache"]  # b generates with transformers


def test_the_one_gpu_preset_recipe_fits_an_80_gb_card_on_gspos_schedule(hub_cache, capsys):
    """recipes/one_gpu_qwen3_preset.yaml: both real agents on one card, the preset's taught rows inside GSPO's 2
    updates of 32 own rows (none skipped), in forwards of 16 own + up to 16 taught rows."""
    path = ROOT / "recipes" / "one_gpu_qwen3_preset.yaml"
    assert plan_main(["--config", str(path), "--plan", "--gpus_per_node", "1"]) == 0
    out = capsys.readouterr().out
    assert "plan: OK" in out and "sharing: recommended (" in out
    line = "2 optimizer updates per generation batch, as GSPO with this recipe: 32 own rows each, none skipped"
    assert out.count(line) == 2 and out.count("rows per forward pass: 32\n") == 2


def test_a_batch_that_does_not_divide_into_prompt_groups_gets_its_fix_and_no_verdict_on_the_split(capsys):
    """`--per_device_train_batch_size 5` on the size recipe: 20 completions are not whole groups of 8. The plan says
    so where it shows the batch (never "2.5 prompts"), its PROBLEM line carries the launch's fix, and the balance
    section judges no split instead of calling the broken one the best."""
    code = plan_main(["--config", str(ROOT / "recipes" / "tiny_size.yaml"), "--per_device_train_batch_size", "5",
                      "--plan"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1 and "2.5 prompts" not in out and "the current split is the best one" not in out
    assert out.count("generation batch: 20 completions, not whole prompt groups of 8 (PROBLEM below)") == 2
    problems = [line for line in out.splitlines() if line.startswith("plan: PROBLEM")]
    assert len(problems) == 2 and all("use num_generations 2, 4, 5, 10 or 20, or per_device_train_batch_size 4 or 6"
                                      in line for line in problems), problems  # fmt: skip
    assert "no split judged: 20 completions are not whole prompt groups of 8 (fix the PROBLEM above first)" in out
