"""Named sharing modes: one recipe line, ``sharing: recommended``, instead of the settings it stands for.

Each name expands, here and nowhere else, to values of the settings below; a setting given beside the name wins
(in the recipe, on the command line or in ``HACPOConfig(...)``). The recipe checks, ``--plan``, the config and the
probe all expand a recipe through :func:`expand_sharing`, so the name means the same to each. Standard library only:
the checks before any ML library loads read it.
"""

from __future__ import annotations

import difflib
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

# rule 17's candidate B, chosen on its validation screen (benchmarks/RESULTS.md): a peer's correct rows on the prompts
# the learner solved at most 1 in 8 times, a batch's taught rows weighing at most 3 rows' worth, on GSPO's schedule
_RECOMMENDED = {"peer_filter": "correct", "peer_prompts": "failed", "taught_ratio_floor": 0.2, "taught_schedule": "solo",
                "band_gate": True, "taught_cap": 3, "taught_failed_rate": 0.125}  # fmt: skip

# name -> (the settings it changes from the paper's rule, what it is). The public modes only: the settings the
# benchmark screened and did not adopt are its own (benchmarks/reproduce.py), next to the rules that tried them.
_CHANGES: dict[str, tuple[dict[str, Any], str]] = {
    "paper": ({}, "the paper's rule: every peer row, in the band"),
    "recommended": (
        _RECOMMENDED,
        "a peer's correct rows on the prompts the learner solved at most 1 in 8 times, at full weight while few "
        "(a batch's taught rows weigh at most 3 rows' worth), in GSPO's updates",
    ),
    "none": ({"share_rollouts": False}, "no sharing: every agent trains alone with TRL's loss (GSPO)"),
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
        close = difflib.get_close_matches(str(name), SHARING_PRESETS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"`sharing` must be one of {', '.join(map(repr, SHARING_PRESETS))}, got {name!r}{hint}")
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
