"""This agent's vLLM engine, around the one TRL builds: what HACPO sets before TRL builds it and after, in one place.

Before (:func:`before_build`): each agent's engines sample with seeds of their own (:mod:`.vllm_seed`), and on vLLM's
CPU build the engine runs eager and in the model's dtype (:mod:`.vllm_cpu`). After (:func:`after_build`): the CPU
build's weight sync replaces TRL's, and in server mode the weight-sync communicator is closed when the process exits
(TRL closes it at `atexit`, which the launch's hard exit skips). A trainer that does not generate with vLLM, or whose
engine is on a GPU, keeps TRL's path untouched.
"""

from __future__ import annotations

from ..run.topology import at_exit
from .vllm_cpu import use_cpu_engine, use_cpu_sync
from .vllm_seed import use_agent_engine_seeds

__all__ = ["after_build", "before_build"]


def before_build(args, model, load_dtype) -> None:
    """Before TRL builds the engine of the agent ``args`` trains (``model``: its path or instance; ``load_dtype``:
    how the trainer reads the dtype the model loads in, handed in by the caller, which owns model loading)."""
    use_agent_engine_seeds()
    use_cpu_engine(args, model, load_dtype)


def after_build(trainer) -> None:
    """Once TRL built ``trainer`` (and its engine, if any)."""
    generation = getattr(trainer, "vllm_generation", None)
    use_cpu_sync(generation)
    if (client := getattr(generation, "vllm_client", None)) is not None:
        at_exit(client.close_communicator)  # server mode: TRL closes it at `atexit`, which our hard exit skips
