"""Verifiable rewards, and the registry that lets recipes name them.

Every reward follows TRL's reward-function protocol: ``f(completions, **columns) -> list[float | None]``, where
``completions`` are strings or conversational ``[{"role": "assistant", "content": ...}]`` lists and the dataset's
other columns (e.g. ``answer``) arrive as keyword lists aligned with the completions. Held-out evaluation calls a
reward with the same arguments (`hacpo_trl.evaluation.evaluate.reward_arguments`; docs/training.md#reward-functions).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import inspect
import os
import re
import traceback
from collections.abc import Callable

from ..run.last_line import OneLineError
from ..sharing.retokenize import completion_text

__all__ = [
    "REWARD_FUNCS",
    "TASK_REWARDS",
    "RewardError",
    "arithmetic_exact_match",
    "arithmetic_trace_answer",
    "boxed_format",
    "call_reward",
    "get_reward_funcs",
    "guard_reward",
    "guard_rewards",
    "last_boxed",
    "math_verify_boxed",
    "no_reward_warning",
    "task_reward_funcs",
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


# The reward each task is graded by: a recipe without `reward_funcs` trains on it (a reward that does not fit the
# task's answers scores every completion 0, and the run learns nothing without saying why).
TASK_REWARDS: dict[str, str] = {
    "arithmetic": "arithmetic_exact",
    "arithmetic_fewshot": "arithmetic_exact",
    "arithmetic_trace": "arithmetic_trace",
    "arithmetic_trace_bracket": "arithmetic_trace",
    "arithmetic_trace_carries": "arithmetic_trace",
    "math": "math_verify",
}


def task_reward_funcs(task: str) -> list[str]:
    """The reward names a recipe of ``task`` trains on when it names none (`TASK_REWARDS`); a task without a reward
    of its own (``dataset``: any columns) must name one."""
    if task not in TASK_REWARDS:
        raise ValueError(
            f"task {task!r} has no reward of its own: set `reward_funcs` to one of {sorted(REWARD_FUNCS)} or an "
            "import path such as `my_package.rewards:my_reward`"
        )
    return [TASK_REWARDS[task]]


def get_reward_funcs(names: list[str] | str) -> list[Callable]:
    """Reward functions by registry name or import path (``package.module:function`` or ``package.module.function``).

    An import path that cannot be loaded raises a `ValueError` naming which of four causes it is (see
    `_import_reward`), since each has its own fix."""
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
        if not (sep and module and attr):
            raise ValueError(
                f"`reward_funcs`: unknown reward function {name!r}; use one of {sorted(REWARD_FUNCS)} or an import "
                "path such as `my_package.rewards:my_reward`"
            )
        funcs.append(_import_reward(name, module, attr))
    return funcs


def _import_reward(name: str, module_name: str, attr: str) -> Callable:
    """The function ``attr`` of ``module_name``, or a `ValueError` saying which of four causes stops it: no such
    module, a module file that exists but is not on the import path, a module without that function, or a module
    whose own import fails (its exception quoted, e.g. an ImportError of something it imports)."""
    what = f"`reward_funcs`: reward {name!r}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):  # the module itself
            found = _module_files(module_name)
            if found:
                folder, path = found[0]
                raise ValueError(
                    f"{what}: module {module_name!r} is at {path}, but {folder} is not on the import path "
                    f"(ModuleNotFoundError: {exc}): put `PYTHONPATH={folder}` in front of the command, or run "
                    f"`python -m hacpo_trl.train` / `accelerate launch -m hacpo_trl.train` from {folder} (they "
                    "import from the working directory; the `hacpo-train` script does not)"
                ) from None
            raise ValueError(
                f"{what}: no module {module_name!r} (ModuleNotFoundError: {exc}); no file for it in the working "
                f"directory {os.getcwd()} or its subfolders either: install the package that has it, or put the "
                "folder holding its .py file on PYTHONPATH"
            ) from None
        raise ValueError(_import_failure(what, module_name, exc)) from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed at import: say how, whatever it raised
        raise ValueError(_import_failure(what, module_name, exc)) from None
    func = getattr(module, attr, None)
    if callable(func):
        return func
    where = getattr(module, "__file__", None) or module_name
    has = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
    own = [n for n in has if getattr(vars(module)[n], "__module__", None) == module.__name__]
    listed = own or has
    shown = ", ".join(listed[:12]) + (f" and {len(listed) - 12} more" if len(listed) > 12 else "")
    kind = f" (of type {type(func).__name__}, not a function)" if func is not None else ""
    close = difflib.get_close_matches(attr, listed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"{what}: module {module_name!r} ({where}) has no function {attr!r}{kind}; its callables: "
        f"{shown or 'none'}{hint}"
    )


def _import_failure(what: str, module_name: str, exc: BaseException) -> str:
    """The message for a module that exists but whose own import raised ``exc``: its type, text and line."""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename and f.filename != __file__]
    at = f" at {user[-1].filename}:{user[-1].lineno}" if user else ""
    return f"{what}: importing module {module_name!r} failed{at}: {type(exc).__name__}: {exc}"


def _module_files(module_name: str) -> list[tuple[str, str]]:
    """(folder to put on the import path, file) for each file that would be ``module_name`` (``a/b.py`` or
    ``a/b/__init__.py`` below the folder) in the working directory or one of its direct subfolders (e.g. next to
    the recipes): where a reward module that is not on the import path usually is."""
    relative = module_name.replace(".", os.sep)
    roots = [os.getcwd()]
    with contextlib.suppress(OSError):
        roots += sorted(e.path for e in os.scandir(os.getcwd()) if e.is_dir() and not e.name.startswith("."))
    found = []
    for root in roots:
        for candidate in (f"{relative}.py", os.path.join(relative, "__init__.py")):
            if os.path.isfile(os.path.join(root, candidate)):
                found.append((root, os.path.join(root, candidate)))
    return found


def no_reward_warning(step_rewards: dict[str, list[float]], reward_names: list[str]) -> str | None:
    """The warning for a generation batch in which every completion of every agent scored 0 (``step_rewards``:
    each agent's rewards of the batch over all its ranks), else None. No agent then gets a learning signal, and the
    usual cause is a reward that does not fit the task's answers, which nothing else reports."""
    if not step_rewards or any(x != 0 for rewards in step_rewards.values() for x in rewards):
        return None
    counts = ", ".join(f"{agent}: {len(rewards)}" for agent, rewards in step_rewards.items())
    own = ", ".join(f"{task} -> {reward}" for task, reward in TASK_REWARDS.items())
    return (
        f"every completion of every agent scored 0 in this generation batch ({counts} completions) with "
        f"reward functions {list(reward_names)}: no agent gets a learning signal from it. Check that the reward fits the "
        f"task's answers (the built-in tasks' own rewards: {own}) and that the agents solve some problems"
    )


# ------------------------------------------------------------------------------ calling a reward function

CONTRACT = "docs/training.md#reward-functions"


class RewardError(OneLineError):
    """A reward function raised, or returned the wrong number of rewards. The message is one line naming the
    function, the phase and the types of the arguments it received; the function's own exception is chained."""


def reward_name(func) -> str:
    """``module.function`` of a reward (the callable's class for a callable object, the function of a partial)."""
    while isinstance(func, functools.partial):
        func = func.func
    name = (getattr(func, "__qualname__", None) or type(func).__qualname__).rsplit("<locals>.", 1)[-1]
    module = getattr(func, "__module__", None) or type(func).__module__
    return f"{module}.{name}" if module and module != "__main__" else name


def _type_name(value, depth: int = 0) -> str:
    """``list[list[dict]]`` for a list of message lists: a container's type with its first element's, two deep."""
    if isinstance(value, list | tuple) and depth < 2:
        return f"{type(value).__name__}[{_type_name(value[0], depth + 1)}]" if value else type(value).__name__
    return type(value).__name__


def argument_types(kwargs: dict) -> str:
    """``completions: list[list[dict]], answer: list[str], ...``: what a reward was called with."""
    return ", ".join(f"{key}: {_type_name(value)}" for key, value in kwargs.items())


def call_reward(func: Callable, phase: str, **kwargs) -> list:
    """``func(**kwargs)``, or a `RewardError` naming it, ``phase`` and the argument types when it raises or does
    not return one reward per completion."""
    try:
        rewards = func(**kwargs)
    except Exception as exc:
        raise _failure(func, phase, exc, kwargs) from exc
    _check_count(func, phase, rewards, len(kwargs.get("completions", ())))
    return rewards


def _failure(func: Callable, phase: str, exc: Exception, kwargs: dict) -> RewardError:
    text = " ".join(str(exc).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return RewardError(
        f"reward function {reward_name(func)!r} raised {type(exc).__name__}: {text} during {phase}; it was called "
        f"with {argument_types(kwargs)} (the contract: {CONTRACT})"
    )


def _check_count(func: Callable, phase: str, rewards, expected: int) -> None:
    count = len(rewards) if hasattr(rewards, "__len__") and not isinstance(rewards, str | dict) else None
    if count != expected:
        got = f"{count} rewards" if count is not None else f"a {type(rewards).__name__}"
        raise RewardError(
            f"reward function {reward_name(func)!r} returned {got} during {phase}; it must return a list of "
            f"{expected} floats (or None), one per completion (the contract: {CONTRACT})"
        )


def guard_rewards(funcs: list, phase: str, hidden: tuple[str, ...] = ()) -> list:
    """Every reward function of ``funcs`` through :func:`guard_reward`; a reward model (a torch module, which TRL
    scores with its own forward) as it is."""
    import torch  # a trainer's rewards: torch is loaded by then, and this module stays importable without it

    return [f if isinstance(f, torch.nn.Module) else guard_reward(f, phase, hidden) for f in funcs]


def guard_reward(func: Callable, phase: str, hidden: tuple[str, ...] = ()) -> Callable:
    """``func`` calling through `call_reward` (an async reward stays async), under the same name, without the
    ``hidden`` keyword arguments (columns of the trainer's own)."""
    inner = func
    while isinstance(inner, functools.partial):
        inner = inner.func
    if inspect.iscoroutinefunction(inner) or inspect.iscoroutinefunction(type(inner).__call__):  # as TRL tells

        @functools.wraps(func)
        async def guarded_async(**kwargs):
            kwargs = {k: v for k, v in kwargs.items() if k not in hidden}
            try:
                rewards = await func(**kwargs)
            except Exception as exc:
                raise _failure(func, phase, exc, kwargs) from exc
            _check_count(func, phase, rewards, len(kwargs.get("completions", ())))
            return rewards

        return guarded_async

    @functools.wraps(func)
    def guarded(**kwargs):
        return call_reward(func, phase, **{k: v for k, v in kwargs.items() if k not in hidden})

    return guarded
