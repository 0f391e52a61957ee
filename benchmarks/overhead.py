"""What a step costs: GSPO, HACPO and GSPO×2 side by side on the paper-regime pairs, same machine, one run.

    python benchmarks/overhead.py            # the grid's four pairs, 5 generation batches per run (about 15 min on 2 cores)
    python benchmarks/overhead.py --quick    # the size pair (or --pairs ...), 3 generation batches per run
    python benchmarks/overhead.py --preset --steps 5 --reps 5   # GSPO against `sharing: recommended`, five pairs

Each pair (`recipes/tiny_<pair>.yaml`, the built-in warm-started agents) runs the three methods with the schedules of
`benchmarks/reproduce.py` (8 prompts per step): GSPO draws 8 completions per prompt and trains on them (2 updates per
generation batch); HACPO draws 8, exchanges them, and trains on its own 64 rows plus the peer's 64 (4 updates);
GSPO×2 draws 16 and trains on its own 128 (4 updates). All runs of a pair share one `accelerate launch` (one process
per agent, `_worker.py`); the methods' order rotates from pair to pair, and the load average is recorded beside each
run, so load from other processes on a shared machine falls on every method. The first generation batch of every
run is warm-up and left out.

`--preset` runs GSPO and GSPO's recipe with the line `sharing: recommended` (its batching unchanged: 2 updates of 32
own rows per generation batch, taught rows joining them) alternately in one launch per pair, `--reps` times each, and reports the ratio per repetition, over
every batch and over the batches at which no agent was taught a prompt (its own section of RESULTS.md).

Wall time per generation batch is the sum of TRL's `step_time` (generation, scoring, exchange, every forward and
backward) and the optimizer step over the batch's updates; per trained row divides it by the rows an agent trains
on per generation batch.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "src"))
from _common import command, free_port, provenance, resolved, write_section  # noqa: E402
from reproduce import GRID_PAIRS, METHODS, _flags  # noqa: E402

from hacpo_trl.agents.demo import PAIRS  # noqa: E402

COMPARED = ("GSPO", "HACPO", "GSPO×2")
ROWS = {"GSPO": 64, "HACPO": 128, "GSPO×2": 128}  # rows one agent trains on per generation batch
# `--preset`: GSPO against GSPO's recipe plus the line `sharing: recommended`, as a user runs it (GSPO's batching;
# the same optimizer steps as the benchmark's solo schedule, `behaviour-check-preset/`)
PRESET = "recommended"
_GSPO, _, _GSPO_UPDATES = METHODS["GSPO"]
PRESET_RUN = ({**_GSPO, "share_rollouts": True, "sharing": PRESET}, _GSPO_UPDATES)
PRESET_PAIRS = ["state", "size", "model", "style", "complement"]
PARTS = ("generate", "exchange_wait", "exchange_transfer", "loss_and_backward")


def _run_dir(work: Path, pair: str, method: str) -> Path:
    return work / pair / method.replace("×", "x")


def _per_batch(steps: list[dict], key: str, updates: int) -> float:
    """Mean per generation batch of a logged time (the logs are per optimizer step, ``updates`` per batch)."""
    return sum(e.get(key, 0.0) for e in steps) * updates / max(len(steps), 1)


def _job(pair: str, out: Path, batches: int, settings: dict, updates: int) -> list[str]:
    """One run's `hacpo-train` arguments: ``batches`` generation batches of ``updates`` optimizer steps, no eval."""
    return [
        "--config", str(ROOT / "recipes" / f"tiny_{pair}.yaml"), "--output_dir", str(out),
        "--max_steps", str(batches * updates), "--eval_samples", "0", "--plot", "false", "--logging_steps", "1",
        "--save_strategy", "no", *_flags(settings),
    ]  # fmt: skip


