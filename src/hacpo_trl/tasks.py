"""Datasets: the built-in arithmetic task (offline, from a seed) and the paper's MATH training set.

Every dataset has a conversational ``prompt`` column (so each agent applies its own chat template) and an
``answer`` column that the rewards compare against.
"""

from __future__ import annotations

import random

from datasets import Dataset

__all__ = ["BOXED_INSTRUCTION", "arithmetic_splits", "load_any_dataset", "math_dataset"]

BOXED_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def _problem(a: int, b: int) -> dict:
    return {"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)}


def arithmetic_splits(seed: int = 0, max_operand: int = 49, test_size: int = 300) -> dict[str, Dataset]:
    """Disjoint ``warmup`` / ``train`` / ``test`` splits of the built-in task.

    The warm-up split teaches the tiny agents the format and part of the skill (supervised); ``train`` is for RL and
    ``test`` is held out from both.
    """
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    random.Random(seed).shuffle(pairs)
    test = pairs[:test_size]
    rest = pairs[test_size:]
    half = len(rest) // 2
    return {
        "test": Dataset.from_list([_problem(a, b) for a, b in test]),
        "warmup": Dataset.from_list([_problem(a, b) for a, b in rest[:half]]),
        "train": Dataset.from_list([_problem(a, b) for a, b in rest[half:]]),
    }


def load_any_dataset(name: str, config: str | None = None, split: str = "train") -> Dataset:
    """A Hub dataset id, a local dataset folder, or a local ``.json``/``.jsonl``/``.csv``/``.parquet`` file."""
    from datasets import load_dataset

    for suffix, builder in ((".json", "json"), (".jsonl", "json"), (".csv", "csv"), (".parquet", "parquet")):
        if name.endswith(suffix):
            return load_dataset(builder, data_files=name, split="train")
    return load_dataset(name, config, split=split)


def math_dataset(
    name: str = "DigitalLearningGmbH/MATH-lighteval",
    split: str = "train",
    config: str | None = None,
    problem_column: str = "problem",
    solution_column: str = "solution",
    instruction: str = BOXED_INSTRUCTION,
) -> Dataset:
    """The paper's training data: MATH problems with the boxed-answer instruction; the gold answer is the solution's
    last ``\\boxed{}``. ``name`` may also be a local file or folder that ``datasets.load_dataset`` understands."""
    from .rewards import last_boxed

    data = load_any_dataset(name, config, split)

    def convert(example):
        answer = example.get("answer") or last_boxed(example[solution_column]) or example[solution_column]
        return {"prompt": [{"role": "user", "content": f"{example[problem_column]} {instruction}"}], "answer": answer}

    return data.map(convert, remove_columns=data.column_names)
