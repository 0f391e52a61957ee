"""Forwards at their rows' own width: exactly TRL's padded forward (log-probs, entropies, loss, gradients), and the
padding metric on a hand-built batch."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl.trainer.utils import add_fused_lm_head

from hacpo_trl.agents.tiny import bpe_tokenizer, char_tokenizer, tiny_llama, tiny_qwen2
from hacpo_trl.run import padding
from hacpo_trl.trainer import HACPOTrainer
from hacpo_trl.training import metrics

# 4 rows, prompts 4 columns wide (left-padded), completions 6 wide (right-padded); column 0 and column 9 are padding
# in every row, as when peer rows or another rank's rows set the batch's width
PROMPT_MASK = [[0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 1, 1]]
COMPLETION_MASK = [[1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]]


def _trainer(model, trim: bool) -> HACPOTrainer:
    """Just what the forward hook reads: no process group, no dataset."""
    trainer = object.__new__(HACPOTrainer)
    trainer.args = SimpleNamespace(
        trim_padding=trim,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        per_device_train_batch_size=4,
        share_rollouts=False,
        solo_steps_per_generation=None,
    )
    trainer.agent_names = ["a"]
    trainer.accelerator = SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True)
    trainer.model = model
    trainer._forward_pass, trainer._generation_forwards = "other", 0
    trainer._padding_sums = {"train": {}, "eval": {}}
    trainer._trim_sides = padding.trim_sides(model.config)
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return trainer


def _batch(vocab: int, pad_id: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.cat([torch.tensor(PROMPT_MASK), torch.tensor(COMPLETION_MASK)], dim=1)
    ids = torch.randint(3, vocab, mask.shape, generator=gen)
    return ids.masked_fill(mask == 0, pad_id), mask, len(COMPLETION_MASK[0])


def _run(trainer, model, ids, mask, keep, batch_size):
    """Log-probs, entropies, a GSPO-like loss (weighted per-sequence means) and its gradient."""
    model.zero_grad()
    logps, entropy, _ = trainer._get_per_token_logps_and_entropies(
        model, ids, mask, keep, batch_size=batch_size, compute_entropy=True
    )
    completion_mask = mask[:, -keep:].float()
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0])
    loss = (weights * (logps * completion_mask).sum(-1) / completion_mask.sum(-1)).sum()
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logps.detach(), entropy.detach(), loss.detach(), grads


def _gpt2():
    """Learned absolute positions: a shift of the left padding changes what it computes."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = char_tokenizer()
    torch.manual_seed(1)
    config = GPT2Config(
        vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=tok.pad_token_id, eos_token_id=tok.pad_token_id,
    )  # fmt: skip
    return GPT2LMHeadModel(config), tok


def _phi3_longrope():
    """Rotary frequencies chosen by the forward's length: long ones above 8 positions (the batch is 10 wide)."""
    from transformers import Phi3Config, Phi3ForCausalLM

    tok, half_head = char_tokenizer(), 8
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * half_head,
            "long_factor": [4.0] * half_head, "original_max_position_embeddings": 8}  # fmt: skip
    config = Phi3Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=8, rope_parameters=rope,
        pad_token_id=tok.pad_token_id, initializer_range=0.5,
    )  # fmt: skip
    torch.manual_seed(1)
    return Phi3ForCausalLM(config), tok


MODELS = {
    "llama": lambda: (tiny_llama(tok := char_tokenizer(), hidden_size=32, seed=1), tok),
    "qwen2": lambda: (tiny_qwen2(tok := bpe_tokenizer(), hidden_size=32, seed=1), tok),
    "gpt2": _gpt2,
    "phi3-longrope": _phi3_longrope,
}


def _differences(name: str, batch_size: int | None) -> list[float]:
    model, tok = MODELS[name]()
    model.float()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids, mask, keep = _batch(len(tok), tok.pad_token_id)
    full = _run(_trainer(model, trim=False), model, ids, mask, keep, batch_size)
    trimmed = _run(_trainer(model, trim=True), model, ids, mask, keep, batch_size)
    assert full[0].shape == trimmed[0].shape == (4, keep)
    # relative to each tensor's largest value (log-probs ~5, gradients ~5: one fp32 ulp there is ~5e-7)
    return [float((a - b).abs().max() / a.abs().max().clamp(min=1)) for a, b in zip(full, trimmed, strict=True)]


