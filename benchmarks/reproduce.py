"""The paper's Table 1 and ablations in miniature: the two built-in tiny agents on the built-in arithmetic task.

    python benchmarks/reproduce.py            # the full grid: 5 methods + 7 ablations x 3 seeds (about 25 min, 2 cores)
    python benchmarks/reproduce.py --quick    # 1 seed, 30 steps, a few methods (a few minutes)

Every method starts from the same two warm-started agents, sees the same prompt stream (seeded), trains for the
same number of steps and is evaluated the same way: greedy accuracy on the 300 held-out problems, which no method
(and no hyperparameter choice) ever trains on. Hyperparameters are the demo recipe's for every method.

Methods (paper §4): GRPO (token-level ratio, ε 0.2/0.28), GSPO (sequence ratio, ε 3e-4/4e-4), GSPO×2 (twice the
rollouts per prompt, as many optimizer updates as HACPO), Naive sharing, HACPO; ablations: no capability-aware
baseline, no capability coefficient, α ∈ {0, 2, 3}, no stepwise clipping (fixed bound), no peer clipping.
Baselines train each agent on its own (`share_rollouts: false`) in the same launch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port, provenance, write_section  # noqa: E402

AGENTS = ("tiny-llama", "tiny-qwen2")
PROMPTS_PER_STEP = 8

# name -> (recipe overrides, own rollouts per prompt and step, optimizer updates per step)
METHODS: dict[str, tuple[dict, int, int]] = {
    "GRPO": (
        {"share_rollouts": False, "importance_sampling_level": "token", "epsilon": 0.2, "epsilon_high": 0.28,
         "per_device_train_batch_size": 64, "steps_per_generation": 1},
        8, 1,
    ),
    "GSPO": ({"share_rollouts": False, "per_device_train_batch_size": 64, "steps_per_generation": 1}, 8, 1),
    "GSPO×2": (
        {"share_rollouts": False, "num_generations": 16, "per_device_train_batch_size": 64, "steps_per_generation": 2},
        16, 2,
    ),
    "Naive": ({"naive": True}, 8, 2),
    "HACPO": ({}, 8, 2),
}  # fmt: skip
ABLATIONS: dict[str, dict] = {
    "w/o capability-aware baseline": {"capability_baseline": False},
    "w/o capability coefficient": {"capability_coefficient": False},
    "α = 0": {"alpha": 0.0},
    "α = 2": {"alpha": 2.0},
    "α = 3": {"alpha": 3.0},
    "w/o stepwise (fixed bound)": {"peer_delta_step": 0.0},
    "w/o peer clipping": {"peer_clipping": False},
}


def _flags(settings: dict) -> list[str]:
    out = []
    for key, value in settings.items():
        out += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return out


def run_one(name: str, settings: dict, seed: int, steps: int, eval_every: int, out: Path) -> dict:
    """One launch of both agents; returns hacpo_summary.json (accuracy before/after and the learning curve)."""
    folder = out / f"{name.replace(' ', '_').replace('/', '')}-seed{seed}"
    summary = folder / "hacpo_summary.json"
    if summary.exists():  # resume an interrupted grid
        return json.loads(summary.read_text())
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "accelerate_configs" / "cpu_2agents.yaml"), "--main_process_port", str(free_port()),
        "-m", "hacpo_trl.train", "--config", str(ROOT / "recipes" / "demo_cpu.yaml"),
        "--output_dir", str(folder), "--seed", str(seed), "--max_steps", str(steps), "--plot", "false",
        "--eval_every", str(eval_every), "--logging_steps", "10",
        *_flags(settings),
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = proc.stderr[proc.stderr.find("Traceback") :][:3000] or proc.stderr[-3000:]
        raise RuntimeError(f"{name} seed {seed} failed:\n{tail}")
    result = json.loads(summary.read_text())
    result["_wall_seconds"] = time.perf_counter() - start
    summary.write_text(json.dumps(result, indent=2))
    return result


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def _plot(curves: dict[str, dict[str, list]], rollouts: dict[str, int], path: Path) -> None:
    """Held-out accuracy against rollouts: methods on top, HACPO and its ablations below, one column per agent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("methods", [m for m in curves if m in METHODS]),
        ("ablations", [m for m in curves if m in ABLATIONS or m == "HACPO"]),
    ]
    panels = [(title, names) for title, names in panels if names]
    fig, axes = plt.subplots(len(panels), len(AGENTS), figsize=(11, 4 * len(panels)), squeeze=False)
    for row, (title, names) in enumerate(panels):
        for ax, agent in zip(axes[row], AGENTS, strict=True):
            for i, method in enumerate(names):
                runs = curves[method].get(agent, [])
                if not runs:
                    continue
                steps = [s for s, _ in runs[0]]
                mean = [statistics.mean(r[j][1] for r in runs) for j in range(len(steps))]
                style = "-" if i < 10 else "--"
                ax.plot([s * rollouts[method] for s in steps], mean, style, marker="o", ms=3, label=method)
            ax.set(title=f"{agent}: {title}", xlabel="rollouts generated by this agent", ylabel="held-out accuracy")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


