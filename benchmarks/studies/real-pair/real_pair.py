"""The real pair, SmolLM2-135M-Instruct with Gemma-3-270M (`recipes/real_pair_cpu.yaml`), trained with the recommended
preset and with GSPO (`--sharing none`): each agent's held-out accuracy before and after, its seconds per generation
batch and its peak memory.

    python benchmarks/studies/real-pair/real_pair.py --seeds 0 --steps 40      # needs `make install-real-pair`

Each run is one `accelerate launch` of `hacpo_trl.train` on the recipe (one process per agent,
`accelerate_configs/cpu_2agents.yaml`) with `--sharing`, `--seed` and `--max_steps` set; a run whose
`hacpo_summary.json` exists is reused, so an interrupted study resumes. Accuracy is the trainer's own evaluation:
greedy, on the first `eval_samples` (the recipe's 300) problems of `arithmetic_fewshot`'s held-out `test` split, before
and after. That task has no validation split: nothing is chosen from these numbers. Seconds per generation batch:
TRL's `step_time` plus the optimizer's time over a batch's 2 updates, median over the batches after the first.
Peak memory: each agent process's maximum resident set size, as the run's summary records it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import free_port, provenance, write_section  # noqa: E402

RECIPE = ROOT / "recipes" / "real_pair_cpu.yaml"
AGENTS = ("smollm2-135m-instruct", "gemma3-270m")
LABELS = {"recommended": "preset (`recommended`)", "none": "GSPO (`none`)"}
UPDATES = 2  # the recipe's steps_per_generation


def run(out: Path, sharing: str, seed: int, steps: int) -> dict:
    summary = out / "hacpo_summary.json"
    if not summary.is_file():
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(ROOT / "accelerate_configs" / "cpu_2agents.yaml"),
            "--main_process_port", str(free_port()), "-m", "hacpo_trl.train", "--config", str(RECIPE),
            "--sharing", sharing, "--seed", str(seed), "--max_steps", str(steps), "--output_dir", str(out),
            "--overwrite_output_dir", "--plot", "false",
        ]  # fmt: skip
        start = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-4000:])
        print(f"  {sharing} seed {seed}: {time.time() - start:.0f} s", flush=True)
    data = json.loads(summary.read_text())
    result = {}
    for agent in AGENTS:
        history = json.loads((out / agent / "log_history.json").read_text())
        steps_logged = [e for e in history if "step_time" in e]
        batches = [steps_logged[i : i + UPDATES] for i in range(0, len(steps_logged), UPDATES)][1:]
        seconds = [sum(e["step_time"] + e.get("hacpo/time/optimizer", 0.0) for e in b) for b in batches]
        result[agent] = {
            "before": data[agent]["accuracy_before"],
            "after": data[agent]["accuracy_after"],
            "batch_s": statistics.median(seconds) if seconds else None,
            "peak_rss_mb": data[agent]["peak_rss_mb"],
        }
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["none", "recommended"], choices=sorted(LABELS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per run (2 per generation batch)")
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "runs" / "real-pair"), help="run folders (ignored by git)"
    )
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    args = parser.parse_args(argv)
    started = time.time()
    out = Path(args.out)
    results = {m: {s: run(out / f"{m}-seed{s}", m, s, args.steps) for s in args.seeds} for m in args.methods}
    record = {"steps": args.steps, "results": {m: {str(s): r for s, r in v.items()} for m, v in results.items()}}
    (Path(__file__).parent / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [
        "## The real pair: SmolLM2-135M-Instruct with Gemma-3-270M (`benchmarks/studies/real-pair/real_pair.py`, CPU)",
        "",
        f"`recipes/real_pair_cpu.yaml` (LoRA r 16 on both, 8 prompts x 8 completions per agent and generation batch, "
        f"2 updates of 32 own rows each), {args.steps // UPDATES} generation batches, seeds {', '.join(map(str, args.seeds))}; "
        "greedy accuracy on the first 300 held-out `test` problems of `arithmetic_fewshot` before and after "
        "(one machine's CPU: a demonstration, not a benchmark). s / batch: `step_time` + optimizer over a generation "
        "batch, median over the batches after the first; peak: each agent process's maximum resident set size.",
        "",
        "| sharing | agent | before | after, per seed | s / batch, per seed | peak RSS GiB, per seed |",
        "|---|---|---|---|---|---|",
    ]
    for method, by_seed in results.items():
        for agent in AGENTS:
            runs = [by_seed[s][agent] for s in args.seeds]
            lines.append(
                f"| {LABELS[method]} | {agent} | {runs[0]['before']:.3f} | "
                + ", ".join(f"{r['after']:.3f}" for r in runs)
                + " | "
                + ", ".join(f"{r['batch_s']:.1f}" for r in runs)
                + " | "
                + ", ".join(f"{r['peak_rss_mb'] / 1024:.2f}" for r in runs)
                + " |"
            )
    recorded = [a if not os.path.isabs(a) else os.path.relpath(a, ROOT) for a in (argv or sys.argv[1:])]
    lines += ["", provenance("studies/real-pair/real_pair.py", recorded, time.time() - started)]
    write_section(Path(args.results), "real_pair", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
