"""What one agent trains, resolved from its :class:`~hacpo_trl.config.AgentSpec` and the trainer's arguments:
the model (path or instance), the base model a card names, the tokenizer and the LoRA config."""

from __future__ import annotations

from ..agents.builtin import resolve_model
from ..generation import vllm_cpu
from ..run.placement import launch_engine

__all__ = [
    "check_batch_supported",
    "check_supported",
    "check_trainable_precision",
    "load_dtype",
    "moe_loss_message",
    "prepare_agent",
    "resolve_agent",
]

_UNSUPPORTED_KEYS = ("pixel_values", "image_grid_thw", "tool_mask", "num_images")


def check_supported(args, kwargs: dict) -> None:
    """Reject, before anything is loaded, what HACPOTrainer cannot train: no `HACPOConfig`, tools, environments,
    custom rollouts, or loss settings HACPO's loss does not implement."""
    from ..config import HACPOConfig

    if not isinstance(args, HACPOConfig):
        raise TypeError("HACPOTrainer needs `args=HACPOConfig(...)` (created before anything touches accelerate)")
    for name in ("tools", "environment_factory", "rollout_func"):
        if kwargs.get(name) is not None:
            raise ValueError(f"HACPOTrainer does not support `{name}` yet")
    if args.top_entropy_quantile < 1.0 or args.off_policy_mask_threshold is not None:
        raise ValueError("HACPO's loss does not support `top_entropy_quantile` < 1 or `off_policy_mask_threshold`")


def check_batch_supported(batch: dict) -> None:
    """Reject a TRL generation batch with multimodal or tool-calling columns (peers could not share them)."""
    for key in _UNSUPPORTED_KEYS:
        if key in batch:
            raise ValueError(f"HACPOTrainer does not support `{key}` (multimodal or tool-calling) inputs yet")


def moe_loss_message(agent: str, model_class: str, router_aux_loss_coef: float) -> str:
    """Why a Mixture-of-Experts agent with a router loss cannot share rollouts, and what to set instead."""
    return (
        f"agent {agent!r}: {model_class} is a Mixture-of-Experts model, so TRL would add its "
        f"router load-balancing loss (router_aux_loss_coef={router_aux_loss_coef}), but HACPO's loss "
        "does not add it. Set `router_aux_loss_coef: 0.0`, or `share_rollouts: false` for TRL's own loss."
    )


def prepare_agent(args, kwargs: dict, model=None, processing_class=None, peft_config=None):
    """What `HACPOTrainer` hands TRL, checked before anything loads: :func:`check_supported`, then
    :func:`resolve_agent`'s ``(model, base_model, processing_class, peft_config)`` for ``args.agent_spec``, refused by
    :func:`check_trainable_precision` where it could not learn and by :func:`hacpo_trl.generation.vllm_cpu.check` where vLLM on
    the CPU could not generate with it."""
    check_supported(args, kwargs)
    model, base_model, processing_class, peft_config = resolve_agent(
        args.agent_spec, model, processing_class, peft_config
    )
    check_trainable_precision(args, model, peft_config, args.agent_spec.name)
    vllm_cpu.check(args, model, args.agent_spec.name)
    return model, base_model, processing_class, peft_config


def resolve_agent(spec, model=None, processing_class=None, peft_config=None):
    """``(model, base_model, processing_class, peft_config)``: each argument left None is taken from ``spec``
    (``model_name_or_path``, ``tokenizer_name_or_path`` or the model's path, ``lora``); a ``builtin:<name>`` model
    becomes its cached folder. ``base_model`` is the model's path, or the ``_name_or_path`` of an instance."""
    if model is None:
        if not spec.model_name_or_path:
            raise ValueError(f"agent {spec.name!r} has no `model_name_or_path` and no model was passed")
        model = spec.model_name_or_path
    if isinstance(model, str):
        model = resolve_model(model)  # `builtin:<name>`, as in recipes: the cached folder
    name_or_path = getattr(getattr(model, "config", None), "_name_or_path", None)
    base_model = model if isinstance(model, str) else name_or_path
    if processing_class is None:
        source = spec.tokenizer_name_or_path or (model if isinstance(model, str) else None)
        if source is None:
            source = name_or_path
        if not source:
            raise ValueError(f"agent {spec.name!r}: pass `processing_class` or set `tokenizer_name_or_path`")
        from transformers import AutoTokenizer

        processing_class = AutoTokenizer.from_pretrained(source, padding_side="left")
    if peft_config is None and spec.lora is not None:
        from peft import LoraConfig

        peft_config = LoraConfig(**{"task_type": "CAUSAL_LM", **spec.lora})
    return model, base_model, processing_class, peft_config


def load_dtype(model, args):
    """The dtype the trainable weights will have after TRL loads ``model`` (a path or an instance), or None when
    it cannot be told without loading."""
    import torch

    if isinstance(model, torch.nn.Module):
        dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
        return dtypes.pop() if len(dtypes) == 1 else None
    dtype = (args.model_init_kwargs or {}).get("dtype", (args.model_init_kwargs or {}).get("torch_dtype", "auto"))
    # transformers v5: "auto" loads the dtype saved in the model's config
    if dtype in (None, "auto"):
        try:
            from transformers import AutoConfig

            dtype = getattr(AutoConfig.from_pretrained(model), "dtype", None)
        except (OSError, ValueError):
            return None
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else None


def check_trainable_precision(args, model, peft_config, agent: str) -> None:
    """Refuse, before the model is loaded, full fine-tuning that would update bf16/fp16 parameters with a plain torch
    optimizer (DDP or one process): AdamW steps of ~1e-6 round away in bf16, so the model would not learn.
    DeepSpeed ZeRO and FSDP keep fp32 master weights; LoRA adapters are fp32 (peft's default)."""
    import torch

    if peft_config is not None or launch_engine(args) is not None:
        return
    dtype = load_dtype(model, args)
    if dtype not in (torch.bfloat16, torch.float16):
        return
    name = str(dtype).removeprefix("torch.")
    raise ValueError(
        f"agent {agent!r}: full fine-tuning would update {name} weights with a plain torch optimizer (no DeepSpeed "
        f"ZeRO or FSDP keeping fp32 master weights), so updates of ~1e-6 round away and the model does not learn. "
        "Launch with a DeepSpeed ZeRO or FSDP accelerate config (e.g. accelerate_configs/zero2_8gpu.yaml or "
        "multi_node_zero2.yaml), load float32 (`model_init_kwargs: {dtype: float32}`), or train LoRA adapters."
    )
