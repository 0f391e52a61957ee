"""Independent sampling noise per agent in vLLM colocate mode.

TRL seeds each colocated vLLM engine with ``accelerator.process_index // vllm_tensor_parallel_size``. Inside HACPO that
index is agent-local, so rank r of every agent would sample with seed r; both agents' rank r also get the same
prompts (shared data seed), so their sampling noise could be correlated for as long as their batches line up, which
understates the joint group's variance. Here the engine seed is offset by the agent's first global rank: every
(agent, rank) pair gets its own engine seed (a single agent keeps TRL's seeds), while ``args.seed``, which orders the
data, stays shared. Server mode takes its seed from each server's command line (``--seed``), see the README.
"""

from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["engine_seed_offset", "use_agent_engine_seeds", "wrap_engine"]


def engine_seed_offset(topology) -> int:
    """The agent's first global rank (0 without a topology): above every engine seed of the agents before it."""
    if topology is None:
        return 0
    return sum(topology.process_counts[: topology.agent_index])


def wrap_engine(name: str, update) -> None:
    """Pass the keyword arguments of TRL's colocated engines (``vllm_generation.LLM``, built in
    `GRPOTrainer.__init__`) through ``update`` (kwargs -> kwargs). One wrapper holds every update by name, so a second
    call with a name replaces that update instead of stacking it; a no-op when vLLM is not installed."""
    try:
        from trl.generation import vllm_generation
    except ImportError:
        return
    llm = getattr(vllm_generation, "LLM", None)
    if llm is None:
        return
    updates = getattr(llm, "_hacpo_updates", None)
    if updates is None:
        original, updates = llm, {}

        def llm(*args, **kwargs):
            for step in updates.values():
                kwargs = step(kwargs)
            with _quiet_unless_first():
                return original(*args, **kwargs)

        llm._hacpo_updates = updates
        vllm_generation.LLM = llm
    updates[name] = update


@contextlib.contextmanager
def _quiet_unless_first():
    """Every engine prints the same start-up warnings (some from C++, past Python's logging): only global rank 0's
    reach the console. Another process's stderr goes to /dev/null while its engine starts; an error it raises is
    still reported after, with stderr restored."""
    if os.environ.get("HACPO_GLOBAL_RANK", "0") == "0":
        yield
        return
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _agent_seed(kwargs: dict) -> dict:
    from ..run.topology import current_topology

    return {**kwargs, "seed": (kwargs.get("seed") or 0) + engine_seed_offset(current_topology())}


def use_agent_engine_seeds() -> None:
    """Make TRL's colocated engines use this process's agent offset. Idempotent; a no-op when vLLM is not
    installed."""
    wrap_engine("seed", _agent_seed)