def _launch(pair: str, jobs: list[list[str]], labels: list[str], work: Path) -> dict[str, list[float]]:
    """Run ``jobs`` (one label each) in one launch; the 1-minute load average at each job's start and end."""
    jobs_file = work / f"{pair}-jobs.json"
    jobs_file.parent.mkdir(parents=True, exist_ok=True)
    jobs_file.write_text(json.dumps(jobs))
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "accelerate_configs" / "cpu_2agents.yaml"),
        "--main_process_port", str(free_port()), str(ROOT / "benchmarks" / "_worker.py"), str(jobs_file),
    ]  # fmt: skip
    loads = {}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pending = list(labels)
    loads[pending[0]] = [os.getloadavg()[0]]
    for line in proc.stdout:
        if line.startswith("done: ") and pending:
            finished = pending.pop(0)
            loads[finished].append(os.getloadavg()[0])
            print(f"  {pair}: {finished} done", flush=True)
            if pending:
                loads[pending[0]] = [os.getloadavg()[0]]
    stderr = proc.stderr.read()
    if proc.wait() != 0:
        raise RuntimeError(stderr[stderr.find("Traceback") :][:3000] or stderr[-3000:])
    return loads


def run_pair(pair: str, order: tuple[str, ...], batches: int, work: Path) -> dict[str, dict]:
    """The three methods of one pair in one launch; per agent: means over generation batches after the first."""
    jobs = [_job(pair, _run_dir(work, pair, m), batches, METHODS[m][0], METHODS[m][2]) for m in order]
    loads = _launch(pair, jobs, list(order), work)
    out = {}
    for method in order:
        updates = METHODS[method][2]
        agents = {}
        for agent in PAIRS[pair]:
            history = json.loads((_run_dir(work, pair, method) / agent / "log_history.json").read_text())
            steps = [e for e in history if "step_time" in e][updates:]  # the first generation batch is warm-up
            agents[agent] = {
                "batch_s": _per_batch(steps, "step_time", updates) + _per_batch(steps, "hacpo/time/optimizer", updates),
                "parts": {p: _per_batch(steps, f"hacpo/time/{p}", updates) for p in PARTS},
            }
        out[method] = {"agents": agents, "load": loads.get(method, [float("nan")])}
    return out


def batch_times(history: list[dict], updates: int) -> list[tuple[float, bool]]:
    """Per generation batch after the first (warm-up): its wall time (TRL's `step_time` + optimizer over its
    ``updates`` optimizer steps, skipped ones included) and whether the learner was taught a prompt at it."""
    batches: dict[int, tuple[float, bool]] = {}
    for e in history:
        if "step" not in e or ("step_time" not in e and "hacpo/time/optimizer" not in e):
            continue
        b = (e["step"] - 1) // updates
        seconds, taught = batches.get(b, (0.0, False))
        taught |= any(v > 0 for k, v in e.items() if k.startswith("hacpo/taught_prompts/"))
        batches[b] = (seconds + e.get("step_time", 0.0) + e.get("hacpo/time/optimizer", 0.0), taught)
    return [batches[b] for b in sorted(batches) if b > 0]


def preset_ratios(reps: list[dict[str, dict[str, list[tuple[float, bool]]]]]) -> dict[str, dict]:
    """Per agent, from each repetition's ``{"GSPO"|PRESET: {agent: batch_times}}`` (same seed, so batch ``b`` of
    both runs draws the same prompts): seconds per batch of each method and the ratio preset / GSPO per repetition,
    over every batch and over the batches at which no agent of the pair was taught (pair-level: the agents wait for
    each other at the exchange), each the ratio of summed times over the same batches."""
    out: dict[str, dict] = {}
    for rep in reps:
        gspo, preset = rep["GSPO"], rep[PRESET]
        n = min(len(t) for runs in (gspo, preset) for t in runs.values())
        untaught = [b for b in range(n) if not any(preset[a][b][1] for a in preset)]
        for agent in gspo:
            g, q = [t for t, _ in gspo[agent][:n]], [t for t, _ in preset[agent][:n]]
            r = out.setdefault(agent, {"gspo_s": [], "preset_s": [], "overall": [], "untaught": [], "batches": [0, 0]})
            r["gspo_s"].append(sum(g) / n)
            r["preset_s"].append(sum(q) / n)
            r["overall"].append(sum(q) / sum(g))
            if untaught:
                r["untaught"].append(sum(q[b] for b in untaught) / sum(g[b] for b in untaught))
            r["batches"][0] += len(untaught)
            r["batches"][1] += n
    return out


