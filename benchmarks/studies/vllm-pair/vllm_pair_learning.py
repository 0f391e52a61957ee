"""Does the built-in vllm pair learn its task within a few generation batches? Each agent's greedy accuracy on the
held-out problems before and after N generation batches of `recipes/tiny_vllm.yaml`, over several seeds, with the
mean gain and its 95% t-interval, at every evaluation point of the same runs.

    python benchmarks/studies/vllm-pair/vllm_pair_learning.py     # 12 seeds, 16 generation batches; the presets, the paper's rule, no sharing

Generation runs on transformers' generate (`--use_vllm false`): it samples from the same weights as the agents'
vLLM engines, which only change how fast a batch is drawn, and the main install has no vLLM. The runs are
`reproduce.py`'s (one launch, `_worker.py`; finished runs reused, recorded in `<out>/runs.jsonl.gz`), with the
recipe's schedule: 8 prompts x 4 completions per agent and generation batch. Evaluated on the first `eval_samples`
(the recipe's 100) problems of `arithmetic`'s held-out `test` split, which has no validation split: nothing is chosen
from these numbers.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the shared modules
import reproduce as rp  # noqa: E402
from _common import provenance, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
PAIR = "vllm"
# `--methods` names (the recipe's `sharing:` names) -> reproduce.py's method of the same settings
METHODS = {"recommended": rp.RECOMMENDED, "quarter_weight": rp.QUARTER_PRESET, "paper": "HACPO", "none": "GSPO"}
GENERATE = {"use_vllm": False}


def rows(entry: dict, method: str, sharing: str) -> list[str]:
    """One table row per agent of a `reproduce._report` pair entry: accuracy before and after per seed, and the mean
    gain with its 95% t-interval at each evaluation point (generation batches)."""
    out = []
    for agent in entry["agents"]:
        before, after = entry["accuracy_before"][agent], entry["accuracy"][agent][method]
        per_seed = ", ".join(f"{a:.2f}" for a in after)
        gains = [f"{n}: {d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for n, _, d, lo, hi in entry["curve"][agent][method] if n]
        learned = "yes" if entry["curve"][agent][method][-1][3] > 0 else "no"
        out.append(f"| {sharing} | {agent} | {before:.2f} | {per_seed} | {'; '.join(gains)} | {learned} |")
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(12)))
    parser.add_argument("--steps", type=int, default=16, help="generation batches per run")
    parser.add_argument("--eval_every", type=int, default=4, help="also evaluate every N generation batches")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--learning_rate", type=float, default=None, help="default: the recipe's")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/runs/vllm-pair-<steps>steps")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    args = parser.parse_args(argv)
    lr = "" if args.learning_rate is None else f"-lr{args.learning_rate:g}"
    args.out = args.out or ROOT / "benchmarks" / "runs" / f"vllm-pair-{args.steps}steps{lr}"
    # what reproduce.py's launch and report read from its command line
    args.split, args.pair_steps, args.device = "test", {}, "cpu"
    return args


def methods_of(args: argparse.Namespace) -> dict[str, tuple[dict, int, int]]:
    """reproduce.py's methods of the `--methods` named."""
    return {METHODS[m]: rp.METHODS[METHODS[m]] for m in args.methods}


def lines_for(args: argparse.Namespace, results: dict[str, dict[int, dict]]) -> list[str]:
    """The section's table from the runs' summaries (method -> seed -> summary)."""
    methods = methods_of(args)
    rollouts = {name: per_prompt * rp.PROMPTS_PER_STEP for name, (_, per_prompt, _) in methods.items()}
    entry = rp._report({PAIR: results}, args, methods, rollouts)["settings"][PAIR]
    seeds = f"{args.seeds[0]}–{args.seeds[-1]}" if len(args.seeds) > 1 else str(args.seeds[0])
    lines = [
        "## Does the vllm pair learn? (`benchmarks/studies/vllm-pair/vllm_pair_learning.py`, CPU)",
        "",
        f"`recipes/tiny_vllm.yaml` (learning rate {entry['learning_rate']:g}) on transformers' generate, "
        f"{args.steps} generation batches of 8 prompts x 4 completions per agent, seeds {seeds}; greedy accuracy "
        "on the first 100 held-out `test` problems of `arithmetic` before and after each run (the same problems, "
        "so the gain is paired by seed), and the mean gain after *n* generation batches with its 95% t-interval "
        "across seeds. *Learned*: the interval at the last point lies above 0. "
        + ", ".join(f"{name}: `{METHODS[name]}`" for name in args.methods)
        + ".",
        "",
        "| sharing | agent | before | after, per seed | mean gain [95% interval] after n batches | learned |",
        "|---|---|---|---|---|---|",
    ]
    for sharing in args.methods:
        lines += rows(entry, METHODS[sharing], sharing)
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (m, {**s, **GENERATE}, updates, seed) for m, (s, _, updates) in methods_of(args).items() for seed in args.seeds
    ]
    results = rp.run_pair(PAIR, jobs, args, time.perf_counter())
    lines = lines_for(args, results)
    trained = sum(run.get("_wall_seconds", 0.0) for by_seed in results.values() for run in by_seed.values())
    # the runs' own time (a rerun reuses them), as reproduce.py reports it
    lines += [
        "",
        provenance("studies/vllm-pair/vllm_pair_learning.py", sys.argv[1:] if argv is None else argv, trained),
    ]
    write_section(args.results, "vllm_pair_learning", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
