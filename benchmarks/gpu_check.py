"""Measure on a GPU what `hacpo-train --plan` predicts: time and memory of a few generation batches of each recipe.

    make gpu-check   # the one-GPU recipe on the Qwen3-shaped stand-ins, GSPO then HACPO, 3 generation batches each
    python benchmarks/gpu_check.py --config recipes/qwen3_4b_x_qwen3_4b_instruct.yaml \
        --accelerate_config accelerate_configs/zero2_8gpu.yaml

For each ``--config`` it writes a copy of the recipe cut to ``--generation_batches`` batches with every completion
forced to ``max_completion_length`` (``min_tokens`` for vLLM, ``min_new_tokens`` for transformers), saving and
evaluating nothing, and launches it. Inside every rank it synchronises CUDA around the trainer's ``hacpo/time/*``
timers, sums them from the trainer's own metric lists before TRL averages them into a log, notes when each
generation batch starts, and writes the peak reserved and allocated memory when training ends, one file per global
rank. Per agent it reports: the time split (the slowest rank's seconds: generate, score, old log-probs,
loss+backward, optimizer, exchange wait), seconds per generation batch (the first, with warm-up, and the mean of the
rest), peak reserved and allocated memory against the plan, and, with two recipes of which one is GSPO
(``share_rollouts: false``), HACPO's time per generation batch over GSPO's. Output: ``benchmarks/gpu_check/<recipe>.json``
and a section of ``benchmarks/RESULTS.md``.

``--vllm`` (``make gpu-check GPU_CHECK_VLLM=1``) runs each recipe with ``use_vllm: true`` and ``vllm_mode:
colocate``, planned the same way; it needs the `vllm` package (the CUDA distribution; vLLM's CPU build does not
count) and exits 2 with one line without it.

Without a CUDA GPU it exits 2 with one line; the arithmetic (`make_report`, `compare`) is tested on CPU with
measurements fed in (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIME_PREFIX = "hacpo/time/"
MEASUREMENT = "gpu_check_rank{rank}.json"
# the trainer's timers in seconds (hacpo/time/padding_ratio/* are ratios; prepare_inputs encloses generate, score
# and the exchange)
TIMERS = ("generate", "score", "old_logps", "loss_and_backward", "optimizer", "exchange_wait", "exchange_transfer")
INVISIBLE = ("CUDA context", "NCCL communicators")  # planned memory torch's allocator does not see


def worst_case_recipe(
    recipe: dict, updates_per_generation: float, output_dir: str, generation_batches: int = 1
) -> dict:
    """The recipe cut to ``generation_batches`` generation batches with every completion at its maximum length,
    saving nothing."""
    completion = int(recipe.get("max_completion_length", 512))
    forced = {"min_tokens": completion} if recipe.get("use_vllm") else {"min_new_tokens": completion}
    return {
        **recipe,
        "max_steps": int(updates_per_generation * generation_batches),
        "generation_kwargs": {**(recipe.get("generation_kwargs") or {}), **forced},
        "save_strategy": "no",
        "eval_samples": 0,
        "report_to": "none",
        "logging_steps": 1,
        "push_to_hub": False,
        "output_dir": output_dir,
    }


def with_vllm(recipe: dict) -> dict:
    """The recipe generating with a colocated vLLM engine per agent process."""
    return {**recipe, "use_vllm": True, "vllm_mode": "colocate"}


def vllm_missing() -> str | None:
    """Why ``--vllm`` cannot run here (one line), or None: it needs the `vllm` distribution itself."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
    except PackageNotFoundError:
        return "gpu_check: --vllm needs the vllm package on the GPU machine (pip install -e '.[vllm]'); it is not installed"
    return None


def seconds_of(times: dict[str, list[float]]) -> dict[str, float]:
    """The timers' seconds summed, from a trainer's metric lists (``hacpo/time/<name>`` -> values since the log)."""
    return {
        name: float(sum(times[TIME_PREFIX + name])) for name in TIMERS if TIME_PREFIX + name in times
    }  # fmt: skip


