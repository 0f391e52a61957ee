"""Which agent, agent-local rank and GPUs a process gets, decided from environment variables alone.

The CUDA driver reads ``CUDA_VISIBLE_DEVICES`` once, when it is first initialised in a process; a later rewrite is
ignored. Importing trl initialises CUDA when bitsandbytes is installed (trl -> transformers -> peft -> bitsandbytes,
whose import queries the GPU), and accelerate then maps every agent-local rank ``r`` to ``cuda:r % device_count``:
agent B's ranks would silently land on agent A's GPUs. So this module imports no torch and no library that does:
``hacpo-train`` calls :func:`place_process` before anything else, and :func:`hacpo_trl.run.topology.init_agent_worlds`
refuses to run on GPUs if CUDA was initialised before the placement (see ``cuda_initialised_before_placement``).

Global ranks go to agents in recipe order; launchers number ranks contiguously per node, so an agent spanning two
nodes gets different agent-local ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` and devices on each node.

With ``share_gpus`` (a recipe key) the agents time-share the node's GPUs on purpose: the node's ``i``-th process gets
GPU ``i mod (GPUs listed)``, so two one-process agents on one GPU both get it. An agent's own processes still get
one GPU each (their NCCL group refuses two ranks on one device).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from .resolve import ResolvedRecipe, resolve  # torch-free, like this module

__all__ = [
    "Placement",
    "allocator_expandable",
    "agent_slot",
    "compute_placement",
    "free_port",
    "launch_engine",
    "node_gpu_count",
    "place_process",
    "process_counts",
    "set_cuda_allocator",
    "share_gpus",
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
    shared: bool = False  # agents time-share GPUs (`share_gpus`)


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


def node_gpu_count(driver_dir: str = "/proc/driver/nvidia/gpus", nvidia_smi: str = "nvidia-smi") -> int | None:
    """The node's NVIDIA GPUs, from the driver's one folder per GPU, else ``nvidia-smi -L``: no CUDA call in this
    process, so its devices are not fixed yet. None where neither answers (no NVIDIA driver)."""
    import subprocess

    try:
        return len(os.listdir(driver_dir)) or None
    except OSError:
        pass
    try:
        listed = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(line.startswith("GPU ") for line in listed.splitlines()) or None


def compute_placement(
    counts: Sequence[int],
    environ: Mapping[str, str] = os.environ,
    share_gpus: bool = False,
    node_gpus: int | None = None,
) -> Placement:
    """This process's placement from the launcher's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``CUDA_VISIBLE_DEVICES``) and the agents' process counts. Pure: changes nothing.
    ``node_gpus``: the node's GPU count, used with ``share_gpus`` when ``CUDA_VISIBLE_DEVICES`` is unset (otherwise
    every process of the node is assumed to have a GPU of its own)."""
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
    if visible is None:
        listed = [str(i) for i in range(node_gpus if share_gpus and node_gpus else node_world)]
    else:
        listed = [d.strip() for d in visible.split(",") if d.strip()]
    if share_gpus and listed:
        devices = tuple(listed[i % len(listed)] for i in mine)
        devices = devices if len(set(devices)) == len(devices) else None  # an agent's own ranks on one GPU: refused
    else:
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
        shared=bool(share_gpus),
    )


_PLACED: tuple[Placement, bool] | None = None  # (placement, CUDA was already initialised when it was applied)


def _cuda_initialised() -> bool:
    """Whether torch's CUDA state exists in this process, without importing torch."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return bool(cuda is not None and cuda.is_initialized())


