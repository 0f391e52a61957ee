"""What agents share each generation step, and the all-gather that shares it.

Only small CPU data travels: completion texts, rewards and per-sequence numbers. Each rank sends one columnar
:class:`RolloutBatch` and receives every rank's, in global-rank order, over the gloo exchange group of
:mod:`hacpo_trl.run.topology`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import pickle
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch.distributed.distributed_c10d import AllgatherOptions

__all__ = [
    "PROMPT_ID_COLUMN",
    "ExchangeError",
    "Exchange",
    "ExchangeGroup",
    "RolloutBatch",
    "check_same_prompts",
    "end_startup",
    "rewards_by_agent",
    "with_prompt_ids",
]

PROMPT_ID_COLUMN = "hacpo_prompt_id"


class ExchangeError(RuntimeError):
    """A cross-agent exchange failed or timed out: another agent stopped or disagrees with this one."""


@dataclass
class RolloutBatch:
    """One rank's completions of one generation step, one entry per completion (columnar)."""

    agent: str
    global_rank: int
    step: int
    prompt_ids: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    old_mean_logps: list[float] = field(default_factory=list)  # generator's pre-update policy, own tokenization
    num_tokens: list[int] = field(default_factory=list)
    terminated: list[bool] = field(default_factory=list)  # ended with EOS (the text does not show it)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def validate(self) -> None:
        n = len(self.prompt_ids)
        columns = (self.texts, self.rewards, self.old_mean_logps, self.num_tokens, self.terminated)
        if any(len(c) != n for c in columns):
            raise ValueError(f"rollout batch of agent {self.agent!r} has columns of different lengths")

    def finite_mask(self) -> list[bool]:
        """Rows whose reward and old log-prob are finite (a NaN must never reach a peer's loss)."""
        return [math.isfinite(r) and math.isfinite(lp) for r, lp in zip(self.rewards, self.old_mean_logps, strict=True)]


def _prompt_id(example: dict, index: int) -> dict:
    digest = hashlib.sha1(json.dumps(example["prompt"], sort_keys=True, default=str).encode()).hexdigest()[:12]
    return {PROMPT_ID_COLUMN: f"{index}:{digest}"}


def with_prompt_ids(dataset):
    """Add a prompt id (row index + content hash) so agents can prove they train on the same prompts."""
    if dataset is None or PROMPT_ID_COLUMN in (dataset.column_names or []):
        return dataset
    return dataset.map(_prompt_id, with_indices=True)


def rewards_by_agent(records: list[RolloutBatch], agent_names: list[str]) -> dict[str, list[float]]:
    """Each agent's finite rewards of one step, over all its ranks' records ([0.0] for an agent with none)."""
    return {
        agent: [x for r in records if r.agent == agent for x in r.rewards if math.isfinite(x)] or [0.0]
        for agent in agent_names
    }


def check_same_prompts(records: list[RolloutBatch], agent: str, step: int) -> None:
    """Every agent's records of one step answer the same prompts (by id) as ``agent``'s: agents train in lockstep
    on the same data, or the joint groups would mix different questions."""
    steps = {r.step for r in records}
    if len(steps) > 1:
        raise ExchangeError(f"agents are at different steps {sorted(steps)}: every agent must train in lockstep")
    per_agent: dict[str, list[str]] = defaultdict(list)
    for r in records:
        per_agent[r.agent].extend(r.prompt_ids)
    reference = sorted(per_agent[agent])
    for other, ids in per_agent.items():
        if sorted(ids) != reference:
            missing = sorted(set(reference) - set(ids))[:3]
            extra = sorted(set(ids) - set(reference))[:3]
            raise ExchangeError(
                f"step {step}: agent {other!r} received different prompts than agent {agent!r} (missing {missing}, "
                f"unexpected {extra}). Every agent needs the same dataset, seed and generation batch size."
            )


_SEQUENCE = 0
_STARTING = True  # until the first training step is done: exchanges then also wait for downloads, vLLM start-up


def end_startup() -> None:
    """The first step is done: from now on an exchange waits at most ``exchange_timeout`` (the per-step bound)."""
    global _STARTING
    _STARTING = False


