"""Three agents at once with the preset of rule 7 (`FORMER_PRESET`, recommended until rule 13; issue 18, stretch):
the state pair's two agents and the size pair's `trace-small` (`recipes/tiny_three.yaml`), each compared, seed by seed, with its own pair's runs of the
held-out grid (GSPO and the preset with two agents; `benchmarks/reproduce.py` makes them).

    python benchmarks/studies/three-agents/three_agents.py            # 8 seeds, 48 generation batches, on `test`; resumes finished runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the shared modules
import _runs  # noqa: E402
import reproduce as rp  # noqa: E402
from _common import free_port, provenance, write_section  # noqa: E402

AGENTS = {"trace-instruct": "state", "trace-base": "state", "trace-small": "size"}  # agent -> its two-agent pair


def _accuracies(out: Path, pair: str, method: str, seeds: list[int], agent: str, batches: int) -> list[float]:
    """The agent's held-out accuracy after ``batches`` generation batches: at the end of the run, or the evaluation
    of a longer run at that point (the size pair runs 64 batches, RESULTS.md rule 5; its curve has 48)."""
    runs = [_runs.record(rp._folder(out, pair, method, s))["summary"] for s in seeds]
    step = batches * rp.UPDATES[method]  # curves count optimizer steps
    return [dict(run[agent]["curve"])[step] for run in runs]


def _paired(a: list[float], b: list[float]) -> str:
    diff = [x - y for x, y in zip(a, b, strict=True)]
    mean = statistics.mean(diff)
    half = rp.T_975[len(diff) - 1] * statistics.stdev(diff) / len(diff) ** 0.5
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def rows(out: Path, seeds: list[int], steps: int) -> list[str]:
    """The table's rows: each agent at ``steps`` generation batches, from the runs' records."""
    lines = []
    for agent, pair in AGENTS.items():
        gspo, two, three = (
            _accuracies(out, p, m, seeds, agent, steps)
            for p, m in ((pair, "GSPO"), (pair, rp.FORMER_PRESET), ("three", rp.FORMER_PRESET))
        )
        means = " | ".join(f"{statistics.mean(x):.3f}" for x in (gspo, two, three))
        lines.append(f"| {agent} | {pair} | {means} | {_paired(three, gspo)} | {_paired(three, two)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    parser.add_argument("--steps", type=int, default=48, help="generation batches per run")
    parser.add_argument("--eval_every", type=int, default=16)
    parser.add_argument("--split", default="test", choices=["test", "validation"])
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/runs/<split>-<steps>steps-b3")
    parser.add_argument(
        "--results", type=Path, default=rp.ROOT / "benchmarks" / "studies" / "three-agents" / "RESULTS.md"
    )
    args = parser.parse_args(argv)
    args.out = args.out or rp.ROOT / "benchmarks" / "runs" / f"{args.split}-{args.steps}steps-b3"
    args.learning_rate, args.pair_steps = None, {}  # the recipe's rates (trace-small's is its pair's, 5e-5)
    settings, _, updates = rp.METHODS[rp.FORMER_PRESET]
    needed = [(pair, m) for pair in set(AGENTS.values()) for m in ("GSPO", rp.FORMER_PRESET)]
    missing = [
        f"{pair}/{m}" for pair, m in needed if _runs.record(rp._folder(args.out, pair, m, args.seeds[-1])) is None
    ]
    if missing:
        raise SystemExit(
            f"three_agents: the two-agent runs {missing} are missing in {args.out}: run reproduce.py first"
        )

    todo = [s for s in args.seeds if _runs.record(rp._folder(args.out, "three", rp.FORMER_PRESET, s)) is None]
    (args.out / "three").mkdir(parents=True, exist_ok=True)
    built = {**rp._built_agents("state"), **rp._built_agents("size")}
    (args.out / "three" / rp.AGENTS_RECORD).write_text(json.dumps({a: built[a] for a in AGENTS}, indent=1))
    if todo:
        jobs = args.out / "three-jobs.json"
        jobs.write_text(json.dumps([rp._argv("three", rp.FORMER_PRESET, settings, updates, s, args) for s in todo]))
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(rp.ROOT / "accelerate_configs" / "cpu_3agents.yaml"),
            "--main_process_port", str(free_port()), str(rp.ROOT / "benchmarks" / "_worker.py"), str(jobs),
        ]  # fmt: skip
        with open(args.out / "three-worker.log", "w") as log:
            subprocess.run(cmd, stderr=log, check=True)

    runs = [_runs.record(rp._folder(args.out, "three", rp.FORMER_PRESET, s))["summary"] for s in args.seeds]
    run_seconds = sum(run.get("_wall_seconds", 0.0) for run in runs)  # of the runs, resumed or not
    lines = [
        "## Three agents at once (`benchmarks/studies/three-agents/three_agents.py`)",
        "",
        provenance("studies/three-agents/three_agents.py", sys.argv[1:] if argv is None else argv, run_seconds),
        "",
        f"The recommended preset (`{rp.FORMER_PRESET}`) with `trace-instruct`, `trace-base` and `trace-small` in one run "
        f"(`recipes/tiny_three.yaml`), {args.steps} generation batches, {args.split} split, seeds {args.seeds}. Each "
        "agent against its own pair's two-agent runs with the same seeds, at the same number of generation batches "
        "(the size pair's runs are longer: their evaluation at that point), paired 95% intervals:",
        "",
        "| agent | its pair | GSPO | preset, two agents | preset, three agents | three − GSPO | three − two |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += rows(args.out, args.seeds, args.steps)
    write_section(args.results, "three_agents", lines + [""])
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
