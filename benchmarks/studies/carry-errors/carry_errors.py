"""What a `complement` learner gets wrong on its own half after training: greedy solutions of the `carry` half of
`arithmetic_trace_carries`'s validation split by `trace-carry` as trained by each method, counting the wrong ones
and those that write the no-carry traces' marker (`+0=`) in a column, where every column of this half is due a
carry (`+1=`).

    python benchmarks/studies/carry-errors/carry_errors.py --runs benchmarks/runs/validation-48steps-b3-complement-lr5e-05 \
        --methods GSPO "<method>" --seeds 100 101 --results benchmarks/screens/<screen>/RESULTS.md

Nothing is trained here; the runs' weights are read from their folders (kept local, not committed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the shared modules
from _common import provenance, write_section  # noqa: E402
from reproduce import _folder  # noqa: E402

NO_CARRY_MARKER = "+0="


def writes_no_carry(text: str) -> bool:
    """A solution that adds a carry of 0 to some column (`4+3+0=7`): on the carry half, a column whose carry it lost."""
    return NO_CARRY_MARKER in text


def count(model, tokenizer, rows) -> dict[str, int]:
    """Greedy solutions of ``rows``: how many, how many wrong, how many of the wrong ones write a carry of 0."""
    import torch

    from hacpo_trl.tasks.rewards import arithmetic_trace_answer

    out = {"problems": 0, "wrong": 0, "wrong_with_zero_carry": 0}
    for row in rows:
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_tensors="pt")
        ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
        with torch.no_grad():
            generated = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        text = tokenizer.decode(generated[0, ids.shape[1] :], skip_special_tokens=True)
        wrong = arithmetic_trace_answer([text], [row["answer"]])[0] <= 0
        out["problems"] += 1
        out["wrong"] += wrong
        out["wrong_with_zero_carry"] += wrong and writes_no_carry(text)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True)
    parser.add_argument("--methods", nargs="+", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--results", type=Path, required=True)
    args = parser.parse_args(argv)
    started = time.time()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hacpo_trl.tasks.data import task_splits

    torch.set_num_threads(1)
    rows = [r for r in task_splits("arithmetic_trace_carries")["validation"] if r["half"] == "carry"]
    lines = [
        "## Carry-half errors of `trace-carry` (`benchmarks/studies/carry-errors/carry_errors.py`)",
        "",
        "Greedy solutions of the carry half of the validation split (every column carries) by `trace-carry` after "
        "training: wrong ones, and wrong ones that write a carry of 0 (`+0=`, the no-carry traces' marker).",
        "",
        "| method | seed | problems | wrong | wrong with `+0=` |",
        "|---|---|---|---|---|",
    ]
    for method in args.methods:
        for seed in args.seeds:
            folder = _folder(args.runs, "complement", method, seed) / "trace-carry"
            model = AutoModelForCausalLM.from_pretrained(folder).eval()
            counts = count(model, AutoTokenizer.from_pretrained(folder), rows)
            lines.append(f"| {method} | {seed} | {counts['problems']} | {counts['wrong']} | "
                         f"{counts['wrong_with_zero_carry']} |")  # fmt: skip
            print(lines[-1], flush=True)
    lines += [
        "",
        provenance(
            "studies/carry-errors/carry_errors.py", sys.argv[1:] if argv is None else argv, time.time() - started
        ),
    ]
    write_section(args.results, "carry_errors", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