def batch_seconds(starts: list[float], end: float) -> list[float]:
    """Wall seconds of each generation batch, from the times its generation started and the end of training."""
    return [b - a for a, b in zip(starts, [*starts[1:], end], strict=True)] if starts else []


def make_report(plan, measurements: list[dict], title: str) -> tuple[dict, list[str]]:
    """Per agent (the worst of its ranks): measured peak reserved and allocated memory against the plan, the time
    split and seconds per generation batch. ``plan`` is a `hacpo_trl.planning.plan.Plan`; ``measurements`` one dict per rank:
    ``rank`` (global), ``agent``, ``peak_reserved_gib``, ``peak_allocated_gib``, ``device_used_gib``, ``times``
    (seconds per timer) and ``batch_seconds``."""
    report: dict = {"recipe": title, "device_gib": plan.device_gib, "agents": {}}
    lines = [
        f"### gpu_check: {title}",
        "",
        "| agent | ranks | planned peak | planned reserved / allocated | measured reserved / allocated (worst rank) | "
        "measured / planned (reserved, allocated) | device used at end | generate s | score s | loss+backward s | "
        "optimizer s | exchange wait s | s per generation batch (first; rest) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for agent in plan.agents:
        ranks = sorted((m for m in measurements if m["agent"] == agent.name), key=lambda m: m["rank"])
        if not ranks:
            raise ValueError(f"no measurement for agent {agent.name!r} (ranks {agent.ranks})")
        invisible = sum(agent.memory.get(k, 0.0) for k in INVISIBLE)
        planned_reserved = agent.peak_gib - invisible
        planned_allocated = planned_reserved - agent.memory.get("fragmentation allowance", 0.0)
        reserved = max(m["peak_reserved_gib"] for m in ranks)
        allocated = max(m.get("peak_allocated_gib", 0.0) for m in ranks)
        times = {n: max(m["times"].get(n, 0.0) for m in ranks) for n in TIMERS if any(n in m["times"] for m in ranks)}
        batches = [max(s) for s in zip(*(m.get("batch_seconds", []) for m in ranks), strict=False)]
        rest = batches[1:]
        entry = {
            "ranks": {str(m["rank"]): m["peak_reserved_gib"] for m in ranks},
            "planned_peak_gib": agent.peak_gib,
            "planned_error_bar_gib": list(agent.error_gib),
            "planned_reserved_gib": planned_reserved,
            "planned_allocated_gib": planned_allocated,
            "measured_peak_reserved_gib": reserved,
            "measured_peak_allocated_gib": allocated,
            "reserved_over_planned": reserved / planned_reserved,
            "allocated_over_planned": allocated / planned_allocated,
            "device_used_at_end_gib": max(m.get("device_used_gib", 0.0) for m in ranks),
            "time_seconds": times,
            "batch_seconds": batches,
            "seconds_per_batch_after_first": sum(rest) / len(rest) if rest else None,
        }
        report["agents"][agent.name] = entry
        per_batch = f"{batches[0]:.1f}; {entry['seconds_per_batch_after_first']:.1f}" if rest else (
            f"{batches[0]:.1f}; -" if batches else "-"
        )  # fmt: skip
        lines.append(
            f"| {agent.name} | {agent.ranks[0]}-{agent.ranks[-1]} | {agent.peak_gib:.1f} | "
            f"{planned_reserved:.1f} / {planned_allocated:.1f} | {reserved:.1f} / {allocated:.1f} | "
            f"{entry['reserved_over_planned']:.2f}, {entry['allocated_over_planned']:.2f} | "
            f"{entry['device_used_at_end_gib']:.1f} | {times.get('generate', 0.0):.1f} | {times.get('score', 0.0):.1f} | "
            f"{times.get('loss_and_backward', 0.0):.1f} | {times.get('optimizer', 0.0):.1f} | "
            f"{times.get('exchange_wait', 0.0):.1f} | {per_batch} |"
        )
    lines.append("")
    lines.append(
        "GiB per rank. Planned reserved = the plan's peak without its CUDA-context and NCCL allowances (torch's "
        "allocator does not see them); planned allocated = that without the fragmentation allowance. Times: the "
        "slowest rank's sum of each `hacpo/time/*` timer over the run, CUDA-synchronised; a generation batch runs "
        "from the start of its generation to the start of the next (the first includes warm-up)."
    )
    return report, lines


def compare(reports: dict[str, dict], sharing: dict[str, bool]) -> list[str]:
    """HACPO's seconds per generation batch (after the first) over GSPO's, per agent, for one GSPO report
    (``sharing`` False) and the others; no lines without both."""
    gspo = [name for name, shares in sharing.items() if not shares]
    hacpo = [name for name, shares in sharing.items() if shares]
    if len(gspo) != 1 or not hacpo:
        return []
    base = reports[gspo[0]]["agents"]
    lines = ["", f"HACPO / GSPO seconds per generation batch after the first ({gspo[0]} is GSPO):", ""]
    for name in hacpo:
        for agent, entry in reports[name]["agents"].items():
            mine, theirs = (
                entry["seconds_per_batch_after_first"],
                base.get(agent, {}).get("seconds_per_batch_after_first"),
            )
            if mine and theirs:
                lines.append(f"- {name} / {gspo[0]}, {agent}: {mine:.1f} s / {theirs:.1f} s = {mine / theirs:.2f}")
    return lines


# ------------------------------------------------------------------------------------------- inside each rank


def _instrument(out_dir: str) -> None:
    """Synchronise CUDA around the trainer's timers, sum them before TRL averages them into a log, note each
    generation batch's start, and write this rank's peaks when training ends. Call after the process is placed
    (importing the trainer imports trl, which may initialise CUDA)."""
    import time as _time

    import torch

    import hacpo_trl
    from hacpo_trl.trainer import HACPOTrainer

    class SyncedTime:
        def perf_counter(self) -> float:
            torch.cuda.synchronize()
            return _time.perf_counter()

        def __getattr__(self, name):
            return getattr(_time, name)

    for name, module in list(sys.modules.items()):  # every hacpo_trl module that times with `time.perf_counter`
        if name.startswith(hacpo_trl.__name__ + ".") and getattr(module, "time", None) is _time:
            module.time = SyncedTime()
    times: dict[str, float] = {}
    starts: list[float] = []
    log, train, generate = HACPOTrainer.log, HACPOTrainer.train, HACPOTrainer._generate

    def logged(self, values, *args, **kwargs):
        for name, seconds in seconds_of(self._metrics["train"]).items():  # TRL averages and clears these in log()
            times[name] = times.get(name, 0.0) + seconds
        return log(self, values, *args, **kwargs)

    def generating(self, *args, **kwargs):
        if self.model.training:
            torch.cuda.synchronize()
            starts.append(_time.perf_counter())
        return generate(self, *args, **kwargs)

    def measured(self, *args, **kwargs):
        torch.cuda.reset_peak_memory_stats()
        try:
            return train(self, *args, **kwargs)
        finally:
            torch.cuda.synchronize()
            end = _time.perf_counter()
            free, total = torch.cuda.mem_get_info()
            rank = int(os.environ.get("HACPO_GLOBAL_RANK", os.environ.get("RANK", "0")))  # RANK is agent-local
            record = {
                "rank": rank,
                "agent": self.agent,
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
                "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                "device_used_gib": (total - free) / 2**30,
                "times": times,
                "batch_seconds": batch_seconds(starts, end),
            }
            with open(os.path.join(out_dir, MEASUREMENT.format(rank=rank)), "w") as f:
                json.dump(record, f)

    HACPOTrainer.log, HACPOTrainer.train, HACPOTrainer._generate = logged, measured, generating


def _worker(out_dir: str, argv: list[str]) -> int:
    """One rank of the launch: placed first (as `hacpo-train` does), then instrumented, then trained."""
    from hacpo_trl.launch.bootstrap import place
    from hacpo_trl.launch.recipe import config_path, load_recipe
    from hacpo_trl.launch.train import main as train_main

    place(load_recipe(config_path(argv)), int(os.environ.get("WORLD_SIZE", "1") or 1))
    _instrument(out_dir)
    return train_main(argv)


# ------------------------------------------------------------------------------------------------------ main


def _measure(
    config: str, accelerate_config: str, generation_batches: int, device_gib: float, vllm: bool = False
) -> tuple[dict, list]:
    """Launch one recipe; its plan, report and table lines."""
    import yaml

    from hacpo_trl.launch.plan_cli import build_plan
    from hacpo_trl.launch.recipe import load_recipe

    base = with_vllm(load_recipe(config)) if vllm else load_recipe(config)
    plan = build_plan(base, accelerate_config, device_gib)
    name = Path(config).stem + ("+vllm" if vllm else "")
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        recipe = worst_case_recipe(
            base, plan.agents[0].batch["updates_per_generation"], os.path.join(tmp, "run"), generation_batches,
        )  # fmt: skip
        recipe_path = os.path.join(tmp, f"{name}.yaml")
        with open(recipe_path, "w") as f:
            yaml.safe_dump(recipe, f)
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", accelerate_config]
        proc = subprocess.run([*launch, __file__, "--worker", tmp, "--config", recipe_path])
        if proc.returncode:
            raise RuntimeError(f"the launch of {name} failed (exit {proc.returncode}); see its output above")
        measurements = []
        for path in sorted(glob.glob(os.path.join(tmp, MEASUREMENT.format(rank="*")))):
            with open(path) as f:
                measurements.append(json.load(f))
    report, lines = make_report(plan, measurements, name)
    report["shares_rollouts"] = bool(recipe["share_rollouts"])  # load_recipe expanded the sharing mode
    report["name"] = name
    return report, lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:  # one rank of a launch below
        return _worker(argv[1], argv[2:])
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, action="append", help="a GPU recipe (repeat for several)")
    parser.add_argument("--accelerate_config", required=True, help="the accelerate config the recipes run with")
    parser.add_argument("--generation_batches", type=int, default=1, help="generation batches per recipe")
    parser.add_argument("--output_dir", default=str(HERE / "gpu_check"), help="where each recipe's JSON goes")
    parser.add_argument("--results", default=str(HERE / "RESULTS.md"), help="the markdown file to add the table to")
    parser.add_argument("--vllm", action="store_true", help="generate with a colocated vLLM engine (the vllm package)")
    args = parser.parse_args(argv)
    if args.vllm and (why := vllm_missing()):
        print(why, file=sys.stderr)
        return 2

    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here (it measures GPU recipes on a GPU); `hacpo-train --config R --plan` checks "
              "a recipe on paper anywhere", file=sys.stderr)  # fmt: skip
        return 2
    sys.path.insert(0, str(HERE))
    from _common import provenance, write_section

    device_gib = torch.cuda.mem_get_info()[1] / 2**30
    device = torch.cuda.get_device_name()
    started = time.time()
    reports: dict[str, dict] = {}
    lines: list[str] = []
    for config in args.config:
        report, table = _measure(config, args.accelerate_config, args.generation_batches, device_gib, args.vllm)
        name = report["name"]
        report["device"] = device
        reports[name] = report
        lines += [*table, ""]
        output = Path(args.output_dir) / f"{name}.json"
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(report, indent=2))
        print("\n".join(table), flush=True)
    lines += compare(reports, {n: r["shares_rollouts"] for n, r in reports.items()})
    lines.append("")
    lines.append(provenance("gpu_check.py", argv, time.time() - started).replace("CPU only", device))
    section = "gpu_check/" + "+".join(reports)
    write_section(Path(args.results), section, lines)
    print("\n".join(lines))
    print(f"gpu_check: {args.output_dir} and {args.results} (section {section})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