DIAGNOSTICS = (
    ("hacpo/peer_kept", "peer rows kept"),
    ("hacpo/peer_clipped_low", "clipped low (s < lb)"),
    ("hacpo/peer_clipped_high", "clipped high (s > 1)"),
    ("hacpo/peer_ratio_mean", "mean peer ratio s"),
    ("hacpo/self_ratio_mean", "mean self ratio s"),
)


def _diagnostics(out: Path, methods: list[str], seeds: list[int]) -> list[str]:
    """Why sharing helps or not: what happened to the peer rows, from each run's training log."""
    lines = [
        "### What happened to the peer rows (training logs, mean over steps and seeds)",
        "",
        "| method | agent | " + " | ".join(label for _, label in DIAGNOSTICS) + " | final P̂ (own) | ω(peer, me) |",
        "|---|---|" + "---|" * (len(DIAGNOSTICS) + 2),
    ]
    for method in methods:
        for agent in AGENTS:
            values: dict[str, list[float]] = {key: [] for key, _ in DIAGNOSTICS}
            caps, omegas = [], []
            for seed in seeds:
                path = out / f"{method.replace(' ', '_').replace('/', '')}-seed{seed}" / agent / "log_history.json"
                if not path.exists():
                    continue
                history = json.loads(path.read_text())
                for key in values:
                    values[key] += [e[key] for e in history if key in e]
                caps += [e[f"hacpo/capability/{agent}"] for e in history if f"hacpo/capability/{agent}" in e][-1:]
                omegas += [v for e in history for k, v in e.items() if k.startswith("hacpo/omega/")]
            if not any(values.values()):
                continue
            cells = [f"{statistics.mean(v):.3f}" if v else "–" for v in values.values()]
            cap = f"{statistics.mean(caps):.3f}" if caps else "–"
            omega = f"{statistics.mean(omegas):.2f}" if omegas else "–"
            lines.append(f"| {method} | {agent} | " + " | ".join(cells) + f" | {cap} | {omega} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 30 steps, GSPO / Naive / HACPO only")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--eval_every", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "runs")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    parser.add_argument("--methods", nargs="*", default=None, help="a subset of methods/ablations by name")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.eval_every = args.seeds[:1], 30, 15
    grid = {name: (settings, per_prompt, updates) for name, (settings, per_prompt, updates) in METHODS.items()}
    grid |= {name: (settings, 8, 2) for name, settings in ABLATIONS.items()}
    if args.methods:
        grid = {k: v for k, v in grid.items() if k in args.methods}
    elif args.quick:
        grid = {k: v for k, v in grid.items() if k in ("GSPO", "Naive", "HACPO")}
    args.out.mkdir(parents=True, exist_ok=True)

    results: dict[str, list[dict]] = {}
    started = time.perf_counter()
    for name, (settings, _, _) in grid.items():
        for seed in args.seeds:
            print(f"[{time.perf_counter() - started:6.0f}s] {name} seed {seed}", flush=True)
            results.setdefault(name, []).append(run_one(name, settings, seed, args.steps, args.eval_every, args.out))
    # the runs' own wall times (a grid resumed from finished runs still reports what they cost)
    run_seconds = sum(r.get("_wall_seconds", 0.0) for runs in results.values() for r in runs)

    rollouts = {name: per_prompt * PROMPTS_PER_STEP for name, (_, per_prompt, _) in grid.items()}
    curves = {name: {a: [r[a]["curve"] for r in runs] for a in AGENTS} for name, runs in results.items()}
    _plot(curves, rollouts, args.results.parent / "learning_curves.png")
    (args.results.parent / "results.json").write_text(json.dumps(results, indent=2))

    lines = [
        "## Reproduction in miniature (`benchmarks/reproduce.py`)",
        "",
        provenance("reproduce.py", sys.argv[1:] if argv is None else argv, run_seconds)
        + f" Seeds {args.seeds}, {args.steps} steps.",
        "",
        "Held-out greedy accuracy (300 problems never trained on) after training, mean ± std over seeds; before "
        "training: "
        + ", ".join(f"{a} {results[next(iter(results))][0][a]['accuracy_before']:.3f}" for a in AGENTS)
        + ". Rollouts: completions each agent generates per step (8 prompts × G); updates: optimizer steps per step.",
        "",
    ]
    for agent in AGENTS:
        lines += [f"### {agent}", "", "| method | accuracy | rollouts / step | updates / step |", "|---|---|---|---|"]
        for name, runs in results.items():
            _, per_prompt, updates = grid[name]
            acc = _mean_std([r[agent]["accuracy_after"] for r in runs])
            lines.append(f"| {name} | {acc} | {per_prompt * PROMPTS_PER_STEP} | {updates} |")
        lines.append("")
    lines += ["![learning curves](learning_curves.png)", ""]
    lines += _diagnostics(args.out, [name for name in results if name not in ("GRPO", "GSPO", "GSPO×2")], args.seeds)
    write_section(args.results, "reproduce", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
