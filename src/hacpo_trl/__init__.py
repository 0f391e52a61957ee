"""HACPO (Heterogeneous Agent Collaborative Policy Optimization) for Hugging Face TRL.

`hacpo_trl.algorithm` is importable on its own (torch only); the trainer classes load TRL lazily.
"""

__version__ = "0.1.0.dev0"

_LAZY = {
    "AgentSpec": "resolve",
    "HACPOConfig": "config",
    "HACPOTrainer": "trainer",
    "init_agent_worlds": "topology",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'hacpo_trl' has no attribute {name!r}")
