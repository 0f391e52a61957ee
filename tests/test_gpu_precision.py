"""GPU-path precision and start-up choices checked on CPU (review N1, N3, N7, N9, N10): full fine-tuning of bf16
weights without fp32 master weights is refused before loading; the shipped recipes turn TRL's vLLM IS correction
off; wandb without credentials is caught before any download."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from hacpo_trl.agents.tiny import char_tokenizer, tiny_llama
from hacpo_trl.config import HACPOConfig
from hacpo_trl.launch.trackers import check_trackers
from hacpo_trl.training.loading import check_trainable_precision

ROOT = Path(__file__).resolve().parents[1]
COMMON = dict(use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False)


# ------------------------------------------------------------------------------ N1: bf16 weights, plain optimizer


def _saved_model(path: Path, dtype: torch.dtype) -> Path:
    tok = char_tokenizer()
    tiny_llama(tok, seed=0).to(dtype).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.launch
def test_full_finetuning_of_bf16_weights_is_refused_at_startup(tmp_path):
    """The real start-up path (`python -m hacpo_trl.train`, no DeepSpeed/FSDP): a model saved in bf16 and loaded with
    the default dtype ("auto") would make AdamW update bf16 parameters; the run stops before training, naming the fix.
    On the code before this change the same command trained."""
    model = _saved_model(tmp_path / "bf16-model", torch.bfloat16)
    recipe = {
        "agents": [{"name": "a", "model_name_or_path": str(model)}],
        "output_dir": str(tmp_path / "out"),
        "task": "arithmetic_trace",
        "reward_funcs": ["arithmetic_trace"],
        "eval_samples": 0,
        **dict(num_generations=2, per_device_train_batch_size=2, max_completion_length=4, max_steps=1),
        **dict(save_strategy="no", activation_checkpointing=False, **COMMON),
    }
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "WORLD_SIZE", "RANK"))}
    env["PYTHONPATH"] = str(ROOT / "src")
    cmd = [sys.executable, "-m", "hacpo_trl.train", "--config", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "agent 'a': full fine-tuning would update bfloat16 weights with a plain torch optimizer" in proc.stderr
    assert "zero2_8gpu.yaml" in proc.stderr and "dtype: float32" in proc.stderr
    assert not (tmp_path / "out" / "log_history.json").exists()


def test_what_keeps_fp32_master_weights_is_not_refused(tmp_path, monkeypatch):
    args = HACPOConfig(output_dir=str(tmp_path), model_init_kwargs={"dtype": "bfloat16"}, **COMMON)
    for var in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="would update bfloat16 weights"):
        check_trainable_precision(args, "any/path", None, "a")  # explicit dtype: no config read
    from peft import LoraConfig

    check_trainable_precision(args, "any/path", LoraConfig(r=4), "a")  # LoRA: fp32 adapters
    fp16 = tiny_llama(char_tokenizer()).to(torch.float16)
    with pytest.raises(ValueError, match="would update float16 weights"):
        check_trainable_precision(args, fp16, None, "a")  # an instance: its trainable parameters' dtype
    check_trainable_precision(args, tiny_llama(char_tokenizer()), None, "a")  # fp32 instance
    for var in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP"):  # what `accelerate launch` sets
        monkeypatch.setenv(var, "true")
        check_trainable_precision(args, "any/path", None, "a")
        monkeypatch.delenv(var)


# ---------------------------------------------------------------------------------- N9: wandb without credentials


@pytest.fixture
def no_wandb_login(tmp_path, monkeypatch):
    for var in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "absent-netrc"))
    return tmp_path


def test_wandb_without_credentials_falls_back_to_offline_with_one_warning(no_wandb_login, monkeypatch, capsys):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "wandb" else None)
    check_trackers(["wandb"])
    assert os.environ["WANDB_MODE"] == "offline"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no wandb credentials were found" in err and "wandb sync" in err
    # with credentials nothing changes: a key in the environment, or `wandb login`'s netrc entry
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "k")
    check_trackers("wandb")
    monkeypatch.delenv("WANDB_API_KEY")
    netrc = no_wandb_login / "absent-netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    netrc.chmod(0o600)
    check_trackers(["wandb", "tensorboard"])
    assert "WANDB_MODE" not in os.environ and capsys.readouterr().err == ""
    check_trackers(["none"])


def test_wandb_not_installed_stops_before_any_model_is_loaded(no_wandb_login, monkeypatch, capsys, tmp_path):
    """Through `hacpo_trl.launch.train.main`: the model is a Hub id that cannot be reached here, so reaching the model load
    would fail with another message; the tracker check comes first and exits 2 with one line. (A local folder that
    does not exist is refused even earlier, by the recipe's pre-load checks.)"""
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="wandb is not installed"):
        check_trackers(["wandb"])
    check_trackers("all")  # transformers picks the installed trackers
    recipe = {"agents": [{"name": "a", "model_name_or_path": "nobody/nowhere"}], "report_to": "wandb"}
    recipe |= {"output_dir": str(tmp_path / "out"), "use_cpu": True, "bf16": False, "task": "arithmetic_trace"}
    recipe |= {"reward_funcs": ["arithmetic_trace"]}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    from hacpo_trl.launch.train import main

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "hacpo-train: error: report_to includes 'wandb' but wandb is not installed: `pip install wandb`, or "
        "`report_to: none`"
    ]


