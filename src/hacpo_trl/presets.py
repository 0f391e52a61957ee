"""Named sharing modes: one recipe line, ``sharing: recommended``, instead of the settings it stands for.

Each name expands, here and nowhere else, to values of the settings below; a setting given beside the name wins
(in the recipe, on the command line or in ``HACPOConfig(...)``). The recipe checks, ``--plan``, the config and the
probe all expand a recipe through :func:`expand_sharing`, so the name means the same to each. Standard library only:
the checks before any ML library loads read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEFAULT_SHARING",
    "PRESET_SETTINGS",
    "SHARING_CHANGES",
    "SHARING_PRESETS",
    "describe_sharing",
    "expand_sharing",
]

# The paper's rule: every open peer's every row enters the joint group, trained in the band. Every other name is
# this with the settings it changes; these are also the settings' defaults (`SharingSettings` reads them).
_PAPER: dict[str, Any] = {
    "share_rollouts": True,
    "peer_filter": "all",
    "peer_prompts": "all",
    "taught_ratio_floor": 0.2,
    "taught_schedule": "sharing",
    "taught_scale": 1.0,
    "taught_cap": 0,
    "taught_failed_rate": 0.0,
    "band_gate": False,
    "capability_gate": 0.0,
    "capability_gate_confidence": 0.0,
}

# taught rows at full weight on the prompts the learner failed entirely, on GSPO's schedule
_FAILED_PROMPTS = {"peer_filter": "correct", "peer_prompts": "failed", "taught_ratio_floor": 0.2,
                   "taught_schedule": "solo", "band_gate": True}  # fmt: skip
# rule 17's candidate B, chosen on its validation screen (benchmarks/RESULTS.md): the recommended preset
_CAPPED_ALMOST_FAILED = {**_FAILED_PROMPTS, "taught_cap": 3, "taught_failed_rate": 0.125}

# name -> (the settings it changes from the paper's rule, what it is). The names of the benchmark's presets are
# those of benchmarks/reproduce.py (`PRESET_METHODS` there maps its method names to them).
_CHANGES: dict[str, tuple[dict[str, Any], str]] = {
    "paper": ({}, "the paper's rule: every peer row, in the band"),
    "none": ({"share_rollouts": False}, "no sharing: every agent trains alone with TRL's loss (GSPO)"),
    "recommended": (
        _CAPPED_ALMOST_FAILED,
        "a peer's correct rows on the prompts the learner solved at most 1 in 8 times, at full weight while few "
        "(a batch's taught rows weigh at most 3 rows' worth), in GSPO's updates",
    ),
    "quarter_weight": (
        {**_FAILED_PROMPTS, "taught_scale": 0.25},
        "the preset of rule 16: a peer's correct rows on the prompts the learner failed entirely, at a quarter "
        "weight, in GSPO's updates",
    ),
    "failed_prompts": (
        _FAILED_PROMPTS,
        "the preset of rule 13: a peer's correct rows on the prompts the learner failed entirely, at full weight, in "
        "GSPO's updates",
    ),
    # the candidates of benchmark rule 17 (benchmarks/RESULTS.md); B was chosen and is 'recommended'
    "capped_taught": (
        {**_FAILED_PROMPTS, "taught_cap": 3},
        "'failed_prompts' with a batch's taught rows weighing at most 3 rows' worth (rule 17's candidate A)",
    ),
    "capped_almost_failed": (
        _CAPPED_ALMOST_FAILED,
        "rule 17's candidate B, chosen: 'recommended' ('capped_taught' also on the prompts solved at most 1 in 8)",
    ),
    # the candidate of benchmark rule 18 (benchmarks/RESULTS.md), not chosen: B stayed 'recommended'
    "capped_mostly_failed": (
        {**_FAILED_PROMPTS, "taught_cap": 3, "taught_failed_rate": 0.25},
        "rule 18's candidate C, not chosen: 'recommended' also on the prompts the learner solved 2 in 8 times",
    ),
    "confident_gate": (
        {"peer_filter": "correct", "capability_gate": 1.0, "capability_gate_confidence": 0.95, "band_gate": True},
        "the preset of rule 7: correct rows of a peer at least as capable at 95% confidence, on the paper's schedule",
    ),
}  # fmt: skip

SHARING_PRESETS: dict[str, dict[str, Any]] = {name: {**_PAPER, **changes} for name, (changes, _) in _CHANGES.items()}
# what each name sets beyond the paper's rule (the benchmark's method definitions are checked against these)
SHARING_CHANGES: dict[str, dict[str, Any]] = {name: dict(changes) for name, (changes, _) in _CHANGES.items()}
PRESET_SETTINGS = tuple(_PAPER)
DEFAULT_SHARING = "paper"


def _name(values: Mapping[str, Any]) -> str:
    name = values.get("sharing")
    if name is None:
        return DEFAULT_SHARING
    if name not in SHARING_PRESETS:
        raise ValueError(f"`sharing` must be one of {tuple(SHARING_PRESETS)}, got {name!r}")
    return name


def expand_sharing(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (a recipe, or a config's fields) with ``sharing`` named (default 'paper') and each of
    :data:`PRESET_SETTINGS` it leaves out (absent or None) set to the named mode's value."""
    name = _name(values)
    out = {**values, "sharing": name}
    for key, value in SHARING_PRESETS[name].items():
        if out.get(key) is None:
            out[key] = value
    return out


def describe_sharing(values: Mapping[str, Any]) -> str:
    """One line: the mode's name, what it is, and its settings as ``values`` (expanded) hold them; a setting set
    beside the name to another value is marked ``(set)``."""
    name = _name(values)
    preset = SHARING_PRESETS[name]
    changes, what = _CHANGES[name]
    shown = []
    for key in PRESET_SETTINGS:
        value = values.get(key, preset[key])
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if value != preset[key]:
            shown.append(f"{key} {text} (set)")
        elif key in changes:
            shown.append(f"{key} {text}")
    return f"sharing: {name} ({what})" + (f": {', '.join(shown)}" if shown else "")
