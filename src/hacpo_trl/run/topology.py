"""One launch, one accelerate world per agent, plus a cross-agent exchange group.

``accelerate launch --num_processes P`` (or ``torchrun``) starts P ranks in one world. If they stayed in it,
DDP would refuse heterogeneous models (and silently average gradients across same-architecture agents), and
every TRL gather, sampler shard, save gate and the vLLM path would treat all agents as one model. So, before any
``Accelerator`` (or ``TrainingArguments``) exists, each rank:

1. finds its agent from the recipe's process counts (global ranks are given to agents in order) and restricts
   ``CUDA_VISIBLE_DEVICES`` to the agent's devices on this node (:mod:`hacpo_trl.run.placement`, torch-free, which
   ``hacpo-train`` runs before importing trl, as CUDA ignores later rewrites);
2. initialises torch's *default* process group as the agent's own world, on the launcher's store under an agent
   prefix, with the backend and timeout accelerate would use (``ddp_backend`` or ``cuda:nccl,cpu:gloo`` on GPUs,
   ``ddp_timeout``); accelerate, DDP, ZeRO/FSDP, vLLM colocate, saving and logging then see only that agent;
3. rewrites ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` to agent-local values (accelerate reads
   them);
4. joins a gloo *exchange group* over all ranks of all agents (only texts and per-sequence numbers travel), and
   checks over it that no two processes of the launch use the same GPU (device UUIDs).

Reusing the launcher's own store (``TORCHELASTIC_USE_AGENT_STORE``) avoids the hang where ranks wait as clients
on a port nobody hosts and needs no extra *rendezvous* port. The store only brokers addresses: gloo (the exchange
group, and CPU agent worlds) and NCCL then connect every pair of ranks directly on ephemeral ports, so on several
nodes those ports must be open between the nodes, and ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` must name
the interface the nodes reach each other on when the hostname resolves to another one (e.g. ``127.0.1.1``).
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

from .exchange import Exchange
from .last_line import OneLineError, repeat_after_launcher
from .placement import agent_slot, cuda_initialised_before_placement, place_process

__all__ = ["AgentTopology", "at_exit", "current_topology", "exit_process", "init_agent_worlds"]

_TOPOLOGY: AgentTopology | None = None
ANNOUNCE_SECONDS = 60.0  # how long a failing process waits for the others to print its failure (see below)


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
    timeout_seconds: float  # bound on an exchange once training runs (exchange_timeout)
    store: object | None = None  # the launcher's store (prefixed), where failures are reported
    startup_timeout_seconds: float | None = None  # bound on the exchanges up to the first step (None: as above)
    device: str | None = None  # "<host> cuda:<i> <uuid>" of this process's GPU, None on CPU

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(a for a in self.agents if a != self.agent)

    def agent_of_rank(self, global_rank: int) -> str:
        return self.agents[agent_slot(self.process_counts, global_rank)[0]]

    def describe_rank(self, global_rank: int) -> str:
        index, start = agent_slot(self.process_counts, global_rank)
        return f"agent {self.agents[index]!r} (its rank {global_rank - start}, global rank {global_rank})"

    def report_failure(self, message: str) -> bool:
        """Tell every other process why this one is stopping (best effort: the store may be gone); whether this is
        the launch's first failure (True without a store)."""
        if self.store is None:
            return True
        try:
            self.store.set(f"failed/{self.global_rank}", f"{self.describe_rank(self.global_rank)} failed: {message}")
            return self.store.add("failures", 1) == 1  # what the other processes' watchers poll
        except Exception:  # noqa: BLE001 - nothing more can be done while failing
            return False

    def wait_until_announced(self, wait_seconds: float = ANNOUNCE_SECONDS) -> None:
        """After :meth:`report_failure`: wait (at most ``wait_seconds``) until every other process that has not
        failed itself has printed this failure. This process's exit is what makes the launcher stop the others, so
        leaving first would race their message (the launcher may stop them before they print it)."""
        if self.store is None:
            return
        import time

        others = [r for r in range(self.global_world_size) if r != self.global_rank]
        deadline = time.monotonic() + wait_seconds
        try:
            while time.monotonic() < deadline:
                waiting = [
                    r
                    for r in others
                    if not self.store.check([f"announced/{self.global_rank}/{r}"])
                    and not self.store.check([f"failed/{r}"])
                ]
                if not waiting:
                    return
                time.sleep(0.1)
        except Exception:  # noqa: BLE001 - the store went away with the launcher: nobody is left to wait for
            return

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
            Exchange(self).all_gather(None, what="shutdown")
        if dist.is_initialized():
            dist.destroy_process_group()
        _TOPOLOGY = None


