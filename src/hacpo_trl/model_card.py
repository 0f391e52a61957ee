"""The HACPO section of an agent's model card: a pure function of its settings, peers and log history.

TRL writes the card (front matter, base model, citation); :class:`~hacpo_trl.trainer.HACPOTrainer` appends this
section so a saved agent says what a HACPO agent needs to be understood: its peers, the recipe and final metrics.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .pretrained import original_model

__all__ = ["CARD_SETTINGS", "hacpo_card_section"]

CARD_SETTINGS = (
    "alpha", "peer_delta", "peer_delta_step", "capability_window", "capability_baseline", "capability_coefficient",
    "peer_clipping", "naive", "peer_filter", "epsilon", "epsilon_high", "num_generations", "learning_rate",
    "temperature", "max_completion_length", "beta",
)  # fmt: skip


def hacpo_card_section(
    settings, agent: str, base_model: str | None, log_history: Sequence[dict], global_step: int
) -> str:
    """The Markdown appended to TRL's card. ``settings`` is the agent's `HACPOConfig` (``specs``,
    ``share_rollouts`` and :data:`CARD_SETTINGS` are read); the final value of each reward, capability and
    ``train_loss`` entry of ``log_history`` is listed."""
    lines = ["", "", "## HACPO", ""]
    lines.append(f"This model is agent `{agent}` of a HACPO run (arXiv 2603.02604), trained with `hacpo-trl`.")
    lines.append(f"Base model: `{base_model or 'in-memory model'}`.")
    if original_model(base_model):
        lines.append(f"It is an offline copy of `{original_model(base_model)}` (see its README.md).")
    lines.append("")
    peers = [s for s in settings.specs if s.name != agent]
    if peers and settings.share_rollouts:
        lines.append("It learned from its own completions and from those of its peers:")
        lines += [f"- `{p.name}`: `{p.model_name_or_path or 'in-memory model'}`" for p in peers]
    else:
        lines.append("It was trained on its own completions only (no rollout sharing).")
    recipe = {k: getattr(settings, k) for k in CARD_SETTINGS}
    lines += ["", "Recipe (HACPO settings):", "", "```json", json.dumps(recipe, indent=2, default=str), "```", ""]
    final: dict[str, float] = {}
    for entry in log_history:
        for key, value in entry.items():
            if key == "reward" or key.startswith("hacpo/capability/") or key == "train_loss":
                final[key] = value
    if final:
        lines += ["Final training metrics:", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" for k, v in final.items() if isinstance(v, int | float)]
        lines += [f"| global step | {global_step} |", ""]
    return "\n".join(lines) + "\n"
