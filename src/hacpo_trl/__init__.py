"""HACPO (Heterogeneous Agent Collaborative Policy Optimization) for Hugging Face TRL.

The public API is one line, ``from hacpo_trl import HACPOTrainer, HACPOConfig, AgentSpec, SHARING_PRESETS``; every
name loads lazily, so ``import hacpo_trl`` imports neither torch nor TRL. `hacpo_trl.algorithm` (the equations) is
importable on its own (torch only). The subpackages and what each may import: docs/architecture.md.
"""

__version__ = "0.1.0.dev0"

_LAZY = {
    "AgentSpec": "run.resolve",
    "HACPOConfig": "config",
    "HACPOTrainer": "trainer",
    "SHARING_PRESETS": "sharing.presets",
    "init_agent_worlds": "run.topology",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'hacpo_trl' has no attribute {name!r}")
