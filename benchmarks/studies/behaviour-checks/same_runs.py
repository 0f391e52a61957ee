"""Whether two `reproduce.py` outputs hold the same per-run numbers: every pair, agent, method and seed's held-out
accuracy after training, and each agent's accuracy before. For a refactor that must not change behaviour, run
`reproduce.py --quick` before and after it on one machine and compare the two `results.json`:

    python benchmarks/studies/behaviour-checks/same_runs.py BEFORE/results.json AFTER/results.json

Prints one line per run and exits 1 if any differs (or a run is missing from one side).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def per_run(results: dict) -> dict[tuple, float]:
    """(pair, agent, method, seed) -> accuracy after training; (pair, agent, "before", None) -> accuracy before."""
    runs = {}
    for pair, setting in results["settings"].items():
        for agent, by_method in setting["accuracy"].items():
            for method, values in by_method.items():
                for seed, value in zip(setting["seeds"], values, strict=True):
                    runs[(pair, agent, method, seed)] = value
        for agent, value in setting["accuracy_before"].items():
            runs[(pair, agent, "before", None)] = value
    return runs


def compare(before: dict, after: dict) -> tuple[list[str], int]:
    """One line per run and the number of runs that differ or are missing from one side."""
    a, b = per_run(before), per_run(after)
    lines, differ = [], 0
    for key in sorted(a.keys() | b.keys(), key=str):
        x, y = a.get(key), b.get(key)
        same = x is not None and x == y
        differ += not same
        lines.append(f"{'same' if same else 'DIFFERS'}  {' / '.join(str(k) for k in key if k is not None)}: {x} -> {y}")
    return lines, differ


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if len(paths) != 2:
        print(__doc__)
        return 2
    before, after = (json.loads(Path(p).read_text()) for p in paths)
    lines, differ = compare(before, after)
    print("\n".join(lines))
    print(f"{len(lines) - differ} of {len(lines)} runs identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
