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

from .plan import DEVICE_GIB  # what --plan assumes of an 80 GB card, quoted in --help

# Recipe reading and checking live in `hacpo_trl.recipe`; the names are re-exported here for existing callers.
from .recipe import (
    HACPOScriptArguments,
    RecipeError,
    check_output_dir,
    check_recipe,
    config_path,
    load_recipe,
    numbers_as_values,
    preflight,
)
from .trackers import check_trackers

__all__ = ["HACPOScriptArguments", "RecipeError", "check_recipe", "load_recipe", "main"]


# ------------------------------------------------------------------------------------------------ the run


def _dataset(script_args: HACPOScriptArguments):
    from .tasks import TASKS, load_any_dataset, math_dataset

    if script_args.task in TASKS:
        splits = TASKS[script_args.task]()
        if script_args.eval_split not in splits:
            raise RecipeError(f"task {script_args.task!r} has no {script_args.eval_split!r} split")
        return splits["train"], splits[script_args.eval_split]
    if script_args.task == "math":
        return math_dataset(script_args.dataset_name or "DigitalLearningGmbH/MATH-lighteval"), None
    data = load_any_dataset(script_args.dataset_name, script_args.dataset_config, script_args.dataset_train_split)
    return data, None


def _evaluate(trainer, test, script_args, by_half: bool = False):
    """Held-out accuracy, reported by the agent's rank 0 (None elsewhere); with ``by_half``, (accuracy, accuracy per
    half) for a task whose rows name their half (`hacpo_trl.tasks.HALVES`; None per half for any other task), from
    the same completions. Under FSDP or ZeRO-3 every forward is a collective over the agent's ranks, so all of them
    generate (the same prompts, in calls sized alike by the least free memory among them) or rank 0 would wait
    forever for the other shards."""
    nothing = (None, None) if by_half else None
    if test is None or script_args.eval_samples <= 0:
        return nothing
    collective = getattr(trainer, "is_fsdp_enabled", False) or getattr(getattr(trainer, "_dist", None), "is_zero3", 0)
    if trainer.accelerator.process_index != 0 and not collective:
        return nothing
    from .evaluate import eval_length, evaluate_model, least_free_bytes
    from .rewards import get_reward_funcs

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
    )
    if trainer.accelerator.process_index != 0:
        return nothing
    return (result.avg_at_k, result.by_group) if by_half else result.avg_at_k


def _write_task_record(config, script_args) -> None:
    """What this agent was trained on, next to it, so that `hacpo-eval` evaluates the same task the same way."""
    from .evaluate import TASK_RECORD

    record = {
        "task": script_args.task,
        "dataset_name": script_args.dataset_name,
        "reward_funcs": list(script_args.reward_funcs),
        "eval_split": script_args.eval_split,
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


def _place(recipe: dict, world: int) -> None:
    """Give this process its agent's GPUs and the CUDA allocator's settings while CUDA cannot have been initialised
    yet (see `hacpo_trl.placement`). A recipe whose process counts do not fit the launch is left to `check_recipe`."""
    from .placement import place_process, process_counts, set_cuda_allocator, share_gpus

    counts = process_counts(recipe)
    if world > 1 and counts is not None and sum(counts) == world:
        place_process(counts, share_gpus(recipe))
    said = set_cuda_allocator(recipe)
    if said and os.environ.get("RANK", "0") == "0":
        print(said, file=sys.stderr, flush=True)


def _filter_library_warnings(recipe: dict, argv: list[str]) -> None:
    """Hide library warnings a user of this script cannot act on (each one says why)."""
    import warnings

    # TRL 1.16 reads `model.is_gradient_checkpointing` and calls `gradient_checkpointing_enable/disable` around every
    # generation, which transformers 5 deprecates (activation_checkpointing_*); only a TRL release fixes it.
    for name in ("is_gradient_checkpointing", "gradient_checkpointing_enable", "gradient_checkpointing_disable"):
        warnings.filterwarnings("ignore", message=rf"`{name}` is deprecated", category=FutureWarning)
    if "gradient_checkpointing" not in recipe and not any(a.startswith("--gradient_checkpointing") for a in argv):
        # GRPOConfig's own default sets the deprecated `gradient_checkpointing` field (to True) when the user set
        # neither name; a user who wrote `gradient_checkpointing` still sees the warning telling them the new name.
        warnings.filterwarnings("ignore", message=r"`gradient_checkpointing` is deprecated", category=FutureWarning)


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

    from . import recipe

    lines = [_WORKFLOW, "task, data and reporting:"]
    config = os.path.join(os.path.dirname(recipe.__file__), "config.py")
    for source, cls in ((inspect.getsource(recipe), "HACPOScriptArguments"), (open(config).read(), "HACPOConfig")):
        body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls).body
        if cls == "HACPOConfig":
            lines += ["", "HACPO settings (the paper's defaults):"]
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
            lines.append(f"  --{node.target.id:<28} {help_text} (default: {default})")
    return "\n".join(lines)


