"""The benchmark's agents, committed: build each built-in agent from its seed, copy it here and measure it.

    python benchmarks/agents/build.py             # every agent of PAIRS and the demo's short-answer pair
    python benchmarks/agents/build.py --check     # only measure the committed agents and compare with agents.json

Each agent is built by `hacpo_trl.agents.demo.build_agent` (warm-started from its seed until its accuracy lies in its band,
on one thread) into ``HACPO_CACHE`` and copied to ``benchmarks/agents/<name>/``, where ``builtin:<name>`` finds it
on every machine (`hacpo_trl.agents.builtin`). ``agents.json`` records, per agent, the build (steps, accuracy at build), the
weights' SHA-256 and greedy accuracy before RL on each split of its task, exactly as a benchmark run measures it
before training; README.md is written from it. ``--check`` measures the committed copies again: another CPU may
differ in the last bits of a few problems, this one should not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hacpo_trl.agents.demo import BUILD_RECORD, BUILTIN_AGENTS, PAIRS, build_agent  # noqa: E402

RECORD = HERE / "agents.json"
# the agents of every benchmark pair, the vLLM pair and the short-answer pair of the quickstart and the tests
AGENTS = sorted({a for pair in PAIRS.values() for a in pair} | {"tiny-llama", "tiny-qwen2"})
# how the benchmark evaluates each task before and after RL: the recipe's eval_samples and completion length
EVALUATION = {  # task -> (completion length, {split: problems})
    "arithmetic_trace": (40, {"validation": 500, "test": 500}),
    "arithmetic_trace_bracket": (40, {"validation": 500, "test": 500}),
    "arithmetic_trace_carries": (40, {"validation": 500, "test": 500}),
    "arithmetic": (6, {"test": 100}),
}
# the task an agent is benchmarked on (its pair's recipe): `trace-bracket` learns the bracket format but is rewarded
# on the final answer of `arithmetic_trace`, as the style pair trains it
BENCHMARKED_ON = {"trace-bracket": "arithmetic_trace"}
FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "chat_template.jinja", BUILD_RECORD)  # fmt: skip


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def accuracy_before(folder: Path, task: str) -> dict[str, float]:
    """Greedy accuracy on each split, as `hacpo_trl.train` measures it before training (and with halves, per half)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hacpo_trl.evaluation.evaluate import builtin_eval, evaluate_model

    length, splits = EVALUATION[task]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, padding_side="left")
    out = {}
    for split, count in splits.items():
        data, reward, tokens = builtin_eval(task, length, split)
        data = data.select(range(min(count, len(data))))
        by = "half" if "half" in data.column_names else None
        result = evaluate_model(model, tok, data, reward, max_new_tokens=tokens, by=by)
        out[split] = round(result.avg_at_k, 4)
        for half, value in (result.by_group or {}).items():
            out[f"{split} ({half})"] = round(value, 4)
    return out


def describe(name: str, folder: Path) -> dict:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    spec = BUILTIN_AGENTS[name]
    build = json.loads((folder / BUILD_RECORD).read_text())
    config = AutoConfig.from_pretrained(folder)
    task = BENCHMARKED_ON.get(name, spec.task)
    size = sum(t.numel() for t in load_file(folder / "model.safetensors").values())
    return {
        "architecture": config.model_type,
        "hidden_size": config.hidden_size,
        "layers": config.num_hidden_layers,
        "parameters": size,
        "tokenizer": "characters" if spec.architecture == "llama" else "byte-level BPE",
        "seed": spec.seed,
        "warmed_up_on": spec.task,
        "band": list(spec.band),
        "measure": spec.measure,
        "steps": build["steps"],
        "accuracy_at_build": build["validation_accuracy"],
        "built_as": build.get("folder"),
        "task": task,
        "sha256": sha256(folder / "model.safetensors"),
        "accuracy_before": accuracy_before(folder, task),
    }


def copy(name: str) -> Path:
    built = Path(build_agent(name))
    target = HERE / name
    target.mkdir(exist_ok=True)
    for file in FILES:
        if (built / file).exists():
            shutil.copyfile(built / file, target / file)
    record = json.loads((target / BUILD_RECORD).read_text())
    record["folder"] = built.name  # the cache folder it was built as: the name the runs' agents.json record
    (target / BUILD_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return target


def readme(agents: dict[str, dict], command: str) -> str:
    lines = [
        "# The benchmark's agents",
        "",
        "Every benchmark pair, the vLLM pair, `make demo` and the tests train from these folders: `builtin:<name>` "
        "resolves to `benchmarks/agents/<name>` on every machine (`hacpo_trl.agents.builtin`), so every number in "
        "`benchmarks/RESULTS.md` starts from the same weights wherever it is rerun. `builtin:<name>@seed` builds the "
        "agent from its seed instead (cached in `HACPO_CACHE`); builds differ between CPUs, these copies do not.",
        "",
        "Each was built by `hacpo_trl.agents.demo.build_agent`: a tiny model from its seed, warm-started on its task's "
        "`warmup` split, on one thread, until its accuracy on validation problems lies in its band "
        "(`BUILTIN_AGENTS`). *Accuracy before RL* is greedy accuracy, as every run measures it before training "
        "(trace tasks: the 300 validation and first 500 test problems, 40 tokens; `arithmetic`: its first 100 test problems, "
        "no validation split).",
        "",
        "| agent | model | parameters | tokenizer | band (measure) | warm-start steps | at build | before RL | "
        "SHA-256 of the weights |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, a in agents.items():
        before = ", ".join(f"{split} {value:.3f}" for split, value in a["accuracy_before"].items())
        lines.append(
            f"| `{name}` | {a['architecture']} {a['layers']}×{a['hidden_size']} | {a['parameters']:,} | "
            f"{a['tokenizer']} | [{a['band'][0]}, {a['band'][1]}] ({a['measure']}) | {a['steps']} | "
            f"{a['accuracy_at_build']:.3f} | {a['task']}: {before} | `{a['sha256'][:12]}` |"
        )
    lines += ["", f"Made by `{command}`; the numbers are in `agents.json`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="measure the committed agents, compare, write nothing")
    parser.add_argument("--agents", nargs="+", default=AGENTS, choices=AGENTS)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    saved = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    agents = dict(saved)
    for name in args.agents:
        folder = HERE / name if args.check else copy(name)
        agents[name] = describe(name, folder)
        print(f"{name}: {agents[name]['task']} {agents[name]['accuracy_before']}", flush=True)
    if args.check:
        differ = {n: (saved.get(n, {}).get("accuracy_before"), agents[n]["accuracy_before"]) for n in args.agents}
        differ = {n: v for n, v in differ.items() if v[0] != v[1]}
        print(f"{len(args.agents) - len(differ)} of {len(args.agents)} agents measure as committed; differ: {differ}")
        return 1 if differ else 0
    agents = {n: agents[n] for n in AGENTS if n in agents}
    RECORD.write_text(json.dumps(agents, indent=1) + "\n")
    command = " ".join(["python", "benchmarks/agents/build.py", *(argv if argv is not None else sys.argv[1:])])
    (HERE / "README.md").write_text(readme(agents, command))
    print(f"{time.perf_counter() - start:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
