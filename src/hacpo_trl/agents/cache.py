"""Where built-in agents and built-in pretrained models are cached, and where the committed agents are: one naming
for all, below `demo`, `pretrained` and `builtin` so that none of them has to import another for it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

__all__ = ["AGENTS_ENV", "agents_root", "build_lock", "cache_folder", "cache_root"]

AGENTS_ENV = "HACPO_AGENTS"


def cache_root() -> str:
    return os.environ.get("HACPO_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "hacpo-trl"))


def agents_root() -> Path | None:
    """The folder of the committed agents: ``HACPO_AGENTS``, else ``benchmarks/agents`` of the repository this package
    runs from (an editable install or a checkout); None for an installed package without it."""
    if os.environ.get(AGENTS_ENV):
        return Path(os.environ[AGENTS_ENV])
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file():
            folder = parent / "benchmarks" / "agents"
            return folder if folder.is_dir() else None
    return None


def cache_folder(name: str, spec, version: int | str, directory: str | None = None) -> str:
    """``directory``, or the cache folder of a built-in model: named after its spec, so a changed spec (or a bumped
    ``version``) is built anew instead of reusing an old folder."""
    payload = json.dumps({"name": name, **asdict(spec), "v": version}, sort_keys=True).encode()
    return directory or os.path.join(cache_root(), f"{name}-{hashlib.sha1(payload).hexdigest()[:10]}")


def builtin_name(path: str | None) -> str | None:
    """``builtin:<name>`` for a folder of the cache (``<name>-<10 hex>`` under `cache_root`) or a committed agent,
    else None: model cards name a built-in model as the user wrote it, not by its cache path."""
    if not isinstance(path, str):
        return None
    committed = agents_root()
    if committed is not None and os.path.dirname(os.path.abspath(path)) == os.path.abspath(committed):
        return f"builtin:{os.path.basename(os.path.normpath(path))}"
    if os.path.dirname(os.path.abspath(path)) != os.path.abspath(cache_root()):
        return None
    name, _, digest = os.path.basename(os.path.normpath(path)).rpartition("-")
    return f"builtin:{name}" if name and len(digest) == 10 and all(c in "0123456789abcdef" for c in digest) else None


@contextlib.contextmanager
def build_lock(folder: str):
    """Held while a built-in model is checked for and built: every process of a launch (and every test worker) that
    needs the same model waits for the one building it, then finds it built, instead of building it again on the
    same cores. An flock: released by the system if the builder dies, so a killed build never blocks the next."""
    from filelock import FileLock, Timeout

    os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
    lock = FileLock(f"{folder}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"hacpo: waiting for another process that is building {os.path.basename(folder)}", file=sys.stderr)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
