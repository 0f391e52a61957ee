"""How often each learner was taught under a per-prompt method: the generation batches with a taught prompt and the
taught prompts per run, read from the runs' records of their logs (`hacpo/taught_prompts/<peer>`, a share of the
batch's prompts; `_runs.py`).

    python benchmarks/studies/taught-rows/taught_prompts.py --runs benchmarks/runs/validation-48steps-b3 --pairs state model style \
        complement --method "<method>" --results benchmarks/screens/<screen>/RESULTS.md

Nothing is trained here. A learner closed off by the band gate logs 0 for that batch.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the shared modules
import _runs  # noqa: E402
from _common import provenance, write_section  # noqa: E402
from reproduce import PAIR_AGENTS, PROMPTS_PER_STEP, _folder  # noqa: E402


def taught_counts(log_history: list[dict]) -> tuple[int, int, float]:
    """(batches logged, batches with a taught prompt, taught prompts) of one learner's run."""
    batches = with_taught = 0
    prompts = 0.0
    for entry in log_history:
        shares = [v for k, v in entry.items() if k.startswith("hacpo/taught_prompts/")]
        if shares:
            batches += 1
            with_taught += sum(shares) > 0
            prompts += sum(shares) * PROMPTS_PER_STEP
    return batches, with_taught, prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True)
    parser.add_argument("--method", required=True)
    parser.add_argument("--pairs", nargs="+", required=True, choices=list(PAIR_AGENTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(100, 108)))
    parser.add_argument("--results", type=Path, required=True)
    args = parser.parse_args(argv)
    start = time.time()
    lines = [
        "## Taught prompts (`benchmarks/studies/taught-rows/taught_prompts.py`)",
        "",
        f"`{args.method}`, seeds {args.seeds[0]}–{args.seeds[-1]}: generation batches at which the learner was taught"
        " (all seeds) and taught prompts per run.",
        "",
        "| pair | learner | batches with a taught prompt | taught prompts per run |",
        "|---|---|---|---|",
    ]
    for pair in args.pairs:
        for agent in PAIR_AGENTS[pair]:
            total = [0, 0, 0.0]
            for seed in args.seeds:
                folder = _folder(args.runs, pair, args.method, seed)
                run = _runs.record(folder)
                if run is None or agent not in run["logs"]:
                    raise SystemExit(f"no run of {agent} recorded at {folder}")
                for i, n in enumerate(taught_counts(_runs.batches(run["logs"][agent]))):
                    total[i] += n
            lines.append(f"| {pair} | `{agent}` | {total[1]} of {total[0]} | {total[2] / len(args.seeds):.1f} |")
    argv = argv if argv is not None else sys.argv[1:]
    lines += [
        "",
        provenance(
            "studies/taught-rows/taught_prompts.py", [f'"{a}"' if " " in a else a for a in argv], time.time() - start
        ),
    ]
    write_section(args.results, "taught_prompts", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
