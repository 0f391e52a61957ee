"""The HACPO section of an agent's model card: a pure function of its settings, peers and log history.

TRL writes the card (front matter, base model, citation); :func:`complete_card` fills in the names TRL's template
leaves as ``None`` and appends this section, so a saved agent says what a HACPO agent needs to be understood: its
peers, the recipe and final metrics.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from contextlib import contextmanager

from ..agents.cache import builtin_name
from ..agents.pretrained import original_model
from ..sharing.presets import SHARING_PRESETS, describe_sharing
from ..sharing.settings import LEARNER_SETTINGS

__all__ = [
    "CARD_SETTINGS",
    "PAPER",
    "append_card_section",
    "complete_card",
    "hacpo_card_section",
    "hub_base_model",
    "name_card",
]

# TRL's card cites it (`GRPOTrainer._paper`)
PAPER = {
    "title": "Heterogeneous Agent Collaborative Reinforcement Learning",
    "id": "2603.02604",
    "citation": "@article{zhang2026hacrl, title={Heterogeneous Agent Collaborative Reinforcement Learning}, "
    "author={Zhang, Zhixia and Huang and others}, journal={arXiv preprint arXiv:2603.02604}, year={2026}}",
}

CARD_SETTINGS = (
    "alpha", "peer_delta", "peer_delta_step", "capability_window", "capability_baseline", "capability_coefficient",
    "peer_clipping", "naive", "sharing", *LEARNER_SETTINGS, "epsilon", "epsilon_high", "num_generations", "learning_rate",
    "temperature", "max_completion_length", "beta", "use_vllm", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
)  # fmt: skip


def hacpo_card_section(
    settings,
    agent: str,
    base_model: str | None,
    log_history: Sequence[dict],
    global_step: int,
    base_label: str | None = None,
) -> str:
    """The Markdown appended to TRL's card. ``settings`` is the agent's `HACPOConfig` (``specs``,
    ``share_rollouts`` and :data:`CARD_SETTINGS` are read); the final value of each reward, capability and
    ``train_loss`` entry of ``log_history`` is listed. ``base_label`` names the base model as the user gave it
    (``builtin:<name>``, a Hub id or a path; default ``base_model``, the folder it was loaded from)."""
    lines = ["", "", "## HACPO", ""]
    lines.append(f"This model is agent `{agent}` of a HACPO run (arXiv 2603.02604), trained with `hacpo-trl`.")
    lines.append(f"Base model: `{base_label or base_model or 'in-memory model'}`.")
    if original_model(base_model):
        lines.append(f"It is an offline copy of `{original_model(base_model)}` (see its README.md).")
    lines.append("")
    peers = [s for s in settings.specs if s.name != agent]
    if peers and settings.share_rollouts:
        lines.append("It learned from its own completions and from those of its peers:")
        lines += [f"- `{p.name}`: `{p.model_name_or_path or 'in-memory model'}`" for p in peers]
    else:
        lines.append("It was trained on its own completions only (no rollout sharing).")
    lines += ["", _is_correction_sentence(settings)]
    if getattr(settings, "sharing", None) in SHARING_PRESETS:  # the named mode and what it set
        lines += ["", describe_sharing(vars(settings)) + "."]
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


def _is_correction_sentence(settings) -> str:
    """Whether TRL's vLLM importance-sampling correction reweighted the self rows: the paper's loss has none."""
    if not settings.use_vllm:
        return "Generation ran through the trainer's own model, so no vLLM importance-sampling correction applies."
    if settings.vllm_importance_sampling_correction:
        return (
            "TRL's vLLM importance-sampling correction was ON (mode "
            f"`{settings.vllm_importance_sampling_mode}`): self rows were reweighted by the trainer/vLLM probability "
            "ratio, which the paper's loss does not do."
        )
    return "TRL's vLLM importance-sampling correction was OFF, as in the paper's loss."


@contextmanager
def hub_base_model(model, base_model: str | None):
    """While TRL writes the card: the model's ``config._name_or_path`` names the Hub model that a built-in folder
    ``base_model`` is a copy of (TRL's card takes ``base_model`` from it and omits local folders); restored after."""
    config = getattr(model, "config", None)
    original = original_model(base_model)
    saved = getattr(config, "_name_or_path", None)
    if original and config is not None:
        config._name_or_path = original
    try:
        yield
    finally:
        if original and config is not None:
            config._name_or_path = saved


def name_card(text: str, agent: str, base_model: str | None, model_id: str) -> str:
    """TRL's card with the names its template leaves as ``None`` filled in: the title names the agent, the base
    model is named as the user gave it (a Hub id links to the Hub; ``builtin:<name>`` or a local path is shown as
    written) and the quick start loads ``model_id`` (the Hub repository, else the saved folder)."""
    text = text.replace("# Model Card for None", f"# Model Card for {agent}")
    if base_model and base_model.count("/") == 1 and not base_model.startswith((".", "/", "~", "builtin:")):
        base = f"[{base_model}](https://huggingface.co/{base_model})"
    else:
        base = f"`{base_model or 'an in-memory model'}`"
    text = text.replace("[None](https://huggingface.co/None)", base)
    return text.replace('model="None"', f'model="{model_id}"')


def append_card_section(output_dir: str, section: str) -> None:
    """Append ``section`` to the card TRL wrote in ``output_dir`` (nothing when TRL wrote none)."""
    path = os.path.join(output_dir, "README.md")
    if not os.path.isfile(path):
        return
    with open(path, "a") as f:
        f.write(section)


def complete_card(settings, agent: str, base_model: str | None, log_history, global_step: int, model_id: str) -> None:
    """Finish the card TRL wrote into ``settings.output_dir``: its names filled in (:func:`name_card`), then the HACPO
    section appended (:func:`hacpo_card_section`). The base model is named as the user wrote it: the recipe's name,
    else ``builtin:<name>`` for a cache folder, else the path given."""
    label = settings.agent_spec.model_name_or_path or builtin_name(base_model) or base_model
    card = os.path.join(settings.output_dir, "README.md")
    # TRL's template leaves base model and repository as `None` for local models
    if os.path.isfile(card):
        with open(card) as f:
            text = name_card(f.read(), agent, label, model_id)
        with open(card, "w") as f:
            f.write(text)
    section = hacpo_card_section(settings, agent, base_model, log_history, global_step, label)
    append_card_section(settings.output_dir, section)
