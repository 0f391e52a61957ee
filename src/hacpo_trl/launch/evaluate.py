"""`hacpo-eval`: evaluate trained agents, each on its own, and write JSON and a markdown table.

    hacpo-eval --model outputs/demo_cpu/tiny-llama --model outputs/demo_cpu/tiny-qwen2
    python -m hacpo_trl.evaluate --model AGENT --benchmark math500          # the same

The command line over `hacpo_trl.evaluation.evaluate` (the library: generation, scoring, benchmarks): which
benchmarks each agent gets (by default the task and split its training run evaluated, from the record
`hacpo-train` writes next to it), with which reward, template and budget.
"""

from __future__ import annotations

from ..evaluation.evaluate import (
    BENCHMARKS,
    BUILTIN_TASKS,
    MAIN_TABLE_NEW_TOKENS,
    Benchmark,
    builtin_eval,
    evaluate_model,
    evaluate_with_vllm,
    load_benchmark,
    load_for_eval,
    trained_task,
)

__all__ = ["cli", "main"]


def _markdown(results: dict[str, dict[str, dict]]) -> str:
    benches = sorted({b for per_model in results.values() for b in per_model})
    lines = ["| model | " + " | ".join(benches) + " |", "|---|" + "---|" * len(benches)]
    for model, per_bench in results.items():
        cells = []
        for b in benches:
            r = per_bench.get(b)
            cells.append("" if r is None else f"{r['avg@k']:.3f}" + (f" / {r['best@k']:.3f}" if r["k"] > 1 else ""))
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`hacpo-eval`: evaluate one or more trained agents, each on its own, and write JSON and a markdown table."""
    import argparse
    import json
    import os

    from transformers import AutoTokenizer

    from ..tasks.rewards import math_verify_boxed

    parser = argparse.ArgumentParser(prog="hacpo-eval", description=main.__doc__)
    parser.add_argument("--model", action="append", required=True, help="a trained agent folder (repeatable)")
    parser.add_argument(
        "--benchmark",
        action="append",
        default=None,
        help=f"a built-in task ({', '.join(BUILTIN_TASKS)}) or one of {sorted(BENCHMARKS)} (repeatable); default: "
        "the task the agent was trained on (its held-out split, as many problems as the run evaluated)",
    )
    parser.add_argument("--dataset", help="any dataset id or .json/.jsonl file, with --problem_column/--answer_column")
    parser.add_argument("--split", default="test")
    parser.add_argument("--problem_column", default="problem")
    parser.add_argument("--answer_column", default="answer")
    parser.add_argument("--k", type=int, default=1, help="samples per problem: avg@k and best@k")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument(
        "--max_new_tokens",
        type=int,
        default=MAIN_TABLE_NEW_TOKENS,
        help="the paper's main table: 8192 (its ablations: 4096); built-in arithmetic: at most 8",
    )
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N problems only")
    parser.add_argument(
        "--batch_size",
        type=int,
        default=None,
        help="problems per generate call (x k samples), lowered to fit the KV cache; default: 64 on built-in "
        "tasks, else 16",
    )
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf", help="generate with transformers or vLLM")
    parser.add_argument(
        "--chat_template_kwargs",
        type=json.loads,
        default=None,
        help="e.g. '{\"enable_thinking\": false}'; default: the agent's own from training (hacpo_task.json)",
    )
    parser.add_argument(
        "--reward_funcs",
        nargs="+",
        default=None,
        help="as hacpo-train's: a built-in name or package.module:function (its folder on PYTHONPATH); the first "
        "scores each completion. Default: on the task an agent was trained on, its run's (hacpo_task.json), so "
        "that the number is the training summary's; elsewhere the benchmark's own",
    )
    parser.add_argument("--output_dir", default="eval_results")
    args = parser.parse_args(argv)
    from ..tasks.rewards import get_reward_funcs

    def reward_of(names, whose: str):
        try:
            return get_reward_funcs(list(names))[0]
        except ValueError as exc:
            parser.error(f"{whose} reward_funcs {list(names)} cannot be loaded: {exc}")

    chosen_reward = reward_of(args.reward_funcs, "--reward_funcs") if args.reward_funcs else None

    benches: dict[str, Benchmark | None] = {}
    for name in args.benchmark or []:
        if name not in BUILTIN_TASKS and name not in BENCHMARKS:
            parser.error(
                f"unknown benchmark {name!r}; use one of {list(BUILTIN_TASKS) + sorted(BENCHMARKS)}, or --dataset"
            )
        benches[name] = BENCHMARKS.get(name)
    if args.dataset:
        benches[os.path.basename(args.dataset.rstrip("/"))] = Benchmark(
            args.dataset, args.split, args.problem_column, args.answer_column
        )
    if args.backend == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            parser.error("--backend vllm needs vLLM: pip install 'hacpo-trl[vllm]' (GPU only)")
    plans = {}  # per agent: its benchmarks and, for built-in tasks, how its training run evaluated them
    for path in args.model:
        if not os.path.isdir(path):
            parser.error(f"--model {path!r} is not a folder with a trained agent")
        record = trained_task(path) or {}
        task = record.get("task")
        chosen = dict(benches)
        # no benchmark named: the task the agent was trained on, else the short-answer task
        if not chosen:
            if task is not None and task not in BUILTIN_TASKS:
                parser.error(f"--model {path!r} was trained on task {task!r}: name a --benchmark or --dataset")
            chosen = {task or "arithmetic": None}
            print(
                f"{os.path.basename(os.path.normpath(path))}: "
                + (
                    f"trained on {task!r}; evaluating its held-out {record.get('eval_split', 'test')!r} split"
                    if task
                    else "no training record; evaluating the built-in 'arithmetic' task"
                ),
                flush=True,
            )
        for name in chosen:
            if task in BUILTIN_TASKS and name in BUILTIN_TASKS and name != task:
                parser.error(
                    f"--model {path!r} was trained on {task!r}, not {name!r}: use --benchmark {task} "
                    "(or leave --benchmark out)"
                )
        # what training scored with, loaded before any model (a custom module missing from PYTHONPATH: one line)
        rewards = {}
        if chosen_reward is None and record.get("reward_funcs") and task in chosen:
            fix = "put its module's folder on PYTHONPATH as in training, or pass --reward_funcs"
            rewards[task] = reward_of(record["reward_funcs"], f"--model {path!r}: its run's ({fix});")
        plans[path] = (chosen, record, rewards)

    results: dict[str, dict[str, dict]] = {}
    for path in args.model:
        benches, record, rewards = plans[path]
        model = load_for_eval(path) if args.backend == "hf" else None
        tok = AutoTokenizer.from_pretrained(path, padding_side="left")
        name = os.path.basename(os.path.normpath(path))
        results[name] = {}
        template_kwargs = args.chat_template_kwargs
        if template_kwargs is None:  # as the agent was trained (e.g. Qwen3 with enable_thinking false)
            template_kwargs = record.get("chat_template_kwargs")
        for bench_name, bench in benches.items():
            batch_size = args.batch_size or 16
            limit = args.limit
            if bench is None:
                trained_here = record.get("task") == bench_name
                data, reward, max_new = builtin_eval(
                    bench_name,
                    record.get("max_completion_length") if trained_here else None,
                    record.get("eval_split", "test") if trained_here else "test",
                )
                max_new = min(args.max_new_tokens, max_new)
                batch_size = args.batch_size or 64  # as the training run's evaluation batches
                if limit is None and trained_here and record.get("eval_samples"):
                    limit = record["eval_samples"]  # the problems the run's summary reports
            else:
                data, reward, max_new = load_benchmark(bench), math_verify_boxed, args.max_new_tokens
            reward = chosen_reward or rewards.get(bench_name, reward)
            if limit:
                data = data.select(range(min(limit, len(data))))
            sampling = dict(k=args.k, temperature=args.temperature, max_new_tokens=max_new)
            if args.backend == "vllm":
                result = evaluate_with_vllm(path, tok, data, reward, chat_template_kwargs=template_kwargs, **sampling)
            else:
                result = evaluate_model(
                    model,
                    tok,
                    data,
                    reward,
                    batch_size=batch_size,
                    chat_template_kwargs=template_kwargs,
                    progress=True,
                    desc=f"{name} / {bench_name}",
                    phase="evaluation (hacpo-eval)",
                    **sampling,
                )
            results[name][bench_name] = result.as_dict()
            print(
                f"{name} / {bench_name} ({len(data)} problems): avg@{args.k} {result.avg_at_k:.3f}  "
                f"best@{args.k} {result.best_at_k:.3f}"
            )
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(args.output_dir, "results.md"), "w") as f:
        f.write(_markdown(results))
    print(f"results: {os.path.join(args.output_dir, 'results.json')} and results.md")
    return 0


def cli() -> None:
    import sys

    sys.exit(main())


if __name__ == "__main__":
    cli()