def refuse(exc: Exception, prog: str = "hacpo-train", environ=os.environ) -> int:
    """Print ``prog: error: <exc>`` exactly once per launch, however the ranks race; return exit status 2.

    The checks before this are a deterministic function of the recipe and the launch, so every rank fails the
    same way. Global rank 0 prints and exits; the launcher then stops every other rank. Any other rank first waits
    (at most ``HACPO_ERROR_WAIT`` seconds, 60 by default) for that stop, so it can never exit first and have the
    launcher kill rank 0 before it printed; if it is still alive after the wait, rank 0 did not fail this way,
    and it prints the line itself. Once the agent worlds are split, ``RANK`` is agent-local (every agent has a
    rank 0), so the global rank decides. Under a launcher the line is also repeated after the launcher's own
    traceback (`_repeat_after_launcher`), so that it is the last line on the console as well as the first.
    """
    if environ.get("HACPO_GLOBAL_RANK", environ.get("RANK", "0")) != "0":
        import signal
        import time

        # the launcher's stop is expected (rank 0 says why): no "stopped by the launcher" line of our own
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(float(environ.get("HACPO_ERROR_WAIT", "60")))
    line = f"{prog}: error: {exc}"
    print(line, file=sys.stderr, flush=True)
    _repeat_after_launcher(line, environ)
    return 2


# Run by `_repeat_after_launcher` in a process of its own: wait until the launcher has exited (its pidfd becomes
# readable), at most argv[2] seconds, then print argv[3]. No imports beyond the standard library's `select`.
_REPEAT = """import select, sys
if select.select([int(sys.argv[1])], [], [], float(sys.argv[2]))[0]:
    sys.stderr.write(sys.argv[3] + "\\n")
"""


