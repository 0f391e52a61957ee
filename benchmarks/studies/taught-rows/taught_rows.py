"""How many taught rows a learner's updates hold under a per-prompt method: per learner, the generation batches with
taught rows, the taught prompts and rows per such batch (mean, median, 90th percentile, largest), and for each cap K
(`taught_cap`) the share of those batches it would damp (more than K rows) and a taught row's mean weight under it,
sum(min(n, K)) / sum(n) over the batches' row counts n; read from the runs' records (`hacpo/peer_rows`,
`hacpo/taught_prompts/<peer>`; `_runs.py`). Under `peer_prompts` 'better' or 'failed' every peer row is a taught row
(a peer enters only on the prompts it teaches).

    python benchmarks/studies/taught-rows/taught_rows.py --runs benchmarks/runs/validation-48steps-b3 --method "<method>" \
        --pair_runs size=benchmarks/runs/validation-64steps-b3-size-lr5e-05

The records hold counts per batch, not prompt ids: which prompts were taught is known only as "failed by the
learner at every completion and solved by the peer" (the method's rule). Nothing is trained here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the shared modules
import _runs  # noqa: E402
from _common import provenance  # noqa: E402
from reproduce import PAIR_AGENTS, PROMPTS_PER_STEP, _folder  # noqa: E402


def batch_rows(log_history: list[dict]) -> list[tuple[float, float]]:
    """(taught prompts, peer rows appended) of each generation batch of one learner's run."""
    out = []
    for entry in log_history:
        shares = [v for k, v in entry.items() if k.startswith("hacpo/taught_prompts/")]
        if shares:
            out.append((sum(shares) * PROMPTS_PER_STEP, entry.get("hacpo/peer_rows", 0.0)))
    return out


def row(pair: str, agent: str, batches: list[tuple[float, float]], seeds: int, caps: list[float]) -> str:
    """One learner's line of the table, over all its seeds' batches."""
    taught = [rows for _, rows in batches if rows > 0]
    prompts = [p for p, rows in batches if rows > 0]
    if not taught:
        return f"| {pair} | `{agent}` | 0 of {len(batches)} |" + " – |" * (6 + 2 * len(caps))
    deciles = statistics.quantiles(taught, n=10, method="inclusive") if len(taught) > 1 else [taught[0]] * 9
    damped = [f"{sum(n > k for n in taught) / len(taught):.2f}" for k in caps]
    weight = [f"{sum(min(n, k) for n in taught) / sum(taught):.2f}" for k in caps]
    return (
        f"| {pair} | `{agent}` | {len(taught)} of {len(batches)} ({len(taught) / len(batches):.2f}) "
        f"| {statistics.mean(prompts):.2f} | {statistics.mean(taught):.2f} | {statistics.median(taught):g} "
        f"| {deciles[8]:g} | {max(taught):g} | {sum(taught) / seeds:.0f} | " + " | ".join(damped + weight) + " |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True, help="the grid folder of every pair not in --pair_runs")
    parser.add_argument("--pair_runs", nargs="+", default=[], metavar="PAIR=FOLDER", help="another folder per pair")
    parser.add_argument("--method", required=True)
    parser.add_argument("--pairs", nargs="+", default=["state", "size", "model", "style", "complement"])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(100, 108)))
    parser.add_argument("--caps", type=float, nargs="+", default=[2, 4, 8], help="the values of taught_cap shown")
    args = parser.parse_args(argv)
    folders = {pair: Path(folder) for pair, folder in (p.split("=", 1) for p in args.pair_runs)}
    start = time.time()
    caps = " | ".join([f"damped at {k:g}" for k in args.caps] + [f"weight at {k:g}" for k in args.caps])
    lines = [
        f"`{args.method}`, seeds {args.seeds[0]}–{args.seeds[-1]}: generation batches with taught rows, taught prompts"
        " and rows per such batch, rows per run; for each cap K, the share of those batches with more than K rows and"
        " a taught row's mean weight, sum(min(n, K)) / sum(n).",
        "",
        f"| pair | learner | batches with taught rows | prompts | rows: mean | median | 90th pct | max | rows per run "
        f"| {caps} |",
        "|---|---|---|---|---|---|---|---|---|" + "---|" * 2 * len(args.caps),
    ]
    for pair in args.pairs:
        for agent in PAIR_AGENTS[pair]:
            batches = []
            for seed in args.seeds:
                folder = _folder(folders.get(pair, args.runs), pair, args.method, seed)
                run = _runs.record(folder)
                if run is None or agent not in run["logs"]:
                    raise SystemExit(f"no run of {agent} recorded at {folder}")
                batches += batch_rows(_runs.batches(run["logs"][agent]))
            lines.append(row(pair, agent, batches, len(args.seeds), args.caps))
    argv = argv if argv is not None else sys.argv[1:]
    lines += [
        "",
        provenance(
            "studies/taught-rows/taught_rows.py", [f'"{a}"' if " " in a else a for a in argv], time.time() - start
        ),
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
