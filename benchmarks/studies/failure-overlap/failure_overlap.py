"""How many problems the stronger agent of each pair fails at every sample while its weaker peer solves one: the
prompts `capability_gate_rescue` would lend the weaker peer's rows on, measured before any RL (RESULTS.md, rule 8).
And where the stronger agent gets no GRPO signal of its own (every sample right, or every one wrong) or is unsure
(some right), with what the weaker peer wrote there: the rows a lever of another kind than the preset's would use.

    python benchmarks/studies/failure-overlap/failure_overlap.py      # the first 200 validation problems, 8 samples at T = 1, 40 tokens

Both agents of each pair as committed (`benchmarks/agents`), sampled with seed 0 on one thread; the reward is the
training reward (`arithmetic_trace_answer`). Writes `benchmarks/studies/failure-overlap/RESULTS.md`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the shared modules
from _common import provenance, write_section  # noqa: E402

from hacpo_trl.agents.builtin import resolve_model  # noqa: E402
from hacpo_trl.agents.demo import PAIRS  # noqa: E402
from hacpo_trl.evaluation.evaluate import _prompt_ids, builtin_eval  # noqa: E402

STRONGER = {"state": "trace-instruct", "size": "trace-large", "model": "trace-qwen2", "style": "trace-bracket"}


def correct_samples(name: str, rows: list[dict], k: int, tokens: int) -> torch.Tensor:
    """(problems, k) rewards of ``k`` samples per problem at temperature 1."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(f"builtin:{name}")
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    _, reward, _ = builtin_eval("arithmetic_trace", tokens, split="validation")
    torch.manual_seed(0)
    prompts = [_prompt_ids(tok, r, None) for r in rows]
    texts = []
    for start in range(0, len(prompts), 25):
        chunk = [p for p in prompts[start : start + 25] for _ in range(k)]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, do_sample=True,
                             temperature=1.0, top_p=None, top_k=None, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)  # fmt: skip
        texts += tok.batch_decode(out[:, width:], skip_special_tokens=True)
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    scores = reward(prompts=None, completions=completions, answer=[r["answer"] for r in rows for _ in range(k)])
    return torch.tensor([float(s or 0) for s in scores]).view(len(rows), k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=40)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    data, _, _ = builtin_eval("arithmetic_trace", opts.tokens, split="validation")
    rows = list(data)[: opts.problems]
    lines = ["## Problems the stronger agent fails at every sample, and its weaker peer solves", "",
             "| pair | stronger (sampled acc.) | weaker (sampled acc.) | stronger fails all | of which weaker solves | "
             "weaker's correct samples there |", "|---|---|---|---|---|---|"]  # fmt: skip
    signal = {}
    # the paper's four pairs, on arithmetic_trace
    for pair, strong in STRONGER.items():
        weak = next(a for a in PAIRS[pair] if a != strong)
        s = correct_samples(strong, rows, opts.samples, opts.tokens) > 0
        w = correct_samples(weak, rows, opts.samples, opts.tokens) > 0
        failed = s.sum(1) == 0
        signal[pair] = (s, w)
        lines.append(
            f"| {pair} | `{strong}` ({s.float().mean():.3f}) | `{weak}` ({w.float().mean():.3f}) | {int(failed.sum())} "
            f"| {int((failed & (w.sum(1) > 0)).sum())} | {int(w[failed].sum())} |"
        )
        print(lines[-1], flush=True)
    lines += ["", "## Where the stronger agent has no signal of its own, and what its weaker peer wrote there", "",
              "Per pair, the problems by how many of the stronger agent's samples are right: all (no signal: GRPO's "
              "advantages are 0), some (unsure) or none (no signal); with the weaker peer's wrong samples where the "
              "stronger solves all (plausible negatives) and its right samples where the stronger is unsure or fails all.", "",
              "| pair | stronger solves all | weaker's wrong samples there | unsure (1 to k-1 right) | weaker's right "
              "samples there | stronger fails all | weaker's right samples there |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for pair, (s, w) in signal.items():
        solved, failed = s.sum(1) == s.shape[1], s.sum(1) == 0
        unsure = ~solved & ~failed
        lines.append(
            f"| {pair} | {int(solved.sum())} | {int((~w[solved]).sum())} | {int(unsure.sum())} | {int(w[unsure].sum())} "
            f"| {int(failed.sum())} | {int(w[failed].sum())} |"
        )
    lines += ["", f"{opts.problems} validation problems x {opts.samples} samples at T = 1, {opts.tokens} new tokens.",
              provenance("studies/failure-overlap/failure_overlap.py", sys.argv[1:], time.perf_counter() - start)]  # fmt: skip
    write_section(Path(__file__).resolve().parent / "RESULTS.md", "failure-overlap", lines)


if __name__ == "__main__":
    main()