def place_process(counts: Sequence[int], share_gpus: bool = False) -> Placement:
    """Restrict ``CUDA_VISIBLE_DEVICES`` to this process's agent's devices on this node (once per process).

    Call before importing anything that may touch CUDA (trl, transformers, peft, bitsandbytes, vllm). Only the
    device list changes here; the rank variables are rewritten when the agent worlds are created.
    """
    global _PLACED
    counts = tuple(counts)
    if _PLACED is not None:
        if (_PLACED[0].counts, _PLACED[0].shared) != (counts, bool(share_gpus)):
            raise RuntimeError(
                f"this process was placed for agents of {list(_PLACED[0].counts)} processes with share_gpus "
                f"{_PLACED[0].shared}, not {list(counts)} with share_gpus {bool(share_gpus)}"
            )
        return _PLACED[0]
    node_gpus = node_gpu_count() if share_gpus and "CUDA_VISIBLE_DEVICES" not in os.environ else None
    placement = compute_placement(counts, share_gpus=share_gpus, node_gpus=node_gpus)
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
    try:
        return resolve(recipe).process_counts
    except (ValueError, TypeError):
        return None


def share_gpus(recipe: Mapping) -> bool:
    """The recipe's ``share_gpus`` (default false), checked: the one place this launch setting's value is validated,
    read by the placement before any ML library loads, by the config and by the plan (an agent that sets it for
    itself is refused where agents are read, `hacpo_trl.run.resolve`)."""
    value = recipe.get("share_gpus", False)
    if not isinstance(value, bool):
        raise ValueError(f"recipe key 'share_gpus' must be true or false, got {value!r}")
    return value


ALLOCATOR = "expandable_segments:True"


def allocator_expandable(
    recipe: Mapping, environ: Mapping[str, str] = os.environ, resolved: ResolvedRecipe | None = None
) -> bool:
    """Whether torch's CUDA allocator will use expandable segments in a launch of this recipe by `hacpo-train`
    (``resolved``: the recipe's agents, if known)."""
    chosen = environ.get("PYTORCH_CUDA_ALLOC_CONF", environ.get("PYTORCH_ALLOC_CONF"))
    if chosen is not None:
        return "expandable_segments:true" in chosen.replace(" ", "").lower()
    return set_cuda_allocator(recipe, {}, resolved) is not None


def set_cuda_allocator(
    recipe: Mapping, environ: MutableMapping[str, str] = os.environ, resolved: ResolvedRecipe | None = None
) -> str | None:
    """Give torch's CUDA allocator expandable segments unless the user chose its settings; returns a line saying so,
    or None when nothing was set. Must run before CUDA's first allocation. ``resolved``: the recipe's agents, if
    known (read here otherwise).

    Why: RL generation grows a KV cache of a new length at every batch, which fragments the default allocator's
    fixed segments. On one H200 a Qwen3-4B-shaped LoRA agent reserved 71.8 GiB for 15.7 GiB allocated by default,
    16.3 GiB with expandable segments. vLLM's sleep mode does not work with them (its memory pool), so a launch in
    which any agent colocates vLLM in sleep mode (the run's setting or the agent's own) is left alone."""
    if "PYTORCH_CUDA_ALLOC_CONF" in environ or "PYTORCH_ALLOC_CONF" in environ or recipe.get("use_cpu"):
        return None
    if _vllm_sleeps(recipe, resolved):
        return None
    environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATOR
    return (
        f"hacpo-train: PYTORCH_CUDA_ALLOC_CONF={ALLOCATOR} (RL's growing KV caches fragment the default allocator's "
        "memory several-fold; set PYTORCH_CUDA_ALLOC_CONF yourself to choose otherwise)"
    )


def _vllm_sleeps(recipe: Mapping, resolved: ResolvedRecipe | None) -> bool:
    """Whether any agent of the recipe generates with vLLM in sleep mode: both keys may be set per agent."""
    if resolved is None:
        try:
            resolved = resolve(recipe)
        except (ValueError, TypeError):  # agents the recipe check will refuse: the run's keys alone
            return bool(recipe.get("use_vllm") and recipe.get("vllm_enable_sleep_mode"))
    return any(a.get("use_vllm") and a.get("vllm_enable_sleep_mode") for a in resolved.agents)


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
