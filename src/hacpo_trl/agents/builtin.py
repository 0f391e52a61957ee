"""`builtin:<name>` model names, resolved to a local folder: the one place the library maps them, above the built-in
agents (`hacpo_trl.agents.demo`), the real pretrained models shipped in packages (`hacpo_trl.agents.pretrained`) and the systems
stand-ins (`hacpo_trl.agents.shapes`), so the trainer's model loading never goes through the demo.

A built-in agent resolves to the copy committed in the repository (``benchmarks/agents/<name>``, or the folder named
by ``HACPO_AGENTS``), the agents every benchmark number was trained from, identical on every machine; where there is
none (an installed package without the repository) it is built from its seed. ``builtin:<name>@seed`` always builds
it from its seed (cached): builds differ between CPUs, so such an agent may differ from the committed one.
"""

from __future__ import annotations

import sys

from .cache import AGENTS_ENV, agents_root

__all__ = ["FROM_SEED", "PREFIX", "committed_agent", "resolve_model"]

PREFIX = "builtin:"
FROM_SEED = "@seed"  # `builtin:<name>@seed`: the agent built from its seed on this machine, not the committed copy


def committed_agent(name: str) -> str | None:
    """The committed folder of built-in agent ``name``, or None where there is none."""
    root = agents_root()
    folder = root / name if root is not None else None
    return str(folder) if folder is not None and (folder / "config.json").is_file() else None


def resolve_model(name_or_path: str) -> str:
    """``builtin:<name>`` -> the folder of that model (the committed agent, or built on first use); anything else
    unchanged."""
    if not (isinstance(name_or_path, str) and name_or_path.startswith(PREFIX)):
        return name_or_path
    name = name_or_path[len(PREFIX) :]
    from .pretrained import PRETRAINED, build_pretrained

    if name in PRETRAINED:
        return build_pretrained(name)
    from .shapes import SHAPES, build_shape

    if name in SHAPES:
        return build_shape(name)
    from .demo import BUILTIN_AGENTS, build_agent

    if name.endswith(FROM_SEED):
        return build_agent(name.removesuffix(FROM_SEED))
    if name in BUILTIN_AGENTS and (folder := committed_agent(name)) is not None:
        return folder
    if name in BUILTIN_AGENTS and not _said.get(name):
        _said[name] = True
        print(
            f"hacpo: {PREFIX}{name} has no committed copy here (benchmarks/agents of the repository, or {AGENTS_ENV}):"
            " building it from its seed; on another CPU it may differ from the benchmark's agent",
            file=sys.stderr,
        )
    return build_agent(name)


_said: dict[str, bool] = {}
