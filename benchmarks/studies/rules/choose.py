"""A validation screen's choice, applied as a rule wrote it before its runs (RESULTS.md, rule 17): each method's
worst paired gain over GSPO among every agent of the screened pairs, and its mean over the stronger agents; a
candidate beats the preset by its worst, a tie (within ``--tie``) going to the stronger agents' mean; between two
that beat it, the same order, and an exact tie to the first candidate named.

    python benchmarks/studies/rules/choose.py \\
        --screens scratch/screens/validation-rule17/results.json ... \\
        --preset "<method>" --candidates A="<method>" B="<method>" \\
        --stronger state:trace-instruct size:trace-large model:trace-qwen2

Gains are the mean over seeds of a method's accuracy minus GSPO's on the same seed (each screen's `results.json`),
compared at three decimals, as they are reported. A screen that does not hold every declared seed (``--seeds``) for
every method is reported and nothing is chosen from it: a rule chooses on its whole screen, never on a part.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the shared modules
from _common import resolved  # noqa: E402

BASELINE = "GSPO"


def gains(reports: list[dict], methods: list[str]) -> tuple[dict[str, dict[str, float]], list[int]]:
    """``{"pair:agent": {method: mean paired gain over GSPO}}`` and the seeds every pair and method holds."""
    table, seeds = {}, None
    for report in reports:
        for pair, entry in report["settings"].items():
            seeds = set(entry["seeds"]) if seeds is None else seeds & set(entry["seeds"])
            for agent in entry["agents"]:
                accuracy = entry["accuracy"][agent]
                missing = [m for m in [BASELINE, *methods] if m not in accuracy]
                if missing:
                    raise SystemExit(f"choose: {pair} has no runs of {missing} for {agent}; run them first")
                base = accuracy[BASELINE]
                table[f"{pair}:{agent}"] = {
                    m: statistics.mean(a - b for a, b in zip(accuracy[m], base, strict=True)) for m in methods
                }
    return table, sorted(seeds or [])


def summarize(table: dict[str, dict[str, float]], method: str, stronger: list[str]) -> tuple[float, float]:
    """A method's worst gain over every agent and its mean over the stronger agents, at three decimals."""
    missing = [s for s in stronger if s not in table]
    if missing:
        raise SystemExit(f"choose: no screened agent {missing}; name stronger agents as pair:agent")
    worst = min(row[method] for row in table.values())
    return round(worst, 3), round(statistics.mean(table[s][method] for s in stronger), 3)


def ahead(a: tuple[float, float], b: tuple[float, float], tie: float) -> bool:
    """Whether (worst, stronger mean) ``a`` is ahead of ``b``: a larger worst beyond ``tie``, or within it a larger
    stronger mean."""
    if abs(a[0] - b[0]) > tie + 1e-9:
        return a[0] > b[0]
    return a[1] > b[1]


def choose(scores: dict[str, tuple[float, float]], preset: str, candidates: list[str], tie: float) -> str:
    """The rule: the candidates that are ahead of the preset; of several, the one ahead of the others (an exact tie
    of both numbers to the first named); none ahead, the preset stays."""
    winners = [c for c in candidates if ahead(scores[c], scores[preset], tie)]
    best = winners[0] if winners else preset
    for c in winners[1:]:
        if ahead(scores[c], scores[best], tie):
            best = c
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--screens", nargs="+", required=True, help="each screen's results.json")
    parser.add_argument("--preset", required=True, help="the preset's method name")
    parser.add_argument("--candidates", nargs="+", required=True, metavar="NAME=METHOD", help="in the rule's order")
    parser.add_argument("--stronger", nargs="+", required=True, metavar="PAIR:AGENT")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(100, 108)), help="the declared seeds")
    parser.add_argument("--tie", type=float, default=0.005)
    args = parser.parse_args(argv)
    named = dict(c.split("=", 1) for c in args.candidates)
    methods = {"preset": args.preset, **named}
    reports = [json.loads(resolved(p).read_text()) for p in args.screens]
    table, seeds = gains(reports, list(methods.values()))
    scores = {name: summarize(table, m, args.stronger) for name, m in methods.items()}

    print("| agent | " + " | ".join(methods) + " |")
    print("|---|" + "---|" * len(methods))
    for agent, row in table.items():
        print(f"| {agent} | " + " | ".join(f"{row[m]:+.3f}" for m in methods.values()) + " |")
    print("| **worst** | " + " | ".join(f"{scores[n][0]:+.3f}" for n in methods) + " |")
    print("| **stronger mean** | " + " | ".join(f"{scores[n][1]:+.3f}" for n in methods) + " |")
    if seeds != sorted(args.seeds):
        print(f"\nPartial screen: seeds {seeds} of the declared {sorted(args.seeds)}; nothing is chosen from it.")
        return 0
    winner = choose(scores, "preset", list(named), args.tie)
    print(f"\nChosen: {winner}" + (" (the preset stays)" if winner == "preset" else f" ({methods[winner]})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
