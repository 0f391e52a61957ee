"""Run several trainings of the same agents in one `accelerate launch`, one after the other (the benchmark grid).

    accelerate launch --config_file accelerate_configs/cpu_2agents.yaml benchmarks/_worker.py jobs.json

``jobs.json`` is a list of `hacpo-train` argument lists. Every process runs every job in order; starting Python,
torch, TRL and the agent worlds once per launch instead of once per run saves most of a short run's wall time.
Each run is still independent: the trainer seeds everything from its own ``--seed`` and loads the agents from disk.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    from _common import recorded
    from trl import TrlParser

    from hacpo_trl.config import HACPOConfig
    from hacpo_trl.launch.recipe import HACPOScriptArguments, check_recipe, load_recipe
    from hacpo_trl.launch.train import run  # hacpo-train's public run
    from hacpo_trl.run.topology import current_topology, exit_process
    from hacpo_trl.tasks.rewards import get_reward_funcs

    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    launch_size = int(os.environ["WORLD_SIZE"])  # the first run splits the launch and rewrites WORLD_SIZE per agent
    for argv in jobs:
        check_recipe(load_recipe(argv[argv.index("--config") + 1]), num_processes=launch_size)
        script_args, config = TrlParser((HACPOScriptArguments, HACPOConfig)).parse_args_and_config(argv)
        start = time.perf_counter()
        # `run`, not hacpo-train's `main`: no check that the output folder is empty, on purpose (reproduce.py
        # gives each run its own folder and skips runs whose summary exists; a run it starts again was unfinished)
        run(script_args, config, get_reward_funcs(script_args.reward_funcs), shutdown=False)
        # the summary is written by global rank 0 at the end of the run
        if current_topology().global_rank == 0:
            root = os.path.dirname(os.path.normpath(config.output_dir))
            path = os.path.join(root, "hacpo_summary.json")
            with open(path) as f:
                summary = json.load(f)
            summary["_wall_seconds"] = time.perf_counter() - start
            for entry in summary.values():  # recorded relative to the repository root, as every benchmark record
                if isinstance(entry, dict) and "output_dir" in entry:
                    entry["output_dir"] = recorded(entry["output_dir"])
            with open(path, "w") as f:
                json.dump(summary, f, indent=2)
            print(f"done: {root} ({summary['_wall_seconds']:.0f}s)", flush=True)
    current_topology().shutdown()
    exit_process(0)


if __name__ == "__main__":
    main()
