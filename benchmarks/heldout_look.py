"""A held-out look at the recommended preset, judged by the bars rule 17 declared before its runs (RESULTS.md).

    python benchmarks/heldout_look.py --runs benchmarks/heldout-rule17/*/results.json

Each agent's mean paired gain over GSPO (same seed: same prompts, same initial agents) with its 95% interval and
its interval at ``--level`` (97.5%: Bonferroni's split of 5% over the two declared looks). Files holding the same
pair on other seeds (a second look) are pooled. The bars, issue 45's: the stronger agents of at least two of
`state`, `size`, `model` above GSPO (interval above 0); both `complement` agents above GSPO; no agent of the five
pairs or `equal` below GSPO beyond noise (lower end >= -0.02 and mean >= 0). The moonshot: every agent of the five
pairs above GSPO. Nothing is trained here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import provenance, resolved, write_section  # noqa: E402
from reproduce import RECOMMENDED, STRONGER  # noqa: E402
from two_looks import interval  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIVE = ("state", "size", "model", "style", "complement")
NOISE = -0.02  # a lower end at or above this, with a mean at or above 0, is "not below GSPO beyond noise"

Gains = dict[tuple[str, str], tuple[float, float, float]]


def paired_gains(reports: list[dict], method: str) -> tuple[dict[tuple[str, str], list[float]], dict[str, list[int]]]:
    """Each (pair, agent)'s differences ``method`` − GSPO by seed, pooled over the reports, and each pair's seeds;
    a seed of a pair in two reports is refused (a look's seeds are its own)."""
    diffs: dict[tuple[str, str], list[float]] = {}
    seeds: dict[str, list[int]] = {}
    for report in reports:
        for pair, entry in report["settings"].items():
            if method not in next(iter(entry["accuracy"].values())):
                continue
            if set(seeds.get(pair, [])) & set(entry["seeds"]):
                raise SystemExit(f"{pair}: seeds {sorted(set(seeds[pair]) & set(entry['seeds']))} in two reports")
            seeds.setdefault(pair, []).extend(entry["seeds"])
            for agent in entry["agents"]:
                acc = entry["accuracy"][agent]
                diffs.setdefault((pair, agent), []).extend(a - b for a, b in zip(acc[method], acc["GSPO"], strict=True))
    return diffs, seeds


def judge(gains: Gains) -> dict[str, bool]:
    """The declared bars on (mean, lower, upper) per (pair, agent), at the look's level."""
    above = {key: low > 0 for key, (_, low, _) in gains.items()}
    stronger = [above[pair, STRONGER[pair]] for pair in ("state", "size", "model") if (pair, STRONGER[pair]) in gains]
    complement = [value for (pair, _), value in above.items() if pair == "complement"]
    judged = [key for key in gains if key[0] in (*FIVE, "equal")]
    return {
        "stronger agents above GSPO in at least two of state, size, model": sum(stronger) >= 2,
        "both complement agents above GSPO": len(complement) == 2 and all(complement),
        "no agent below GSPO beyond noise": all(gains[k][1] >= NOISE and gains[k][0] >= 0 for k in judged),
        "moonshot: every agent of the five pairs above GSPO": all(v for (p, _), v in above.items() if p in FIVE),
    }


def _role(pair: str, agent: str) -> str:
    if pair in STRONGER:
        return "stronger" if STRONGER[pair] == agent else "weaker"
    return ""


def lines_for(reports: list[dict], method: str, level: float) -> list[str]:
    diffs, seeds = paired_gains(reports, method)
    if not diffs:
        raise SystemExit(f"no report holds the method {method!r}")
    gains = {key: interval(values, level) for key, values in diffs.items()}
    pairs = [*FIVE, "equal"]
    order = sorted(diffs, key=lambda k: (pairs.index(k[0]) if k[0] in pairs else len(pairs), _role(*k) != "stronger"))
    out = [
        "## The recommended preset on held-out (`benchmarks/heldout_look.py`)",
        "",
        f"`{method}` − GSPO on `test`, paired by seed; mean, 95% interval, and the {level:.1%} interval the bars are "
        "judged by.",
        "",
        f"| pair | agent | seeds | mean | 95% interval | {level:.1%} interval | above 0 | not below beyond noise |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for pair, agent in order:
        values = diffs[pair, agent]
        mean, low95, high95 = interval(values, 0.95)
        _, low, high = gains[pair, agent]
        role = _role(pair, agent)
        shown = f"`{agent}` ({role})" if role else f"`{agent}`"
        span = f"{min(seeds[pair])}–{max(seeds[pair])}"  # distinct seeds, one difference each (paired_gains)
        out.append(
            f"| {pair} | {shown} | {span} | {mean:+.3f} | [{low95:+.3f}, {high95:+.3f}] | [{low:+.3f}, {high:+.3f}] "
            f"| {'yes' if low > 0 else 'no'} | {'yes' if low >= NOISE and mean >= 0 else 'no'} |"
        )
    out += ["", "Bars (issue 45, declared in rule 17):", ""]
    out += [f"- {bar}: **{'met' if met else 'missed'}**" for bar, met in judge(gains).items()]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="results.json files of reproduce.py")
    parser.add_argument("--method", default=RECOMMENDED)
    parser.add_argument("--level", type=float, default=0.975, help="the level each look is judged at")
    parser.add_argument("--name", default="heldout_look", help="the section of --results written")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    args = parser.parse_args(argv)
    start = time.time()
    reports = [json.loads(resolved(str(path)).read_text()) for path in args.runs]
    lines = lines_for(reports, args.method, args.level)
    lines += ["", provenance("heldout_look.py", argv if argv is not None else sys.argv[1:], time.time() - start)]
    write_section(args.results, args.name, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
