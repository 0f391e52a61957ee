"""`hacpo-train`: train every agent of a recipe in one launch.

    accelerate launch --config_file accelerate_configs/cpu_2agents.yaml -m hacpo_trl.train \\
        --config recipes/demo_cpu.yaml

Every process runs this module; each resolves the recipe to its own agent (see `HACPOConfig`). Recipe keys are
`HACPOConfig` / `GRPOConfig` fields plus the script arguments below, and command-line flags override them, as with
TRL's own scripts. A recipe is checked before any model loads; a bad one stops every process with one message.
"""

from __future__ import annotations

import json
import os
import sys

from ..planning.plan import DEVICE_GIB  # what --plan assumes of an 80 GB card, quoted in --help
from ..sharing.presets import PRESET_SETTINGS, SHARING_PRESETS, describe_sharing
from .bootstrap import refuse
from .recipe import RecipeError
from .start import StartupError, build_trainer, start

__all__ = ["cli", "main", "run", "short_help"]


# ------------------------------------------------------------------------------------------------ the run


def _evaluate(trainer, test, script_args, by_half: bool = False, when: str = ""):
    """Held-out accuracy, reported by the agent's rank 0 (None elsewhere); ``when`` (e.g. "before training") names
    the phase in a reward's error (rewards are called as in training); with ``by_half``, (accuracy, accuracy per
    half) for a task whose rows name their half (`hacpo_trl.tasks.data.HALVES`; None per half for any other task), from
    the same completions. Under FSDP or ZeRO-3 every forward is a collective over the agent's ranks, so all of them
    generate (the same prompts, in calls sized alike by the least free memory among them) or rank 0 would wait
    forever for the other shards."""
    nothing = (None, None) if by_half else None
    if test is None or script_args.eval_samples <= 0:
        return nothing
    collective = getattr(trainer, "is_fsdp_enabled", False) or getattr(getattr(trainer, "_dist", None), "is_zero3", 0)
    if trainer.accelerator.process_index != 0 and not collective:
        return nothing
    from ..evaluation.evaluate import eval_length, evaluate_model, least_free_bytes
    from ..tasks.rewards import get_reward_funcs

    model = trainer.accelerator.unwrap_model(trainer.model)
    halves = by_half and "half" in test.column_names
    result = evaluate_model(
        model,
        trainer.processing_class,
        test.select(range(min(script_args.eval_samples, len(test)))),
        get_reward_funcs(script_args.reward_funcs)[0],
        max_new_tokens=eval_length(script_args.task, trainer.args.max_completion_length),
        chat_template_kwargs=trainer.args.chat_template_kwargs,
        memory_bytes=least_free_bytes(trainer.accelerator) if collective else None,  # the same calls on every rank
        by="half" if halves else None,
        phase=f"held-out evaluation {when}".strip(),
        trainer_state=getattr(trainer, "state", None),
    )
    if trainer.accelerator.process_index != 0:
        return nothing
    return (result.avg_at_k, result.by_group) if by_half else result.avg_at_k


def _write_task_record(config, script_args) -> None:
    """What this agent was trained on, next to it, so that `hacpo-eval` evaluates the same task the same way."""
    from ..evaluation.evaluate import TASK_RECORD

    record = {
        "task": script_args.task,
        "dataset_name": script_args.dataset_name,
        "reward_funcs": list(script_args.reward_funcs),
        "eval_split": script_args.dataset_test_split or script_args.eval_split,
        "eval_samples": script_args.eval_samples,
        "max_completion_length": config.max_completion_length,
        "chat_template_kwargs": config.chat_template_kwargs,
    }
    with open(os.path.join(config.output_dir, TASK_RECORD), "w") as f:
        json.dump(record, f, indent=2)


