"""Rewards (math-verify boxed answers, format, arithmetic), the registry, the built-in task and evaluation."""

import importlib

import pytest

from hacpo_trl.tasks.data import arithmetic_splits
from hacpo_trl.tasks.rewards import (
    arithmetic_exact_match,
    boxed_format,
    get_reward_funcs,
    last_boxed,
    math_verify_boxed,
    no_reward_warning,
)


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
    assert get_reward_funcs("hacpo_trl.tasks.rewards:boxed_format") == [boxed_format]
    assert get_reward_funcs(["hacpo_trl.tasks.rewards.arithmetic_exact_match"]) == [arithmetic_exact_match]
    with pytest.raises(ValueError, match="unknown reward function 'nope'"):
        get_reward_funcs(["nope"])
    with pytest.raises(ValueError, match="module 'os' .* has no function 'nothing_here'"):
        get_reward_funcs(["os:nothing_here"])
    with pytest.raises(ValueError, match="at least one"):
        get_reward_funcs([])


# An import path that does not load: four causes, four fixes, four messages. Each test
# uses its own module name, as a module once imported stays in `sys.modules`.


def test_reward_path_to_a_module_that_exists_nowhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        get_reward_funcs(["hacpo_nowhere_rewards:score"])
    message = str(info.value)
    assert "no module 'hacpo_nowhere_rewards'" in message
    assert "ModuleNotFoundError: No module named 'hacpo_nowhere_rewards'" in message
    assert f"no file for it in the working directory {tmp_path}" in message
    assert "unknown reward function" not in message


def test_reward_path_to_a_module_on_disk_but_not_on_the_import_path(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "hacpo_offpath_rewards.py").write_text("def score(completions, **kw):\n    return []\n")
    monkeypatch.chdir(tmp_path)
    importlib.invalidate_caches()
    with pytest.raises(ValueError) as info:
        get_reward_funcs(["hacpo_offpath_rewards:score"])
    message = str(info.value)
    folder = tmp_path / "recipes"
    assert f"module 'hacpo_offpath_rewards' is at {folder / 'hacpo_offpath_rewards.py'}" in message
    assert f"but {folder} is not on the import path" in message
    assert f"`PYTHONPATH={folder}` in front of the command" in message
    monkeypatch.syspath_prepend(str(folder))  # the fix the message gives
    assert get_reward_funcs(["hacpo_offpath_rewards:score"])[0]([]) == []


