"""Shared by the benchmark scripts: a free port for each launch, and updating one section of RESULTS.md."""

from __future__ import annotations

from pathlib import Path

from hacpo_trl.placement import free_port  # noqa: F401  (the scripts' launches)


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


def provenance(script: str, argv: list[str], elapsed_seconds: float) -> str:
    """The exact command and the machine, for the line under each results table."""
    import os
    import platform

    command = " ".join(["python", f"benchmarks/{script}", *argv])
    return (
        f"Command: `{command}`. Machine: {platform.machine()}, {os.cpu_count()} cores, CPU only, "
        f"{platform.python_implementation()} {platform.python_version()}. Wall time: {elapsed_seconds / 60:.1f} min."
    )
