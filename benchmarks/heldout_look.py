"""The held-out judge: the recommended preset against GSPO on `test`, beside GSPO's own gain over the start, judged by
the bars rule 19 declared before its runs (benchmarks/studies/rule19-headline).

    python benchmarks/heldout_look.py --runs benchmarks/screens/heldout-rule19/results.json \
        benchmarks/screens/heldout-rule19-complement/results.json

For each agent, paired by seed: GSPO − before and preset − GSPO, each with its two-sided t-interval at ``--level``
(95%). A table where GSPO does not improve an agent (the lower end of GSPO − before at or below 0) is refused: the
preset would be measured against a baseline that does not learn. Reports holding one pair on other seeds are pooled;
a seed in two reports is refused. Nothing is trained here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interval, provenance, resolved, write_section  # noqa: E402
from reproduce import RECOMMENDED, STRONGER  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ("state", "size", "model", "style", "complement", "equal")
Interval = tuple[float, float, float]  # mean, lower, upper
NAMES = {RECOMMENDED: "The recommended preset", "HACPO": "The paper's rule (`HACPO`)"}


def paired_gains(
    reports: list[dict], method: str
) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], list[float]], dict[str, list[int]]]:
    """Each (pair, agent)'s ``method`` − GSPO and GSPO − before by seed, pooled over the reports, and each pair's
    seeds; a seed of a pair in two reports is refused (a look's seeds are its own)."""
    diffs: dict[tuple[str, str], list[float]] = {}
    learned: dict[tuple[str, str], list[float]] = {}
    seeds: dict[str, list[int]] = {}
    for report in reports:
        for pair, entry in report["settings"].items():
            if method not in next(iter(entry["accuracy"].values())):
                continue
            if set(seeds.get(pair, [])) & set(entry["seeds"]):
                raise SystemExit(f"{pair}: seeds {sorted(set(seeds[pair]) & set(entry['seeds']))} in two reports")
            seeds.setdefault(pair, []).extend(entry["seeds"])
            for agent in entry["agents"]:
                acc, before = entry["accuracy"][agent], entry["accuracy_before"][agent]
                diffs.setdefault((pair, agent), []).extend(a - b for a, b in zip(acc[method], acc["GSPO"], strict=True))
                learned.setdefault((pair, agent), []).extend(g - before for g in acc["GSPO"])
    return diffs, learned, seeds


def check_regime(learned: dict[tuple[str, str], Interval]) -> None:
    """Refuse a table in which GSPO alone does not improve an agent over its start (interval not above 0)."""
    flat = [f"{pair}:{agent} ({mean:+.3f} [{low:+.3f}, {high:+.3f}])" for (pair, agent), (mean, low, high) in
            learned.items() if low <= 0]  # fmt: skip
    if flat:
        raise SystemExit(
            f"heldout_look: GSPO does not improve {', '.join(flat)} over its start: the preset would be measured "
            "against a baseline that does not learn; change the pair's steps or learning rate by a rule written "
            "before its runs, or leave the pair out"
        )


def judge(gains: dict[tuple[str, str], Interval]) -> dict[str, bool]:
    """Rule 19's bars on preset − GSPO (mean, lower, upper) per (pair, agent); the regime is checked before."""
    above = {key: low > 0 for key, (_, low, _) in gains.items()}
    three = [p for p in ("state", "size", "model") if any(k[0] == p for k in gains)]
    weaker = [above[k] for k in gains if k[0] in three and STRONGER[k[0]] != k[1]]
    stronger = [above[p, STRONGER[p]] for p in three if (p, STRONGER[p]) in gains]
    complement = [value for (pair, _), value in above.items() if pair == "complement"]
    return {
        "no agent below GSPO beyond noise": all(high >= 0 for _, _, high in gains.values()),
        "the weaker agent of state, size and model above GSPO": len(weaker) == 3 and all(weaker),
        "the stronger agents of at least two of state, size, model above GSPO": sum(stronger) >= 2,
        "both complement agents above GSPO": len(complement) == 2 and all(complement),
    }


def _role(pair: str, agent: str) -> str:
    if pair in STRONGER:
        return "stronger" if STRONGER[pair] == agent else "weaker"
    return ""


def lines_for(reports: list[dict], method: str, level: float, bars: bool = True) -> list[str]:
    diffs, learned, seeds = paired_gains(reports, method)
    if not diffs:
        raise SystemExit(f"no report holds the method {method!r}")
    gains = {key: interval(values, level) for key, values in diffs.items()}
    baseline = {key: interval(values, level) for key, values in learned.items()}
    check_regime(baseline)
    before = {(p, a): e["accuracy_before"][a] for r in reports for p, e in r["settings"].items() for a in e["agents"]}
    order = sorted(diffs, key=lambda k: (PAIRS.index(k[0]) if k[0] in PAIRS else len(PAIRS), _role(*k) != "stronger"))
    label = "preset" if method == RECOMMENDED else method
    out = [
        f"## {NAMES.get(method, f'`{method}`')} on held-out (`benchmarks/heldout_look.py`)",
        "",
        f"Greedy accuracy on the 500 `test` problems from the committed agents; per agent, paired by seed, the mean "
        f"and its {level:.0%} interval of GSPO − before and of `{method}` − GSPO.",
        "",
        f"| pair | agent | seeds | before | GSPO − before | {label} − GSPO | above GSPO | below GSPO |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for pair, agent in order:
        mean, low, high = gains[pair, agent]
        g_mean, g_low, g_high = baseline[pair, agent]
        role = _role(pair, agent)
        shown = f"`{agent}` ({role})" if role else f"`{agent}`"
        span = f"{min(seeds[pair])}–{max(seeds[pair])}"  # distinct seeds, one difference each (paired_gains)
        out.append(
            f"| {pair} | {shown} | {span} | {before[pair, agent]:.3f} | {g_mean:+.3f} [{g_low:+.3f}, {g_high:+.3f}] "
            f"| {mean:+.3f} [{low:+.3f}, {high:+.3f}] | {'yes' if low > 0 else 'no'} | {'yes' if high < 0 else 'no'} |"
        )
    if not bars:
        return out + ["", f"{len(order)} intervals, none corrected for their number; no bar is judged on this table."]
    out += [
        "",
        f"Bars (rule 19, declared before its runs; {len(order)} intervals, none corrected for their number):",
        "",
    ]
    out += ["- GSPO improves every agent over its start: **met** (a table where it does not is refused)"]
    out += [f"- {bar}: **{'met' if met else 'missed'}**" for bar, met in judge(gains).items()]
    return out


def figure(reports: list[dict], method: str, level: float, path: Path) -> None:
    """Each agent's preset − GSPO and GSPO − before, with their intervals, side by side (the README's figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    diffs, learned, _ = paired_gains(reports, method)
    order = sorted(diffs, key=lambda k: (PAIRS.index(k[0]) if k[0] in PAIRS else len(PAIRS), _role(*k) != "stronger"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.6), sharey=True, gridspec_kw={"width_ratios": [2, 1]})
    y = list(range(len(order)))[::-1]
    for ax, data, title, color in ((left, diffs, "recommended preset − GSPO", "C0"),
                                   (right, learned, "GSPO − start (what RL alone gives)", "C7")):  # fmt: skip
        stats = [interval(data[k], level) for k in order]
        ax.barh(y, [m for m, _, _ in stats], color=color, alpha=0.8, height=0.6)
        ax.errorbar([m for m, _, _ in stats], y, xerr=[[m - lo for m, lo, _ in stats], [hi - m for m, _, hi in stats]],
                    fmt="none", ecolor="black", capsize=3, lw=1)  # fmt: skip
        ax.axvline(0, color="black", lw=0.8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    left.set_yticks(y, [f"{p}: {a}" + (f" ({_role(p, a)})" if _role(p, a) else "") for p, a in order], fontsize=8)
    left.set_xlabel(f"held-out accuracy, mean over seeds, {level:.0%} interval")
    right.set_xlabel("held-out accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="results.json files of reproduce.py")
    parser.add_argument("--method", default=RECOMMENDED)
    parser.add_argument("--level", type=float, default=0.95, help="the level of every interval")
    parser.add_argument("--name", default="heldout_look", help="the section of --results written")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    parser.add_argument("--figure", type=Path, default=None, help="also draw the table as a PNG here")
    parser.add_argument("--no_bars", action="store_true", help="a description: judge no bar (another method)")
    args = parser.parse_args(argv)
    start = time.time()
    reports = [json.loads(resolved(str(path)).read_text()) for path in args.runs]
    lines = lines_for(reports, args.method, args.level, bars=not args.no_bars)
    lines += ["", provenance("heldout_look.py", argv if argv is not None else sys.argv[1:], time.time() - start)]
    write_section(args.results, args.name, lines)
    if args.figure is not None:
        figure(reports, args.method, args.level, resolved(str(args.figure)))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
