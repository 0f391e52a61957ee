"""Experiment trackers checked before anything is loaded: `report_to: wandb` without credentials would otherwise
fail in `on_train_begin`, after the model download and vLLM start-up (review N9)."""

from __future__ import annotations

import importlib.util
import netrc
import os
import sys
from urllib.parse import urlparse

__all__ = ["check_trackers"]

_NO_SERVER = ("offline", "dryrun", "disabled")


def _wandb_credentials() -> bool:
    """An API key in the environment, or a netrc entry for the wandb host (where `wandb login` writes it)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_trackers(report_to, warn=True) -> None:
    """Raise ValueError when a requested tracker cannot run (wandb not installed); switch wandb to offline mode,
    with one warning, when no credentials are found, so the run logs locally (`wandb sync` uploads it later)."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if "all" not in names and "wandb" not in names:
        return
    if importlib.util.find_spec("wandb") is None:
        if "all" in names:
            return  # transformers reports only the installed trackers
        raise ValueError(
            "report_to includes 'wandb' but wandb is not installed: `pip install wandb`, or `report_to: none`"
        )
    if os.environ.get("WANDB_MODE", "").lower() in _NO_SERVER or _wandb_credentials():
        return
    os.environ["WANDB_MODE"] = "offline"
    if warn:
        print(
            "hacpo-train: warning: report_to includes 'wandb' but no wandb credentials were found (WANDB_API_KEY or "
            "`wandb login`); logging offline to ./wandb (upload later with `wandb sync`)",
            file=sys.stderr,
        )