def _spread(values: list[float]) -> str:
    """Median [min–max] of a ratio over repetitions."""
    if not values:
        return "–"
    return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"


def run_preset_pair(pair: str, reps: int, batches: int, work: Path) -> dict:
    """GSPO and the preset alternating in one launch (A B, B A, ...), repetition ``i`` on seed ``i`` for both: each
    repetition's batch times, each run's whole training time (TRL's `train_runtime`, warm-up batch included) and the
    load average at each method's runs' starts and ends."""
    runs = {"GSPO": (METHODS["GSPO"][0], METHODS["GSPO"][2]), PRESET: PRESET_RUN}
    jobs, labels = [], []
    for i in range(reps):
        for method in ("GSPO", PRESET)[:: 1 if i % 2 == 0 else -1]:
            settings, updates = runs[method]
            jobs.append(_job(pair, work / pair / f"{method}-rep{i}", batches, {**settings, "seed": i}, updates))
            labels.append(f"{method}#{i}")
    loads = _launch(pair, jobs, labels, work)
    reps_out, runtimes = [], []
    for i in range(reps):
        logs = {
            m: {a: json.loads((work / pair / f"{m}-rep{i}" / a / "log_history.json").read_text()) for a in PAIRS[pair]}
            for m in runs
        }
        reps_out.append({m: {a: batch_times(h, runs[m][1]) for a, h in logs[m].items()} for m in runs})
        runtimes.append({m: {a: next(e["train_runtime"] for e in h if "train_runtime" in e) for a, h in logs[m].items()}
                         for m in runs})  # fmt: skip
    by_method = {m: [x for label, v in loads.items() if label.startswith(m + "#") for x in v] for m in runs}
    return {"reps": reps_out, "runtimes": runtimes, "loads": by_method}


def summed_ratio(reps: list[dict], agent: str | None = None, draws: int = 2000) -> tuple[float, float, float]:
    """Preset / GSPO of the time summed over every measured batch of every repetition (of ``agent``, or of every
    agent), and a 95% bootstrap interval over the repetitions (each resampled whole, a fixed seed): a quieter measure
    than the median of per-repetition ratios, as one slow batch weighs by its seconds, not as a repetition."""
    import random

    def sums(rep: dict) -> tuple[float, float]:
        agents = [agent] if agent else list(rep["GSPO"])
        n = min(len(t) for runs in rep.values() for t in runs.values())
        return tuple(sum(t for a in agents for t, _ in rep[m][a][:n]) for m in ("GSPO", PRESET))

    pairs = [sums(rep) for rep in reps]
    ratio = sum(q for _, q in pairs) / sum(g for g, _ in pairs)
    rng = random.Random(0)
    boot = []
    for _ in range(draws):
        pick = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        boot.append(sum(q for _, q in pick) / sum(g for g, _ in pick))
    boot.sort()
    return ratio, boot[int(0.025 * draws)], boot[int(0.975 * draws) - 1]


