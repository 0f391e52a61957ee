"""Rule 20's choice, applied as the rule wrote it before its runs (README.md here): each method's paired gain over
GSPO for every agent of the screened pairs with its 95% t-interval; the candidate loses if any agent's upper end is
below 0, and otherwise replaces the incumbent only if its stronger agents' mean gain is larger by more than 0.005
while its worst gain is not lower by more than 0.005.

    python benchmarks/studies/rule20-negatives/decide.py

It reads the screen's three `results.json` and prints the table and the decision (recorded in README.md here). A screen that does
not hold seeds 100-107 for GSPO, the incumbent and the candidate in every pair is refused: the rule chooses only on
its complete screen.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the shared modules
from _common import ROOT, interval  # noqa: E402

SCREENS = [ROOT / "benchmarks" / "screens" / name / "results.json"
           for name in ("validation-rule20", "validation-rule20-size", "validation-rule20-complement")]  # fmt: skip
INCUMBENT = (
    "HACPO correct + failed-prompt floor 0.2 + failed rate 0.125 + taught cap 3 + GSPO solo schedule + band gate"
)
CANDIDATE = (
    "HACPO correct + failed-prompt floor 0.2 + failed rate 0.125 + taught cap 3 + unsure negatives + GSPO solo "
    "schedule + band gate"
)
STRONGER = ("state:trace-instruct", "size:trace-large", "model:trace-qwen2")
SEEDS = list(range(100, 108))
TIE = 0.005


def gains(reports: list[dict]) -> dict[str, dict[str, tuple[float, float, float]]]:
    """``{"pair:agent": {method: (mean, low, high)}}``: the paired gain over GSPO, 95% t-interval over the seeds."""
    table = {}
    for report in reports:
        for pair, entry in report["settings"].items():
            if sorted(entry["seeds"]) != SEEDS:
                raise SystemExit(f"decide: {pair} holds seeds {entry['seeds']}, not {SEEDS}: finish the screen first")
            order = [entry["seeds"].index(s) for s in SEEDS]
            for agent in entry["agents"]:
                accuracy = entry["accuracy"][agent]
                missing = [m for m in ("GSPO", INCUMBENT, CANDIDATE) if m not in accuracy]
                if missing:
                    raise SystemExit(f"decide: {pair} has no runs of {missing} for {agent}: finish the screen first")
                base = [accuracy["GSPO"][i] for i in order]
                table[f"{pair}:{agent}"] = {
                    m: interval([accuracy[m][i] - b for i, b in zip(order, base, strict=True)], 0.95)
                    for m in (INCUMBENT, CANDIDATE)
                }
    return table


def decide(table: dict[str, dict[str, tuple[float, float, float]]]) -> tuple[list[str], str]:
    """The table's lines and the decision, by rule 20."""
    lines = ["| pair | agent | B − GSPO | N − GSPO | N − B (means) |", "|---|---|---|---|---|"]
    for key, row in table.items():
        pair, agent = key.split(":")
        b, n = row[INCUMBENT], row[CANDIDATE]
        cells = [f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" for m, lo, hi in (b, n)]
        mark = " (stronger)" if key in STRONGER else ""
        lines.append(f"| {pair} | `{agent}`{mark} | {cells[0]} | {cells[1]} | {n[0] - b[0]:+.3f} |")
    summary = {}
    for name, method in (("B", INCUMBENT), ("N", CANDIDATE)):
        worst = min(table, key=lambda k: table[k][method][0])
        summary[name] = (
            round(table[worst][method][0], 3),
            worst,
            round(statistics.mean(table[k][method][0] for k in STRONGER), 3),
        )
    below = [k for k, row in table.items() if row[CANDIDATE][2] < 0]
    lines += [
        "",
        *(f"{name}: worst {w:+.3f} ({k}), stronger agents' mean {s:+.3f}" for name, (w, k, s) in summary.items()),
    ]
    (wb, _, sb), (wn, _, sn) = summary["B"], summary["N"]
    if below:
        verdict = f"N loses: below GSPO beyond noise for {', '.join(below)}; B stays"
    elif sn > sb + TIE and wn >= wb - TIE:
        verdict = f"N replaces B: stronger mean {sn:+.3f} against {sb:+.3f}, worst {wn:+.3f} against {wb:+.3f}"
    else:
        verdict = f"B stays: stronger mean {sn:+.3f} against {sb:+.3f}, worst {wn:+.3f} against {wb:+.3f}"
    return lines, verdict


if __name__ == "__main__":
    lines, verdict = decide(gains([json.loads(path.read_text()) for path in SCREENS]))
    print("\n".join(lines + ["", f"**{verdict}**"]))