def _plot(
    histories: dict[str, list[dict]],
    agents: list[str],
    path: str,
    curves: dict[str, list] | None = None,
    temperature: float | None = None,
) -> None:
    """Reward and capability per agent, every point marked (one generation batch is one point, never a blank
    axis). The left panel also shows greedy held-out accuracy where it was measured (``curves``: step, accuracy),
    the number the summary reports; the sampled training reward (at the run's temperature) is a different one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_c) = plt.subplots(1, 2, figsize=(11, 4.2))
    t = f"T = {temperature:g}" if temperature is not None else "sampled"
    for i, agent in enumerate(agents):
        color = f"C{i}"
        history = histories.get(agent, [])
        points = [(e["step"], e["reward"]) for e in history if "reward" in e]
        if points:
            ax_r.plot(*zip(*points, strict=True), "o-", ms=4, color=color, lw=1,
                      label=f"{agent}: training reward ({t}, own completions)")  # fmt: skip
        held_out = [(step, acc) for step, acc in (curves or {}).get(agent, []) if acc is not None]
        if held_out:
            ax_r.plot(*zip(*held_out, strict=True), "s--", ms=7, color=color, lw=2,
                      label=f"{agent}: held-out accuracy (greedy)")  # fmt: skip
        caps = [(e["step"], e[f"hacpo/capability/{agent}"]) for e in history if f"hacpo/capability/{agent}" in e]
        if caps:
            ax_c.plot(*zip(*caps, strict=True), "o-", ms=4, color=color, label=agent)
    ax_r.set(title="reward (sampled) and held-out accuracy (greedy)", xlabel="step", ylabel="reward / accuracy")
    ax_c.set(title="capability P̂ (window mean training accuracy)", xlabel="step", ylabel="P̂")
    ax_c.set_ylim(-0.02, 1.02)
    top = max([1.0] + [y for line in ax_r.get_lines() for y in line.get_ydata()])
    ax_r.set_ylim(-0.02, top + 0.02)  # one point alone would get an axis of +-0.005 around it
    for ax in (ax_r, ax_c):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_WORKFLOW = f"""usage: hacpo-train --config RECIPE [--key value ...]
       hacpo-train --config RECIPE --plan [--accelerate_config FILE] [--gpu_memory_gib GIB]
       accelerate launch --config_file accelerate_configs/cpu_2agents.yaml -m hacpo_trl.train --config RECIPE

Train every agent of a HACPO recipe in one launch (one or more processes per agent).