# --------------------------------------------------------------------- N7: LoRA merge/unmerge with a bf16 base


def _merge_unmerge_drift(dtype: torch.dtype, syncs: int = 58) -> tuple[float, float]:
    """rms change of the frozen base after ``syncs`` merge/unmerge cycles (what TRL does at each vLLM weight sync),
    relative to the rms of the adapter delta."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = tiny_llama(char_tokenizer(), hidden_size=64).to(dtype)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    layers = [m for m in peft_model.modules() if hasattr(m, "lora_B") and "default" in m.lora_B]
    before = [m.base_layer.weight.detach().float().clone() for m in layers]
    deltas = []
    for m in layers:
        torch.nn.init.normal_(m.lora_A["default"].weight, std=1.0)
        torch.nn.init.normal_(m.lora_B["default"].weight, std=1e-5 / 8**0.5)  # delta rms ~1e-5 (review appendix)
        deltas.append(m.get_delta_weight("default").float())
    for _ in range(syncs):
        peft_model.merge_adapter()
        peft_model.unmerge_adapter()
    drift = torch.cat([(m.base_layer.weight.float() - b).flatten() for m, b in zip(layers, before, strict=True)])
    delta = torch.cat([d.flatten() for d in deltas])
    return drift.pow(2).mean().sqrt().item(), delta.pow(2).mean().sqrt().item()


def test_bf16_base_drifts_at_each_merge_and_the_fp32_base_recipe_does_not():
    """Review N7: with a bf16 base the frozen weights (and the adapter-disabled reference) change by rounding at each
    merge/unmerge; with the fp32-base LoRA recipe's `model_init_kwargs: {dtype: float32}` they change 2^16 times less.
    Stand-in: peft's own merge on a tiny model; it cannot show the effect on a trained 4B model's rewards."""
    bf16_drift, delta = _merge_unmerge_drift(torch.bfloat16)
    fp32_drift, _ = _merge_unmerge_drift(torch.float32)
    assert bf16_drift > 0.01 * delta  # a visible fraction of the adapter's own delta
    assert fp32_drift < 1e-3 * delta and fp32_drift < bf16_drift / 100
    recipe = yaml.safe_load((ROOT / "recipes" / "qwen3_4b_base_x_llama3.2_3b_instruct_lora_fp32base.yaml").read_text())
    lora = yaml.safe_load((ROOT / "recipes" / "qwen3_4b_base_x_llama3.2_3b_instruct_lora.yaml").read_text())
    assert recipe["model_init_kwargs"] == {"dtype": "float32"} and lora["model_init_kwargs"] == {"dtype": "bfloat16"}
    changed = {k for k in recipe.keys() | lora.keys() if recipe.get(k) != lora.get(k)}
    assert changed == {"model_init_kwargs", "output_dir"}
    assert all(a["lora"] for a in recipe["agents"])  # adapters: the precision refusal does not apply
