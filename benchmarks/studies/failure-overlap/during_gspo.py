"""Where a learner's own groups carry a signal during GSPO's run, and what its peer wrote there, from the run records'
per-batch counts (`hacpo/prompts/...`, logged since 2026-11-29): per generation batch of 8 prompts, the prompts the
learner solved at every completion, was unsure on (some right, some wrong) and failed at every one, and its peer's
wrong rows on the solved ones and right rows on the others; averaged over the seeds' batches, first and second half
of the run apart. The peer's wrong rows on the unsure prompts are 8 per prompt less its right ones.

    python benchmarks/studies/failure-overlap/during_gspo.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import _runs  # noqa: E402

RUNS = Path(__file__).resolve().parents[2] / "runs"
FOLDERS = {"state": "validation-48steps-b3-outcomes", "model": "validation-48steps-b3-outcomes",
           "size": "validation-64steps-b3-size-lr5e-05-outcomes"}  # fmt: skip
# (stronger, weaker) learner of each pair
PAIRS = {"state": ("trace-instruct", "trace-base"), "size": ("trace-large", "trace-small"),
         "model": ("trace-qwen2", "trace-llama")}  # fmt: skip


def table() -> list[str]:
    head = ("| pair | learner | batches | half | solved | unsure | failed | peer wrong on solved | peer right on unsure "
            "| peer wrong on unsure | peer right on failed |")  # fmt: skip
    lines = [head, "|" + "---|" * 11]
    for pair, (stronger, weaker) in PAIRS.items():
        records = {k: v for k, v in _runs.load(RUNS / FOLDERS[pair]).items() if k.startswith(f"{pair}/GSPO-")}
        for learner, peer in ((stronger, weaker), (weaker, stronger)):
            keys = ["solved", "unsure", "failed", f"{peer}_wrong_on_solved", f"{peer}_right_on_unsure",
                    f"{peer}_right_on_failed"]  # fmt: skip
            columns = [r["logs"][learner]["batches"] for r in records.values()]
            n = len(columns[0][f"hacpo/prompts/{keys[0]}"])
            for half, part in (("first", slice(0, n // 2)), ("second", slice(n // 2, n))):
                mean = {k: statistics.mean(x for c in columns for x in c[f"hacpo/prompts/{k}"][part]) for k in keys}
                wrong_unsure = 8 * mean["unsure"] - mean[keys[4]]
                values = [mean[k] for k in keys[:5]] + [wrong_unsure, mean[keys[5]]]
                cells = " | ".join(f"{v:.2f}" for v in values)
                lines.append(f"| {pair} | `{learner}` | {len(columns)} × {n} | {half} | {cells} |")
    return lines


if __name__ == "__main__":
    print("\n".join(table()))