def test_reward_path_to_a_module_without_that_function(tmp_path, monkeypatch):
    (tmp_path / "hacpo_nofunc_rewards.py").write_text(
        "import math\nTHRESHOLD = 2\n\ndef score(completions, **kw):\n    return []\n\n"
        "def _private():\n    pass\n\nclass Scorer:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as info:
        get_reward_funcs(["hacpo_nofunc_rewards:scores"])
    message = str(info.value)
    assert f"module 'hacpo_nofunc_rewards' ({tmp_path / 'hacpo_nofunc_rewards.py'}) has no function 'scores'" in message
    assert message.endswith("its callables: Scorer, score; did you mean 'score'?")  # own public callables only
    with pytest.raises(ValueError, match=r"no function 'THRESHOLD' \(of type int, not a function\)"):
        get_reward_funcs(["hacpo_nofunc_rewards.THRESHOLD"])


@pytest.mark.parametrize(
    "source, error",
    [
        ("import hacpo_no_such_dependency\n", "ModuleNotFoundError: No module named 'hacpo_no_such_dependency'"),
        ("from os import no_such_name\n", "ImportError: cannot import name 'no_such_name' from 'os'"),
        ("x = 1\nraise RuntimeError('reward table missing')\n", "RuntimeError: reward table missing"),
    ],
    ids=["missing_dependency", "bad_from_import", "raises"],
)
def test_reward_path_to_a_module_whose_own_import_fails(tmp_path, monkeypatch, source, error, request):
    name = f"hacpo_broken_rewards_{request.node.callspec.id}"
    (tmp_path / f"{name}.py").write_text(source + "\ndef score(completions, **kw):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as info:
        get_reward_funcs([f"{name}:score"])
    message = str(info.value)
    line = source.count("\n")  # the failing statement is the source's last line
    assert f"importing module '{name}' failed at {tmp_path / name}.py:{line}: {error}" in message
    assert "not on the import path" not in message and "no module" not in message


def test_a_generation_batch_warns_only_when_every_completion_of_every_agent_scored_0():
    names = ["arithmetic_exact_match"]
    assert no_reward_warning({"a": [0.0, 1.0], "b": [0.0, 0.0]}, names) is None  # one correct completion: signal
    assert no_reward_warning({"a": [0.0, 0.0], "b": [0.0, -0.5]}, names) is None  # non-binary rewards still differ
    assert no_reward_warning({}, names) is None
    text = no_reward_warning({"a": [0.0] * 64, "b": [0.0] * 32}, names)
    assert text.startswith(
        "every completion of every agent scored 0 in this generation batch (a: 64, b: 32 completions) with reward "
        "functions ['arithmetic_exact_match']: no agent gets a learning signal"
    )
    assert "arithmetic_trace -> arithmetic_trace" in text  # the likely cause: a reward that does not fit the task


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


def test_fewshot_task_is_the_arithmetic_problems_as_plain_text_without_its_worked_examples():
    from hacpo_trl.tasks.data import TASKS, fewshot_prompt
    from hacpo_trl.tasks.rewards import TASK_REWARDS, arithmetic_exact_match

    plain, chat = TASKS["arithmetic_fewshot"](), arithmetic_splits()
    assert fewshot_prompt(12, 34) == "2+3=5\n14+8=22\n26+13=39\n12+34="
    for name in ("train", "test"):
        problems = [r["prompt"][0]["content"] for r in chat[name]]
        kept = [p for p in problems if p not in ("2+3=", "14+8=", "26+13=")]
        assert [r["prompt"].rsplit("\n", 1)[1] for r in plain[name]] == kept  # the same problems, in order
        assert plain[name]["answer"] == [r["answer"] for r in chat[name] if r["prompt"][0]["content"] in kept]
    assert len(plain["train"]) < len(chat["train"])  # the worked examples' own problems are among them
    assert TASK_REWARDS["arithmetic_fewshot"] == TASK_REWARDS["arithmetic"]
    # a 3-token completion: the answer and the line's end, and a cut-off start of the next line
    assert arithmetic_exact_match(["46\n2", "4\n1", "\n46"], ["46", "46", "46"]) == [1.0, 0.0, 1.0]


def test_evaluate_avg_and_best_at_k():
    import torch

    from hacpo_trl.agents.tiny import char_tokenizer, tiny_llama
    from hacpo_trl.evaluation.evaluate import evaluate_model

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


def test_evaluate_reports_accuracy_per_group_from_the_same_completions():
    """``by``: avg@k per value of a column (a task's halves), in order of first appearance, without changing what is
    generated or the overall numbers; a column the dataset lacks is refused by name."""
    import torch

    from hacpo_trl.agents.tiny import char_tokenizer, tiny_llama
    from hacpo_trl.evaluation.evaluate import _result, evaluate_model

    tok = char_tokenizer()
    model = tiny_llama(tok)
    data = arithmetic_splits()["test"].select(range(6)).add_column("half", ["b", "a", "b", "a", "b", "a"])

    def reward(completions, answer, **kw):  # problems 0 and 2 right (both "b"), and problem 1 ("a")
        return [1.0 if i in (0, 1, 2) else 0.0 for i in range(len(completions))]

    torch.manual_seed(0)
    plain = evaluate_model(model, tok, data, reward, max_new_tokens=2)
    grouped = evaluate_model(model, tok, data, reward, max_new_tokens=2, by="half")
    assert plain.by_group is None and grouped.avg_at_k == plain.avg_at_k == pytest.approx(3 / 6)
    assert grouped.by_group == {"b": pytest.approx(2 / 3), "a": pytest.approx(1 / 3)}
    assert list(grouped.by_group) == ["b", "a"] and grouped.as_dict()["avg@k_by_group"] == grouped.by_group
    # k samples per row: every sample of a row counts for its group
    scores = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    assert _result(scores, ["x", "y", "x"]).by_group == {"x": 0.75, "y": 0.0}
    with pytest.raises(ValueError, match="by='side'.*no such column"):
        evaluate_model(model, tok, data, reward, max_new_tokens=2, by="side")


def test_gold_answers_of_benchmark_formats():
    from hacpo_trl.evaluation.evaluate import _gold_answer

    assert _gold_answer("Natalia sold 48 ... #### 1,072") == "1072"  # GSM8K
    assert _gold_answer(r"... so $x = \boxed{\frac{3}{4}}$.") == r"\frac{3}{4}"  # MATH solution
    assert _gold_answer(["7"]) == "7"  # OlympiadBench lists
    assert _gold_answer(" 12 ") == "12"


@pytest.mark.launch
def test_hacpo_eval_cli_writes_json_and_markdown(tmp_path):
    import json
    import subprocess
    import sys

    from hacpo_trl.agents.tiny import char_tokenizer, tiny_llama

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
