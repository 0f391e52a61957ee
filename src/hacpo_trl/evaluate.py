"""Evaluate each agent on its own, as the standalone model it is at inference: its own tokenizer and chat template.

Greedy decoding gives avg@1; with ``k > 1`` samples per problem (``temperature > 0``) it reports avg@k (mean
accuracy over the samples) and best@k (a problem counts if any sample is right), the paper's two protocols.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

__all__ = ["EvalResult", "evaluate_model"]


@dataclass
class EvalResult:
    avg_at_k: float
    best_at_k: float
    k: int
    n: int

    def as_dict(self) -> dict:
        return {"avg@k": self.avg_at_k, "best@k": self.best_at_k, "k": self.k, "n": self.n}


@torch.no_grad()
def evaluate_model(
    model,
    tokenizer,
    dataset,
    reward_func: Callable,
    *,
    k: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 16,
    batch_size: int = 64,
    chat_template_kwargs: dict | None = None,
    progress: bool = False,
    desc: str = "eval",
) -> EvalResult:
    """Score ``model`` on ``dataset`` (columns ``prompt`` and what ``reward_func`` needs, e.g. ``answer``)."""
    if k < 1:
        raise ValueError(f"`k` must be >= 1, got {k}")
    if k > 1 and temperature <= 0:
        raise ValueError("avg@k / best@k with k > 1 need sampling: set `temperature` > 0")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    rows = list(dataset)
    scores = torch.zeros(len(rows), k)
    for start in tqdm(range(0, len(rows), batch_size), disable=not progress, desc=desc):
        chunk = rows[start : start + batch_size]
        prompts = [
            tokenizer.apply_chat_template(
                r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True, **(chat_template_kwargs or {})
            )["input_ids"]
            if isinstance(r["prompt"], list)
            else tokenizer(r["prompt"])["input_ids"]
            for r in chunk
        ]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + list(p) for p in prompts], device=device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        out = model.generate(
            input_ids=ids.repeat_interleave(k, 0),
            attention_mask=attention.repeat_interleave(k, 0),
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=None,
            top_k=None,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        columns = {key: [r[key] for r in chunk for _ in range(k)] for key in chunk[0] if key != "prompt"}
        rewards = reward_func(completions=texts, **columns)
        scores[start : start + len(chunk)] = torch.tensor(rewards, dtype=torch.float).view(len(chunk), k)
    model.train(was_training)
    correct = scores > 0
    return EvalResult(
        avg_at_k=float(correct.float().mean()),
        best_at_k=float(correct.any(dim=1).float().mean()),
        k=k,
        n=len(rows),
    )
