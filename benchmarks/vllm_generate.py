"""vLLM's CPU build against transformers' generate, for the built-in vllm pair on the CPU: one generation batch of
`recipes/tiny_vllm.yaml` (16 prompts x 4 completions per agent), sampled at temperature 1, both methods in one run,
alternating, ``--repetitions`` times, at the recipe's completion length and at a longer forced one.

    .venv-vllm/bin/python benchmarks/vllm_generate.py        # after `make install-vllm`

Each agent runs in its own process (one engine per process, as in training): vLLM eager in float32 as the trainer
builds it on CPU, transformers' `generate` on the whole batch in one call, as TRL does without vLLM. Reported per
agent and method: seconds per generation batch (median over repetitions, min-max) and generated tokens per second.
It measures the CPU code path only and predicts nothing about GPU speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
AGENTS = ("vllm-llama", "vllm-qwen2")
PROMPTS, GENERATIONS = 16, 4  # the recipe's generation batch: per_device_train_batch_size 16 x steps 4 = 64 rows


def _prompt_ids(tok) -> list[list[int]]:
    from hacpo_trl.tasks.data import arithmetic_splits

    rows = arithmetic_splits()["train"].select(range(PROMPTS))
    ids = [
        tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True) for r in rows
    ]
    return [list(i["input_ids"]) for i in ids for _ in range(GENERATIONS)]


def _agent(name: str, lengths: list[int], repetitions: int) -> list[dict]:
    """This process's agent: every (repetition, length, method) in alternation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from hacpo_trl.agents.builtin import resolve_model

    path = resolve_model(f"builtin:{name}")
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=128, seed=0, max_num_seqs=64)
    prompts = _prompt_ids(tok)
    width = max(map(len, prompts))
    input_ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    attention = (torch.arange(width)[None, :] >= (width - torch.tensor([len(p) for p in prompts]))[:, None]).long()

    def run_vllm(length: int, forced: bool) -> int:
        params = SamplingParams(temperature=1.0, max_tokens=length, min_tokens=length if forced else 0, seed=None)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def run_generate(length: int, forced: bool) -> int:
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=1.0, top_k=0,
                max_new_tokens=length, min_new_tokens=length if forced else 0, pad_token_id=tok.pad_token_id,
            )  # fmt: skip
        ends = out[:, width:] == tok.eos_token_id
        lengths = torch.where(ends.any(1), ends.int().argmax(1) + 1, ends.shape[1])  # up to the first EOS, as TRL keeps
        return int(lengths.sum())

    results = []
    threads = torch.get_num_threads()
    for length, forced in [(lengths[0], False), *[(n, True) for n in lengths[1:]]]:
        run_vllm(length, forced), run_generate(length, forced)  # warm-up, not measured
        for rep in range(repetitions):
            for method, run in (("vLLM", run_vllm), ("generate", run_generate)):
                start = time.perf_counter()
                tokens = run(length, forced)
                results.append({"agent": name, "method": method, "length": length, "forced": forced, "repetition": rep,
                                "seconds": time.perf_counter() - start, "tokens": tokens, "torch_threads": threads})  # fmt: skip
    return results


def table(results: list[dict]) -> list[str]:
    lines = [
        "| agent | completion length | method | s per generation batch (median, min-max) | tokens per s (median) |",
        "|---|---|---|---|---|",
    ]
    keys = sorted(
        {(r["agent"], r["length"], r["forced"], r["method"]) for r in results},
        key=lambda k: (k[0], k[1], k[3] != "vLLM"),
    )
    for agent, length, forced, method in keys:
        rows = [
            r for r in results if (r["agent"], r["length"], r["forced"], r["method"]) == (agent, length, forced, method)
        ]
        seconds = [r["seconds"] for r in rows]
        rates = [r["tokens"] / r["seconds"] for r in rows]
        label = f"{length} (forced)" if forced else f"up to {length} (recipe)"
        lines.append(
            f"| {agent} | {label} | {method} | {statistics.median(seconds):.3f} ({min(seconds):.3f}-{max(seconds):.3f}) "
            f"| {statistics.median(rates):.0f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python benchmarks/vllm_generate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--lengths", default="6,48", help="the recipe's max_completion_length, then forced lengths")
    parser.add_argument("--results", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--raw", default=None, help="its timings (default: vllm_generate.json beside --results)")
    parser.add_argument("--from_raw", default=None, help="the section from committed timings, nothing run")
    parser.add_argument("--agent", help=argparse.SUPPRESS)  # one agent's process (below)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.agent:
        Path(args.out).write_text(json.dumps(_agent(args.agent, lengths, args.repetitions)))
        return 0
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", **os.environ}  # fmt: skip
    started, results = time.time(), []
    sys.path.insert(0, str(HERE))
    import shlex
    import tempfile

    from _common import command, provenance, resolved, write_section

    raw_path = Path(args.raw) if args.raw else Path(args.results).parent / "vllm_generate.json"
    if args.from_raw:  # every timing as measured, committed: the section again, nothing run
        raw = json.loads(resolved(args.from_raw).read_text())
        results, argv, elapsed, day, loads = (
            raw["results"],
            shlex.split(raw["command"])[2:],
            raw["elapsed"],
            raw["day"],
            raw["loads"],
        )
        args = argparse.Namespace(**{**vars(parser.parse_args(argv)), "results": args.results})  # write where asked
    else:
        loads = [os.getloadavg()[0]]
        with tempfile.TemporaryDirectory() as tmp:
            for agent in AGENTS:
                out = os.path.join(tmp, f"{agent}.json")
                cmd = [sys.executable, __file__, "--agent", agent, "--out", out, "--repetitions", str(args.repetitions),
                       "--lengths", args.lengths]  # fmt: skip
                subprocess.run(cmd, check=True, env=env)
                results += json.loads(Path(out).read_text())
                loads.append(os.getloadavg()[0])
        elapsed, day = time.time() - started, time.strftime("%Y-%m-%d")
        raw = {"command": command("vllm_generate.py", argv), "elapsed": elapsed, "day": day, "loads": loads,
               "results": results}  # fmt: skip
        raw_path.write_text(json.dumps(raw, separators=(",", ":")) + "\n")

    torch_threads = "/".join(sorted({str(r["torch_threads"]) for r in results}))
    lines = [
        f"## vLLM's CPU build against transformers' generate: the vllm pair (`benchmarks/vllm_generate.py`, {day}, CPU)",
        "",
        f"One generation batch of `recipes/tiny_vllm.yaml` per agent ({PROMPTS} prompts x {GENERATIONS} completions, "
        "temperature 1), each agent in its own process; vLLM eager in float32 as the trainer builds it on the CPU, "
        f"`generate` on the whole batch in one call; {args.repetitions} repetitions, the methods alternating, after "
        f"one warm-up call each. Torch kept its {torch_threads} threads beside the engine. It measures this CPU path "
        "only and predicts nothing about GPU speed. Each row gives the median and the range over the repetitions: "
        f"the cores were shared (1-minute load {min(loads):.1f}–{max(loads):.1f} at the start and after each agent), "
        "so read a difference only where the ranges do not overlap. Every timing is in "
        f"`{raw_path.name}` beside this page.",
        "",
        *table(results),
        "",
        provenance("vllm_generate.py", argv, elapsed),
    ]
    write_section(Path(args.results), "vllm_generate", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":  # vLLM spawns processes: the script must not run again in them
    sys.exit(main())
