"""The preset of rule 7 (`FORMER_PRESET`, recommended until rule 13) against GSPO at two points of the same runs,
and how often each agent's gate opened: does the preset keep protecting the stronger agent, and keep lifting the weaker one, when training runs twice as long?

    python benchmarks/studies/preset-horizon/preset_horizon.py     # reads benchmarks/runs/validation-96steps-b3 (benchmarks/CHANGELOG.md, 2026-11-25)

Reads the finished runs of `reproduce.py --split validation --steps 96 --eval_every 16 --pairs state model --methods
GSPO "<preset>"` (the curve points at 48 and 96 generation batches, and each agent's logged
`hacpo/learns_from/<peer>`, from the runs' records: `_runs.py`) and writes a section of `benchmarks/screens/validation-96steps-b3/RESULTS.md`. Nothing is
trained here.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the shared modules
import _runs  # noqa: E402
from _common import provenance, write_section  # noqa: E402
from reproduce import FORMER_PRESET as PRESET  # noqa: E402
from reproduce import METHODS, PAIR_AGENTS, STRONGER, _folder, paired_ci  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def paired(a: list[float], b: list[float]) -> str:
    mean, low, high = paired_ci(a, b)
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=ROOT / "benchmarks" / "runs" / "validation-96steps-b3")
    parser.add_argument("--pairs", nargs="+", default=["state", "model"])
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(100, 108)))
    parser.add_argument("--points", nargs="+", type=int, default=[48, 96], help="generation batches")
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args(argv)
    start = time.time()
    updates = {m: METHODS[m][2] for m in ("GSPO", PRESET)}  # optimizer steps per generation batch
    head = " | ".join(f"preset − GSPO at {n}" for n in args.points)
    lines = [
        "## The preset at a longer horizon (`benchmarks/studies/preset-horizon/preset_horizon.py`)",
        "",
        f"Validation, seeds {args.seeds[0]}–{args.seeds[-1]}, paired by seed (95% t-interval); the point at *n* "
        "generation batches is the same run's evaluation there. Open batches: generation batches at which the agent "
        "learned from its peer, per seed.",
        "",
        f"| pair | agent | {head} | seeds = GSPO at {args.points[-1]} | open batches per seed |",
        "|---|---|" + "---|" * len(args.points) + "---|---|",
    ]
    for pair in args.pairs:
        agents = sorted(PAIR_AGENTS[pair], key=lambda a: a != STRONGER[pair])  # the stronger agent first
        for agent in agents:
            peer = next(a for a in agents if a != agent)
            cells, opened = [], []
            for n in args.points:
                acc = {m: [] for m in updates}
                for seed in args.seeds:
                    for method, per_batch in updates.items():
                        curve = _runs.record(_folder(args.runs, pair, method, seed))["summary"][agent]["curve"]
                        acc[method].append(dict(curve)[per_batch * n])
                cells.append(paired(acc[PRESET], acc["GSPO"]))
                equal = sum(x == y for x, y in zip(acc[PRESET], acc["GSPO"], strict=True))
            for seed in args.seeds:
                log = _runs.batches(_runs.record(_folder(args.runs, pair, PRESET, seed))["logs"][agent])
                flags = [e[f"hacpo/learns_from/{peer}"] for e in log if f"hacpo/learns_from/{peer}" in e]
                opened.append(f"{int(sum(flags))}/{len(flags)}")
            role = " (stronger)" if agent == STRONGER[pair] else ""
            lines.append(
                f"| {pair} | {agent}{role} | "
                + " | ".join(cells)
                + f" | {equal}/{len(args.seeds)} | {', '.join(opened)} |"
            )
    results = args.results or args.runs.parent.parent / "screens" / args.runs.name / "RESULTS.md"
    lines += [
        "",
        provenance(
            "studies/preset-horizon/preset_horizon.py", argv if argv is not None else sys.argv[1:], time.time() - start
        ),
    ]
    write_section(results, "preset_horizon", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