_EXIT_HOOKS: list = []


def at_exit(hook) -> None:
    """Run ``hook()`` in :func:`exit_process`, which skips ``atexit`` (e.g. TRL's vLLM ``close_communicator``)."""
    _EXIT_HOOKS.append(hook)


def exit_process(code: int = 0) -> None:
    """End a finished process without the interpreter's teardown.

    Everything is saved and reported by now (call after :meth:`AgentTopology.shutdown`). Tearing down live gloo
    connections while the other processes exit at their own pace occasionally aborted a process (SIGABRT) after
    a complete run in our tests; this runs the hooks of :func:`at_exit` (which ``os._exit`` would skip, as it skips
    ``atexit``), flushes what needs flushing and leaves at once.
    """
    while _EXIT_HOOKS:
        hook = _EXIT_HOOKS.pop()
        try:
            hook()
        except Exception as exc:  # noqa: BLE001 - the run is over; say what failed and still exit
            print(f"hacpo: clean-up {getattr(hook, '__qualname__', hook)} failed: {exc!r}", file=sys.stderr)
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def current_topology() -> AgentTopology | None:
    """The topology set up by :func:`init_agent_worlds` in this process, if any."""
    return _TOPOLOGY


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def _launcher_store(global_rank: int, world_size: int, timeout: datetime.timedelta, client: bool = False) -> dist.Store:
    """The launcher's store under this launch's prefix; ``client=True``: always a new client connection to it."""
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
    master = global_rank == 0 and not client
    store = dist.TCPStore(addr, port, world_size, is_master=master, timeout=timeout, wait_for_workers=False)
    return dist.PrefixStore("/hacpo", store)


def _uses_cuda(use_cpu: bool) -> bool:
    """Whether this process will train on a GPU (as accelerate decides; after the device list is restricted)."""
    if use_cpu or os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true":
        return False
    return torch.cuda.is_available()


def _check_devices_before_use(placement, agent: str) -> None:
    """Refuse, on GPUs, what would make accelerate's ``cuda:LOCAL_RANK % device_count`` put two ranks on one GPU.

    ``torch.cuda.is_initialized()`` misses one early initialisation: ``torch.cuda.is_available()`` alone runs the
    driver's ``cuInit`` (fixing the visible devices) without marking torch's state. :func:`check_distinct_devices`
    catches what that case leads to, two processes on one GPU, by UUID.
    """
    me = f"agent {agent!r} (its rank {placement.agent_rank}, global rank {placement.global_rank})"
    if cuda_initialised_before_placement():
        raise RuntimeError(
            f"{me}: CUDA was initialised before HACPO restricted CUDA_VISIBLE_DEVICES to this agent's GPUs, so the "
            "restriction would be ignored and agents would share GPUs. Something imported before the agent worlds "
            "were set up touched CUDA (trl -> transformers -> peft imports bitsandbytes, which does, when it is "
            "installed). Use `hacpo-train`, or call `hacpo_trl.run.placement.place_process([n_agent_0, n_agent_1, ...])` "
            "at the very top of your script, before importing trl, transformers, peft or vllm."
        )
    visible = torch.cuda.device_count()
    if placement.devices is None or visible < placement.local_world_size:
        listed = placement.node_devices if placement.node_devices is not None else "unset (every GPU of the node)"
        raise RuntimeError(
            f"{me}: this agent has {placement.local_world_size} process(es) on this node but "
            f"{visible if placement.devices is not None else 'not enough'} GPU(s) are visible to it "
            f"(CUDA_VISIBLE_DEVICES {listed}): every process needs its own GPU. Launch fewer processes per node or "
            "make more GPUs visible"
            + (
                " (share_gpus lets agents share GPUs, but an agent's own processes each need their own)."
                if placement.shared
                else ", or set `share_gpus: true` in the recipe to let agents time-share GPUs on purpose."
            )
        )


