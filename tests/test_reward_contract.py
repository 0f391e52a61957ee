"""One reward contract: held-out evaluation calls a reward function with what training passes (TRL's format for the
dataset's kind, the dataset's columns), and a reward that raises is named, with the phase, in one line."""

import pytest
import torch
from datasets import Dataset

from hacpo_trl import HACPOConfig, HACPOTrainer
from hacpo_trl.agents.tiny import char_tokenizer, tiny_llama
from hacpo_trl.evaluation.evaluate import evaluate_model
from hacpo_trl.tasks.rewards import RewardError, call_reward, guard_reward
from helpers import seeded

COMMON = dict(use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False, save_strategy="no")


def _rows(conversational: bool) -> Dataset:
    prompts = [f"{a}+{b}=" for a in range(4) for b in range(2)]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": p}] for p in prompts] if conversational else prompts,
            "answer": [str(eval(p[:-1])) for p in prompts],
            "level": list(range(len(prompts))),
        }
    )


def _shape(value):
    """A value's type, with its first element's for a list, two deep: what a reward can rely on."""
    if isinstance(value, list):
        return ("list", _shape(value[0]) if value else None)
    return "callable" if callable(value) else type(value).__name__  # TRL's writers are bound methods


def _recording(calls: list):
    def trl_style(prompts, completions, completion_ids, answer, **kwargs):
        calls.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
                      "answer": answer, **kwargs})  # fmt: skip
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]  # TRL's idiom
        return [1.0 if t.strip().startswith(a) else 0.0 for t, a in zip(texts, answer, strict=True)]

    return trl_style


@pytest.mark.parametrize("conversational", [True, False], ids=["conversational", "plain"])
def test_evaluation_calls_a_reward_with_what_training_passes(tmp_path, conversational):
    """A reward written for TRL (`completion[-1]["content"]` on a conversational dataset) gets the same arguments,
    of the same types, in one training step and in held-out evaluation, the dataset's columns included (and
    HACPO's own prompt-id column in neither)."""
    tok = char_tokenizer()
    data = _rows(conversational)
    calls: list[dict] = []
    reward = _recording(calls)
    args = HACPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                       max_completion_length=4, max_steps=1, seed=seeded(0), **COMMON)  # fmt: skip
    trainer = HACPOTrainer(model=tiny_llama(tok), reward_funcs=reward, args=args, train_dataset=data,
                           processing_class=tok)  # fmt: skip
    trainer.train()
    training = calls[-1]
    result = evaluate_model(trainer.model, tok, data, reward, max_new_tokens=4, trainer_state=trainer.state)
    evaluation = calls[-1]
    assert len(calls) == 2 and result.n == len(data)
    assert set(evaluation) == set(training) == {
        "prompts", "completions", "completion_ids", "answer", "level", "trainer_state", "log_extra", "log_metric"
    }  # fmt: skip
    assert {k: _shape(v) for k, v in evaluation.items()} == {k: _shape(v) for k, v in training.items()}
    completion = evaluation["completions"][0]
    if conversational:
        assert _shape(completion) == ("list", "dict") and completion[-1]["role"] == "assistant"
    else:
        assert isinstance(completion, str)
    assert evaluation["answer"] == list(data["answer"]) and evaluation["prompts"] == list(data["prompt"])
    assert evaluation["trainer_state"] is trainer.state


def test_completion_ids_stop_at_eos_and_decode_to_the_completion():
    """As in TRL: each completion's ids end with its first EOS (no padding after it) and decode to its text."""
    tok = char_tokenizer()
    calls: list[dict] = []
    model = tiny_llama(tok)
    torch.manual_seed(0)
    evaluate_model(model, tok, _rows(True), _recording(calls), max_new_tokens=12)
    ids, completions = calls[0]["completion_ids"], calls[0]["completions"]
    assert all(tok.pad_token_id not in row or tok.pad_token_id == tok.eos_token_id for row in ids)
    assert all(tok.eos_token_id not in row[:-1] for row in ids)
    assert [tok.decode(row, skip_special_tokens=True) for row in ids] == [c[-1]["content"] for c in completions]


def _wrong_index(completions, answer, **kwargs):
    """Reads every completion as a conversation's message: right for conversational completions, a TypeError for
    any plain one (an empty string included, which `c[0]` would make an IndexError)."""
    return [
        float((c[0] if isinstance(c, list) else c)["content"] == a) for c, a in zip(completions, answer, strict=True)
    ]


def test_a_raising_reward_gets_one_line_naming_it_the_phase_and_its_arguments():
    with pytest.raises(RewardError) as caught:
        call_reward(_wrong_index, "held-out evaluation before training", completions=["12"], answer=["12"])
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith(
        "reward function 'test_reward_contract._wrong_index' raised TypeError: string indices must be integers"
    )
    assert "during held-out evaluation before training; it was called with completions: list[str], answer: " \
        "list[str] (the contract: docs/training.md#reward-functions)" in line  # fmt: skip
    assert isinstance(caught.value.__cause__, TypeError)  # the traceback stays in the log, chained
    with pytest.raises(RewardError, match=r"'test_reward_contract\.<lambda>' returned 1 rewards during training"):
        call_reward(lambda completions, **kw: [1.0], "training", completions=["a", "b"])
    guarded = guard_reward(_wrong_index, "training", hidden=("hacpo_prompt_id",))
    assert guarded.__name__ == "_wrong_index"
    assert guarded(completions=[[{"role": "assistant", "content": "3"}]], answer=["3"], hacpo_prompt_id=["0:x"]) == [
        1.0
    ]
    with pytest.raises(RewardError, match=r"during training; it was called with completions: list\[str\], answer"):
        guarded(completions=["3"], answer=["3"], hacpo_prompt_id=["0:x"])


def test_an_async_reward_stays_async_and_is_named_when_it_raises():
    """TRL runs a coroutine reward on its event loop, so the guard must stay a coroutine function."""
    import asyncio
    import inspect

    async def remote(completions, **kwargs):
        return [float(c[0]["content"] == "3") for c in completions]

    guarded = guard_reward(remote, "training")
    assert inspect.iscoroutinefunction(guarded)
    assert asyncio.run(guarded(completions=[[{"role": "assistant", "content": "3"}]])) == [1.0]
    with pytest.raises(RewardError, match=r"'test_reward_contract\.remote' raised TypeError: .* during training"):
        asyncio.run(guarded(completions=["3"]))


def test_a_raising_reward_is_named_in_evaluation_and_in_training(tmp_path):
    tok = char_tokenizer()
    model = tiny_llama(tok)
    with pytest.raises(RewardError, match=r"'test_reward_contract\._wrong_index' raised TypeError: .* during "
                       r"held-out evaluation before training; it was called with prompts: list\[str\], completions: "
                       r"list\[str\], completion_ids: list\[list\[int\]\], answer: list\[str\], level: list\[int\]"):  # fmt: skip
        evaluate_model(model, tok, _rows(False), _wrong_index, max_new_tokens=2,
                       phase="held-out evaluation before training")  # fmt: skip
    args = HACPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                       max_completion_length=2, max_steps=1, **COMMON)  # fmt: skip
    trainer = HACPOTrainer(model=model, reward_funcs=_wrong_index, args=args, train_dataset=_rows(False),
                           processing_class=tok)  # fmt: skip
    with pytest.raises(RewardError, match=r"'test_reward_contract\._wrong_index' raised TypeError: .* during "
                       r"training; it was called with prompts: list\[str\], completions: list\[str\]"):  # fmt: skip
        trainer.train()
