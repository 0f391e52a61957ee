"""Verifiable rewards, and the registry that lets recipes name them.

Every reward follows TRL's reward-function protocol: ``f(completions, **columns) -> list[float | None]``, where
``completions`` are strings or conversational ``[{"role": "assistant", "content": ...}]`` lists and the dataset's
other columns (e.g. ``answer``) arrive as keyword lists aligned with the completions.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable

from .retokenize import completion_text

__all__ = [
    "REWARD_FUNCS",
    "arithmetic_exact_match",
    "arithmetic_trace_answer",
    "boxed_format",
    "get_reward_funcs",
    "last_boxed",
    "math_verify_boxed",
]


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if absent."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def _gold(answer: str):
    from math_verify import parse

    answer = str(answer).strip()
    if answer.startswith("$") or "\\boxed" in answer:
        return parse(answer)
    parsed = parse(f"${answer}$")  # LaTeX without delimiters, e.g. "\\frac{1}{2}"
    return parsed if parsed else parse(answer)


def math_verify_boxed(completions, answer, **kwargs) -> list[float]:
    """1.0 if the completion's last ``\\boxed{}`` answer equals the gold ``answer`` by math-verify, else 0.0.

    The gold answer may be LaTeX (with or without ``$``) or a plain number. A completion without a boxed answer
    scores 0, as in the paper's boxed-answer reward.
    """
    from math_verify import parse, verify

    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        boxed = last_boxed(completion_text(completion))
        if boxed is None:
            rewards.append(0.0)
            continue
        try:
            rewards.append(1.0 if verify(_gold(gold), parse(f"$\\boxed{{{boxed}}}$")) else 0.0)
        except Exception:  # math-verify raises on inputs it cannot parse; that is a wrong answer, not a crash
            rewards.append(0.0)
    return rewards


def boxed_format(completions, **kwargs) -> list[float]:
    """1.0 if the completion gives a final answer in a ``\\boxed{}``, else 0.0."""
    return [1.0 if last_boxed(completion_text(c)) is not None else 0.0 for c in completions]


_NUMBER = re.compile(r"-?\d+")


def arithmetic_exact_match(completions, answer, **kwargs) -> list[float]:
    """The built-in arithmetic task: 1.0 if the first number in the completion is the answer, else 0.0."""
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        match = _NUMBER.search(completion_text(completion))
        rewards.append(1.0 if match is not None and match.group() == str(gold).strip() else 0.0)
    return rewards


_FINAL = re.compile(r"so (-?\d+)")


def arithmetic_trace_answer(completions, answer, **kwargs) -> list[float]:
    """The built-in ``arithmetic_trace`` task: 1.0 if the final answer (the number after the last ``so``) is the
    sum, else 0.0. The worked steps before it are not graded, like a boxed-answer reward."""
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        finals = _FINAL.findall(completion_text(completion))
        rewards.append(1.0 if finals and finals[-1] == str(gold).strip() else 0.0)
    return rewards


REWARD_FUNCS: dict[str, Callable] = {
    "math_verify": math_verify_boxed,
    "boxed_format": boxed_format,
    "arithmetic_exact": arithmetic_exact_match,
    "arithmetic_trace": arithmetic_trace_answer,
}


def get_reward_funcs(names: list[str] | str) -> list[Callable]:
    """Reward functions by registry name or import path (``package.module:function`` or ``package.module.function``)."""
    if isinstance(names, str):
        names = [names]
    if not names:
        raise ValueError(f"`reward_funcs` must name at least one reward; available: {sorted(REWARD_FUNCS)}")
    funcs = []
    for name in names:
        if name in REWARD_FUNCS:
            funcs.append(REWARD_FUNCS[name])
            continue
        module, sep, attr = name.rpartition(":") if ":" in name else name.rpartition(".")
        func = None
        if sep and module:
            try:
                func = getattr(importlib.import_module(module), attr, None)
            except ImportError:
                func = None
        if not callable(func):
            raise ValueError(
                f"`reward_funcs`: unknown reward function {name!r}; use one of {sorted(REWARD_FUNCS)} or an import "
                "path such as `my_package.rewards:my_reward`"
            )
        funcs.append(func)
    return funcs
