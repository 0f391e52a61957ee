"""One console display for a launch of several agents.

HF `Trainer` gives every agent's main process its own tqdm bar and prints every metric dict, so a launch of N agents
shows N interleaved bars and N dicts per logging step. The exchange already brings every agent's rewards to every
process (`hacpo/reward/<agent>`, `hacpo/capability/<agent>` in each agent's logs), so global rank 0 alone can show
all agents: one bar, and a compact per-agent line per logging step. The full metric dicts go to each agent's
``metrics.jsonl`` (and to the trackers in ``report_to``, untouched); the other processes stay quiet on the console
unless something fails (errors are printed, not logged through these channels).
"""

from __future__ import annotations

import json
import os
import warnings

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

__all__ = ["AgentsProgress", "install", "quiet_replica"]

BAR_PREFIX = "HACPO"


def agents_line(logs: dict, agents: list[str]) -> str:
    """``agent reward 0.531 P̂ 0.400 | ...`` for the agents whose reward and capability are in ``logs``."""
    parts = []
    for agent in agents:
        reward, cap = logs.get(f"hacpo/reward/{agent}"), logs.get(f"hacpo/capability/{agent}")
        if reward is not None and cap is not None:
            parts.append(f"{agent} reward {reward:.3f} P̂ {cap:.3f}")
    return " | ".join(parts)


class AgentsProgress(TrainerCallback):
    """The launch's one bar (``show``: global rank 0 only) and every agent's metric dicts in its ``metrics.jsonl``."""

    def __init__(self, agents: list[str], show: bool):
        self.agents, self.show, self.bar = list(agents), show, None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and state.global_step == 0:  # a fresh run starts a fresh record
            open(os.path.join(args.output_dir, "metrics.jsonl"), "w").close()
        if self.show and not args.disable_tqdm:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc=BAR_PREFIX, dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if state.is_world_process_zero:  # this agent's main process keeps the full record
            with open(os.path.join(args.output_dir, "metrics.jsonl"), "a") as f:
                f.write(json.dumps({"step": state.global_step, **logs}, default=str) + "\n")
        if not self.show:
            return
        line = agents_line(logs, self.agents)
        if not line:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(line)
            self.bar.write(f"{BAR_PREFIX} step {state.global_step}: {line}")
        else:
            print(f"{BAR_PREFIX} step {state.global_step}: {line}", flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def install(trainer, global_rank: int) -> AgentsProgress:
    """Replace HF's per-process bar and metric printer on ``trainer`` by the launch's one display."""
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    callback = AgentsProgress(trainer.agent_names, show=global_rank == 0)
    trainer.add_callback(callback)
    return callback


def quiet_replica() -> None:
    """A process other than global rank 0: no library progress bars, info logs or warnings on the console (rank 0
    runs the same code and shows them once); exceptions and our error messages still reach stderr."""
    import datasets
    import transformers

    from .bootstrap import quiet_vllm

    quiet_vllm()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.utils.logging.set_verbosity_error()
    datasets.utils.logging.disable_progress_bar()
    warnings.simplefilter("ignore")
