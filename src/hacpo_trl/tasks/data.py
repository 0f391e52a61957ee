"""Datasets: the built-in tasks (offline, from a seed) and the paper's MATH training set.

Built-in tasks (all answer-graded, split into disjoint ``warmup`` / ``train`` / ``test``):

* ``arithmetic``: ``12+34=`` -> ``46``; completions are 2-3 tokens, so a peer ratio is two models' probabilities of
  the answer itself (far from the paper's regime, kept for tests and comparison).
* ``arithmetic_trace``: ``347+285=`` -> ``7+5=12, 4+8+1=13, 3+2+1=6, so 632``: a worked digit-by-digit solution,
  then the answer (>= 15 tokens for every built-in tokenizer). Most tokens of a trace are predictable to any agent
  that knows the format, as in the paper's long reasoning traces, so peer ratios sit near 1; the reward looks at the
  final answer only. ``arithmetic_trace_bracket`` is the same task with its warm-up solutions written differently
  (``[5+7=12][8+4+1=13][2+3+1=6] so 632``), for agents that write their traces in another style.
* ``arithmetic_trace_carries``: the same worked solutions on two halves of the problems, tagged in a ``half`` column:
  ``carry`` (every column carries: ``7+5=12, 4+8+1=13, 3+6+1=10, so 1032``) and ``no_carry`` (no column does:
  ``2+5=7, 4+3+0=7, 3+6+0=9, so 977``); every split is half of each, for the ``complement`` pair of agents, each
  warm-started mostly on one half (`HALVES`, `carry_trace_splits`).

* ``arithmetic_fewshot``: the ``arithmetic`` problems as a plain few-shot text, ``2+3=5\n14+8=22\n26+13=39\n12+34=``,
  for real pretrained models, base and instruct alike: under their chat templates SmolLM2-135M-Instruct and
  Gemma-3-270M (base) answer 1-digit sums 4-8% of the time, on this text 38% and 73% (greedy). Its prompts are
  strings, which TRL tokenizes without a chat template; the reward is the first number of the completion.

Every other dataset has a conversational ``prompt`` column (so each agent applies its own chat template), and every
dataset an ``answer`` column that the rewards compare against.
"""

from __future__ import annotations

import random

from datasets import Dataset

__all__ = [
    "BOXED_INSTRUCTION",
    "HALVES",
    "TASKS",
    "FEWSHOT_EXAMPLES",
    "arithmetic_splits",
    "TRACE_STYLES",
    "bracket_trace_splits",
    "carry_half",
    "carry_trace_splits",
    "fewshot_prompt",
    "fewshot_splits",
    "load_any_dataset",
    "math_dataset",
    "task_splits",
    "trace_solution",
    "trace_splits",
]

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


# the worked examples of `arithmetic_fewshot`'s prompts: a 1-digit, a mixed and a 2-digit sum, one with a carry
FEWSHOT_EXAMPLES = ((2, 3), (14, 8), (26, 13))


def fewshot_prompt(a: int, b: int) -> str:
    """``a+b`` after the worked examples, one sum per line, as a plain text a base model continues."""
    shots = "".join(f"{x}+{y}={x + y}\n" for x, y in FEWSHOT_EXAMPLES)
    return f"{shots}{a}+{b}="


def fewshot_splits(seed: int = 0, max_operand: int = 49, test_size: int = 300) -> dict[str, Dataset]:
    """The ``arithmetic`` splits with plain few-shot prompts (`fewshot_prompt`); the worked examples' own problems
    are left out of every split."""
    examples = {f"{a}+{b}=" for a, b in FEWSHOT_EXAMPLES}

    def plain(split: Dataset) -> Dataset:
        rows = [r for r in split if r["prompt"][0]["content"] not in examples]
        return Dataset.from_list(
            [{"prompt": fewshot_prompt(*map(int, r["prompt"][0]["content"][:-1].split("+"))), "answer": r["answer"]}
             for r in rows]
        )  # fmt: skip

    return {name: plain(split) for name, split in arithmetic_splits(seed, max_operand, test_size).items()}


TRACE_STYLES = ("steps", "bracket")


def trace_solution(a: int, b: int, digits: int = 3, style: str = "steps") -> str:
    """The worked solution of ``a+b``, least significant digit first, then ``so <sum>``. Operands are padded with
    zeros to ``digits`` digits; the first step has no carry term.

    Two ways of writing the same reasoning (the ``style`` pair: agents warm-started on different formats, as a Base
    and an Instruct model write differently), with the same final answer and reward:

    * ``steps``: ``7+5=12, 4+8+1=13, 3+2+1=6, so 632``;
    * ``bracket``: ``[5+7=12][8+4+1=13][2+3+1=6] so 632`` (second operand first, bracketed, no commas).
    """
    if style not in TRACE_STYLES:
        raise ValueError(f"unknown trace style {style!r}; available: {list(TRACE_STYLES)}")
    xs, ys = str(a).zfill(digits)[::-1], str(b).zfill(digits)[::-1]
    steps, carry = [], 0
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        total = int(x) + int(y) + carry
        first, second = (x, y) if style == "steps" else (y, x)
        steps.append(f"{first}+{second}={total}" if i == 0 else f"{first}+{second}+{carry}={total}")
        carry = total // 10
    if style == "bracket":
        return "".join(f"[{step}]" for step in steps) + f" so {a + b}"
    return ", ".join(steps) + f", so {a + b}"


