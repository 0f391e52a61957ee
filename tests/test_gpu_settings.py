"""GPU-path settings checked on CPU: save points on generation-batch boundaries, one vLLM server and weight-sync port
per agent, per-agent vLLM engine seeds, and where `hacpo-eval` puts a model (CUDA simulated; vLLM faked)."""

import json
import sys
import types
import warnings
from types import SimpleNamespace

import pytest
import torch

from hacpo_trl import HACPOConfig
from hacpo_trl.config import SHARED_SETTINGS
from hacpo_trl.generation.vllm_servers import check_vllm_servers
from hacpo_trl.run.resolve import resolve

COMMON = dict(use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False)


# ------------------------------------------------------------------------------------------------- save points


@pytest.mark.parametrize(
    "steps_per_generation, accumulation, save_steps, ok",
    [(4, 1, 10, False), (4, 1, 8, True), (4, 2, 3, False), (4, 2, 4, True), (2, 4, 1, True), (3, 2, 2, False)],
)
def test_save_steps_must_fall_between_generation_batches(tmp_path, steps_per_generation, accumulation, save_steps, ok):
    """A generation batch lasts steps_per_generation / GA optimizer updates; (3, 2): generations every 1.5 updates,
    so save_steps 2 lands mid-batch while 3 would not."""
    kwargs = dict(
        output_dir=str(tmp_path),
        num_generations=2,
        per_device_train_batch_size=4,
        steps_per_generation=steps_per_generation,
        gradient_accumulation_steps=accumulation,
        save_strategy="steps",
        save_steps=save_steps,
        **COMMON,
    )
    if ok:
        HACPOConfig(**kwargs)
    else:
        with pytest.raises(ValueError, match=rf"`save_steps` = {save_steps} would checkpoint in the middle"):
            HACPOConfig(**kwargs)
    HACPOConfig(**{**kwargs, "save_strategy": "no"})  # nothing saved, nothing to check


@pytest.mark.parametrize("max_steps, ok", [(10, False), (8, True), (-1, True)])
def test_a_max_steps_inside_a_generation_batch_is_warned_of_when_checkpointing(tmp_path, max_steps, ok):
    """With `save_strategy: steps` the Trainer also saves at `max_steps`: 10 updates with 4 per generation batch
    end (and checkpoint) in the middle of the third, which only matters to a run continued from there, so a warning,
    once (not again without checkpoints); run by epochs, nothing to say."""
    kwargs = dict(
        output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4, steps_per_generation=4,
        save_strategy="steps", save_steps=4, max_steps=max_steps, **COMMON,
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        HACPOConfig(**kwargs)
        HACPOConfig(**{**kwargs, "save_strategy": "no"})
    said = [str(w.message) for w in caught if "`max_steps`" in str(w.message)]
    assert said == ([] if ok else ["`max_steps` = 10 ends in the middle of a generation batch (4 optimizer updates "
                                   "each), and the Trainer checkpoints at the last step: resuming from that checkpoint "
                                   "to train further would run out of phase. Use a multiple of it for a run you mean "
                                   "to continue"])  # fmt: skip


def test_agents_may_not_each_decide_when_to_checkpoint(tmp_path):
    """`save_strategy: best` saves when an agent's own metric improves, so agents would checkpoint at different
    steps; a single agent may."""
    kwargs = dict(
        output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4, save_strategy="best",
        eval_strategy="steps", metric_for_best_model="loss", **COMMON,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"`save_strategy: best` lets each agent decide alone"):
        HACPOConfig(agents=TWO, **kwargs)
    HACPOConfig(**kwargs)


# ----------------------------------------------------------------------------------------------- server mode

TWO = [{"name": "a", "model_name_or_path": "x"}, {"name": "b", "model_name_or_path": "y"}]
SERVER = {"use_vllm": True, "vllm_mode": "server"}


@pytest.mark.parametrize(
    "agents, run, match",
    [
        (TWO, SERVER, r"agents 'a' and 'b' would share the vLLM server http://0.0.0.0:8000"),
        (
            [{**TWO[0], "vllm_server_base_url": "http://h:8000/"}, {**TWO[1], "overrides": {"vllm_server_port": 8000}}],
            {**SERVER, "vllm_server_host": "H"},
            r"share the vLLM server http://h:8000;",
        ),
        (
            [{**TWO[0], "vllm_server_base_url": "http://h:8000"}, {**TWO[1], "vllm_server_base_url": "http://h:8001"}],
            SERVER,
            r"share the weight-sync port 51216; give each agent its own `vllm_group_port`",
        ),
    ],
)
def test_two_agents_on_one_server_or_port_are_refused(agents, run, match):
    with pytest.raises(ValueError, match=match):
        check_vllm_servers(resolve({**run, "agents": agents}))


def test_separate_servers_and_ports_pass_and_colocate_is_not_checked(tmp_path):
    agents = [
        {**TWO[0], "vllm_server_base_url": "http://h:8000", "vllm_group_port": 51216},
        {**TWO[1], "overrides": {"vllm_server_port": 8001, "vllm_group_port": 51217}},
    ]
    check_vllm_servers(resolve({**SERVER, "vllm_server_host": "h", "agents": agents}))
    check_vllm_servers(resolve({"use_vllm": True, "vllm_mode": "colocate", "agents": TWO}))
    # one agent: its own fields become this process's TRL settings
    solo = {**TWO[0], "vllm_server_base_url": "http://h:8001", "vllm_group_port": 51300}
    cfg = HACPOConfig(output_dir=str(tmp_path), agents=[solo], **COMMON)
    assert (cfg.vllm_server_base_url, cfg.vllm_group_port) == ("http://h:8001", 51300)


def test_config_refuses_a_shared_server_before_any_process_group(tmp_path):
    with pytest.raises(ValueError, match="would share the vLLM server"):
        HACPOConfig(output_dir=str(tmp_path), agents=TWO, **SERVER, **COMMON)


# ---------------------------------------------------------------------------------------- vLLM engine seeds


def test_two_agents_generation_seeds_differ(monkeypatch):
    """TRL's own VLLMGeneration builds the engine (vLLM faked): rank 1 of agent 0 and rank 1 of agent 1 (4 + 4 ranks)
    get engine seeds 1 and 5; without the offset both would get 1. The data-order seed stays a shared setting."""
    from trl.generation import vllm_generation

    from hacpo_trl.generation.vllm_seed import use_agent_engine_seeds
    from hacpo_trl.run import topology

    seeds = []

    class FakeLLM:
        def __init__(self, **kwargs):
            seeds.append(kwargs["seed"])

    monkeypatch.setattr(vllm_generation, "LLM", FakeLLM, raising=False)
    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda *a, **k: True)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(var, "0" if var != "MASTER_PORT" else "29500")  # TRL rewrites them; restored after
    use_agent_engine_seeds()
    use_agent_engine_seeds()  # idempotent: one offset, not two
    accelerator = SimpleNamespace(
        process_index=1,
        local_process_index=1,
        num_processes=4,
        state=SimpleNamespace(deepspeed_plugin=None),
        wait_for_everyone=lambda: None,
    )
    model = torch.nn.Linear(1, 1)
    model.name_or_path = "m"
    for agent_index in (0, 1):
        monkeypatch.setattr(topology, "_TOPOLOGY", SimpleNamespace(process_counts=(4, 4), agent_index=agent_index))
        vllm_generation.VLLMGeneration(model, accelerator, processing_class=None, mode="colocate")
    assert seeds == [1, 5]
    assert "seed" in SHARED_SETTINGS


