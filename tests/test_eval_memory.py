"""`hacpo-eval` on the transformers backend: generation batches bounded by the KV cache that fits (a stand-in GPU size
on CPU: these tests cannot show the real free memory of a GPU or generate's own buffers, only the arithmetic and
that generate is called with the bounded batch), the agent's training `chat_template_kwargs` carried into
evaluation, and the paper's 8192-token default."""

import json
import types
from pathlib import Path

import pytest

from hacpo_trl.agents.tiny import char_tokenizer, tiny_llama
from hacpo_trl.evaluation import evaluate as ev
from hacpo_trl.launch import evaluate as hacpo_eval
from hacpo_trl.tasks.data import arithmetic_splits

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "model_configs"
GIB = 2**30


def test_readme_k30_example_is_bounded_on_an_80gb_card():
    """N4: 16 problems x 30 samples x (300 prompt + 8192 new) tokens of Qwen3-4B. One sequence's bf16 KV cache is
    2 (K, V) x 36 layers x 8 KV heads x 128 x 2 B = 144 KiB per token x 8492 tokens = 1.1662 GiB (+ 2 fp32 logits
    rows 8 x 151,936 B = 1.16 MiB); 480 of them would be 560 GiB. With 71 GiB free (80 GB card minus 7.5 GiB of
    weights) 0.9 x 71 / 1.1675 = 54.7 -> 54 sequences at a time."""
    config = json.loads((FIXTURES / "Qwen" / "Qwen3-4B" / "config.json").read_text())
    per_token = 2 * 36 * 8 * 128 * 2
    assert ev.kv_cache_bytes(config, 8492) == per_token * 8492 == 1_252_196_352
    assert 480 * ev.kv_cache_bytes(config, 8492) / GIB == pytest.approx(559.8, abs=0.1)
    per_sequence = 1_252_196_352 + 8 * 151_936
    assert int(0.9 * 71 * GIB) // per_sequence == 54
    assert ev.sequences_per_batch(config, 2, 300, 8192, 16 * 30, 71 * GIB) == 54
    assert ev.sequences_per_batch(config, 2, 300, 8192, 16 * 30, None) == 480  # CPU: no bound
    assert ev.sequences_per_batch(config, 2, 300, 4096, 4, 71 * GIB) == 4  # what was asked, when it fits
    with pytest.raises(ValueError, match=r"needs 1\.17 GiB of KV cache but only 1\.00 GiB is free"):
        ev.sequences_per_batch(config, 2, 300, 8192, 480, 1 * GIB)


def test_generate_runs_the_bounded_number_of_sequences():
    tok = char_tokenizer()
    model = tiny_llama(tok)  # fp32; 2 layers x 2 KV heads x head_dim 4: 2 x 2 x 2 x 4 x 4 B = 128 B per token
    data = arithmetic_splits()["test"].select(range(6))
    widest = max(len(ev._prompt_ids(tok, r, None)) for r in data)
    per_sequence = 128 * (widest + 2) + 8 * 103  # KV of prompt + 2 new tokens, plus 2 fp32 logits rows
    stand_in = int((4 * per_sequence + per_sequence // 2) / 0.9)  # room for 4.5 sequences -> 4
    calls = []
    generate = model.generate
    model.generate = lambda **kw: calls.append(len(kw["input_ids"])) or generate(**kw)

    def reward(completions, answer, **kw):
        return [0.0] * len(completions)

    result = ev.evaluate_model(
        model, tok, data, reward, k=3, temperature=1.0, max_new_tokens=2, batch_size=16, memory_bytes=stand_in
    )
    assert calls == [4, 4, 4, 4, 2] and result.n == 6 and result.k == 3  # 6 problems x 3 samples = 18 sequences
    with pytest.raises(ValueError, match="of KV cache but only"):
        ev.evaluate_model(model, tok, data, reward, max_new_tokens=2, memory_bytes=per_sequence // 2)


def test_eval_uses_the_agents_training_chat_template_kwargs(tmp_path, monkeypatch):
    tok = char_tokenizer()
    agent = tmp_path / "agent"
    tiny_llama(tok).save_pretrained(agent)
    tok.save_pretrained(agent)
    # what `hacpo-train` records next to the agent at save (train._write_task_record)
    from hacpo_trl.launch.train import _write_task_record

    config = types.SimpleNamespace(output_dir=str(agent), max_completion_length=64)
    config.chat_template_kwargs = {"enable_thinking": False}
    script = types.SimpleNamespace(
        task="math", dataset_name=None, dataset_test_split=None, reward_funcs=["math_verify"]
    )
    script.eval_split, script.eval_samples = "test", 0
    _write_task_record(config, script)
    assert ev.trained_task(str(agent))["chat_template_kwargs"] == {"enable_thinking": False}

    seen = []

    def fake_evaluate(model, tok, data, reward, **kw):
        seen.append((kw["chat_template_kwargs"], kw["max_new_tokens"]))
        return ev.EvalResult(0.0, 0.0, 1, len(data))

    monkeypatch.setattr(hacpo_eval, "evaluate_model", fake_evaluate)
    local = tmp_path / "mini.jsonl"
    local.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    args = ["--model", str(agent), "--dataset", str(local), "--output_dir", str(tmp_path / "out")]
    assert hacpo_eval.main(args) == 0
    assert seen[-1] == ({"enable_thinking": False}, 8192)  # the training kwargs and the paper's main-table budget
    assert (
        hacpo_eval.main([*args, "--chat_template_kwargs", '{"enable_thinking": true}', "--max_new_tokens", "4096"]) == 0
    )
    assert seen[-1] == ({"enable_thinking": True}, 4096)  # an explicit flag wins (ablations: 4096)
    (agent / ev.TASK_RECORD).unlink()
    assert (
        hacpo_eval.main(args) == 0 and seen[-1][0] is None
    )  # a model hacpo-train did not save: the template's defaults
