"""With no peer rows, `hacpo_loss` must be TRL's own GSPO loss: checked against `GRPOTrainer._compute_loss`.

The reference is TRL itself (a real `GRPOTrainer` with `importance_sampling_level="sequence"`,
`loss_type="grpo"`), never a copy of its code.
"""

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from hacpo_trl.agents.tiny import char_tokenizer, tiny_llama
from hacpo_trl.algorithm import HACPOLossConfig, hacpo_loss


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    tok = char_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("gspo")),
        use_cpu=True,
        bf16=False,
        importance_sampling_level="sequence",
        loss_type="grpo",
        epsilon=3e-4,
        epsilon_high=4e-4,
        beta=0.0,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        gradient_checkpointing=False,
        report_to="none",
    )
    dataset = Dataset.from_dict({"prompt": ["1+1=", "2+2="]})
    t = GRPOTrainer(
        model=tiny_llama(tok),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=dataset,
        processing_class=tok,
    )
    t.model.train()
    t.current_gradient_accumulation_steps = 1
    return t


def _inputs(trainer, seed):
    g = torch.Generator().manual_seed(seed)
    vocab = trainer.processing_class.vocab_size
    prompt_ids = torch.randint(7, vocab, (4, 3), generator=g)
    completion_ids = torch.randint(7, vocab, (4, 6), generator=g)
    completion_mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.long
    )
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([torch.ones_like(prompt_ids), completion_mask], 1),
            6,
        )
    # Old log-probs off by a per-row shift: rows 0 and 3 stay inside the GSPO band (|log s| < 3e-4),
    # rows 1 and 2 leave it on either side, so both the clipped and unclipped branches are exercised.
    shift = torch.tensor([[1e-4], [5e-3], [-5e-3], [-2e-4]])
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.5, -0.5, 0.7, -1.2]),
        "old_per_token_logps": logps + shift,
        "ref_per_token_logps": logps - 0.05 * torch.randn(logps.shape, generator=g),
        "num_items_in_batch": completion_mask.sum(),
    }


def _grads(loss, model):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(loss, params)


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_hacpo_loss_equals_trl_gspo_without_peers(trainer, beta):
    inputs = _inputs(trainer, seed=int(beta * 100))
    trainer.beta = beta
    try:
        trl_loss = trainer._compute_loss(trainer.model, inputs)
    finally:
        trainer.beta = 0.0
    trl_grads = _grads(trl_loss, trainer.model)

    mask = inputs["completion_mask"]
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model,
        torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
        torch.cat([inputs["prompt_mask"], mask], 1),
        mask.shape[1],
    )
    old_mean = (inputs["old_per_token_logps"] * mask).sum(-1) / mask.sum(-1)
    out = hacpo_loss(
        logps,
        mask,
        old_mean,
        inputs["advantages"],
        torch.zeros(4, dtype=torch.bool),
        ref_logps=inputs["ref_per_token_logps"],
        config=HACPOLossConfig(epsilon_low=3e-4, epsilon_high=4e-4, beta=beta),
    )
    ours = _grads(out.loss, trainer.model)

    # The batch really exercises both branches of the clip.
    assert out.self_clipped.tolist() == [False, True, True, False]
    torch.testing.assert_close(out.loss, trl_loss, rtol=1e-6, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in trl_grads)
    for a, b in zip(ours, trl_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
