"""Tiny heterogeneous agents built offline: for tests, the CPU demo and the docs.

Two deliberately different agents, so that everything cross-agent (re-tokenization, chat templates, EOS
handling, peer log-probs) is exercised on a laptop with no Hub access:

* a Llama-architecture model with a **character-level** tokenizer and a ``[INST]``-style chat template;
* a Qwen2-architecture model with a **byte-level BPE** tokenizer and a ChatML-style chat template.

Everything is built from a seed, without downloading anything.
"""

from __future__ import annotations

import string

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

__all__ = ["bpe_tokenizer", "char_tokenizer", "tiny_llama", "tiny_qwen2", "CHARSET"]

CHARSET = string.digits + string.ascii_letters + " +-*/=?.,:;!()[]{}<>|_'\"\\$^#%&@~`\n"

LLAMA_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'system' %}<<SYS>>{{ m['content'] }}<</SYS>>"
    "{% else %}{{ m['content'] }}</s>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %} {% endif %}"
)

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of :data:`CHARSET`; anything else becomes ``<unk>``."""
    specials = ["<pad>", "</s>", "<unk>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in CHARSET:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", padding_side="left"
    )
    fast.chat_template = LLAMA_CHAT_TEMPLATE
    return fast


def bpe_tokenizer(vocab_size: int = 320, corpus: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained (deterministically) on a small arithmetic corpus."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if corpus is None:
        corpus = [f"{a} + {b} = {a + b}" for a in range(0, 100, 3) for b in range(0, 100, 7)]
        corpus += ["user\nWhat is", "assistant\nThe answer is", "system\nYou are a helpful assistant."]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        bos_token=None,
        padding_side="left",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def _finish(model: PreTrainedModel, tok: PreTrainedTokenizerFast) -> PreTrainedModel:
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def _tiny(
    config_class,
    model_class,
    tok,
    hidden_size: int = 16,
    layers: int = 2,
    seed: int = 0,
    heads: int = 4,
    kv_heads: int = 2,
) -> PreTrainedModel:
    torch.manual_seed(seed)
    config = config_class(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return _finish(model_class(config), tok)


def tiny_llama(tok: PreTrainedTokenizerFast, **shape) -> LlamaForCausalLM:
    """``shape``: ``hidden_size`` (16), ``layers`` (2), ``seed`` (0), ``heads`` (4), ``kv_heads`` (2)."""
    return _tiny(LlamaConfig, LlamaForCausalLM, tok, **shape)


def tiny_qwen2(tok: PreTrainedTokenizerFast, **shape) -> Qwen2ForCausalLM:
    """As :func:`tiny_llama`."""
    return _tiny(Qwen2Config, Qwen2ForCausalLM, tok, **shape)
