"""The held-out grid's section of benchmarks/RESULTS.md: what the grid's preset gave each agent against GSPO, next to
the paper's rule and Naive sharing, and what it cost, recomputed from the grid.

    python benchmarks/studies/grid/summary.py     # rewrites the `summary` section at the top of benchmarks/RESULTS.md

Accuracies come from `benchmarks/studies/grid/results.json` (the grid's command writes it); every pair in it gets its rows, so a
pair added to the grid appears here once the grid has run and this script runs again. The stronger agent of a pair
is `STRONGER` of `reproduce.py` (the agent built to the higher band of sampled accuracy, as HACPO's P̂ ranks it).
The gate's openings, the peer rows and the run times come from the grid's run records (`runs.jsonl.gz` in its
`--out` folder, committed: `_runs.py`); without a run's record those lines are left out. Nothing is trained here. `tests/test_docs.py` fails when the committed section differs from what this script writes.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the shared modules
import _runs  # noqa: E402
from _common import resolved, write_section  # noqa: E402
from reproduce import PRESET_METHODS, RECOMMENDED, STRONGER, _folder, mean_ci  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
COMPARED = (("the paper's rule", "HACPO"), ("Naive", "Naive"))


def _bound(x: float) -> str:
    """Three decimals, four where three would round a bound to 0 and hide its sign (the size pair's -0.0004)."""
    return f"{x:+.4f}" if x != 0 and abs(x) < 0.0005 else f"{x:+.3f}"


def _ci(mean: float, low: float, high: float) -> str:
    return f"{mean:+.3f} [{_bound(low)}, {_bound(high)}]"


def _diff(acc: dict[str, list[float]], method: str, against: str = "GSPO") -> tuple[str, int]:
    """Mean paired difference (by seed) with its 95% interval, and in how many seeds the two are equal."""
    diffs = [a - b for a, b in zip(acc[method], acc[against], strict=True)]
    return _ci(*mean_ci(diffs)), sum(d == 0 for d in diffs)


def _roles(pair: str, agents: list[str]) -> list[tuple[str, str]]:
    """The pair's agents, stronger first."""
    stronger = STRONGER.get(pair)
    if stronger not in agents:
        return [(agent, "") for agent in agents]
    return [(stronger, "stronger")] + [(a, "weaker") for a in agents if a != stronger]


def _runs_folder(report: dict) -> Path | None:
    """The grid's `--out` as its command records it (relative: to the repository root). A folder without run records
    stops the script: without them the gate and cost lines would silently go missing."""
    words = shlex.split(report.get("command", ""))
    if "--out" not in words:
        return None
    folder = resolved(words[words.index("--out") + 1])
    if not (folder / _runs.RECORDS).exists():
        raise SystemExit(
            f"summary: no run records at {folder / _runs.RECORDS} (the --out of results.json's command); record the "
            "folder relative to the repository root, or run the grid's command to make them"
        )
    return folder


def _gate_and_rows(
    runs: Path, pair: str, agent: str, seeds: list[int], preset: str
) -> tuple[int, int, list[float]] | None:
    """The preset's runs of one agent: generation batches at which it learned from a peer, of all batches, and the
    peer rows appended (after `peer_filter`) at those batches."""
    opened = batches = 0
    rows: list[float] = []
    for seed in seeds:
        run = _runs.record(_folder(runs, pair, preset, seed))
        if run is None or agent not in run["logs"]:
            return None
        for entry in _runs.batches(run["logs"][agent]):
            gates = [v for k, v in entry.items() if k.startswith("hacpo/learns_from/")]
            if not gates:
                continue
            batches += 1
            if any(v > 0 for v in gates):
                opened += 1
                rows.append(entry.get("hacpo/peer_rows", 0.0))
    return opened, batches, rows


def _wall(runs: Path, pair: str, method: str, seeds: list[int]) -> list[float] | None:
    times = []
    for seed in seeds:
        run = _runs.record(_folder(runs, pair, method, seed))
        if run is None:
            return None
        times.append(run["summary"]["_wall_seconds"])
    return times


def _preset_sentence(preset: str, settings: dict) -> str:
    """The grid's preset by its `sharing:` name and settings, and whether it is still the recommended one."""
    name = next((n for n, m in PRESET_METHODS.items() if m == preset), None)
    shown = ", ".join(f"`{k}: {str(v).lower() if isinstance(v, bool) else v}`" for k, v in settings.items())
    if preset == RECOMMENDED:
        return f"The grid's preset is the recommended one, `sharing: {name}` (`{preset}`): {shown}."
    return (
        f"The grid's preset is `sharing: {name}` (`{preset}`): {shown}; the recommended preset is now "
        "`sharing: recommended`, measured on held-out in the section above."
    )


def lines_for(report: dict) -> list[str]:
    preset = report.get("recommended")
    if preset not in PRESET_METHODS.values():
        raise SystemExit(f"results.json names the preset {preset!r}, which reproduce.py's PRESET_METHODS do not")
    settings = report["recommended_settings"]
    seeds = report["seeds"]
    out = [
        "## The held-out grid (`benchmarks/studies/grid/summary.py`)",
        "",
        _preset_sentence(preset, settings) + " Held-out greedy accuracy on the 500 `test` problems after RL, seeds "
        f"{seeds[0]}–{seeds[-1]} paired by seed (same prompts, same initial agents); each difference is a mean over "
        f"the {len(seeds)} seeds with its 95% t-interval. *Stronger* and *weaker* are by P̂, the sampled accuracy "
        "HACPO's gate compares (in the size pair the weaker agent decodes better greedily). *= GSPO*: seeds in which "
        "the preset's accuracy equals GSPO's exactly.",
        "",
        "| pair | agent | before | GSPO − before | **preset − GSPO** | = GSPO | "
        + " | ".join(f"{name} − GSPO" for name, _ in COMPARED)
        + " |",
        "|---|---|---|---|---|---|" + "---|" * len(COMPARED),
    ]
    runs = _runs_folder(report)
    gate_lines, cost_lines = [], []
    for pair, entry in report["settings"].items():
        acc_by_agent = entry["accuracy"]
        batches_of_pair = entry.get("steps", report.get("steps"))
        for agent, role in _roles(pair, entry["agents"]):
            acc = acc_by_agent[agent]
            before = entry["accuracy_before"][agent]
            gain = _ci(*mean_ci([a - before for a in acc["GSPO"]]))
            gain_of_preset, equal = _diff(acc, preset) if preset in acc else ("–", 0)
            others = [_diff(acc, method)[0] if method in acc else "–" for _, method in COMPARED]
            name = f"`{agent}` ({role})" if role else f"`{agent}`"
            out.append(
                f"| {pair} | {name} | {before:.3f} | {gain} | **{gain_of_preset}** | {equal}/{len(acc['GSPO'])} | "
                + " | ".join(others)
                + " |"
            )
            gate = _gate_and_rows(runs, pair, agent, entry["seeds"], preset) if runs and preset in acc else None
            if gate:
                opened, batches, rows = gate
                peer = f", {statistics.mean(rows):.1f} correct peer rows per open batch" if rows else ""
                gate_lines.append(f"- {pair}, `{agent}`: {opened} of {batches}{peer}")
        walls = {m: _wall(runs, pair, m, entry["seeds"]) for m in ("GSPO", preset)} if runs else {}
        if walls and all(walls.values()):
            ratios = [p / g for g, p in zip(walls["GSPO"], walls[preset], strict=True)]
            cost_lines.append(
                f"| {pair} | {batches_of_pair} | {statistics.median(walls['GSPO']):.1f} | "
                f"{statistics.median(walls[preset]):.1f} | {statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}–{max(ratios):.2f}) |"
            )
    if gate_lines:
        out += [
            "",
            "Generation batches at which each agent learned from its peer under the preset "
            "(`hacpo/learns_from/<peer>` = 1), all seeds:",
            "",
            *gate_lines,
        ]
    if cost_lines:
        out += [
            "",
            "Wall time of a whole run (both agents in one launch, each waiting for the other at every exchange; "
            "`_wall_seconds` of `hacpo_summary.json`), the preset against GSPO, paired by seed. The runs were made "
            "at different times on a shared 2-core machine whose load nobody controlled, so this is a rough "
            "figure, not a timing benchmark:",
            "",
            "| pair | generation batches | GSPO, median s | preset, median s | preset / GSPO, median (range) |",
            "|---|---|---|---|---|",
            *cost_lines,
        ]
    out += [
        "",
        f"Made by `python benchmarks/studies/grid/summary.py` from `benchmarks/studies/grid/results.json` ({report['command']}).",
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", type=Path, default=ROOT / "benchmarks" / "studies" / "grid" / "results.json")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "studies" / "grid" / "RESULTS.md")
    args = parser.parse_args(argv)
    lines = lines_for(json.loads(args.grid.read_text()))
    write_section(args.results, "summary", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