def _repeat_after_launcher(line: str, environ=os.environ, wait_seconds: float = 300.0) -> None:
    """Under a torch elastic launcher (``accelerate launch``, ``torchrun``), print ``line`` once more after the
    launcher has exited: it follows a failed process with a ~40-line traceback that would otherwise bury the one
    useful line. A detached process (its own session, so the launcher's stop of this process's group spares it)
    waits on the launcher, this process's parent, and writes to the same stderr. Linux only (pidfd); elsewhere,
    and outside a launcher, the line is printed once, before the traceback."""
    if "TORCHELASTIC_RUN_ID" not in environ:
        return
    import subprocess

    try:
        launcher = os.pidfd_open(os.getppid())
    except (AttributeError, OSError):
        return
    try:
        subprocess.Popen(
            [sys.executable, "-S", "-c", _REPEAT, str(launcher), str(wait_seconds), line],
            pass_fds=(launcher,),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
    except OSError:
        pass  # the line was printed once already
    finally:
        os.close(launcher)


def _parse(parser, argv: list[str]):
    """TrlParser's parse, with argparse's usage page (1,300 lines of fields) folded into one `RecipeError` line."""
    import contextlib
    import io

    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            parsed = parser.parse_args_and_config(argv)
    except SystemExit as exc:
        if not exc.code:
            raise
        lines = [line for line in captured.getvalue().splitlines() if ": error: " in line]
        raise RecipeError(lines[-1].split(": error: ", 1)[1] if lines else captured.getvalue().strip()) from None
    sys.stderr.write(captured.getvalue())  # warnings of a good parse are the user's to see
    return parsed


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help-all" in argv:  # TRL's full field list (GRPOConfig and TrainingArguments: about 1,300 lines)
        argv = ["--help" if a == "--help-all" else a for a in argv]
    elif "-h" in argv or "--help" in argv:
        print(short_help())
        return 0
    if "--plan" in argv:  # check the launch on paper: no weights, no process group
        from .plan_cli import main as plan

        return plan(argv)
    argv = numbers_as_values(argv)
    try:
        path = config_path(argv)
        if path is not None:
            world = int(os.environ.get("WORLD_SIZE", "1") or 1)
            launched = world if "RANK" in os.environ else None
            recipe = load_recipe(path)
            try:
                effective = load_recipe(path, argv)
            except ValueError:  # not plain --key value flags: the argument parser below names the problem
                effective = recipe
            preflight(effective, num_processes=launched)  # every rank, before any ML library is imported
            check_output_dir(effective)
            _place(recipe, world)  # before anything imports trl (and maybe CUDA)
            check_recipe(effective, num_processes=launched)  # as the flags leave it
            _filter_library_warnings(recipe, argv)
        from trl import TrlParser

        from .config import HACPOConfig

        parser = TrlParser((HACPOScriptArguments, HACPOConfig))
        script_args, config = _parse(parser, argv)
        if not config.agents:
            raise RecipeError("recipe key 'agents' is missing: name at least one agent with its model_name_or_path")
        check_trackers(
            config.report_to, warn=os.environ.get("RANK", "0") == "0"
        )  # before any download or vLLM start-up
        from .rewards import get_reward_funcs

        reward_funcs = get_reward_funcs(script_args.reward_funcs)
    except (RecipeError, ValueError) as exc:
        return refuse(exc)
    return _run(script_args, config, reward_funcs)


def _run(script_args, config, reward_funcs, shutdown: bool = True) -> int:
    """One run of every agent. ``shutdown=False`` keeps the agent worlds up for another run of the same agents in
    the same launch (the benchmark runs many seeds and methods per launch)."""
    import torch
    from transformers import TrainerCallback

    from .demo import resolve_model
    from .progress import install, quiet_replica
    from .topology import current_topology
    from .trainer import HACPOTrainer

    def trainer_rank() -> int:
        return current_topology().agent_rank

    topology = current_topology()  # RANK is agent-local by now
    global_rank = topology.global_rank if topology is not None else 0
    if global_rank != 0:
        quiet_replica()
    spec = config.agent_spec
    if spec.model_name_or_path.startswith("builtin:"):
        if trainer_rank() == 0:
            resolve_model(spec.model_name_or_path)  # one process per agent builds it
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # this agent's world only
    model_path = resolve_model(spec.model_name_or_path)
    train, test = _dataset(script_args)
    trainer = HACPOTrainer(model=model_path, reward_funcs=reward_funcs, args=config, train_dataset=train)
    before, before_by_half = _evaluate(trainer, test, script_args, by_half=True)
    curve = [] if before is None else [(0, before)]
    if before is not None:
        print(f"[{trainer.agent}] held-out accuracy before training: {before:.3f}", flush=True)

    class LearningCurve(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            every = script_args.eval_every
            if every and state.global_step % every == 0 and state.global_step < state.max_steps:
                accuracy = _evaluate(trainer, test, script_args)
                if accuracy is not None:
                    curve.append((state.global_step, accuracy))

    trainer.add_callback(LearningCurve())
    install(trainer, global_rank)
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    trainer.save_model()
    after, after_by_half = _evaluate(trainer, test, script_args, by_half=True)
    if after is not None:
        curve.append((trainer.state.global_step, after))
        print(f"[{trainer.agent}] held-out accuracy after training:  {after:.3f}", flush=True)

    is_agent_main = trainer.accelerator.process_index == 0
    if is_agent_main:  # the run's record, next to the agent
        with open(os.path.join(config.output_dir, "log_history.json"), "w") as f:
            json.dump(trainer.state.log_history, f)
        _write_task_record(config, script_args)
    import resource

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    halves = {"accuracy_before_by_half": before_by_half, "accuracy_after_by_half": after_by_half}
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
    from .topology import exit_process

    exit_process(code)


if __name__ == "__main__":
    cli()
