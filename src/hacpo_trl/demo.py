"""The two built-in tiny agents of the CPU demo, built reproducibly from a seed and cached at first use.

* ``builtin:tiny-llama``: Llama, character tokenizer, ``[INST]`` chat template, ~124k parameters; warm-started
  longer, the stronger agent.
* ``builtin:tiny-qwen2``: Qwen2, byte-level BPE, ChatML template, ~73k parameters; the weaker agent.

Both are warm-started with a short supervised run on the task's ``warmup`` split (never the RL ``train`` or the
held-out ``test`` split), so that each solves part of the task and RL has something to improve.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass

import torch

from .tasks import arithmetic_splits
from .tiny import bpe_tokenizer, char_tokenizer, tiny_llama, tiny_qwen2

__all__ = ["BUILTIN_AGENTS", "DemoAgent", "build_agent", "resolve_model"]

PREFIX = "builtin:"


@dataclass(frozen=True)
class DemoAgent:
    architecture: str  # "llama" | "qwen2"
    hidden_size: int
    layers: int
    warmup_steps: int
    seed: int
    learning_rate: float = 3e-3
    batch_size: int = 64


BUILTIN_AGENTS = {
    "tiny-llama": DemoAgent("llama", hidden_size=64, layers=3, warmup_steps=450, seed=1),
    "tiny-qwen2": DemoAgent("qwen2", hidden_size=48, layers=2, warmup_steps=800, seed=2),
}


def cache_root() -> str:
    return os.environ.get("HACPO_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "hacpo-trl"))


def _encode(tok, example) -> tuple[list[int], list[int]]:
    prompt = tok.apply_chat_template(example["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)
    answer = tok(example["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return list(prompt["input_ids"]), answer


def _warm_start(model, tok, spec: DemoAgent) -> None:
    """Supervised steps on prompt -> answer + EOS of the warm-up split (loss on the answer only)."""
    rows = [_encode(tok, ex) for ex in arithmetic_splits()["warmup"]]
    generator = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.0)
    model.train()
    for _ in range(spec.warmup_steps):
        picks = torch.randint(len(rows), (spec.batch_size,), generator=generator).tolist()
        length = max(len(rows[i][0]) + len(rows[i][1]) for i in picks)
        ids = torch.full((spec.batch_size, length), tok.pad_token_id)
        labels = torch.full((spec.batch_size, length), -100)
        attention = torch.zeros(spec.batch_size, length, dtype=torch.long)
        for j, i in enumerate(picks):
            prompt, answer = rows[i]
            seq = prompt + answer
            ids[j, : len(seq)] = torch.tensor(seq)
            attention[j, : len(seq)] = 1
            labels[j, len(prompt) : len(seq)] = torch.tensor(answer)
        model(input_ids=ids, attention_mask=attention, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def build_agent(name: str, directory: str | None = None) -> str:
    """Build (or reuse from the cache) a built-in agent; returns the folder with its model and tokenizer."""
    if name not in BUILTIN_AGENTS:
        raise ValueError(f"unknown built-in agent {name!r}; available: {sorted(BUILTIN_AGENTS)}")
    spec = BUILTIN_AGENTS[name]
    key = hashlib.sha1(json.dumps({"name": name, **asdict(spec), "v": 1}, sort_keys=True).encode()).hexdigest()[:10]
    folder = directory or os.path.join(cache_root(), f"{name}-{key}")
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    torch.manual_seed(spec.seed)
    tok = char_tokenizer() if spec.architecture == "llama" else bpe_tokenizer()
    build = tiny_llama if spec.architecture == "llama" else tiny_qwen2
    model = build(tok, hidden_size=spec.hidden_size, layers=spec.layers, seed=spec.seed)
    _warm_start(model, tok, spec)
    tmp = f"{folder}.tmp-{os.getpid()}-{time.time_ns()}"
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.makedirs(os.path.dirname(folder) or ".", exist_ok=True)
    try:
        os.replace(tmp, folder)  # atomic: a concurrent or interrupted build never leaves a half-written agent
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    return folder


def resolve_model(name_or_path: str) -> str:
    """``builtin:<name>`` -> the cached folder of that agent (built on first use); anything else unchanged."""
    if isinstance(name_or_path, str) and name_or_path.startswith(PREFIX):
        from .pretrained import PRETRAINED, build_pretrained  # real pretrained models (builtin:smollm2-...)

        name = name_or_path[len(PREFIX) :]
        return build_pretrained(name) if name in PRETRAINED else build_agent(name)
    return name_or_path