# ------------------------------------------------------------------------------------------------- hacpo-eval


def _saved(tmp_path, name, config):
    folder = tmp_path / name
    folder.mkdir()
    (folder / ("adapter_config.json" if "r" in config else "config.json")).write_text(json.dumps(config))
    return str(folder)


def test_eval_places_the_model_on_the_accelerator_in_its_training_dtype(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from hacpo_trl.evaluation.evaluate import eval_placement, load_for_eval

    bf16 = _saved(tmp_path, "bf16", {"dtype": "bfloat16"})
    fp32 = _saved(tmp_path, "fp32", {"torch_dtype": "float32"})
    lora = _saved(tmp_path, "lora", {"base_model_name_or_path": "base", "r": 16})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert eval_placement(bf16) == ("cpu", torch.float32)  # CPU: as before
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert eval_placement(bf16) == ("cuda", torch.bfloat16)
    assert eval_placement(fp32) == ("cuda", torch.float32)
    assert eval_placement(lora) == ("cuda", "auto")

    calls = []

    class Loaded:
        def to(self, device):
            calls.append(device)
            return self

    def from_pretrained(path, **kwargs):
        calls.append(kwargs)
        return Loaded()

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    load_for_eval(bf16)
    assert calls == [{"dtype": torch.bfloat16}, "cuda"]


def test_vllm_eval_of_a_lora_agent_serves_the_base_with_the_adapter(tmp_path, monkeypatch):
    from hacpo_trl.agents.tiny import char_tokenizer
    from hacpo_trl.evaluation.evaluate import evaluate_with_vllm
    from hacpo_trl.tasks.data import arithmetic_splits
    from hacpo_trl.tasks.rewards import arithmetic_exact_match

    built, generated = [], []

    class LLM:
        def __init__(self, **kwargs):
            built.append(kwargs)

        def generate(self, prompts, params, **kwargs):
            generated.append(kwargs)
            tok = char_tokenizer()  # vLLM's outputs carry their token ids, which TRL decodes (and so does the eval)
            return [SimpleNamespace(outputs=[SimpleNamespace(text=t, token_ids=tok.encode(t))]) for t in answers]

    class LoRARequest:
        def __init__(self, name, lora_id, path):
            self.path = path

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, lambda **kwargs: kwargs
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)

    data = arithmetic_splits()["test"].select(range(2))
    answers = [str(data[0]["answer"]), "-1"]  # one right, one wrong
    lora = _saved(tmp_path, "lora", {"base_model_name_or_path": "/models/base", "r": 64})
    result = evaluate_with_vllm(lora, char_tokenizer(), data, arithmetic_exact_match, max_new_tokens=8)
    assert result.avg_at_k == 0.5
    assert built[0] == {"model": "/models/base", "enable_lora": True, "max_lora_rank": 64}
    assert generated[0]["lora_request"].path == lora
    full = _saved(tmp_path, "full", {"dtype": "bfloat16"})
    evaluate_with_vllm(full, char_tokenizer(), data, arithmetic_exact_match, max_new_tokens=8)
    assert built[1] == {"model": full} and generated[1] == {}