def _device_identity(local_rank: int) -> str | None:
    """The GPU accelerate will give this process (``cuda:LOCAL_RANK % device_count``), by UUID; None on CPU."""
    import socket

    index = local_rank % torch.cuda.device_count()
    return f"{socket.gethostname()} cuda:{index} {torch.cuda.get_device_properties(index).uuid}"


def check_distinct_devices(topology: AgentTopology, share_gpus: bool = False) -> None:
    """Over the exchange group: no two processes of the launch on one physical GPU (with ``share_gpus``: no two of
    one agent), and no agent silently on CPU while others use GPUs (e.g. an agent whose device list named GPUs the
    node does not have)."""
    everyone = Exchange(topology).all_gather(topology.device, what="device check")
    owners: dict[tuple[str, str], int] = {}
    for rank, device in enumerate(everyone):
        if device is None:
            continue
        key = (topology.agent_of_rank(rank) if share_gpus else "", device.rsplit(" ", 1)[-1])
        if key in owners:
            first = owners[key]
            hint = (
                "An agent's own processes each need their own GPU, also with share_gpus"
                if share_gpus
                else "Each process needs its own (or set `share_gpus: true` to let agents time-share GPUs on purpose)"
            )
            raise RuntimeError(
                f"{topology.describe_rank(first)} ({everyone[first]}) and {topology.describe_rank(rank)} ({device}) "
                f"use the same GPU. {hint}: check CUDA_VISIBLE_DEVICES and the scheduler's GPU binding (HACPO gives "
                "each agent its own slice of the GPUs the launcher shows on each node)."
            )
        owners[key] = rank
    on_cpu = [topology.describe_rank(r) for r, d in enumerate(everyone) if d is None]
    if owners and on_cpu:
        raise RuntimeError(
            f"{', '.join(on_cpu)} see no GPU while other processes train on GPUs: this node has fewer GPUs than "
            "processes of the launch on it, or CUDA_VISIBLE_DEVICES lists GPUs that do not exist."
        )


