"""`builtin:<name>` model names, resolved to a local folder: the one place the library maps them, above the built-in
agents (`hacpo_trl.demo`), the real pretrained models shipped in packages (`hacpo_trl.pretrained`) and the systems
stand-ins (`hacpo_trl.shapes`), so the trainer's model loading never goes through the demo."""

from __future__ import annotations

__all__ = ["PREFIX", "resolve_model"]

PREFIX = "builtin:"


def resolve_model(name_or_path: str) -> str:
    """``builtin:<name>`` -> the cached folder of that model (built on first use); anything else unchanged."""
    if not (isinstance(name_or_path, str) and name_or_path.startswith(PREFIX)):
        return name_or_path
    name = name_or_path[len(PREFIX) :]
    from .pretrained import PRETRAINED, build_pretrained

    if name in PRETRAINED:
        return build_pretrained(name)
    from .shapes import SHAPES, build_shape

    if name in SHAPES:
        return build_shape(name)
    from .demo import build_agent

    return build_agent(name)
