"""Which peer rows HACPO's band keeps, split by whether the peer's answer is correct (the mechanism behind RESULTS.md).

    python benchmarks/peer_rows.py            # every pair, both directions, at the warm-started agents

For each pair and each direction (generator -> learner), the generator samples G = 8 completions (T = 1, as in
training) for 64 RL-train prompts; each completion is re-tokenized into the learner's view exactly as the trainer
does (`peer_completion_ids`, the learner's own chat template) and its sequence ratio s (learner's mean per-token
log-prob over the generator's) is computed. A peer row trains only if lb_m <= s <= 1, and its advantage has the
sign of (reward - the learner's baseline), so for a stronger learner nearly every wrong peer row is pushed down.
The table gives, for correct and wrong peer rows separately, the share below the band, in it and above 1, with
lb = 0.85 (the first bound self-first peers see with 4 updates). This is the first step's view; training moves it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hacpo_trl.demo import PAIRS, build_agent  # noqa: E402
from hacpo_trl.evaluate import _prompt_ids  # noqa: E402
from hacpo_trl.retokenize import peer_completion_ids  # noqa: E402
from hacpo_trl.rewards import arithmetic_trace_answer  # noqa: E402
from hacpo_trl.tasks import trace_splits  # noqa: E402

MAX_NEW = 40


def _load(name: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = build_agent(name)
    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def _mean_logps(model, prompts: list[list[int]], completions: list[list[int]], pad: int) -> torch.Tensor:
    """Mean per-token log-prob of each completion after its prompt (left-padded prompts, right-padded completions)."""
    width_p = max(len(p) for p in prompts)
    width_c = max(len(c) for c in completions)
    ids = torch.full((len(prompts), width_p + width_c), pad)
    attention = torch.zeros_like(ids)
    mask = torch.zeros(len(prompts), width_c)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, width_p - len(p) : width_p] = torch.tensor(p)
        ids[i, width_p : width_p + len(c)] = torch.tensor(c)
        attention[i, width_p - len(p) : width_p + len(c)] = 1
        mask[i, : len(c)] = 1
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, width_p - 1 : -1].float()
    logps = logits.log_softmax(-1).gather(-1, ids[:, width_p:].unsqueeze(-1)).squeeze(-1)
    return (logps * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def direction(generator: str, learner: str, rows: list[dict], lb: float, seed: int) -> dict:
    gen_model, gen_tok = _load(generator)
    learn_model, learn_tok = _load(learner)
    torch.manual_seed(seed)
    gen_prompts = [_prompt_ids(gen_tok, r, None) for r in rows for _ in range(8)]
    learn_prompts = [_prompt_ids(learn_tok, r, None) for r in rows for _ in range(8)]
    answers = [r["answer"] for r in rows for _ in range(8)]
    width = max(len(p) for p in gen_prompts)
    ids = torch.tensor([[gen_tok.pad_token_id] * (width - len(p)) + p for p in gen_prompts])
    out = gen_model.generate(
        input_ids=ids, attention_mask=(ids != gen_tok.pad_token_id).long(), do_sample=True, temperature=1.0,
        top_p=None, top_k=None, max_new_tokens=MAX_NEW, pad_token_id=gen_tok.pad_token_id,
        eos_token_id=gen_tok.eos_token_id,
    )  # fmt: skip
    gen_completions, learner_views, terminated = [], [], []
    for row in out[:, width:].tolist():
        ends = [i for i, t in enumerate(row) if t == gen_tok.eos_token_id]
        row = row[: ends[0] + 1] if ends else row
        gen_completions.append(row)
        terminated.append(bool(ends))
    texts = gen_tok.batch_decode(gen_completions, skip_special_tokens=True)
    for text, term in zip(texts, terminated, strict=True):
        view = peer_completion_ids(learn_tok, text, term, MAX_NEW)
        learner_views.append(view.ids if view is not None else [learn_tok.eos_token_id])
    s = (
        _mean_logps(learn_model, learn_prompts, learner_views, learn_tok.pad_token_id)
        - _mean_logps(gen_model, gen_prompts, gen_completions, gen_tok.pad_token_id)
    ).exp()
    correct = torch.tensor(arithmetic_trace_answer(texts, answers)) > 0
    result = {
        "generator": generator,
        "learner": learner,
        "rows": len(texts),
        "peer_accuracy": float(correct.float().mean()),
    }
    for label, pick in (("correct", correct), ("wrong", ~correct)):
        part = s[pick]
        if part.numel() == 0:
            continue
        result[label] = {
            "rows": int(part.numel()),
            "median": float(part.median()),
            "low": float((part < lb).float().mean()),
            "in_band": float(((part >= lb) & (part <= 1)).float().mean()),
            "high": float((part > 1).float().mean()),
        }
    in_band = (s >= lb) & (s <= 1)
    result["wrong_share_of_kept"] = float((~correct & in_band).sum() / in_band.sum().clamp(min=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--lb", type=float, default=0.85)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = list(trace_splits()["train"].select(range(args.prompts)))
    results = []
    print("| pair | generator → learner | peer correct | correct rows: median s, low / in band / high | "
          "wrong rows: median s, low / in band / high | wrong share of kept rows |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for pair in args.pairs:
        a, b = PAIRS[pair]
        for gen, learn in ((b, a), (a, b)):
            r = direction(gen, learn, rows, args.lb, args.seed)
            results.append({"pair": pair, **r})
            cells = []
            for label in ("correct", "wrong"):
                c = r.get(label)
                cells.append(f"{c['median']:.3f}, {c['low']:.2f} / {c['in_band']:.2f} / {c['high']:.2f}" if c else "–")
            print(f"| {pair} | {gen} → {learn} | {r['peer_accuracy']:.2f} | {cells[0]} | {cells[1]} | "
                  f"{r['wrong_share_of_kept']:.2f} |", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
