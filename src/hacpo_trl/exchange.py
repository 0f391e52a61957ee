"""What agents share each generation step, and the all-gather that shares it.

Only small CPU data travels: completion texts, rewards and per-sequence numbers. Each rank sends one columnar
:class:`RolloutBatch` and receives every rank's, in global-rank order, over the gloo exchange group of
:mod:`hacpo_trl.topology`.
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass, field

import torch

from .topology import AgentTopology

__all__ = ["ExchangeError", "Exchange", "RolloutBatch"]


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


class Exchange:
    """All-gather of picklable objects across every rank of every agent."""

    def __init__(self, topology: AgentTopology):
        self.topology = topology

    @property
    def world_size(self) -> int:
        return self.topology.global_world_size

    def all_gather(self, obj, what: str = "data") -> list:
        """Every rank's ``obj``, in global-rank order. Raises :class:`ExchangeError` on failure or timeout."""
        group = self.topology.exchange_group
        if group is None:
            return [obj]
        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        try:
            size = torch.tensor([payload.numel()], dtype=torch.int64)
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
            group.allgather([sizes], [size]).wait()
            longest = int(max(s.item() for s in sizes))
            padded = torch.zeros(longest, dtype=torch.uint8)
            padded[: payload.numel()] = payload
            out = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.world_size)]
            group.allgather([out], [padded]).wait()
        except Exception as exc:  # gloo raises RuntimeError / DistBackendError on a dead peer or timeout
            raise ExchangeError(
                f"{self.topology.describe_rank(self.topology.global_rank)}: exchanging {what} with the other agents "
                f"failed ({type(exc).__name__}: {exc}). Another agent has probably stopped or crashed; see its log. "
                f"(exchange_timeout={self.topology.timeout_seconds:g}s)"
            ) from exc
        return [pickle.loads(t[: int(s.item())].numpy().tobytes()) for t, s in zip(out, sizes, strict=True)]