class ExchangeGroup(Protocol):
    """What an exchange needs of the launch: :class:`~hacpo_trl.run.topology.AgentTopology` has it (`topology` imports
    this module, never the reverse, not even for an annotation)."""

    exchange_group: object | None
    store: object | None
    global_rank: int
    global_world_size: int
    timeout_seconds: float
    startup_timeout_seconds: float | None

    def describe_rank(self, global_rank: int) -> str: ...

    def reported_failures(self, wait_seconds: float = 3.0) -> list[str]: ...


class Exchange:
    """All-gather of picklable objects across every rank of every agent."""

    def _mark_arrival(self, sequence: int) -> None:
        """Note on the launcher's store that this process reached exchange ``sequence`` (to name the absent)."""
        store, rank = self.topology.store, self.topology.global_rank
        if store is None:
            return
        try:
            store.set(f"arrived/{sequence}/{rank}", "1")
            if sequence > 2:
                store.delete_key(f"arrived/{sequence - 2}/{rank}")
        except Exception:  # noqa: BLE001 - bookkeeping only; the collective itself reports real failures
            pass

    def _absent(self, sequence: int) -> list[str]:
        store = self.topology.store
        try:
            return [
                self.topology.describe_rank(r)
                for r in range(self.world_size)
                if not store.check([f"arrived/{sequence}/{r}"])
            ]
        except Exception:  # noqa: BLE001
            return []

    def __init__(self, topology: ExchangeGroup):
        self.topology = topology
        self.last_bytes = 0
        self.last_wait = 0.0  # seconds waiting for the slowest process to arrive (idle, not exchange cost)
        self.last_transfer = 0.0  # seconds moving the data once everyone is there
        self.last_seconds = 0.0  # the whole last call, as its caller would time it

    @property
    def world_size(self) -> int:
        return self.topology.global_world_size

    def _timeout(self) -> tuple[str, float]:
        """(setting, seconds) bounding the next exchange: the wait for the slowest process to arrive."""
        startup = self.topology.startup_timeout_seconds
        if _STARTING and startup is not None and startup > self.topology.timeout_seconds:
            return "exchange_startup_timeout", startup
        return "exchange_timeout", self.topology.timeout_seconds

    def all_gather(self, obj, what: str = "data") -> list:
        """Every rank's ``obj``, in global-rank order. Raises :class:`ExchangeError` on failure or timeout."""
        entered, group = time.perf_counter(), self.topology.exchange_group
        if group is None:
            self.last_seconds = time.perf_counter() - entered
            return [obj]
        global _SEQUENCE
        # every process makes the same exchanges in the same order, so this count names the exchange alike on all
        _SEQUENCE += 1
        sequence = _SEQUENCE
        self._mark_arrival(sequence)
        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        setting, seconds = self._timeout()
        options = AllgatherOptions()
        options.timeout = datetime.timedelta(seconds=seconds)
        try:
            size = torch.tensor([payload.numel()], dtype=torch.int64)
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
            started = time.perf_counter()
            group.allgather([sizes], [size], options).wait()  # also the point where every process has arrived
            arrived = time.perf_counter()
            longest = int(max(s.item() for s in sizes))
            padded = torch.zeros(longest, dtype=torch.uint8)
            padded[: payload.numel()] = payload
            out = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.world_size)]
            group.allgather([out], [padded], options).wait()
            self.last_wait, self.last_transfer = arrived - started, time.perf_counter() - arrived
        except Exception as exc:  # gloo raises RuntimeError / DistBackendError on a dead peer or timeout
            me = self.topology.describe_rank(self.topology.global_rank)
            failures = self.topology.reported_failures()
            absent = self._absent(sequence)
            if failures:
                cause = "; ".join(failures)
            elif absent:
                cause = f"{', '.join(absent)} never reached this exchange (stuck, or killed)"
            else:
                cause = "no other process reported an error: one was killed or ran out of memory"
            cause += f" ({setting}={seconds:g}s)"
            raise ExchangeError(
                f"{me}: exchanging {what} with the other agents failed ({type(exc).__name__}). Cause: {cause}"
            ) from exc
        self.last_bytes = int(sum(s.item() for s in sizes))  # payload this process received, all ranks included
        gathered = [pickle.loads(t[: int(s.item())].numpy().tobytes()) for t, s in zip(out, sizes, strict=True)]
        self.last_seconds = time.perf_counter() - entered
        return gathered
