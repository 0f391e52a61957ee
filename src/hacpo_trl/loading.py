"""What one agent trains, resolved from its :class:`~hacpo_trl.config.AgentSpec` and the trainer's arguments:
the model (path or instance), the base model a card names, the tokenizer and the LoRA config."""

from __future__ import annotations

from .demo import resolve_model

__all__ = ["resolve_agent"]


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
