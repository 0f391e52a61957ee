"""Shared by the benchmark scripts: a free port for each launch, updating one section of RESULTS.md, paths as they
are recorded (relative to the repository root, so that a record reads the same in every checkout), and Student's
t-interval of a mean."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

from hacpo_trl.run.placement import free_port  # noqa: F401  (the scripts' launches)

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


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile (p in (0.5, 1)) by bisection on its CDF, integrated with Simpson's rule from 0."""

    def density(x: float) -> float:
        log_c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
        return math.exp(log_c - (dof + 1) / 2 * math.log1p(x * x / dof))

    def cdf(x: float, n: int = 2000) -> float:
        h = x / n
        odd = sum(density((2 * k - 1) * h) for k in range(1, n // 2 + 1))
        even = sum(density(2 * k * h) for k in range(1, n // 2))
        return 0.5 + h / 3 * (density(0.0) + 4 * odd + 2 * even + density(x))

    if not 0.5 < p < 1 or dof < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and dof >= 1, got p={p}, dof={dof}")
    low, high = 0.0, 1000.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def interval(diffs: list[float], level: float) -> tuple[float, float, float]:
    """Mean and two-sided t-interval at ``level``."""
    mean = statistics.mean(diffs)
    half = t_quantile(1 - (1 - level) / 2, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean, mean - half, mean + half