@pytest.mark.parametrize("batch_size", [None, 2], ids=["one-chunk", "2-row-chunks-by-length"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_trimmed_forward_equals_padded_forward(name, batch_size):
    """Log-probs (every position, the padded ones included), entropies, loss and every parameter's gradient match
    TRL's padded forward to 1e-6 (relative to the tensor's largest value) in fp32: Llama and Qwen2 trimmed on both
    sides (left-trimming shifts every row's rotary positions by the same amount), GPT-2 on the right only (its
    positions are absolute), Phi-3 with longrope not at all (its frequencies follow the forward's length)."""
    assert max(_differences(name, batch_size)) < 1e-6


@pytest.mark.parametrize("name", ["gpt2", "phi3-longrope"])
def test_trimming_what_positions_see_would_change_the_values(monkeypatch, name):
    """The comparison above can fail for these models: trimmed on both sides as a rotary model is, their log-probs
    move far beyond rounding."""
    monkeypatch.setattr(padding, "trim_sides", lambda config: (True, True))
    assert max(_differences(name, 2)) > 1e-3


def test_trim_sides_by_config():
    from transformers import GemmaConfig, GPT2Config, LlamaConfig, OPTConfig

    assert padding.trim_sides(LlamaConfig()) == padding.trim_sides(GemmaConfig()) == (True, True)
    assert padding.trim_sides(GPT2Config()) == padding.trim_sides(OPTConfig()) == (False, True)
    dynamic = LlamaConfig(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    assert padding.trim_sides(dynamic) == (False, False)
    per_layer_type = SimpleNamespace(rope_parameters={"full": {"rope_type": "yarn"}, "local": {"rope_type": "default"}})
    assert padding.trim_sides(per_layer_type) == (True, True)
    per_layer_type.rope_parameters["full"]["rope_type"] = "longrope"
    assert padding.trim_sides(per_layer_type) == (False, False)


@pytest.mark.parametrize("cut", ["left", "right"])
def test_trimming_one_column_too_many_is_caught(monkeypatch, cut):
    """The comparison above can fail: trimming one more real column on either side changes some row's values."""
    honest = padding.chunk_trims

    def greedy(*args, **kwargs):
        return [
            padding.Trim(c.start, c.end, c.left + (cut == "left"), c.right - (cut == "right"))
            for c in honest(*args, **kwargs)
        ]

    monkeypatch.setattr(padding, "chunk_trims", greedy)
    assert max(_differences("llama", None)) > 1e-4


def test_chunk_trims_by_hand():
    mask = torch.cat([torch.tensor(PROMPT_MASK), torch.tensor(COMPLETION_MASK)], dim=1)
    assert padding.chunk_trims(mask, 6, 4) == [(0, 4, 1, 9)]
    assert padding.chunk_trims(mask, 6, 4, trim=False) == [(0, 4, 0, 10)]
    assert padding.length_order(mask).tolist() == [1, 3, 0, 2]  # real lengths 5, 4, 6, 4
    ordered = mask[padding.length_order(mask)]
    assert padding.chunk_trims(ordered, 6, 2) == [(0, 2, 1, 6), (2, 4, 2, 9)]
    # a chunk whose completions are all empty still keeps one completion column and the prompt column before it
    assert padding.chunk_trims(torch.tensor([[0, 1, 0, 0]]), 2, 1) == [(0, 1, 1, 3)]


@pytest.mark.parametrize(
    ("trim", "batch_size", "processed"),
    [(False, None, 40), (True, None, 32), (False, 2, 40), (True, 2, 24)],
)
def test_padding_ratio_metric_by_hand(trim, batch_size, processed):
    """19 real tokens in a 4 x 10 batch. Padded: 40 processed. Trimmed as one chunk: columns 1-8, 32. Trimmed in
    2-row chunks by length: rows (1, 3) need columns 1-5 (10 tokens), rows (0, 2) columns 2-8 (14 tokens): 24."""
    model, tok = MODELS["llama"]()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    trainer = _trainer(model, trim)
    ids, mask, keep = _batch(len(tok), tok.pad_token_id)
    with torch.no_grad(), trainer._pass("peer_scoring"):  # a pass chunked as its caller says
        trainer._get_per_token_logps_and_entropies(model, ids, mask, keep, batch_size=batch_size)
    assert trainer._padding_sums["train"] == {"peer_scoring": [processed, 19]}
    assert metrics.padding_metrics(trainer._padding_sums["train"]) == {
        "hacpo/time/padding_ratio/peer_scoring": pytest.approx(processed / 19)
    }


def test_generation_passes_are_named():
    """Inside TRL's step, the first forward is its old log-probs when TRL computes them (here: gradient
    accumulation misaligned with generation), the next the reference; without old log-probs, only the reference."""
    model, tok = MODELS["llama"]()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    trainer = _trainer(model, True)
    trainer.use_vllm, trainer.num_iterations = False, 1
    trainer.args.steps_per_generation = 2  # 2 updates per generation batch, 1 micro-batch each: TRL's old log-probs
    ids, mask, keep = _batch(len(tok), tok.pad_token_id)
    with torch.no_grad(), trainer._pass("generation"):
        for _ in range(2):
            trainer._get_per_token_logps_and_entropies(model, ids, mask, keep, batch_size=2)
    assert sorted(trainer._padding_sums["train"]) == ["old_logps", "ref_logps"]


@pytest.mark.parametrize("solo, rows", [(None, 1), (2, 2)])
def test_old_logps_are_computed_in_the_chunks_of_a_solo_batchs_updates(solo, rows):
    """TRL's old log-probs of a 4-row generation batch of 4 updates (its mini-batch: 1 row): with
    `solo_steps_per_generation: 2` in a sharing run they are computed 2 rows at a time, as GSPO's 2 updates of 2 rows
    compute them (the same chunks, so the same rounding); without it, TRL's 1 row at a time. Read off the tokens each
    chunk processes at its own width."""
    model, tok = MODELS["llama"]()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    trainer = _trainer(model, True)
    trainer.use_vllm, trainer.num_iterations, trainer.agent_names = False, 1, ["a", "b"]
    trainer.args.steps_per_generation, trainer.args.per_device_train_batch_size = 4, 1
    trainer.args.share_rollouts, trainer.args.solo_steps_per_generation = True, solo
    ids, mask, keep = _batch(len(tok), tok.pad_token_id)
    with torch.no_grad(), trainer._pass("generation"):
        trainer._get_per_token_logps_and_entropies(model, ids, mask, keep, batch_size=1)
    tokens = {n: sum(c.tokens for c in padding.chunk_trims(mask[padding.length_order(mask)], keep, n)) for n in (1, 2)}
    assert tokens[1] != tokens[2]  # the two chunkings are told apart
    assert trainer._padding_sums["train"]["old_logps"][0] == tokens[rows]


def test_length_groups_by_hand():
    """Two updates of two 2-row micro-batches. Update 1 holds self rows (class 0) of lengths 9, 1 | 5, 2 -> 1, 2 |
    5, 9. Update 2 mixes classes: micro-batches (peer 7, self 3) | (peer 4, self 8): peers 4, 7 and selves 3, 8 are
    dealt back in place -> (peer 4, self 3) | (peer 7, self 8). Nothing crosses from one update to the other."""
    lengths = torch.tensor([9, 1, 5, 2, 7, 3, 4, 8])
    classes = torch.tensor([0, 0, 0, 0, 1, 0, 1, 0])
    order = padding.length_groups(lengths, classes, micro_rows=2, block=2)
    assert lengths[order].tolist() == [1, 2, 5, 9, 4, 3, 7, 8]
    assert classes[order].tolist() == classes.tolist()
    with pytest.raises(ValueError, match="whole blocks"):
        padding.length_groups(lengths[:6], classes[:6], micro_rows=2, block=2)


def _update_gradient(order: torch.Tensor, micro_rows: int, ga: int) -> torch.Tensor:
    """The gradient of one optimizer update of HACPO's loss (GA micro-batches, each loss / GA) with respect to every
    row's log-probs, rows taken in ``order``; returned in the original row order."""
    from hacpo_trl.algorithm import HACPOLossConfig, hacpo_loss

    gen = torch.Generator().manual_seed(3)
    n, width = order.shape[0], 7
    lengths = torch.randint(1, width + 1, (n,), generator=gen)
    mask = (torch.arange(width) < lengths[:, None]).long()
    logps = (-torch.rand(n, width, generator=gen) * 2).requires_grad_()
    cols = {
        "old": torch.log(torch.rand(n, generator=gen)) * 0.1 + (logps.detach() * mask).sum(1) / lengths,
        "adv": torch.randn(n, generator=gen),
        "peer": torch.tensor([False, True] * (n // 2)),
        "valid": torch.rand(n, generator=gen) > 0.3,
        "ref": logps.detach() + 0.05 * torch.randn(n, width, generator=gen),
    }
    config = HACPOLossConfig(beta=0.1)
    total = 0
    for start in range(0, n, micro_rows):
        rows = order[start : start + micro_rows]
        total = total + hacpo_loss(
            logps[rows], mask[rows], cols["old"][rows], cols["adv"][rows], cols["peer"][rows], update_index=1,
            omega=torch.full((micro_rows,), 0.7), ref_logps=cols["ref"][rows], valid=cols["valid"][rows], config=config,
        ).loss / ga  # fmt: skip
    total.backward()
    return logps.grad, lengths, cols


def test_grouping_by_length_keeps_the_update():
    """Regrouping the rows of one update (4 micro-batches of 3 rows) by length, between rows of equal weight, gives
    the same gradient; a plain sort by length does not (HACPO means over each micro-batch's valid rows)."""
    n, micro_rows, ga = 12, 3, 4
    reference, lengths, cols = _update_gradient(torch.arange(n), micro_rows, ga)
    classes = 1 + cols["peer"].long() + 2 * (~cols["valid"]).long()
    grouped = padding.length_groups(lengths, classes, micro_rows, ga)
    assert not torch.equal(grouped, torch.arange(n))
    assert torch.allclose(_update_gradient(grouped, micro_rows, ga)[0], reference, atol=1e-7)
    plain = padding.length_groups(lengths, torch.zeros(n, dtype=torch.long), micro_rows, ga)
    assert not torch.allclose(_update_gradient(plain, micro_rows, ga)[0], reference, atol=1e-4)


def test_group_by_length_refused_where_weights_depend_on_the_micro_batch(tmp_path):
    from hacpo_trl.config import HACPOConfig

    with pytest.raises(ValueError, match="group_by_length"):
        HACPOConfig(output_dir=str(tmp_path), share_rollouts=False, group_by_length=True, loss_type="bnpo")
    cpu = {"use_cpu": True, "bf16": False}
    for bonus in ({"entropy_coef": 0.01}, {"use_adaptive_entropy": True}):  # TRL's bonus: a micro-batch token mean
        with pytest.raises(ValueError, match=r"`group_by_length` .* entropy_coef"):
            HACPOConfig(output_dir=str(tmp_path), share_rollouts=False, group_by_length=True, **bonus, **cpu)
    HACPOConfig(output_dir=str(tmp_path), share_rollouts=False, group_by_length=True, **cpu)  # GSPO's loss: allowed


def test_group_by_length_cuts_a_batch_within_updates_and_weights():
    """A batch of 4 two-row micro-batches, 2 per update: self rows of lengths 9, 1 | 5, 2, then (peer 7, self 3) |
    (peer 4, self 8). With HACPO's loss peers and selves are dealt back apart; with TRL's every row weighs alike, so
    the second update is sorted whole; with one update of 4 micro-batches the whole batch is. Other values pass."""
    lengths = torch.tensor([9, 1, 5, 2, 7, 3, 4, 8])
    is_peer = torch.tensor([False] * 4 + [True, False, True, False])
    batch = {
        "prompt_mask": torch.ones(8, 1, dtype=torch.long),
        "completion_mask": (torch.arange(9) < (lengths - 1)[:, None]).long(),
        "completion_ids": torch.arange(8)[:, None].expand(8, 9),
        "hacpo_is_peer": is_peer,
        "hacpo_valid": torch.ones(8, dtype=torch.bool),
        "num_items_in_batch": torch.tensor(8),
    }

    def grouped(ga, hacpo):
        out = padding.group_by_length(batch, steps=4, gradient_accumulation_steps=ga, hacpo=hacpo)
        assert out["num_items_in_batch"] is batch["num_items_in_batch"]
        assert torch.equal(out["hacpo_is_peer"], is_peer[out["completion_ids"][:, 0]])  # rows move whole
        return lengths[out["completion_ids"][:, 0]].tolist()

    assert grouped(2, hacpo=True) == [1, 2, 5, 9, 4, 3, 7, 8]
    assert grouped(2, hacpo=False) == [1, 2, 5, 9, 3, 4, 7, 8]
    assert grouped(4, hacpo=False) == [1, 2, 3, 4, 5, 7, 8, 9]