def preset_lines(results: dict[str, dict], args: argparse.Namespace, argv: list[str], elapsed: float) -> list[str]:
    """The `--preset` section of RESULTS.md from :func:`run_preset_pair`'s results per pair."""
    lines = [
        "## Cost of the recommended preset against GSPO (`benchmarks/overhead.py --preset`)",
        "",
        provenance("overhead.py", argv, elapsed),
        "",
        f"Per pair one launch running GSPO and GSPO's recipe with `sharing: {PRESET}` alternately (A B, B A, …), "
        "GSPO's batching unchanged (2 updates of 32 own rows per generation batch, taught rows joining them), "
        f"{args.reps} repetitions, repetition i on seed i for both; {args.steps} generation batches per run, the "
        "first left out as warm-up. s / batch: TRL's `step_time` + optimizer, summed over a generation batch's "
        "updates, mean over the measured batches, median over repetitions. Ratio: preset / GSPO over the same "
        "batches of one repetition, median [min–max] over repetitions; *untaught*: only the batches at which no "
        "agent of the pair was taught a prompt (`hacpo/taught_prompts/<peer>` 0; the agents wait for each other at "
        "the exchange, so one taught agent slows both), with how many of the measured batches those were; *whole "
        "run*: TRL's `train_runtime` (every batch, the warm-up included, and the Trainer's work between steps). "
        "Load: the machine's 1-minute load average at the starts and ends of the method's runs, min–max. The "
        "machine is a shared 2-core CPU that other work was loading during the runs (load well above its 2 cores): "
        "the ratio within a pair is the measure, the absolute times are not.",
        "",
        "| pair | agent | GSPO s / batch | preset s / batch | ratio overall | summed ratio [95%] | ratio untaught "
        "| untaught batches | ratio whole run | load GSPO | load preset |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    pooled: dict[str, list[float]] = {"overall": [], "untaught": [], "run": []}
    for pair, res in results.items():
        for agent, r in preset_ratios(res["reps"]).items():
            run = [t[PRESET][agent] / t["GSPO"][agent] for t in res["runtimes"]]
            pooled["overall"] += r["overall"]
            pooled["untaught"] += r["untaught"]
            pooled["run"] += run
            load = {m: f"{min(v):.1f}–{max(v):.1f}" if v else "–" for m, v in res["loads"].items()}
            summed = "{:.2f} [{:.2f}, {:.2f}]".format(*summed_ratio(res["reps"], agent))
            lines.append(
                f"| {pair} | {agent} | {statistics.median(r['gspo_s']):.2f} | {statistics.median(r['preset_s']):.2f} "
                f"| {_spread(r['overall'])} | {summed} | {_spread(r['untaught'])} | {r['batches'][0]} / "
                f"{r['batches'][1]} | {_spread(run)} | {load['GSPO']} | {load[PRESET]} |"
            )
    every = [rep for res in results.values() for rep in res["reps"]]
    lines += [
        "",
        f"All agents and repetitions ({', '.join(results)}): ratio overall {_spread(pooled['overall'])}, summed "
        "{:.2f} [{:.2f}, {:.2f}]".format(*summed_ratio(every))
        + f", untaught {_spread(pooled['untaught'])}, whole run "
        f"{_spread(pooled['run'])} (goal: ≤ 1.10 overall, ≤ 1.05 untaught). Summed: the time of every measured batch "
        "of every repetition, preset over GSPO, with a 95% bootstrap interval over the repetitions; single "
        "repetitions spread as the [min–max] show, so only the summed ratio's interval is read against the goal.",
        "",
    ]
    return lines


def preset_main(args: argparse.Namespace, argv: list[str]) -> int:
    """`--preset`: the preset's cost per pair; the section is rewritten after every pair, so a cut-short run keeps
    the pairs it finished."""
    started = time.perf_counter()
    if args.from_raw is not None:  # the section again from the committed timings, nothing run
        raw = json.loads(resolved(str(args.from_raw)).read_text())
        args.reps, args.steps = raw["reps"], raw["steps"]
        lines = preset_lines(raw["pairs"], args, shlex.split(raw["command"])[2:], raw["elapsed"])
        write_section(args.results, "overhead-preset", lines)
        print("\n".join(lines))
        return 0
    results = {}
    raw_path = args.raw or args.results.parent / "overhead-preset.json"
    with tempfile.TemporaryDirectory() as tmp:
        for pair in args.pairs:
            print(f"[{time.perf_counter() - started:5.0f}s] {pair}: {args.reps} x GSPO, {PRESET}", flush=True)
            results[pair] = run_preset_pair(pair, args.reps, args.steps, Path(tmp))
            elapsed = time.perf_counter() - started
            lines = preset_lines(results, args, argv, elapsed)
            write_section(args.results, "overhead-preset", lines)
            raw = {"command": command("overhead.py", argv), "reps": args.reps, "steps": args.steps, "elapsed": elapsed,
                   "pairs": results}  # fmt: skip
            raw_path.write_text(json.dumps(raw, separators=(",", ":")) + "\n")  # every batch's seconds, per rep
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--pairs", nargs="+", choices=list(PAIRS), default=None, help="default: the grid's pairs; size with --quick"
    )
    parser.add_argument("--steps", type=int, default=5, help="generation batches per run (the first is warm-up)")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    parser.add_argument("--preset", action="store_true", help=f"GSPO against `sharing: {PRESET}`, repeated")
    parser.add_argument("--reps", type=int, default=5, help="--preset: repetitions per pair")
    parser.add_argument("--raw", type=Path, default=None, help="--preset: its timings (default: beside --results)")
    parser.add_argument("--from_raw", type=Path, default=None, help="--preset: the section from committed timings")
    args = parser.parse_args(argv)
    if args.preset:
        args.pairs, args.steps = args.pairs or PRESET_PAIRS, max(args.steps, 2)
        return preset_main(args, sys.argv[1:] if argv is None else argv)
    if args.quick:
        args.pairs, args.steps = args.pairs or ["size"], min(args.steps, 3)
    args.pairs = args.pairs or GRID_PAIRS
    args.steps = max(args.steps, 2)

    started = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, pair in enumerate(args.pairs):
            order = COMPARED[i % 3 :] + COMPARED[: i % 3]
            print(f"[{time.perf_counter() - started:5.0f}s] {pair}: {', '.join(order)}", flush=True)
            results[pair] = run_pair(pair, order, args.steps, Path(tmp))
    elapsed = time.perf_counter() - started

    lines = [
        "## Cost of a step: GSPO, HACPO and GSPO×2 (`benchmarks/overhead.py`)",
        "",
        provenance("overhead.py", sys.argv[1:] if argv is None else argv, elapsed),
        "",
        f"{args.steps} generation batches per run (the first left out as warm-up), 8 prompts per step, one process "
        "per agent on the 2 shared cores; both agents of a pair run at once, so each one's time includes waiting "
        "for the other at the exchange. Per agent: wall time per generation batch (TRL's `step_time` + optimizer, "
        "summed over the batch's updates), per trained row (÷ the rows the agent trains on per generation batch: "
        "GSPO 64, HACPO 64 own + 64 peer, GSPO×2 128), and the share of the batch spent generating and waiting for "
        "the peer. Load: 1-minute load average when the run started → ended.",
        "",
        "| pair | agent | method | s / generation batch | ms / trained row | generating | waiting for peer "
        "| exchange | loss+backward | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for pair, methods in results.items():
        for agent in PAIRS[pair]:
            for method in COMPARED:
                r = methods[method]["agents"][agent]
                parts = {p: r["parts"][p] / r["batch_s"] for p in PARTS}
                load = methods[method]["load"]
                lines.append(
                    f"| {pair} | {agent} | {method} | {r['batch_s']:.2f} | {1000 * r['batch_s'] / ROWS[method]:.1f} "
                    f"| {parts['generate']:.0%} | {parts['exchange_wait']:.0%} | {parts['exchange_transfer']:.1%} "
                    f"| {parts['loss_and_backward']:.0%} | {' → '.join(f'{x:.1f}' for x in load)} |"
                )
    lines += [
        "",
        "What does not carry over to GPU:",
        "",
        "- **Generation's share.** Here generation is a Python loop of HF `generate` over tiny models, a few seconds per "
        "batch; on GPU vLLM generates 4k-token traces in batches and dominates the step far more (the review's "
        "estimate: well over half of a step). GSPO×2 pays that twice; HACPO's extra cost is training on the peer "
        "rows, so on GPU HACPO sits closer to GSPO per generation batch than it does here.",
        "- **Waiting for the peer.** The tiny agents differ by ~10× in compute but on CPU both are dominated by "
        "per-layer overhead, so the waiting here is set by layers and Python, not FLOPs; on GPU it follows the FLOPs "
        "ratio (1.7B vs 4B: ~57% idle for the smaller agent on 4 + 4 GPUs, see `--plan`'s balance lines) and is "
        "removed by the suggested split, which a 2-core CPU cannot show.",
        "- **Exchange.** Gloo over loopback moves a few KiB of text per batch; across GPU nodes it is still text (not "
        "tensors), so it stays small, but network latency replaces loopback.",
        "- **Padding.** The trace completions are at most 40 tokens, so trimming barely matters here; with 4k-token "
        "long-tailed traces the padded forwards cost ~2-3× (`benchmarks/studies/padding/padding.py`).",
        "- **Contention.** Two agents share 2 cores with other jobs; on GPU every agent has its own devices.",
        "",
    ]
    write_section(args.results, "overhead", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
