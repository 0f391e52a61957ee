"""How long each agent takes per generation batch, who waits for whom, and the split of processes that waits least.

Agents exchange rollouts once per generation batch, so every agent runs at the pace of the slowest: an agent that
finishes its generation batch early idles until the others reach the exchange. Every agent generates the same number
of completions (``generation_batch_size`` is shared) and trains on the same rows (its own and every peer's), so the
work differs between agents mainly by model size. The cost model, per generation batch and agent, in FLOPs
(``N`` parameters, ``T`` tokens per row = ``prompt_tokens`` + ``completion_tokens``, ``G`` completions per agent,
``k`` agents sharing):

* generation: 2·N per completion token, ``G`` completions (vLLM's decode is memory-bound, so this underweights it
  alike for every agent);
* old log-probs: 2·N·T over the own ``G`` rows (TRL's or HACPO's, one of them always runs);
* reference log-probs (``beta > 0``): 2·N·T over the own rows;
* peer scoring (sharing, ``skip_clipped_peer_backward``): 2·N·T over the ``(k - 1)·G`` peer rows;
* training: 6·N·T (8·N·T with activation checkpointing: the forward runs twice) over ``k·G`` rows, times
  ``num_iterations``.

Attention's own FLOPs and communication are left out. An agent on ``n`` processes takes cost / n; its predicted idle
share is 1 - (its time ÷ the slowest agent's time). A split is usable only if every agent's generation batch divides
into its processes' micro-batches: ``generation_batch_size = per_device_train_batch_size × n × steps_per_generation``
with an integer ``per_device_train_batch_size`` per agent (``steps_per_generation`` is shared).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..sharing.presets import expand_sharing

__all__ = ["Balance", "agent_flops", "best_split", "divisible", "idle_shares", "nearest_batch", "report", "step_times"]


def agent_flops(
    params: float,
    completions: int,
    prompt_tokens: float,
    completion_tokens: float,
    n_agents: int,
    sharing: bool = True,
    beta: float = 0.0,
    peer_scoring: bool = True,
    activation_checkpointing: bool = False,
    num_iterations: int = 1,
) -> dict[str, float]:
    """FLOPs of one agent's generation batch, by part (the model above)."""
    k = n_agents if sharing else 1
    row = prompt_tokens + completion_tokens
    return {
        "generate": 2 * params * completions * completion_tokens,
        "old_logps": 2 * params * completions * row,
        "ref_logps": 2 * params * completions * row if beta > 0 else 0.0,
        "peer_scoring": 2 * params * (k - 1) * completions * row if sharing and peer_scoring else 0.0,
        "train": (8 if activation_checkpointing else 6) * params * k * completions * row * num_iterations,
    }


def step_times(costs: dict[str, float], split: dict[str, int]) -> dict[str, float]:
    """Each agent's time per generation batch, in cost units per process: cost / processes."""
    return {name: costs[name] / split[name] for name in costs}


def idle_shares(times: dict[str, float]) -> dict[str, float]:
    """Share of each agent's wall time spent waiting for the slowest agent at the exchange."""
    slowest = max(times.values())
    return {name: 1 - t / slowest for name, t in times.items()}


def divisible(split: dict[str, int], generation_batch_size: int, steps_per_generation: int) -> bool:
    """Whether every agent gets an integer ``per_device_train_batch_size`` with this split."""
    return all(generation_batch_size % (n * steps_per_generation) == 0 for n in split.values())


@dataclass
class Balance:
    split: dict[str, int]
    times: dict[str, float]
    idle: dict[str, float]
    per_device_train_batch_size: dict[str, int] | None  # None when the split does not divide the batch


