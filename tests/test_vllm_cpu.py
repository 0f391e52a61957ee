"""vLLM's CPU build (`hacpo_trl.generation.vllm_cpu`) without vLLM: what is refused, the engine's settings, the weight sync."""

import types
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig

from hacpo_trl.agents.demo import BUILTIN_AGENTS, PAIRS, untrained
from hacpo_trl.agents.tiny import char_tokenizer, tiny_llama
from hacpo_trl.generation import vllm_cpu
from hacpo_trl.training.loading import load_dtype


def _config(**kwargs):
    return tiny_llama(char_tokenizer(), **kwargs).config


def test_the_vllm_pair_passes_and_what_vllm_on_cpu_cannot_run_is_refused_in_one_line():
    for name in PAIRS["vllm"]:
        config = untrained(BUILTIN_AGENTS[name])[0].config
        assert vllm_cpu.refusal(name, config) is None
        assert not config.tie_word_embeddings and vllm_cpu.head_dim(config) == 32
    refused = {
        "server": vllm_cpu.refusal("a", None, mode="server"),
        "sleep": vllm_cpu.refusal("a", None, sleep_mode=True),
        "head_dim 16": vllm_cpu.refusal("a", untrained(BUILTIN_AGENTS["trace-llama"])[0].config),
        "head_dim 48": vllm_cpu.refusal("a", _config(hidden_size=96, heads=2, kv_heads=1)),
        "tied": vllm_cpu.refusal("a", LlamaConfig(hidden_size=64, num_attention_heads=2, tie_word_embeddings=True)),
    }
    fixes = {
        "server": "use `vllm_mode: colocate`",
        "sleep": "set `vllm_enable_sleep_mode: false`",
        "head_dim 16": "head_dim 16 is not a head size vLLM's CPU attention supports",
        "head_dim 48": "head_dim 48 is not",
        "tied": "use a model with untied embeddings",
    }
    for case, line in refused.items():
        assert line.startswith("agent 'a': ") and "\n" not in line and fixes[case] in line, (case, line)
    assert vllm_cpu.refusal("a", None) is None  # a config that could not be read: TRL's loading reports it


def test_check_refuses_only_where_the_engine_runs_on_the_cpu(monkeypatch):
    model = tiny_llama(char_tokenizer())  # head_dim 4
    args = SimpleNamespace(use_vllm=True, use_cpu=True, vllm_mode="colocate", vllm_enable_sleep_mode=False)
    with pytest.raises(ValueError, match="head_dim 4"):
        vllm_cpu.check(args, model, "a")
    vllm_cpu.check(SimpleNamespace(**{**vars(args), "use_vllm": False}), model, "a")  # transformers' generate
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    vllm_cpu.check(SimpleNamespace(**{**vars(args), "use_cpu": False}), model, "a")  # a GPU engine: TRL's path
    with pytest.raises(ValueError, match="head_dim 4"):
        vllm_cpu.check(args, model, "a")  # `use_cpu` on a GPU machine


def test_the_trainer_refuses_before_loading_anything(tmp_path):
    from hacpo_trl import HACPOConfig
    from hacpo_trl.training.loading import prepare_agent

    args = HACPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", use_vllm=True,
        vllm_enable_sleep_mode=True, per_device_train_batch_size=2, num_generations=2,
    )  # fmt: skip
    with pytest.raises(ValueError, match="vLLM's CPU build has no sleep mode"):
        prepare_agent(args, {}, tiny_llama(char_tokenizer()), char_tokenizer())


def test_engine_settings_compose_with_the_agent_seeds(monkeypatch):
    """Eager and the trained dtype on a CPU platform, over the agent's seed offset; a second trainer in the process
    replaces the settings rather than stacking them; nothing on another platform."""
    from trl.generation import vllm_generation

    from hacpo_trl.generation.vllm_seed import use_agent_engine_seeds
    from hacpo_trl.run import topology

    built = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda **kwargs: built.append(kwargs), raising=False)
    monkeypatch.setattr(topology, "_TOPOLOGY", SimpleNamespace(process_counts=(1, 1), agent_index=1))
    args = SimpleNamespace(use_vllm=True, vllm_mode="colocate", model_init_kwargs=None)
    monkeypatch.setattr(vllm_cpu, "_on_cpu_platform", lambda: False)
    use_agent_engine_seeds()
    vllm_cpu.use_cpu_engine(args, tiny_llama(char_tokenizer()), load_dtype)
    vllm_generation.LLM(model="m", seed=0)
    assert built[-1] == {"model": "m", "seed": 1}
    monkeypatch.setattr(vllm_cpu, "_on_cpu_platform", lambda: True)
    vllm_cpu.use_cpu_engine(args, tiny_llama(char_tokenizer()).to(torch.bfloat16), load_dtype)
    vllm_cpu.use_cpu_engine(args, tiny_llama(char_tokenizer()), load_dtype)
    use_agent_engine_seeds()
    vllm_generation.LLM(model="m", seed=0)
    assert built[-1] == {"model": "m", "seed": 1, "enforce_eager": True, "dtype": "float32"}


def test_cpu_sync_reloads_copies_of_the_merged_weights_then_resets_the_prefix_cache(monkeypatch):
    """TRL's iterator yields LoRA-merged weights and unmerges them in place after its last yield: the reload must get
    the merged values."""
    calls = []
    weight = torch.ones(2)

    def merged_then_unmerged(self):
        weight.add_(1.0)  # merge
        yield "model.layers.0.mlp.up_proj.weight", weight
        weight.sub_(1.0)  # unmerge, in place

    def reload_weights(weights_iterator, is_checkpoint_format):
        calls.append(("reload", [(n, t.tolist()) for n, t in weights_iterator], is_checkpoint_format))

    worker = SimpleNamespace(reload_weights=reload_weights)
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(model_executor=SimpleNamespace(driver_worker=worker)),
        reset_prefix_cache=lambda: calls.append("reset"),
    )
    generation = SimpleNamespace(mode="colocate", llm=llm)
    generation._iter_named_params = types.MethodType(merged_then_unmerged, generation)
    monkeypatch.setattr(vllm_cpu, "_on_cpu_platform", lambda: True)
    vllm_cpu.use_cpu_sync(generation)
    generation.sync_weights()
    assert calls == [("reload", [("model.layers.0.mlp.up_proj.weight", [2.0, 2.0])], True), "reset"]
    server = SimpleNamespace(mode="server", sync_weights="TRL's")
    vllm_cpu.use_cpu_sync(server)
    assert server.sync_weights == "TRL's"
