"""Measure what `hacpo-train --plan` predicts: one generation batch of every agent of a GPU recipe at its worst case.

    python benchmarks/gpu_check.py --config recipes/qwen3_4b_x_qwen3_4b_instruct.yaml \
        --accelerate_config accelerate_configs/zero2_8gpu.yaml

On the GPU machine it writes a copy of the recipe that runs exactly one generation batch (``max_steps`` = the
optimizer updates of one batch), forces every completion to ``max_completion_length`` (``min_tokens`` for vLLM,
``min_new_tokens`` for transformers), saves nothing and evaluates nothing, and launches it with the accelerate
config. Inside every rank it synchronises CUDA around the trainer's ``hacpo/time/*`` timers (generate, score,
prepare_inputs, loss_and_backward, optimizer, exchange) and records ``torch.cuda.max_memory_reserved()`` and the
device's used memory at the end. It then compares each agent's worst rank with the plan: the ratio is measured peak
reserved / planned peak without the CUDA context and NCCL allowances (torch's allocator does not see those; its
reserved memory does include fragmentation). Output: ``benchmarks/gpu_check/<recipe>.json`` and a table in
``benchmarks/RESULTS.md`` (section ``gpu_check/<recipe>``).

On a machine without a CUDA GPU it exits 2 with a message; `make_report` (the arithmetic and the table) is tested on
CPU with measurements fed in (tests/test_gpu_check.py). Nothing here has run on a GPU yet.
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


def worst_case_recipe(recipe: dict, updates_per_generation: int, output_dir: str) -> dict:
    """The recipe cut to one generation batch with every completion at its maximum length, saving nothing."""
    completion = int(recipe.get("max_completion_length", 512))
    forced = {"min_tokens": completion} if recipe.get("use_vllm") else {"min_new_tokens": completion}
    return {
        **recipe,
        "max_steps": int(updates_per_generation),
        "generation_kwargs": {**(recipe.get("generation_kwargs") or {}), **forced},
        "save_strategy": "no",
        "eval_samples": 0,
        "report_to": "none",
        "logging_steps": 1,
        "push_to_hub": False,
        "output_dir": output_dir,
    }


def make_report(plan, measurements: list[dict], title: str) -> tuple[dict, list[str]]:
    """Per agent: its ranks' measured peak reserved memory, the step's time split (the slowest rank's sum of each
    ``hacpo/time/*`` metric over the batch) and measured/planned. ``plan`` is a `hacpo_trl.plan.Plan`;
    ``measurements`` one dict per rank: ``rank``, ``agent``, ``peak_reserved_gib``, ``device_used_gib``, ``times``."""
    report: dict = {"recipe": title, "device_gib": plan.device_gib, "agents": {}}
    lines = [
        f"### gpu_check: {title}",
        "",
        "| agent | ranks | planned peak | planned, torch-visible | measured peak reserved (worst rank) | "
        "measured / planned | device used at end | generate s | loss+backward s | optimizer s | other s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for agent in plan.agents:
        ranks = sorted((m for m in measurements if m["agent"] == agent.name), key=lambda m: m["rank"])
        if not ranks:
            raise ValueError(f"no measurement for agent {agent.name!r} (ranks {agent.ranks})")
        invisible = agent.memory.get("CUDA context", 0.0) + agent.memory.get("NCCL communicators", 0.0)
        planned_torch = agent.peak_gib - invisible
        worst = max(m["peak_reserved_gib"] for m in ranks)
        names = sorted({n for m in ranks for n in m["times"]})
        times = {n: max(m["times"].get(n, 0.0) for m in ranks) for n in names}
        entry = {
            "ranks": {str(m["rank"]): m["peak_reserved_gib"] for m in ranks},
            "planned_peak_gib": agent.peak_gib,
            "planned_error_bar_gib": list(agent.error_gib),
            "planned_torch_visible_gib": planned_torch,
            "measured_peak_reserved_gib": worst,
            "measured_over_planned": worst / planned_torch,
            "device_used_at_end_gib": max(m.get("device_used_gib", 0.0) for m in ranks),
            "time_seconds": times,
        }
        report["agents"][agent.name] = entry
        main = {"generate", "loss_and_backward", "optimizer"}
        other = sum(v for n, v in times.items() if n not in main)
        lines.append(
            f"| {agent.name} | {agent.ranks[0]}-{agent.ranks[-1]} | {agent.peak_gib:.1f} | {planned_torch:.1f} | "
            f"{worst:.1f} | {entry['measured_over_planned']:.2f} | {entry['device_used_at_end_gib']:.1f} | "
            f"{times.get('generate', 0.0):.1f} | {times.get('loss_and_backward', 0.0):.1f} | "
            f"{times.get('optimizer', 0.0):.1f} | {other:.1f} |"
        )
    lines.append("")
    lines.append(
        "GiB per rank. Planned, torch-visible = the plan's peak without its CUDA-context and NCCL allowances. Times: "
        "the slowest rank's sum of each `hacpo/time/*` metric over one generation batch, CUDA-synchronised."
    )
    return report, lines


# ------------------------------------------------------------------------------------------- inside each rank


def _instrument(out_dir: str) -> None:
    """Synchronise CUDA around the trainer's timers, collect its ``hacpo/time/*`` logs, and write this rank's peak
    reserved memory when training ends."""
    import time as _time

    import torch

    from hacpo_trl import metrics as metrics_module
    from hacpo_trl import trainer as trainer_module

    class SyncedTime:
        def perf_counter(self) -> float:
            torch.cuda.synchronize()
            return _time.perf_counter()

        def __getattr__(self, name):
            return getattr(_time, name)

    trainer_module.time = metrics_module.time = SyncedTime()
    cls = trainer_module.HACPOTrainer
    logs: list[dict] = []
    log, train = cls.log, cls.train

    def logged(self, values, *args, **kwargs):
        logs.append({k.split(TIME_PREFIX, 1)[1]: float(v) for k, v in values.items() if TIME_PREFIX in k})
        return log(self, values, *args, **kwargs)

    def measured(self, *args, **kwargs):
        torch.cuda.reset_peak_memory_stats()
        try:
            return train(self, *args, **kwargs)
        finally:
            free, total = torch.cuda.mem_get_info()
            times: dict[str, float] = {}
            for entry in logs:
                for name, seconds in entry.items():
                    times[name] = times.get(name, 0.0) + seconds
            rank = int(os.environ.get("RANK", "0"))
            record = {
                "rank": rank,
                "agent": self.agent,
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
                "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                "device_used_gib": (total - free) / 2**30,
                "times": times,
            }
            with open(os.path.join(out_dir, MEASUREMENT.format(rank=rank)), "w") as f:
                json.dump(record, f)

    cls.log, cls.train = logged, measured


# ------------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:  # one rank of the launch below
        _instrument(argv[1])
        from hacpo_trl.train import main as train_main

        return train_main(argv[2:])
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a GPU recipe")
    parser.add_argument("--accelerate_config", required=True, help="the accelerate config the recipe runs with")
    parser.add_argument("--output", default=None, help="JSON path (default benchmarks/gpu_check/<recipe>.json)")
    parser.add_argument("--results", default=str(HERE / "RESULTS.md"), help="the markdown file to add the table to")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA GPU here (torch.cuda.is_available() is False); it measures a GPU recipe on the GPU "
            "machine. Check the plan on this machine with `hacpo-train --config R --plan --accelerate_config A`.",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, str(HERE))
    import yaml
    from _common import provenance, write_section

    from hacpo_trl.plan_cli import build_plan
    from hacpo_trl.recipe import load_recipe

    device_gib = torch.cuda.mem_get_info()[1] / 2**30
    plan = build_plan(load_recipe(args.config), args.accelerate_config, device_gib)
    name = Path(args.config).stem
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        recipe = worst_case_recipe(
            load_recipe(args.config), plan.agents[0].batch["updates_per_generation"], os.path.join(tmp, "run")
        )
        recipe_path = os.path.join(tmp, f"{name}.yaml")
        with open(recipe_path, "w") as f:
            yaml.safe_dump(recipe, f)
        accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
        cmd = [accelerate, "launch", "--config_file", args.accelerate_config, __file__, "--worker", tmp]
        proc = subprocess.run([*cmd, "--config", recipe_path])
        if proc.returncode:
            print(f"gpu_check: the launch failed (exit {proc.returncode}); see its output above", file=sys.stderr)
            return 1
        measurements = []
        for path in sorted(glob.glob(os.path.join(tmp, MEASUREMENT.format(rank="*")))):
            with open(path) as f:
                measurements.append(json.load(f))
    report, lines = make_report(plan, measurements, name)
    output = Path(args.output or HERE / "gpu_check" / f"{name}.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2))
    lines.append(
        provenance("gpu_check.py", argv, time.time() - started).replace("CPU only", torch.cuda.get_device_name())
    )
    write_section(Path(args.results), f"gpu_check/{name}", lines)
    print("\n".join(lines))
    print(f"gpu_check: {output} and {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
