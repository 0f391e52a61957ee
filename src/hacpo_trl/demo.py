"""The built-in tiny agents of the CPU demo and benchmarks, built reproducibly from a seed and cached at first use.

Short-answer task (``arithmetic``), kept for tests and comparison:

* ``builtin:tiny-llama``: Llama, character tokenizer, ``[INST]`` chat template, ~124k parameters; the stronger agent.
* ``builtin:tiny-qwen2``: Qwen2, byte-level BPE, ChatML template, ~73k parameters; the weaker agent.

Reasoning-trace task (``arithmetic_trace``), one pair per kind of heterogeneity in the paper (see ``PAIRS``):

* *state* (same architecture and tokenizer, different amounts of warm-start, like Qwen3-4B vs -4B-Instruct):
  ``trace-base`` and ``trace-instruct``, the same model warm-started for fewer or more steps;
* *size* (same tokenizer, different depth and width, like Qwen3-1.7B vs 4B): ``trace-small`` and ``trace-large``;
* *model* (different architecture and tokenizer, like Qwen3 vs Llama-3.2): ``trace-llama`` (character tokenizer)
  and ``trace-qwen2`` (byte-level BPE).

Every agent is warm-started with a short supervised run on its task's ``warmup`` split (never the RL ``train`` or
the held-out ``test`` split), so that each solves part of the task and RL has something to improve. The warm-start
uses exactly the tokenizer that ``AutoTokenizer.from_pretrained(folder)`` returns for the saved agent: the trainer
and ``hacpo-eval`` load it that way, and under transformers 5 a Qwen2 folder loads as ``Qwen2Tokenizer``, which
splits digits differently from the in-memory tokenizer it was built from.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from .cache import cache_folder
from .tasks import task_splits
from .tiny import bpe_tokenizer, char_tokenizer, tiny_llama, tiny_qwen2

__all__ = ["BUILTIN_AGENTS", "PAIRS", "DemoAgent", "build_agent", "resolve_model"]

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
    task: str = "arithmetic"  # whose warmup split it is warm-started on


_TRACE = {"task": "arithmetic_trace"}
BUILTIN_AGENTS = {
    "tiny-llama": DemoAgent("llama", hidden_size=64, layers=3, warmup_steps=450, seed=1),
    # 300 steps: with the tokenizer it is trained and evaluated with, 800 steps (v1) would solve 97% of the task
    "tiny-qwen2": DemoAgent("qwen2", hidden_size=48, layers=2, warmup_steps=300, seed=2),
    # state: one model, warm-started for fewer / more steps (the same seed, so `trace-instruct` is `trace-base`
    # trained further on the same stream)
    "trace-base": DemoAgent("llama", hidden_size=64, layers=3, warmup_steps=400, seed=11, **_TRACE),
    "trace-instruct": DemoAgent("llama", hidden_size=64, layers=3, warmup_steps=500, seed=11, **_TRACE),
    # size: one tokenizer, a smaller and a larger model, each warm-started until it solves part of the task (the
    # larger one learns more slowly at this learning rate, so it needs more steps to get ahead, as 4B is of 1.7B)
    "trace-small": DemoAgent("llama", hidden_size=32, layers=2, warmup_steps=350, seed=12, **_TRACE),
    "trace-large": DemoAgent("llama", hidden_size=96, layers=4, warmup_steps=600, seed=13, **_TRACE),
    # model: different architecture, tokenizer and chat template
    "trace-llama": DemoAgent("llama", hidden_size=64, layers=3, warmup_steps=350, seed=14, **_TRACE),
    "trace-qwen2": DemoAgent("qwen2", hidden_size=64, layers=3, warmup_steps=300, seed=15, **_TRACE),
}

# the paper's three kinds of heterogeneity, each a pair of built-in agents on `arithmetic_trace`
PAIRS = {
    "state": ("trace-instruct", "trace-base"),
    "size": ("trace-large", "trace-small"),
    "model": ("trace-llama", "trace-qwen2"),
}


def _encode(tok, example) -> tuple[list[int], list[int]]:
    """(prompt ids, target ids + EOS): the target is the worked solution when the task has one, else the answer."""
    prompt = tok.apply_chat_template(example["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)
    target = example.get("solution") or example["answer"]
    answer = tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return list(prompt["input_ids"]), answer


def _warm_start(model, tok, spec: DemoAgent) -> None:
    """Supervised steps on prompt -> target + EOS of the warm-up split (loss on the target only)."""
    rows = [_encode(tok, ex) for ex in task_splits(spec.task)["warmup"]]
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


def _as_loaded(model, tok, folder: str):
    """The tokenizer exactly as `AutoTokenizer.from_pretrained` will load it from the agent's saved folder (the
    model's config decides its class), checked to keep the vocabulary the model was sized for."""
    from transformers import AutoTokenizer

    model.config.save_pretrained(folder)
    tok.save_pretrained(folder)
    loaded = AutoTokenizer.from_pretrained(folder, padding_side="left")
    if len(loaded) != len(tok) or loaded.eos_token_id != tok.eos_token_id or loaded.pad_token_id != tok.pad_token_id:
        raise RuntimeError(f"the saved tokenizer in {folder} does not load back with the same vocabulary and specials")
    return loaded


def build_agent(name: str, directory: str | None = None) -> str:
    """Build (or reuse from the cache) a built-in agent; returns the folder with its model and tokenizer."""
    if name not in BUILTIN_AGENTS:
        raise ValueError(f"unknown built-in agent {name!r}; available: {sorted(BUILTIN_AGENTS)}")
    spec = BUILTIN_AGENTS[name]
    # v2: warm-started with the tokenizer the saved folder loads back as (v1 used the in-memory one)
    folder = cache_folder(name, spec, 2, directory)
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    torch.manual_seed(spec.seed)
    built = char_tokenizer() if spec.architecture == "llama" else bpe_tokenizer()
    build = tiny_llama if spec.architecture == "llama" else tiny_qwen2
    model = build(built, hidden_size=spec.hidden_size, layers=spec.layers, seed=spec.seed)
    tmp = f"{folder}.tmp-{os.getpid()}-{time.time_ns()}"
    tok = _as_loaded(model, built, tmp)
    _warm_start(model, tok, spec)
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
