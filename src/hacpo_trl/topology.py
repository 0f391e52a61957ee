"""One launch, one accelerate world per agent, plus a cross-agent exchange group.

``accelerate launch --num_processes P`` (or ``torchrun``) starts P ranks in one world. If they stayed in it,
DDP would refuse heterogeneous models (and silently average gradients across same-architecture agents), and
every TRL gather, sampler shard, save gate and the vLLM path would treat all agents as one model. So, before any
``Accelerator`` (or ``TrainingArguments``) exists, each rank:

1. finds its agent from the recipe's process counts (global ranks are given to agents in order);
2. initialises torch's *default* process group as the agent's own world, on the launcher's store under an agent
   prefix; accelerate, DDP, ZeRO/FSDP, vLLM colocate, saving and logging then see only that agent, unchanged;
3. rewrites ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` to agent-local values (accelerate reads
   them) and ``CUDA_VISIBLE_DEVICES`` to the agent's devices on this node, so agents never share a GPU;
4. joins a gloo *exchange group* over all ranks of all agents (only texts and per-sequence numbers travel).

Reusing the launcher's own store (``TORCHELASTIC_USE_AGENT_STORE``) avoids the hang where ranks wait as clients
on a port nobody hosts, needs no extra port, and works across nodes since every rank can reach it.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["AgentTopology", "current_topology", "exit_process", "init_agent_worlds"]

_TOPOLOGY: AgentTopology | None = None


@dataclass(frozen=True)
class AgentTopology:
    """Where this process sits: its agent, its rank in the agent's world and in the whole launch."""

    agents: tuple[str, ...]
    process_counts: tuple[int, ...]
    agent: str
    agent_index: int
    agent_rank: int
    agent_world_size: int
    global_rank: int
    global_world_size: int
    exchange_group: object | None  # ProcessGroupGloo over the whole launch, None for a single process
    timeout_seconds: float
    store: object | None = None  # the launcher's store (prefixed), where failures are reported

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(a for a in self.agents if a != self.agent)

    def agent_of_rank(self, global_rank: int) -> str:
        return self.agents[_slot(self.process_counts, global_rank)[0]]

    def describe_rank(self, global_rank: int) -> str:
        index, start = _slot(self.process_counts, global_rank)
        return f"agent {self.agents[index]!r} (its rank {global_rank - start}, global rank {global_rank})"

    def report_failure(self, message: str) -> None:
        """Tell every other process why this one is stopping (best effort: the store may be gone)."""
        if self.store is None:
            return
        try:
            self.store.set(f"failed/{self.global_rank}", f"{self.describe_rank(self.global_rank)} failed: {message}")
        except Exception:  # noqa: BLE001 - nothing more can be done while failing
            pass

    def reported_failures(self, wait_seconds: float = 3.0) -> list[str]:
        """Failures other processes reported, waiting up to ``wait_seconds`` for a first one to arrive."""
        if self.store is None:
            return []
        import time

        keys = [f"failed/{r}" for r in range(self.global_world_size) if r != self.global_rank]
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                found = [k for k in keys if self.store.check([k])]
                if found or time.monotonic() >= deadline:
                    return [self.store.get(k).decode(errors="replace") for k in found]
            except Exception:  # noqa: BLE001 - the store itself may have died with the launcher
                return []
            time.sleep(0.2)

    def shutdown(self) -> None:
        """Leave cleanly: wait until every process is done with the exchange group, then tear the worlds down."""
        global _TOPOLOGY
        if self.exchange_group is not None:
            from .exchange import Exchange

            Exchange(self).all_gather(None, what="shutdown")
        if dist.is_initialized():
            dist.destroy_process_group()
        _TOPOLOGY = None


def exit_process(code: int = 0) -> None:
    """End a finished process without the interpreter's teardown.

    Everything is saved and reported by now (call after :meth:`AgentTopology.shutdown`). Tearing down live gloo
    connections while the other processes exit at their own pace occasionally aborted a process (SIGABRT) after
    a complete run in our tests; this flushes what needs flushing and leaves at once.
    """
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _slot(process_counts: Sequence[int], global_rank: int) -> tuple[int, int]:
    """(agent index, first global rank of that agent) of a global rank: agents take ranks in order."""
    start = 0
    for index, count in enumerate(process_counts):
        if global_rank < start + count:
            return index, start
        start += count
    raise ValueError(f"global rank {global_rank} is outside the launch of {sum(process_counts)} processes")


def current_topology() -> AgentTopology | None:
    """The topology set up by :func:`init_agent_worlds` in this process, if any."""
    return _TOPOLOGY


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def _launcher_store(global_rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port_text = os.environ.get("MASTER_PORT")
    if not port_text:
        raise RuntimeError(
            f"WORLD_SIZE={world_size} but MASTER_PORT is not set: launch with `accelerate launch` or `torchrun`"
        )
    port = int(port_text)
    use_agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    if use_agent_store:
        # torchrun's elastic agent hosts this store; workers are clients of it.
        store = dist.TCPStore(addr, port, world_size, is_master=False, timeout=timeout)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"/hacpo/attempt_{attempt}", store)
    store = dist.TCPStore(addr, port, world_size, is_master=global_rank == 0, timeout=timeout, wait_for_workers=False)
    return dist.PrefixStore("/hacpo", store)


def _local_ranks_on_node(global_rank: int, agent_start: int, agent_count: int) -> list[int]:
    """This node's original local ranks that belong to the agent (torchrun numbers ranks contiguously per node)."""
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", 1)
    node_start = global_rank - local_rank
    return [
        r - node_start
        for r in range(node_start, node_start + local_world)
        if agent_start <= r < agent_start + agent_count
    ]


