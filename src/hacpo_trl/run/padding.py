"""Forwards at their rows' own width: which columns of a padded chunk can go, in which order to chunk rows, and how
many of the tokens a forward processes are real.

TRL pads a generation batch once, prompts on the left and completions on the right, to the widest row of the batch
(the rank's own rows and, in HACPO, the peer rows). Every forward then runs at that width, however short its own rows
are. A column that is padding in every row of a chunk changes nothing the chunk computes:

* as a key it is masked for every query, so no real token attends to it;
* as a label it is ``-100`` (TRL masks labels where the attention mask is 0), so the fused LM head scores it 0.

So the chunk can drop its leading and trailing all-padding columns, and the per-token log-probs it returns are the
untrimmed ones with zeros put back on the right. Positions are where models differ (:func:`trim_sides`). Dropping
leading columns shifts every row's positions by the same amount, which models whose attention depends only on
position differences (rotary embeddings: Llama, Qwen, Mistral, Gemma, ...) do not see; a model without rotary
embeddings may count positions absolutely (GPT-2's learned ones), so it keeps its left padding. Dropping trailing
columns shortens the forward, which rotary embeddings whose frequencies depend on the forward's length ("dynamic",
"longrope") do see, so such a model keeps TRL's padded forwards. ``trim_padding=False`` keeps them for every model.

For the no-gradient passes over a whole generation batch (TRL's old log-probs and reference log-probs), rows are
independent, so they are also chunked in order of length (:func:`length_order`): chunks then hold rows of similar
length and trim to little padding. The result is put back in the original row order.

The training micro-batches are fixed by the optimizer update they belong to, so their rows keep their mixed lengths
unless ``group_by_length`` regroups them (:func:`length_groups`): only within one optimizer update, and only between
rows that weigh the same in the loss, so every update sums the same rows with the same weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

__all__ = [
    "Trim",
    "chunk_trims",
    "forward_at_width",
    "group_by_length",
    "length_groups",
    "length_order",
    "padding_ratio",
    "restore_width",
    "trim_sides",
]

# rotary embeddings whose frequencies are chosen from the forward's length (transformers' `rope_type`)
LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})


def _rope_types(rope) -> set[str] | None:
    """The rope types named in a config's `rope_parameters` / `rope_scaling` (one dict, or one per layer type);
    None without rotary embeddings."""
    if not isinstance(rope, dict):
        return None
    nested = [v for v in rope.values() if isinstance(v, dict)]
    if nested:
        return set().union(*(_rope_types(v) or set() for v in nested))
    return {str(rope.get("rope_type") or rope.get("type") or "default")}


def trim_sides(config) -> tuple[bool, bool]:
    """Which all-padding columns a forward of a model with this config may drop: (leading, trailing), by the rules
    of the module docstring. Read from transformers' rope fields (`rope_parameters`, `rope_scaling`, `rope_theta`): a
    rotary model that names its rope otherwise (GPT-J's `rotary_dim`) keeps its left padding, costing compute only."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None)
    types = _rope_types(rope)
    if types is None:
        return (getattr(text, "rope_theta", None) is not None, True)
    if types & LENGTH_DEPENDENT_ROPE:
        return (False, False)
    return (True, True)


class Trim(NamedTuple):
    """One chunk of a forward: rows ``start:end`` (of the possibly reordered batch) and columns ``left:right``."""

    start: int
    end: int
    left: int
    right: int

    @property
    def tokens(self) -> int:
        """Tokens the chunk's forward processes: rows × width."""
        return (self.end - self.start) * (self.right - self.left)


def _bounds(attention_mask: torch.Tensor, logits_to_keep: int, trim: bool | tuple[bool, bool]) -> tuple[int, int]:
    width = attention_mask.shape[1]
    trim_left, trim_right = trim if isinstance(trim, tuple) else (trim, trim)
    if not (trim_left or trim_right):
        return 0, width
    real = attention_mask.bool().any(0).nonzero().flatten().tolist()
    if not real:
        return 0, width
    first_completion = width - logits_to_keep
    # keep the column before the first completion token (its hidden state scores that token) and at least one
    # completion column (``logits_to_keep`` 0 would mean "every position" to the model)
    left = min(real[0], max(first_completion - 1, 0)) if trim_left else 0
    right = max(real[-1] + 1, first_completion + 1) if trim_right else width
    return left, right


def chunk_trims(
    attention_mask: torch.Tensor, logits_to_keep: int, batch_size: int, trim: bool | tuple[bool, bool] = True
) -> list[Trim]:
    """The chunks of ``batch_size`` rows and, with ``trim``, the columns each keeps: from its first to its last
    column that is real in any of its rows (bounded so the chunk still scores every completion column it keeps);
    ``trim`` = (leading, trailing) drops only the sides named (:func:`trim_sides`)."""
    n = attention_mask.shape[0]
    return [
        Trim(s, min(s + batch_size, n), *_bounds(attention_mask[s : s + batch_size], logits_to_keep, trim))
        for s in range(0, n, batch_size)
    ]


def length_order(attention_mask: torch.Tensor) -> torch.Tensor:
    """Row indices by real length (ties in row order), so that consecutive chunks hold rows of similar length."""
    lengths = attention_mask.sum(1)
    return torch.sort(lengths, stable=True).indices


def length_groups(lengths: torch.Tensor, classes: torch.Tensor, micro_rows: int, block: int) -> torch.Tensor:
    """A row order that puts rows of similar length into the same micro-batch without changing any update's loss.

    Rows ``[k * micro_rows, (k + 1) * micro_rows)`` form micro-batch ``k``; every ``block`` consecutive micro-batches
    lie inside one optimizer update. ``classes`` says which rows weigh alike within a micro-batch (for HACPO: valid
    self, valid peer, invalid rows: its loss is a mean over valid rows plus a KL mean over valid self rows), so a
    row's weight is set by its class and by its micro-batch's count of each class. Within a block, micro-batches
    with the same counts form a group; in each group, the rows of each class are sorted by length and dealt back in
    micro-batch order, each micro-batch taking as many as it held: the first gets the shortest, the last the
    longest. Every row keeps its weight and every update its rows. Returns indices: ``batch[order]``.
    """
    n = lengths.shape[0]
    if n % (micro_rows * block):
        raise ValueError(f"{n} rows are not whole blocks of {block} micro-batches of {micro_rows} rows")
    kinds = classes.unique()
    counts = (classes.view(-1, micro_rows, 1) == kinds).sum(1)  # (micro-batches, classes)
    order = torch.arange(n)
    for first in range(0, n // micro_rows, block):
        micro = torch.arange(first, first + block)
        for signature in counts[micro].unique(dim=0):
            alike = micro[(counts[micro] == signature).all(1)]
            rows = (alike[:, None] * micro_rows + torch.arange(micro_rows)).flatten()
            for c in kinds:
                slots = rows[classes[rows] == c]  # the class's positions, micro-batch by micro-batch
                order[slots] = slots[torch.sort(lengths[slots], stable=True).indices]
    return order


def group_by_length(batch: dict, steps: int, gradient_accumulation_steps: int, hacpo: bool) -> dict:
    """A generation batch of ``steps`` micro-batches with rows of similar length in the same micro-batch, within each
    optimizer update and between rows of equal weight (:func:`length_groups`): blocks of gcd(steps, GA) micro-batches
    never cross an update. With HACPO's loss (``hacpo`` and peer columns) the classes are valid self, valid peer and
    invalid rows (a mean over valid rows, a KL over valid self rows); TRL's loss weighs every row alike."""
    rows = batch["completion_ids"].shape[0]
    block = math.gcd(steps, gradient_accumulation_steps)
    lengths = (batch["prompt_mask"].sum(1) + batch["completion_mask"].sum(1)).cpu()
    classes = torch.zeros(rows, dtype=torch.long)
    if hacpo and "hacpo_is_peer" in batch:
        classes = 1 + batch["hacpo_is_peer"].long().cpu() + 2 * (~batch["hacpo_valid"]).long().cpu()
    order = length_groups(lengths, classes, rows // steps, block).to(batch["completion_ids"].device)
    return {k: (v[order] if isinstance(v, torch.Tensor) and v.ndim >= 1 else v) for k, v in batch.items()}


def forward_at_width(
    forward: Callable,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    batch_size: int | None,
    sides: tuple[bool, bool],
) -> tuple[tuple, int]:
    """``forward`` (TRL's `_get_per_token_logps_and_entropies` with the model and flags bound: ``forward(input_ids,
    attention_mask, logits_to_keep, batch_size)``) chunk by chunk at each chunk's own width: the same log-probs,
    entropies and gradients without the padding columns. ``sides`` are those the model may trim (:func:`trim_sides`);
    with neither, TRL's padded forward runs as it is. Rows go in chunks of ``batch_size`` (None: one chunk); with
    several (the no-gradient passes over a generation batch), in order of length, returned in the caller's order.

    Returns TRL's (log-probs, entropies, aux loss) and the tokens the forwards processed (rows x width, summed)."""
    n, width = input_ids.shape
    batch_size, trim = batch_size or n, any(sides)
    order = length_order(attention_mask) if trim and batch_size < n else None
    if order is not None:
        input_ids, attention_mask = input_ids[order], attention_mask[order]
    chunks = chunk_trims(attention_mask, logits_to_keep, batch_size, sides if trim else False)
    processed = sum(c.tokens for c in chunks)
    if not trim:
        return forward(input_ids, attention_mask, logits_to_keep, batch_size), processed
    first_completion = width - logits_to_keep
    logps, entropies, aux_losses = [], [], []
    for c in chunks:
        columns = slice(c.left, c.right)
        lp, entropy, aux = forward(
            input_ids[c.start : c.end, columns], attention_mask[c.start : c.end, columns], c.right - first_completion
        )
        logps.append(restore_width(lp, width - c.right))
        # TRL returns entropies and an aux loss only when asked for them
        if entropy is not None:
            entropies.append(restore_width(entropy, width - c.right))
        if aux is not None:
            aux_losses.append(aux)
    logps = torch.cat(logps)
    entropy = torch.cat(entropies) if entropies else None
    if order is not None:
        inverse = torch.argsort(order)
        logps = logps[inverse]
        entropy = None if entropy is None else entropy[inverse]
    return (logps, entropy, torch.stack(aux_losses).mean() if aux_losses else None), processed


def restore_width(values: torch.Tensor, dropped_right: int) -> torch.Tensor:
    """A trimmed chunk's per-token values back at full completion width: zeros (TRL's value for a padded label) on
    the dropped right columns; the gradient flows through the kept ones."""
    if dropped_right == 0:
        return values
    return torch.nn.functional.pad(values, (0, dropped_right))


def padding_ratio(processed: float, real: float) -> float:
    """Tokens processed ÷ real tokens: 1 is padding-free; 3 means two padded tokens for every real one."""
    return processed / real if real else 1.0
