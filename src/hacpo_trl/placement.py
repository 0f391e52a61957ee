"""Which agent, agent-local rank and GPUs a process gets, decided from environment variables alone.

The CUDA driver reads ``CUDA_VISIBLE_DEVICES`` once, when it is first initialised in a process; a later rewrite is
ignored. Importing trl initialises CUDA when bitsandbytes is installed (trl -> transformers -> peft -> bitsandbytes,
whose import queries the GPU), and accelerate then maps every agent-local rank ``r`` to ``cuda:r % device_count``:
agent B's ranks would silently land on agent A's GPUs. So this module imports no torch and no library that does:
``hacpo-train`` calls :func:`place_process` before anything else, and :func:`hacpo_trl.topology.init_agent_worlds`
refuses to run on GPUs if CUDA was initialised before the placement (see ``cuda_initialised_before_placement``).

Global ranks go to agents in recipe order; launchers number ranks contiguously per node, so an agent spanning two
nodes gets different agent-local ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` and devices on each node.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "Placement",
    "agent_slot",
    "compute_placement",
    "free_port",
    "launch_engine",
    "place_process",
    "process_counts",
]


@dataclass(frozen=True)
class Placement:
    """Where one process of the launch sits, and what it may see of this node's GPUs."""

    counts: tuple[int, ...]  # processes per agent, in launch order
    agent_index: int
    agent_rank: int  # rank in the agent's own world
    agent_world_size: int
    global_rank: int
    world_size: int
    local_rank: int  # agent-local index among this agent's processes on this node
    local_world_size: int  # this agent's processes on this node
    devices: tuple[str, ...] | None  # this agent's entries of the node's CUDA_VISIBLE_DEVICES; None: too few listed
    node_devices: str | None  # CUDA_VISIBLE_DEVICES as the launcher set it (None: unset, every GPU of the node)


def agent_slot(process_counts: Sequence[int], global_rank: int) -> tuple[int, int]:
    """(agent index, first global rank of that agent) of a global rank: agents take ranks in order."""
    start = 0
    for index, count in enumerate(process_counts):
        if global_rank < start + count:
            return index, start
        start += count
    raise ValueError(f"global rank {global_rank} is outside the launch of {sum(process_counts)} processes")


def _env_int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = environ.get(name)
    if value in (None, ""):
        if default is None:
            raise ValueError(
                f"{name} is not set: launch with `accelerate launch` or `torchrun`, which set it (with another "
                f"launcher set RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE = processes on this node yourself)"
            )
        return default
    return int(value)


def compute_placement(counts: Sequence[int], environ: Mapping[str, str] = os.environ) -> Placement:
    """This process's placement from the launcher's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``CUDA_VISIBLE_DEVICES``) and the agents' process counts. Pure: changes nothing."""
    counts = tuple(counts)
    world_size = _env_int(environ, "WORLD_SIZE", 1)
    if sum(counts) != world_size:
        raise ValueError(f"agents' process counts {list(counts)} add up to {sum(counts)}, the launch has {world_size}")
    global_rank = _env_int(environ, "RANK", 0)
    index, start = agent_slot(counts, global_rank)
    count = counts[index]
    if world_size == 1:
        local_rank, node_world = 0, 1
    else:
        local_rank, node_world = _env_int(environ, "LOCAL_RANK"), _env_int(environ, "LOCAL_WORLD_SIZE")
    node_start = global_rank - local_rank
    # this node's launch-local ranks that belong to the agent
    mine = [r - node_start for r in range(node_start, node_start + node_world) if start <= r < start + count]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    # unset: every GPU of the node; "" hides them all (a CPU run), and stays so
    listed = (
        [str(i) for i in range(node_world)] if visible is None else [d.strip() for d in visible.split(",") if d.strip()]
    )
    devices = tuple(listed[i] for i in mine) if max(mine) < len(listed) else None
    return Placement(
        counts=counts,
        agent_index=index,
        agent_rank=global_rank - start,
        agent_world_size=count,
        global_rank=global_rank,
        world_size=world_size,
        local_rank=mine.index(local_rank),
        local_world_size=len(mine),
        devices=devices,
        node_devices=visible,
    )


_PLACED: tuple[Placement, bool] | None = None  # (placement, CUDA was already initialised when it was applied)


def _cuda_initialised() -> bool:
    """Whether torch's CUDA state exists in this process, without importing torch."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return bool(cuda is not None and cuda.is_initialized())


def place_process(counts: Sequence[int]) -> Placement:
    """Restrict ``CUDA_VISIBLE_DEVICES`` to this process's agent's devices on this node (once per process).

    Call before importing anything that may touch CUDA (trl, transformers, peft, bitsandbytes, vllm). Only the
    device list changes here; the rank variables are rewritten when the agent worlds are created.
    """
    global _PLACED
    counts = tuple(counts)
    if _PLACED is not None:
        if _PLACED[0].counts != counts:
            raise RuntimeError(
                f"this process was placed for agents of {list(_PLACED[0].counts)} processes, not {list(counts)}"
            )
        return _PLACED[0]
    placement = compute_placement(counts)
    if placement.world_size > 1 and placement.devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(placement.devices)
    _PLACED = (placement, _cuda_initialised())
    return placement


def cuda_initialised_before_placement() -> bool:
    """True if CUDA was initialised in this process before :func:`place_process` restricted its devices."""
    return _PLACED is not None and _PLACED[1]


def process_counts(recipe: Mapping) -> list[int] | None:
    """The agents' ``num_processes`` of a recipe mapping (default 1), or None if the recipe does not say clearly
    (the recipe check then reports what is wrong)."""
    agents = recipe.get("agents")
    if isinstance(agents, Mapping):
        agents = list(agents.values())
    if not isinstance(agents, list) or not agents:
        return None
    counts = []
    for agent in agents:
        count = (agent or {}).get("num_processes", 1) if agent is None or isinstance(agent, Mapping) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            return None
        counts.append(count)
    return counts


def free_port() -> int:
    """A local port nobody listens on now, for the rendezvous of a single-machine launch (the probe's, the benchmarks'
    and the tests'). Another process may take it before the launch binds it: callers that can retry do."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_engine(args) -> str | None:
    """The engine the launch shards with and keeps fp32 master weights in: "DeepSpeed" (ZeRO), "FSDP", or None,
    from the training arguments or the variables `accelerate launch` sets (read before TRL loads either)."""
    true = ("1", "true", "yes")
    if getattr(args, "deepspeed", None) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in true:
        return "DeepSpeed"
    if getattr(args, "fsdp", None) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in true:
        return "FSDP"
    return None
