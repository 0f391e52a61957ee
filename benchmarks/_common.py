"""Shared by the benchmark scripts: a free port for each launch, updating one section of RESULTS.md, and paths as
they are recorded (relative to the repository root, so that a record reads the same in every checkout)."""

from __future__ import annotations

import os
from pathlib import Path

from hacpo_trl.placement import free_port  # noqa: F401  (the scripts' launches)

ROOT = Path(__file__).resolve().parents[1]


def recorded(arg: str) -> str:
    """A command-line argument as it is written into a record: an absolute path inside the repository (also as
    ``--key=PATH``) relative to its root, anything else as given."""
    key, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    if os.path.isabs(value):
        path = Path(value).resolve()
        if path.is_relative_to(ROOT):
            value = path.relative_to(ROOT).as_posix()
    return key + eq + value


def resolved(path: str | Path) -> Path:
    """A recorded path on this checkout: a relative one is relative to the repository root."""
    return ROOT / path


def write_section(results: Path, name: str, lines: list[str]) -> None:
    """Replace (or append) the section between ``<!-- name -->`` markers, keeping the other scripts' sections."""
    marker = f"<!-- {name} -->"
    existing = results.read_text() if results.exists() else "# Benchmark results\n\n"
    block = f"{marker}\n" + "\n".join(lines) + f"\n{marker}\n"
    if marker in existing:
        head, _, rest = existing.partition(marker)
        _, _, tail = rest.partition(marker)
        existing = head + block + tail.lstrip("\n")
    else:
        existing += "\n" + block
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(existing)


def command(script: str, argv: list[str]) -> str:
    """The command line of a benchmark script as recorded: run from the repository root, paths relative to it."""
    return " ".join(["python", f"benchmarks/{script}", *map(recorded, argv)])


def provenance(script: str, argv: list[str], elapsed_seconds: float) -> str:
    """The exact command and the machine, for the line under each results table."""
    import os
    import platform

    return (
        f"Command: `{command(script, argv)}`. Machine: {platform.machine()}, {os.cpu_count()} cores, CPU only, "
        f"{platform.python_implementation()} {platform.python_version()}. Wall time: {elapsed_seconds / 60:.1f} min."
    )
