"""A peer's completion seen through the learner's tokenizer.

The learner scores a peer completion exactly as if it had generated it: under its own prompt formatting (the
prompt ids TRL built for the learner, chat template with ``add_generation_prompt=True``), with the completion
*text* re-encoded by the learner's tokenizer (``add_special_tokens=False``). TRL decodes completions with
``skip_special_tokens=True``, so the text never shows the generator's EOS; the learner's EOS is appended only if
the generator stopped on its own, so that the learner is taught to stop where the peer stopped, and never where it
was cut off.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PeerCompletion", "completion_text", "peer_completion_ids"]


@dataclass(frozen=True)
class PeerCompletion:
    ids: list[int]
    truncated: bool  # cut to max_completion_length in the learner's tokens (EOS, if any, was cut too)


def completion_text(completion) -> str:
    """The text of a TRL completion: a string, or a conversational ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(m["content"] if isinstance(m.get("content"), str) else "" for m in completion)
    raise TypeError(f"unsupported completion type {type(completion).__name__}")


def peer_completion_ids(
    tokenizer, text: str, terminated: bool, max_completion_length: int, eos_token_id: int | None = None
) -> PeerCompletion | None:
    """Token ids of a peer completion in the learner's vocabulary, or ``None`` if nothing is left to learn from.

    * ``terminated``: the generator ended with its EOS: append the learner's EOS (``eos_token_id`` or the
      tokenizer's). An empty text that terminated becomes the single EOS action.
    * longer than ``max_completion_length`` learner tokens: cut, marked ``truncated``.
    * an empty text that did not terminate: ``None``.
    """
    if max_completion_length < 1:
        raise ValueError(f"`max_completion_length` must be >= 1, got {max_completion_length}")
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
    if terminated:
        eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        if eos is None:
            raise ValueError("the learner's tokenizer has no EOS token; set `eos_token` on it")
        ids.append(eos)
    truncated = len(ids) > max_completion_length
    ids = ids[:max_completion_length]
    if not ids:
        return None
    return PeerCompletion(ids=ids, truncated=truncated)
