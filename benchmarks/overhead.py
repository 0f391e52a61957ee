"""What collaboration costs per training step: HACPO against the same agents trained apart (`share_rollouts: false`).

    python benchmarks/overhead.py            # n = 2, 3, 4 agents x G = 4, 8, 16 (about 10 min on 2 cores)
    python benchmarks/overhead.py --quick    # n = 2, G = 4 only

For each (n, G) two launches run the same built-in agents (alternating tiny-llama / tiny-qwen2) for the same steps
with 8 prompts x G completions per agent and step; each reports per-step wall time and where it goes (hacpo/time/*
from the trainer: generation, own scoring, own old log-probs, exchange transfer and wait, peer re-tokenization, loss
forward + backward, optimizer), peak RSS per process, and bytes exchanged. The first two logged steps are warm-up
and left out. With n processes on a 2-core machine the processes compete for cores: compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port, provenance, write_section  # noqa: E402

BUILTINS = ("builtin:tiny-llama", "builtin:tiny-qwen2")
STEPS_PER_GENERATION = 2  # optimizer steps per generation batch; per-generation times are spread over them
PER_GENERATION = {"generate", "score", "old_logps", "exchange_transfer", "exchange_wait", "retokenize_time"}
PARTS = (
    "generate",
    "score",
    "old_logps",
    "exchange_transfer",
    "exchange_wait",
    "retokenize_time",
    "loss_and_backward",
    "optimizer",
)


def _mean(entries: list[dict], key: str) -> float:
    values = [e[key] for e in entries if key in e]
    return statistics.mean(values) if values else 0.0


def run(n: int, g: int, share: bool, steps: int, work: Path) -> dict:
    """One launch; per-agent means over the logged steps after warm-up."""
    out = work / f"n{n}-g{g}-{'hacpo' if share else 'apart'}"
    recipe = yaml.safe_load((ROOT / "recipes" / "demo_cpu.yaml").read_text())
    recipe.update(
        agents=[{"name": f"a{i}", "model_name_or_path": BUILTINS[i % 2]} for i in range(n)],
        output_dir=str(out),
        num_generations=g,
        per_device_train_batch_size=8 * g // STEPS_PER_GENERATION,
        steps_per_generation=STEPS_PER_GENERATION,
        max_steps=steps,
        logging_steps=2,
        eval_samples=0,
        plot=False,
        share_rollouts=share,
        save_strategy="no",
    )
    path = work / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(n),
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        "-m", "hacpo_trl.train", "--config", str(path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[proc.stderr.find("Traceback") :][:3000] or proc.stderr[-3000:])
    summary = json.loads((out / "hacpo_summary.json").read_text())
    agents = {}
    for agent, info in summary.items():
        history = json.loads((out / agent / "log_history.json").read_text())
        logged = [e for e in history if "step_time" in e][1:]  # the first logged window is warm-up
        key = {part: f"hacpo/time/{part}" for part in PARTS} | {"retokenize_time": "hacpo/retokenize_time"}
        agents[agent] = {
            "step_time": _mean(logged, "step_time"),
            # per optimizer step: work done once per generation batch is spread over its optimizer steps
            "times": {
                part: _mean(logged, key[part]) / (STEPS_PER_GENERATION if part in PER_GENERATION else 1)
                for part in PARTS
            },
            "bytes": _mean(logged, "hacpo/exchange_bytes") / STEPS_PER_GENERATION,
            "peer_rows": _mean(logged, "hacpo/peer_rows"),
            "peer_kept": _mean(logged, "hacpo/peer_kept"),
            "peak_rss_mb": info["peak_rss_mb"],
        }
    return agents


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--agents", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--generations", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.agents, args.generations, args.steps = [2], [4], 6

    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.agents:
            for g in args.generations:
                print(f"[{time.perf_counter() - started:5.0f}s] n={n} G={g}", flush=True)
                hacpo = run(n, g, True, args.steps, Path(tmp))
                apart = run(n, g, False, args.steps, Path(tmp))
                rows.append((n, g, hacpo, apart))
    elapsed = time.perf_counter() - started

    def avg(per_agent: dict, *path: str) -> float:
        values = []
        for v in per_agent.values():
            for p in path:
                v = v[p]
            values.append(v)
        return statistics.mean(values)

    lines = [
        "## Cost of collaboration per step (`benchmarks/overhead.py`)",
        "",
        provenance("overhead.py", sys.argv[1:] if argv is None else argv, elapsed),
        "",
        f"{args.steps} steps, 8 prompts × G completions per agent and step, {STEPS_PER_GENERATION} optimizer updates "
        "per generation batch; the n processes share the machine's cores. Means over agents and logged steps after "
        "warm-up.",
        "",
        "| n | G | step s (apart) | step s (HACPO) | ratio | exchange transfer | waiting for peers | re-tokenize "
        "| loss+backward (apart → HACPO) | peer rows / self rows | peer rows kept | KiB exchanged / step | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, g, hacpo, apart in rows:
        step_h, step_a = avg(hacpo, "step_time"), avg(apart, "step_time")
        shares = {part: avg(hacpo, "times", part) / step_h for part in PARTS}
        lines.append(
            f"| {n} | {g} | {step_a:.3f} | {step_h:.3f} | {step_h / step_a:.2f} | {shares['exchange_transfer']:.1%} "
            f"| {shares['exchange_wait']:.1%} | {shares['retokenize_time']:.1%} "
            f"| {avg(apart, 'times', 'loss_and_backward'):.3f} → {avg(hacpo, 'times', 'loss_and_backward'):.3f} "
            f"| {avg(hacpo, 'peer_rows') / (8 * g):.2f} | {avg(hacpo, 'peer_kept'):.2f} "
            f"| {avg(hacpo, 'bytes') / 1024:.1f} | {avg(hacpo, 'peak_rss_mb'):.0f} |"
        )
    names = {"old_logps": "old log-probs", "exchange_wait": "waiting for peers", "retokenize_time": "re-tokenize",
             "exchange_transfer": "exchange transfer", "loss_and_backward": "loss+backward"}  # fmt: skip
    lines += [
        "",
        "Where a HACPO step's time goes, as shares of the step. Scoring the peer rows under the learner happens in "
        "*loss+backward* (a no-grad forward for the rows the band drops). *old log-probs* is the forward HACPO adds "
        "only when TRL has not computed the generator's log-probs itself; here TRL has (two updates per generation "
        "batch), and that forward is in *other*, with data collation, logging and the trainer loop.",
        "",
        "| n | G | " + " | ".join(names.get(part, part) for part in PARTS) + " | other |",
        "|---|---|" + "---|" * (len(PARTS) + 1),
    ]
    for n, g, hacpo, _ in rows:
        step_h = avg(hacpo, "step_time")
        shares = [avg(hacpo, "times", part) / step_h for part in PARTS]
        lines.append(f"| {n} | {g} | " + " | ".join(f"{s:.1%}" for s in shares) + f" | {1 - sum(shares):.1%} |")
    lines += [
        "",
        "Shares are of a HACPO optimizer step (work done once per generation batch is spread over its "
        f"{STEPS_PER_GENERATION} optimizer steps). *Waiting for peers* is idle time until the slowest agent reaches the exchange "
        "(agents of different sizes generate at different speeds); *exchange transfer* is the exchange itself.",
        "",
    ]
    write_section(args.results, "overhead", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