def _restrict_cuda_devices(local_ranks: list[int]) -> None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(max(local_ranks) + 1)]
    if max(local_ranks) < len(devices):
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices[i] for i in local_ranks)


def init_agent_worlds(
    agents: Sequence[tuple[str, int]],
    *,
    timeout_seconds: float = 300.0,
    backend: str | None = None,
) -> AgentTopology:
    """Split the launch into one torch world per agent plus an exchange group; call before any accelerate state.

    Args:
        agents: ``(name, num_processes)`` per agent, in order; their counts must add up to the launch's
            ``WORLD_SIZE``. Global ranks ``0..n0-1`` are the first agent, and so on.
        timeout_seconds: bound on every collective of the exchange group and of the agent worlds' setup, so
            that a dead agent makes the others fail instead of waiting forever.
        backend: backend of each agent's world; default ``nccl`` when CUDA is available, else ``gloo``.

    Idempotent for the same ``agents`` (a single process, which has no process groups, may switch); returns the
    topology.
    """
    global _TOPOLOGY
    names = [a for a, _ in agents]
    counts = [c for _, c in agents]
    if _TOPOLOGY is not None and _TOPOLOGY.global_world_size > 1:
        if list(_TOPOLOGY.agents) != names or list(_TOPOLOGY.process_counts) != counts:
            raise RuntimeError(
                f"agent worlds were already set up for {list(zip(_TOPOLOGY.agents, _TOPOLOGY.process_counts, strict=True))}; "
                f"cannot switch to {list(agents)} in the same process"
            )
        return _TOPOLOGY
    if not names:
        raise ValueError("`agents` must name at least one agent")
    if len(set(names)) != len(names):
        raise ValueError(f"agent names must be unique, got {names}")
    if any(not isinstance(c, int) or c < 1 for c in counts):
        raise ValueError(f"every agent needs num_processes >= 1, got {dict(agents)}")

    world_size = _env_int("WORLD_SIZE", 1)
    global_rank = _env_int("RANK", 0)
    total = sum(counts)
    if total != world_size:
        detail = ", ".join(f"{n}: {c}" for n, c in agents)
        hint = (
            "launch with `accelerate launch --multi_gpu --num_processes {0}` (or `torchrun --nproc_per_node {0}`)"
            if world_size == 1
            else "set each agent's `num_processes` so that they add up to the launch"
        ).format(total)
        raise ValueError(
            f"agents' `num_processes` add up to {total} ({detail}) but the launch has {world_size} process(es): {hint}"
        )
    timeout = datetime.timedelta(seconds=timeout_seconds)

    index, start = _slot(counts, global_rank)
    name, count = names[index], counts[index]
    agent_rank = global_rank - start

    if world_size == 1:
        _TOPOLOGY = AgentTopology(tuple(names), tuple(counts), name, 0, 0, 1, 0, 1, None, timeout_seconds)
        return _TOPOLOGY

    if dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is already initialised: HACPO must split the launch into agent worlds before any "
            "accelerate state exists. Create the HACPOConfig (or call init_agent_worlds) before anything else that "
            "touches accelerate (TrainingArguments, Accelerator, PartialState)."
        )
    base = _launcher_store(global_rank, world_size, timeout)
    exchange = dist.ProcessGroupGloo(dist.PrefixStore("exchange", base), global_rank, world_size, timeout)

    node_local = _local_ranks_on_node(global_rank, start, count)
    original_local_rank = _env_int("LOCAL_RANK", 0)
    os.environ.update(
        {
            "RANK": str(agent_rank),
            "WORLD_SIZE": str(count),
            "LOCAL_RANK": str(node_local.index(original_local_rank)),
            "LOCAL_WORLD_SIZE": str(len(node_local)),
            "HACPO_AGENT": name,
            "HACPO_GLOBAL_RANK": str(global_rank),
        }
    )
    _restrict_cuda_devices(node_local)
    _report_uncaught_exceptions()
    if backend is None:
        backend = (
            "nccl"
            if torch.cuda.is_available() and os.environ.get("ACCELERATE_USE_CPU", "").lower() != "true"
            else "gloo"
        )
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore(f"agent/{name}", base),
        rank=agent_rank,
        world_size=count,
        timeout=timeout,
    )
    _TOPOLOGY = AgentTopology(
        tuple(names),
        tuple(counts),
        name,
        index,
        agent_rank,
        count,
        global_rank,
        world_size,
        exchange,
        timeout_seconds,
        store=base,
    )
    return _TOPOLOGY


def _report_uncaught_exceptions() -> None:
    """Make a failing process tell the others why, and make every process say why it stops.

    An uncaught exception is written to the launcher's store (so the other agents name it in their errors) and
    summarised in one line; when the launcher terminates the remaining processes after a failure, each prints which
    process failed and why before it exits.
    """
    previous = sys.excepthook

    def hook(kind, value, traceback):
        if _TOPOLOGY is not None and not issubclass(kind, KeyboardInterrupt):
            _TOPOLOGY.report_failure(f"{kind.__name__}: {value}")
            me = _TOPOLOGY.describe_rank(_TOPOLOGY.global_rank)
            print(f"hacpo: {me} failed: {kind.__name__}: {value}", file=sys.stderr, flush=True)
        previous(kind, value, traceback)

    def on_terminate(signum, frame):
        if _TOPOLOGY is not None:
            me = _TOPOLOGY.describe_rank(_TOPOLOGY.global_rank)
            causes = "; ".join(_TOPOLOGY.reported_failures(wait_seconds=1.0)) or "no process reported an error"
            print(f"hacpo: {me} stopped by the launcher. Cause: {causes}", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    sys.excepthook = hook
    signal.signal(signal.SIGTERM, on_terminate)