recipe workflow:
  --config RECIPE          the YAML recipe (recipes/*.yaml); any key below, any GRPOConfig field, and `agents`
  --key value              override a recipe key on the command line (`--max_steps 10`, `--learning_rate -1e-4`)
  --plan                   check the launch on paper (memory per GPU, batch arithmetic), loading no weights
  --accelerate_config FILE (with --plan) the accelerate config the run will be launched with; default: the
                           recipe's `accelerate_config` key, else the launch environment
  --gpu_memory_gib GIB     (with --plan) memory of one GPU (80 GB cards: {DEVICE_GIB})
  --overwrite_output_dir   train into an output folder that already holds a run (refused otherwise)
  --help-all               every field of TRL's GRPOConfig and transformers' TrainingArguments as well

agents (recipe key): a list of {{name, model_name_or_path (Hub id, local folder or builtin:<name>),
  num_processes, learning_rate, lora, output_dir, ...}}; see README "Train your own agents" (CPU) and
  "GPU recipes" (one GPU, and the paper's settings on 8).
"""


def short_help() -> str:
    """`hacpo-train --help`: the recipe workflow and HACPO's own options, read from the dataclasses' source without
    importing trl (fast); `--help-all` adds TRL's ~1,300 lines of fields."""
    import ast
    import inspect
    from importlib.util import find_spec

    from . import recipe

    lines = [_WORKFLOW, "task, data and reporting:"]
    # their source files, found without importing them (importing config would import trl)
    config, sharing = (
        open(find_spec(name).origin).read() for name in ("hacpo_trl.config", "hacpo_trl.sharing.settings")
    )
    classes = ((inspect.getsource(recipe), "HACPOScriptArguments"), (config, "HACPOConfig"), (sharing, "SharingFields"))
    for source, cls in classes:
        body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls).body
        if cls == "HACPOConfig":
            lines += ["", "HACPO settings (the paper's defaults):"]
        if cls == "SharingFields":  # inherited by HACPOConfig
            lines += ["", "each learner's sharing settings (may differ per agent, `overrides`):"]
        for node in body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call)):
                continue
            kw = {k.arg: k.value for k in node.value.keywords}
            meta = kw.get("metadata")
            help_text = ""
            if isinstance(meta, ast.Dict):
                for k, v in zip(meta.keys, meta.values, strict=True):
                    if isinstance(k, ast.Constant) and k.value == "help":
                        help_text = ast.literal_eval(v)
            default = ast.unparse(kw["default"]) if "default" in kw else ast.unparse(kw.get("default_factory", ""))
            default = default.removeprefix("lambda: ")
            if node.target.id == "sharing":
                default = "'paper'"
            elif node.target.id in PRESET_SETTINGS:  # None: the named mode fills it in
                default = f"{SHARING_PRESETS['paper'][node.target.id]!r}, or the `sharing` mode's"
            lines.append(f"  --{node.target.id:<28} {help_text} (default: {default})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help-all" in argv:  # TRL's full field list (GRPOConfig and TrainingArguments: about 1,300 lines)
        argv = ["--help" if a == "--help-all" else a for a in argv]
    elif "-h" in argv or "--help" in argv:
        print(short_help())
        return 0
    # check the launch on paper: no weights, no process group
    if "--plan" in argv:
        from .plan_cli import main as plan

        return plan(argv)
    try:
        started = start(argv)
    except (RecipeError, ValueError) as exc:
        return refuse(exc)
    try:
        return run(started.script_args, started.config, started.reward_funcs)
    except StartupError as exc:
        return refuse(exc)


def run(script_args, config, reward_funcs, shutdown: bool = True) -> int:
    """One run of every agent, from what :func:`~hacpo_trl.launch.start.start` returned (or the benchmark's worker
    parsed): each process builds its agent (:func:`~hacpo_trl.launch.start.build_trainer`), evaluates it, trains it,
    saves it, and global rank 0 writes the summary. ``shutdown=False`` keeps the agent worlds up for another run of
    the same agents in the same launch (the benchmark runs many seeds and methods per launch). An agent that cannot
    start raises `StartupError`."""
    from transformers import TrainerCallback

    from .progress import install

    trainer, test = build_trainer(script_args, config, reward_funcs)
    global_rank = trainer.topology.global_rank
    if test is None and script_args.eval_samples > 0 and global_rank == 0:
        print(
            f"hacpo: task {script_args.task!r} has no held-out rows, so no accuracy before and after training is "
            "reported; set `dataset_test_split` (a split of dataset_name, or a .jsonl file of held-out rows)",
            file=sys.stderr,
            flush=True,
        )
    before, before_by_half = _evaluate(trainer, test, script_args, by_half=True, when="before training")
    curve = [] if before is None else [(0, before)]
    # every agent's number on global rank 0's console, before its one progress bar starts
    starts = trainer.exchange.all_gather((trainer.agent, before), what="held-out accuracy before training")
    if global_rank == 0:
        shown = set()
        for agent, value in starts:  # in launch order; an agent's rank 0 holds its number
            if value is not None and agent not in shown:
                shown.add(agent)
                print(f"[{agent}] held-out accuracy before training: {value:.3f}", flush=True)

    class LearningCurve(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            every = script_args.eval_every
            if every and state.global_step % every == 0 and state.global_step < state.max_steps:
                accuracy = _evaluate(trainer, test, script_args, when=f"at step {state.global_step}")
                if accuracy is not None:
                    curve.append((state.global_step, accuracy))

    trainer.add_callback(LearningCurve())
    install(trainer, global_rank)
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    trainer.save_model()
    after, after_by_half = _evaluate(trainer, test, script_args, by_half=True, when="after training")
    if after is not None:  # printed with every agent's in the summary below, once the progress bar is closed
        curve.append((trainer.state.global_step, after))

    is_agent_main = trainer.accelerator.process_index == 0
    # the run's record, next to the agent
    if is_agent_main:
        with open(os.path.join(config.output_dir, "log_history.json"), "w") as f:
            json.dump(trainer.state.log_history, f)
        _write_task_record(config, script_args)
    import resource

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    halves = {"accuracy_before_by_half": before_by_half, "accuracy_after_by_half": after_by_half}
    halves["sharing"] = describe_sharing(vars(config))  # this agent's mode and its settings, as it trained
    report = (trainer.agent, is_agent_main, before, after, trainer.state.log_history, config.output_dir, curve, peak_mb)
    reports = [r for r in trainer.exchange.all_gather((*report, halves), what="final report") if r[1]]
    if trainer.topology.global_rank == 0:
        root = os.path.commonpath([r[5] for r in reports]) if len(reports) > 1 else config.output_dir
        summary = {
            r[0]: {
                "accuracy_before": r[2],
                "accuracy_after": r[3],
                "output_dir": r[5],
                "curve": r[6],
                "peak_rss_mb": round(r[7], 1),
                **{k: v for k, v in r[8].items() if v is not None},  # a task with halves: accuracy per half
            }
            for r in reports
        }
        with open(os.path.join(root, "hacpo_summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        print("\nHACPO run finished.")
        for agent, info in summary.items():
            change = ""
            if info["accuracy_before"] is not None:
                change = f"  held-out accuracy {info['accuracy_before']:.3f} -> {info['accuracy_after']:.3f}"
            print(f"  {agent}: {info['output_dir']}{change}")
            print(f"    {info['sharing']}")
        if script_args.plot:
            png = os.path.join(root, "hacpo_curves.png")
            _plot(
                {r[0]: r[4] for r in reports},
                [r[0] for r in reports],
                png,
                {r[0]: r[6] for r in reports},
                config.temperature,
            )
            print(f"  curves: {png}")
        print(f"  summary: {os.path.join(root, 'hacpo_summary.json')}", flush=True)
    if shutdown:
        trainer.topology.shutdown()  # nobody leaves while another process still uses the exchange group
    return 0


def cli() -> None:
    code = main()
    from ..run.topology import exit_process

    exit_process(code)


if __name__ == "__main__":
    cli()
