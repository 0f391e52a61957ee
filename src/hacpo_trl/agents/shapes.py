"""Offline stand-ins of the paper's model sizes, for systems checks only: time and memory on any GPU without the Hub.

* ``builtin:qwen3-4b-shape``: Qwen3-4B's architecture (hidden 2560, 36 layers, 32 heads, 8 KV heads, head_dim 128,
  intermediate 9728, tied embeddings);
* ``builtin:qwen3-1.7b-shape``: Qwen3-1.7B's (2048, 28, 16, 8, 128, 6144, tied).

Random weights (seeded, bfloat16) and the project's byte-level BPE tokenizer with a ChatML template, so the vocabulary
is a few hundred tokens, not Qwen3's 151,669: the LM head and embeddings are a few MB instead of ~0.8 GB, and
everything else (layers, KV cache, activations, LoRA) is the real model's. They never learn anything useful: use them
to measure time and memory (``make gpu-check``), never accuracy. Built once into the hacpo cache (``HACPO_CACHE``),
directly on the GPU when there is one.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass

from .cache import build_lock, cache_folder

__all__ = ["SHAPES", "Shape", "build_shape", "shape_config"]

CACHE_VERSION = 1


@dataclass(frozen=True)
class Shape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    seed: int
    max_position_embeddings: int = 40960
    rope_theta: float = 1_000_000.0


SHAPES = {
    "qwen3-4b-shape": Shape(2560, 36, 32, 8, 128, 9728, seed=4),
    "qwen3-1.7b-shape": Shape(2048, 28, 16, 8, 128, 6144, seed=17),
}


def shape_config(name: str):
    """The stand-in's ``Qwen3Config`` (sized for the project's BPE tokenizer); builds no weights."""
    from transformers import Qwen3Config

    from .tiny import bpe_tokenizer

    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; available: {sorted(SHAPES)}")
    s, tok = SHAPES[name], bpe_tokenizer()
    return Qwen3Config(
        vocab_size=len(tok),
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads,
        head_dim=s.head_dim,
        max_position_embeddings=s.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": s.rope_theta},
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        dtype="bfloat16",
    )


def build_shape(name: str, directory: str | None = None) -> str:
    """Build (or reuse from the cache) a stand-in; returns its folder (config, bf16 weights, tokenizer)."""
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; available: {sorted(SHAPES)}")
    folder = cache_folder(name, SHAPES[name], CACHE_VERSION, directory)
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    with build_lock(folder):
        if not os.path.isfile(os.path.join(folder, "config.json")):
            _build(name, folder)
    return folder


def _build(name: str, folder: str) -> None:
    import torch
    from transformers import Qwen3ForCausalLM

    from .tiny import bpe_tokenizer

    config = shape_config(name)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # a 4B model initialises in seconds on a GPU
    torch.manual_seed(SHAPES[name].seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    tok = bpe_tokenizer()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = None
    tmp = f"{folder}.tmp-{os.getpid()}-{time.time_ns()}"
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    with open(os.path.join(tmp, "README.md"), "w") as f:
        f.write(f"# {name}\n\nRandom weights in the shape of {name.removesuffix('-shape')}: a hacpo-trl systems stand-in "
                "for time and memory checks, never for accuracy.\n")  # fmt: skip
    del model
    if device == "cuda":  # the trainer's peak memory is measured from here on: keep none of the build's cache
        torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(folder) or ".", exist_ok=True)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.replace(tmp, folder)