def trace_splits(
    seed: int = 0,
    digits: int = 3,
    test_size: int = 500,
    validation_size: int = 300,
    warmup_size: int = 4000,
    train_size: int = 4000,
    style: str = "steps",
) -> dict[str, Dataset]:
    """Disjoint ``warmup`` / ``train`` / ``validation`` / ``test`` splits of ``arithmetic_trace``.

    ``warmup`` rows carry the worked solution, written in ``style``, in ``solution`` (supervised warm-start of the
    built-in agents; the problems and answers do not depend on the style);
    ``answer`` is the sum alone, the only thing the reward checks. ``validation`` is carved from the RL side, for
    choosing settings without looking at ``test``.
    """  # fmt: skip
    top = 10**digits
    rng = random.Random(seed)
    needed = test_size + validation_size + warmup_size + train_size
    pairs: set[tuple[int, int]] = set()
    while len(pairs) < needed:
        pairs.add((rng.randrange(top), rng.randrange(top)))
    ordered = sorted(pairs)
    rng.shuffle(ordered)

    def rows(chunk):
        return Dataset.from_list(
            [{**_problem(a, b), "solution": trace_solution(a, b, digits, style)} for a, b in chunk]
        )

    cuts = [0, test_size, test_size + validation_size, test_size + validation_size + warmup_size, needed]
    names = ["test", "validation", "warmup", "train"]
    return {name: rows(ordered[lo:hi]) for name, lo, hi in zip(names, cuts[:-1], cuts[1:], strict=True)}


def bracket_trace_splits(**kwargs) -> dict[str, Dataset]:
    """``arithmetic_trace`` with its worked solutions written in the ``bracket`` style (same problems, answers and
    reward): what the ``style`` pair's second agent is warm-started on."""
    return trace_splits(style="bracket", **kwargs)


HALVES = ("carry", "no_carry")


def carry_half(a: int, b: int, digits: int = 3) -> str | None:
    """``"carry"`` if every column of ``a+b`` carries, ``"no_carry"`` if none does, else None (in neither half).

    Every column or none, not "some carry or none": a problem with one carry has columns without, so an agent trained
    on such problems also writes every step of a no-carry problem; here each half's steps are ones the other half's
    traces never show (totals of 10 and more with a carry of 1, against totals below 10 with a carry of 0)."""
    xs, ys = str(a).zfill(digits)[::-1], str(b).zfill(digits)[::-1]
    carries, carry = [], 0
    for x, y in zip(xs, ys, strict=True):
        carry = (int(x) + int(y) + carry) // 10
        carries.append(carry)
    return "carry" if all(carries) else "no_carry" if not any(carries) else None


def carry_trace_splits(
    seed: int = 0,
    digits: int = 3,
    test_size: int = 500,
    validation_size: int = 1000,
    warmup_size: int = 4000,
    train_size: int = 4000,
) -> dict[str, Dataset]:
    """Disjoint ``warmup`` / ``train`` / ``validation`` / ``test`` splits of ``arithmetic_trace_carries``: the
    ``steps`` worked solutions of problems in one of two `HALVES` (`carry_half`), named in a ``half`` column.

    Every split alternates the halves row by row (``carry`` first), so that it and every even-length prefix of it
    (the first ``eval_samples`` test problems, the first validation problems a warm-start is checked on) is half of
    each. ``warmup`` is half of each too: an agent picks its own mix of it (`hacpo_trl.agents.demo.DemoAgent.half`)."""
    top = 10**digits
    rng = random.Random(seed)
    sizes = {"test": test_size, "validation": validation_size, "warmup": warmup_size, "train": train_size}
    if any(size % 2 for size in sizes.values()):
        raise ValueError(
            f"every split of arithmetic_trace_carries is half of each half: sizes must be even, got {sizes}"
        )
    each = sum(sizes.values()) // 2
    pairs: dict[str, set[tuple[int, int]]] = {half: set() for half in HALVES}
    while any(len(found) < each for found in pairs.values()):
        a, b = rng.randrange(top), rng.randrange(top)
        half = carry_half(a, b, digits)
        if half is not None and len(pairs[half]) < each:
            pairs[half].add((a, b))
    ordered = {}
    for half in HALVES:
        ordered[half] = sorted(pairs[half])
        rng.shuffle(ordered[half])

    splits, start = {}, 0
    for name, size in sizes.items():
        chunks = [ordered[half][start : start + size // 2] for half in HALVES]
        rows = [
            {**_problem(a, b), "solution": trace_solution(a, b, digits), "half": half}
            for pair in zip(*chunks, strict=True)
            for half, (a, b) in zip(HALVES, pair, strict=True)
        ]
        splits[name] = Dataset.from_list(rows)
        start += size // 2
    return splits


TASKS = {
    "arithmetic": arithmetic_splits,
    "arithmetic_fewshot": fewshot_splits,
    "arithmetic_trace": trace_splits,
    "arithmetic_trace_bracket": bracket_trace_splits,
    "arithmetic_trace_carries": carry_trace_splits,
}


def task_splits(task: str) -> dict[str, Dataset]:
    """The splits of a built-in task by name."""
    if task not in TASKS:
        raise ValueError(f"unknown built-in task {task!r}; available: {sorted(TASKS)}")
    return TASKS[task]()


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