def _balance(costs, split, generation_batch_size, steps_per_generation) -> Balance:
    times = step_times(costs, split)
    ok = divisible(split, generation_batch_size, steps_per_generation)
    per_device = {a: generation_batch_size // (n * steps_per_generation) for a, n in split.items()} if ok else None
    return Balance(split, times, idle_shares(times), per_device)


def best_split(
    costs: dict[str, float],
    total: int,
    generation_batch_size: int | None = None,
    steps_per_generation: int | None = None,
) -> Balance | None:
    """The split of ``total`` processes (at least one per agent, agents in the given order) with the smallest
    slowest-agent time; with a batch given, only splits that divide it (None if none does). Ties: the split with
    the least total idle, then the first in order."""
    names = list(costs)
    best = None
    for cut in itertools.combinations(range(1, total), len(names) - 1):
        sizes = [b - a for a, b in zip((0, *cut), (*cut, total), strict=True)]
        split = dict(zip(names, sizes, strict=True))
        if generation_batch_size is not None and not divisible(split, generation_batch_size, steps_per_generation):
            continue
        times = step_times(costs, split)
        key = (max(times.values()), sum(idle_shares(times).values()))
        if best is None or key < best[0]:
            best = (key, split)
    if best is None:
        return None
    if generation_batch_size is None:
        times = step_times(costs, best[1])
        return Balance(best[1], times, idle_shares(times), None)
    return _balance(costs, best[1], generation_batch_size, steps_per_generation)


def nearest_batch(
    split: dict[str, int],
    generation_batch_size: int,
    steps_per_generation: int,
    num_generations: int,
    gradient_accumulation_steps: int,
) -> tuple[int, int]:
    """The ``(generation_batch_size, steps_per_generation)`` nearest to the given ones that ``split`` divides:
    steps_per_generation a multiple of gradient_accumulation_steps (every update stays inside a generation batch),
    the batch a multiple of steps_per_generation × every agent's processes and of ``num_generations``. Nearest: the
    smallest change of the batch, then of steps_per_generation, then the smaller batch."""
    best = None
    lcm = math.lcm(*split.values())
    for steps in range(gradient_accumulation_steps, 2 * generation_batch_size + 1, gradient_accumulation_steps):
        unit = math.lcm(steps * lcm, num_generations)
        for batch in (unit * max(1, generation_batch_size // unit), unit * (generation_batch_size // unit + 1)):
            key = (abs(batch - generation_batch_size), abs(steps - steps_per_generation), batch)
            if best is None or key < best[0]:
                best = (key, (batch, steps))
    return best[1]


def report(recipe: dict, agents: list[tuple[str, int, int]], prompt_tokens: float = 256.0) -> list[str]:
    """The plan's lines about balance: ``agents`` is ``(name, parameters, processes)`` in launch order; settings
    not in ``recipe`` take HACPOConfig's defaults. Completions are taken at half ``max_completion_length``."""
    get = recipe.get
    n_agents, total = len(agents), sum(n for _, _, n in agents)
    completions = int(get("generation_batch_size") or 0) or None
    spg, ga = (
        int(get("steps_per_generation") or get("gradient_accumulation_steps", 1)),
        int(get("gradient_accumulation_steps", 1)),
    )
    if completions is None:  # TRL: per_device_train_batch_size x processes x steps_per_generation, the same for all
        completions = int(get("per_device_train_batch_size", 8)) * agents[0][2] * spg
    completion_tokens = int(get("max_completion_length", 256)) / 2
    sharing = bool(expand_sharing(recipe)["share_rollouts"]) and n_agents > 1  # the sharing mode's, if left out
    costs = {
        name: sum(
            agent_flops(
                params, completions, prompt_tokens, completion_tokens, n_agents,
                sharing=sharing, beta=float(get("beta", 0.0) or 0.0),
                peer_scoring=bool(get("skip_clipped_peer_backward", True)),
                activation_checkpointing=bool(get("activation_checkpointing") or get("gradient_checkpointing")),
                num_iterations=int(get("num_iterations", 1)),
            ).values()
        )
        for name, params, _ in agents
    }  # fmt: skip
    split = {name: n for name, _, n in agents}
    now = _balance(costs, split, completions, spg)
    lines = [
        "balance (who waits at the exchange; FLOPs per generation batch: generation 2N per completion token, "
        f"old/reference log-probs and peer scoring 2N per token, training 6N (8N with activation checkpointing); "
        f"rows of {prompt_tokens:.0f} prompt + {completion_tokens:.0f} completion tokens, the same for every agent):",
    ]
    for name, _, n in agents:
        lines.append(
            f"  {name}: {_flops_text(costs[name])} on {n} process(es): predicted idle {now.idle[name]:.0%} "
            "of its time (waiting for peers)"
        )
    best = best_split(costs, total, completions, spg)
    ideal = best_split(costs, total)
    if best is not None and best.split != split:
        lines.append(
            f"  suggested split of the {total} processes: {_split_text(best)} (time per completion "
            f"{max(best.times.values()) / max(now.times.values()):.0%} of now; idle {_idle_text(best)}); "
            f"per_device_train_batch_size {_per_device_text(best)}"
        )
    elif completions % int(get("num_generations", 8)):
        lines.append(
            f"  no split judged: {completions} completions are not whole prompt groups of {get('num_generations', 8)}"
            " (fix the PROBLEM above first)"
        )
    else:
        lines.append(f"  the current split is the best one this generation batch divides ({completions} completions)")
    if ideal.split != (best.split if best else None):
        batch, steps = nearest_batch(ideal.split, completions, spg, int(get("num_generations", 8)), ga)
        fitted = _balance(costs, ideal.split, batch, steps)
        lines.append(
            f"  with generation_batch_size {batch} and steps_per_generation {steps}, the split {_split_text(fitted)} "
            f"divides the batch: time per completion {max(fitted.times.values()) / max(now.times.values()):.0%} of "
            f"now, idle {_idle_text(fitted)}; per_device_train_batch_size {_per_device_text(fitted)}"
            + _updates_text(steps, spg, ga)
        )
    return lines


def _updates_text(steps: int, spg: int, ga: int) -> str:
    """Keeping the recipe's optimizer updates per generation batch with the new steps_per_generation."""
    updates = spg // ga
    if steps // ga == updates or steps % updates:
        return ""
    return f" (and gradient_accumulation_steps {steps // updates} to keep {updates} updates per generation batch)"


def _flops_text(flops: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if flops >= scale:
            return f"{flops / scale:.1f} {unit}"
    return f"{flops / 1e6:.1f} MFLOP"


def _split_text(b: Balance) -> str:
    return " + ".join(f"{n} for {name}" for name, n in b.split.items())


def _idle_text(b: Balance) -> str:
    return ", ".join(f"{name} {share:.0%}" for name, share in b.idle.items())


def _per_device_text(b: Balance) -> str:
    return ", ".join(f"{name} {n}" for name, n in (b.per_device_train_batch_size or {}).items())