def init_agent_worlds(
    agents: Sequence[tuple[str, int]],
    *,
    timeout_seconds: float = 1800.0,
    startup_timeout_seconds: float | None = None,
    backend: str | None = None,
    agent_timeout_seconds: float = 1800.0,
    use_cpu: bool = False,
    share_gpus: bool = False,
) -> AgentTopology:
    """Split the launch into one torch world per agent plus an exchange group; call before any accelerate state.

    Args:
        agents: ``(name, num_processes)`` per agent, in order; their counts must add up to the launch's
            ``WORLD_SIZE``. Global ranks ``0..n0-1`` are the first agent, and so on.
        timeout_seconds: bound on an exchange once training runs (``exchange_timeout``), so that a dead or stuck
            agent makes the others fail instead of waiting forever.
        startup_timeout_seconds: bound on the exchanges before the first step has finished (settings, resume
            checks, the first rollouts: they also wait for model downloads and vLLM start-up); None: as above.
        backend: backend of each agent's world (``ddp_backend``); default ``cuda:nccl,cpu:gloo`` on GPUs, as
            accelerate picks for FSDP with CPU offload or full state dicts, and ``gloo`` on CPU.
        agent_timeout_seconds: timeout of each agent's world (``ddp_timeout``), as accelerate would pass it.
        use_cpu: the run trains on CPU (``use_cpu``), whatever GPUs are visible.
        share_gpus: agents may time-share GPUs (``share_gpus``); an agent's own processes still need one each.

    On GPUs, raises if CUDA was initialised before the agent's devices were set, if fewer GPUs are visible than
    the agent has processes on this node, or if two processes of the launch end up on one GPU.

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
    startup = max(timeout_seconds, startup_timeout_seconds or 0.0)

    index, start = agent_slot(counts, global_rank)
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
    placement = place_process(counts, share_gpus)  # done already by hacpo-train, before trl was imported
    cuda = _uses_cuda(use_cpu)
    if cuda:
        _check_devices_before_use(placement, name)
    base = _launcher_store(global_rank, world_size, datetime.timedelta(seconds=startup))
    exchange = dist.ProcessGroupGloo(
        dist.PrefixStore("exchange", base), global_rank, world_size, datetime.timedelta(seconds=startup)
    )
    os.environ.update(
        {
            "RANK": str(agent_rank),
            "WORLD_SIZE": str(count),
            "LOCAL_RANK": str(placement.local_rank),
            "LOCAL_WORLD_SIZE": str(placement.local_world_size),
            "HACPO_AGENT": name,
            "HACPO_GLOBAL_RANK": str(global_rank),
        }
    )
    _report_uncaught_exceptions()
    dist.init_process_group(
        backend=backend or ("cuda:nccl,cpu:gloo" if cuda else "gloo"),
        store=dist.PrefixStore(f"agent/{name}", base),
        rank=agent_rank,
        world_size=count,
        timeout=datetime.timedelta(seconds=agent_timeout_seconds),
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
        startup_timeout_seconds=startup,
        device=_device_identity(placement.local_rank) if cuda else None,
    )
    _watch_failures(_TOPOLOGY, _launcher_store(global_rank, world_size, datetime.timedelta(seconds=60), client=True))
    check_distinct_devices(_TOPOLOGY, share_gpus)
    return _TOPOLOGY


def _watch_failures(topology: AgentTopology, store: dist.Store, poll_seconds: float = 0.5) -> None:
    """A daemon thread that prints every failure another process reports, as soon as it is reported, and
    acknowledges it (the failing process waits for that, :meth:`AgentTopology.wait_until_announced`). It has its own
    store connection, and runs while the main thread is busy or blocked in a collective (which releases the GIL)."""
    import threading
    import time

    me = topology.describe_rank(topology.global_rank)

    def watch():
        seen, count = set(), 0
        while True:
            try:
                total = store.add("failures", 0)
                if total > count:
                    for r in range(topology.global_world_size):
                        if r in seen or r == topology.global_rank or not store.check([f"failed/{r}"]):
                            continue
                        seen.add(r)
                        cause = store.get(f"failed/{r}").decode(errors="replace")
                        print(f"hacpo: {me} is stopping. Cause: {cause}", file=sys.stderr, flush=True)
                        store.set(f"announced/{r}/{topology.global_rank}", "1")
                    count = total
            except Exception:  # noqa: BLE001 - the store is gone: the launch is ending
                return
            time.sleep(poll_seconds)

    threading.Thread(target=watch, name="hacpo-failure-watch", daemon=True).start()


def _report_uncaught_exceptions() -> None:
    """Make a failing process tell the others why, and make every process say why it stops.

    An uncaught exception is written to the launcher's store (so the other agents name it in their errors) and
    summarised in one line; when the launcher terminates the remaining processes after a failure, each prints which
    process failed and why before it exits.
    """
    previous = sys.excepthook

    def hook(kind, value, traceback):
        if _TOPOLOGY is not None and not issubclass(kind, KeyboardInterrupt):
            first = _TOPOLOGY.report_failure(f"{kind.__name__}: {value}")
            me = _TOPOLOGY.describe_rank(_TOPOLOGY.global_rank)
            print(f"hacpo: {me} failed: {kind.__name__}: {value}", file=sys.stderr, flush=True)
            if first and issubclass(kind, OneLineError):  # a line of its own: also the console's last, once
                repeat_after_launcher(f"hacpo-train: error: {value}")
            _TOPOLOGY.wait_until_announced()
        previous(kind, value, traceback)

    def on_terminate(signum, frame):
        if _TOPOLOGY is not None:
            me = _TOPOLOGY.describe_rank(_TOPOLOGY.global_rank)
            causes = "; ".join(_TOPOLOGY.reported_failures(wait_seconds=1.0)) or "no process reported an error"
            print(f"hacpo: {me} stopped by the launcher. Cause: {causes}", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    sys.excepthook = hook
    signal.signal(signal.SIGTERM, on_terminate)
