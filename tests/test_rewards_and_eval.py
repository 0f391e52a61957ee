"""Rewards (math-verify boxed answers, format, arithmetic), the registry, the built-in task and evaluation."""

import pytest

from hacpo_trl.rewards import (
    arithmetic_exact_match,
    boxed_format,
    get_reward_funcs,
    last_boxed,
    math_verify_boxed,
)
from hacpo_trl.tasks import arithmetic_splits


def test_last_boxed_balances_braces():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert last_boxed(r"\fbox{7}") == "7"
    assert last_boxed("no answer") is None
    assert last_boxed(r"\boxed{unclosed") is None


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"so the answer is \boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),  # LaTeX gold without $
        (r"\boxed{0.5}", r"\frac12", 1.0),  # equal by value
        (r"\boxed{42}", "42", 1.0),  # plain-number gold
        (r"\boxed{42}", "$42$", 1.0),  # gold with $
        (r"\boxed{41}", "42", 0.0),
        ("42", "42", 0.0),  # no boxed answer: no reward, as in the paper
        ([{"role": "assistant", "content": r"\boxed{x^2+1}"}], "1+x^2", 1.0),  # conversational
    ],
)
def test_math_verify_boxed(completion, gold, expected):
    assert math_verify_boxed([completion], answer=[gold]) == [expected]


def test_format_and_arithmetic_rewards():
    assert boxed_format([r"\boxed{1}", "1", [{"role": "assistant", "content": r"\boxed{}"}]]) == [1.0, 0.0, 1.0]
    # the first number in the completion is the answer
    got = arithmetic_exact_match(["46", " 46 apples", "4", "= 46", "4 6", "-3", ""], answer=["46"] * 5 + ["-3", "1"])
    assert got == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def test_registry_by_name_and_import_path():
    assert get_reward_funcs(["math_verify"]) == [math_verify_boxed]
    assert get_reward_funcs("hacpo_trl.rewards:boxed_format") == [boxed_format]
    assert get_reward_funcs(["hacpo_trl.rewards.arithmetic_exact_match"]) == [arithmetic_exact_match]
    with pytest.raises(ValueError, match="unknown reward function 'nope'"):
        get_reward_funcs(["nope"])
    with pytest.raises(ValueError, match="unknown reward function 'os:nothing_here'"):
        get_reward_funcs(["os:nothing_here"])
    with pytest.raises(ValueError, match="at least one"):
        get_reward_funcs([])


def test_arithmetic_splits_are_disjoint_and_reproducible():
    a, b = arithmetic_splits(seed=0), arithmetic_splits(seed=0)
    keys = {name: {r["prompt"][0]["content"] for r in split} for name, split in a.items()}
    assert len(keys["test"]) == 300
    assert not (keys["test"] & keys["train"]) and not (keys["test"] & keys["warmup"])
    assert not (keys["train"] & keys["warmup"])
    assert a["test"][0] == b["test"][0]
    row = a["train"][0]
    x, y = row["prompt"][0]["content"].rstrip("=").split("+")
    assert int(x) + int(y) == int(row["answer"])


def test_evaluate_avg_and_best_at_k():
    import torch

    from hacpo_trl.evaluate import evaluate_model
    from hacpo_trl.tiny import char_tokenizer, tiny_llama

    tok = char_tokenizer()
    model = tiny_llama(tok)
    data = arithmetic_splits()["test"].select(range(6))
    calls = []
    generate = model.generate
    model.generate = lambda **kw: calls.append(len(kw["input_ids"])) or generate(**kw)

    def reward(completions, answer, **kw):  # completions come problem by problem, k each: problems 0 and 1 right
        return [1.0 if i in (0, 3) else 0.0 for i in range(len(completions))]  # on their first sample

    torch.manual_seed(0)
    result = evaluate_model(model, tok, data, reward, k=3, temperature=1.0, max_new_tokens=2, batch_size=2)
    # generate runs 2 problems x 3 samples at a time; scores: problems 0 and 1 right once each
    assert calls == [6, 6, 6]
    assert result.avg_at_k == pytest.approx(2 / 18) and result.best_at_k == pytest.approx(2 / 6) and result.n == 6
    with pytest.raises(ValueError, match="temperature"):
        evaluate_model(model, tok, data, reward, k=2)


def test_gold_answers_of_benchmark_formats():
    from hacpo_trl.evaluate import _gold_answer

    assert _gold_answer("Natalia sold 48 ... #### 1,072") == "1072"  # GSM8K
    assert _gold_answer(r"... so $x = \boxed{\frac{3}{4}}$.") == r"\frac{3}{4}"  # MATH solution
    assert _gold_answer(["7"]) == "7"  # OlympiadBench lists
    assert _gold_answer(" 12 ") == "12"


@pytest.mark.launch
def test_hacpo_eval_cli_writes_json_and_markdown(tmp_path):
    import json
    import subprocess
    import sys

    from hacpo_trl.tiny import char_tokenizer, tiny_llama

    tok = char_tokenizer()
    tiny_llama(tok).save_pretrained(tmp_path / "agent")
    tok.save_pretrained(tmp_path / "agent")
    local = tmp_path / "mini.jsonl"
    local.write_text("".join(json.dumps({"question": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "hacpo_trl.evaluate", "--model", str(tmp_path / "agent"), "--benchmark", "arithmetic",
         "--dataset", str(local), "--problem_column", "question", "--limit", "5", "--max_new_tokens", "4",
         "--output_dir", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results["agent"]) == {"arithmetic", "mini.jsonl"}
    assert results["agent"]["arithmetic"]["n"] == 5 and results["agent"]["mini.jsonl"]["n"] == 3
    table = (out / "results.md").read_text()
    assert table.startswith("| model | arithmetic | mini.jsonl |") and "| agent |" in table
    bad = subprocess.run(
        [sys.executable, "-m", "hacpo_trl.evaluate", "--model", str(tmp_path / "agent"), "--benchmark", "mmlu"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "unknown benchmark 'mmlu'" in bad.stderr
    no_vllm = subprocess.run(
        [sys.executable, "-m", "hacpo_trl.evaluate", "--model", str(tmp_path / "agent"), "--backend", "vllm"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert no_vllm.returncode == 2 and "--backend vllm needs vLLM" in no_vllm.stderr
