"""A peer's completion in the learner's tokens: unit tests, and the peer rows the trainer builds from them."""

import dataclasses

import pytest
import torch
from datasets import Dataset

from hacpo_trl.agents.tiny import bpe_tokenizer, char_tokenizer, tiny_llama
from hacpo_trl.algorithm import CapabilityTracker
from hacpo_trl.run.exchange import RolloutBatch
from hacpo_trl.sharing.retokenize import completion_text, peer_completion_ids

CHAR = char_tokenizer()
BPE = bpe_tokenizer()


@pytest.mark.parametrize("tok", [CHAR, BPE], ids=["char", "bpe"])
def test_terminated_completion_gets_the_learners_eos(tok):
    view = peer_completion_ids(tok, "12 + 3 = 15", terminated=True, max_completion_length=64)
    assert view.ids[-1] == tok.eos_token_id and not view.truncated
    assert tok.decode(view.ids[:-1]) == "12 + 3 = 15"
    assert tok.eos_token_id not in view.ids[:-1]


def test_tokenizers_really_differ():
    char = peer_completion_ids(CHAR, "12 + 3 = 15", True, 64).ids
    bpe = peer_completion_ids(BPE, "12 + 3 = 15", True, 64).ids
    assert len(char) == 12 and len(bpe) < len(char)  # one token per character vs merged byte pairs


def test_unterminated_completion_has_no_eos():
    view = peer_completion_ids(CHAR, "12 +", terminated=False, max_completion_length=64)
    assert view.ids == CHAR("12 +", add_special_tokens=False)["input_ids"]
    assert CHAR.eos_token_id not in view.ids


def test_over_long_completion_is_cut_and_marked():
    view = peer_completion_ids(CHAR, "123456789", terminated=True, max_completion_length=4)
    assert view.truncated and len(view.ids) == 4
    assert CHAR.decode(view.ids) == "1234"  # the EOS was cut with the tail: the learner is not taught to stop here
    exact = peer_completion_ids(CHAR, "123", terminated=True, max_completion_length=4)
    assert not exact.truncated and exact.ids[-1] == CHAR.eos_token_id


def test_empty_completion():
    assert peer_completion_ids(CHAR, "", terminated=True, max_completion_length=4).ids == [CHAR.eos_token_id]
    assert peer_completion_ids(CHAR, "", terminated=False, max_completion_length=4) is None


def test_text_the_learner_cannot_represent_becomes_unknown_tokens():
    view = peer_completion_ids(CHAR, "π=3", terminated=False, max_completion_length=8)
    assert view.ids[0] == CHAR.unk_token_id and CHAR.decode(view.ids[1:]) == "=3"
    # a byte-level tokenizer represents everything
    assert BPE.decode(peer_completion_ids(BPE, "π=3", False, 8).ids) == "π=3"


def test_completion_text_of_conversational_and_plain():
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "4"}]) == "4"
    with pytest.raises(TypeError):
        completion_text(3)


def test_bad_max_length():
    with pytest.raises(ValueError, match="max_completion_length"):
        peer_completion_ids(CHAR, "1", True, 0)


# ------------------------------------------------------------------- the peer rows the trainer appends


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    """A one-process trainer for a char-level Llama learner, told that a byte-BPE peer exists."""
    from hacpo_trl import HACPOConfig, HACPOTrainer

    args = HACPOConfig(
        output_dir=str(tmp_path_factory.mktemp("learner")),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=5,
        steps_per_generation=2,
        report_to="none",
        gradient_checkpointing=False,
    )
    prompts = [[{"role": "user", "content": "1+1="}], [{"role": "user", "content": "2+2="}]]
    trainer = HACPOTrainer(
        model=tiny_llama(CHAR),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=CHAR,
    )
    trainer.agent_names = ["policy", "peer"]
    trainer.capability = CapabilityTracker(trainer.agent_names)
    trainer.capability.update({"policy": [1, 0, 0, 0], "peer": [1, 1, 0, 1]})  # P = 0.25 and 0.75
    return trainer


def _learner_batch(learner):
    """The learner's own batch of 2 prompts x 2 completions plus one peer's records, as the trainer builds it."""
    # the learner's own batch: 2 prompts x 2 completions, prompts under the learner's chat template
    msgs = [{"role": "user", "content": "1+1="}]
    prompt = CHAR.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert CHAR.decode(prompt) == "[INST] 1+1= [/INST] "  # the peer's ChatML template plays no part
    other = CHAR.apply_chat_template(
        [{"role": "user", "content": "2+2="}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    width = max(len(prompt), len(other))
    prompt_rows = [prompt, prompt, other, other]
    batch = {
        "prompt_ids": torch.tensor([[CHAR.pad_token_id] * (width - len(p)) + p for p in prompt_rows]),
        "prompt_mask": torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_rows]),
        "completion_ids": torch.tensor([[10, 11, 1, 0], [10, 0, 0, 0], [12, 13, 14, 1], [12, 1, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]),
        "advantages": torch.zeros(4),
        "hacpo_is_peer": torch.zeros(4, dtype=torch.bool),
        "hacpo_old_mean_logp": torch.full((4,), -1.0),
        "hacpo_old_len": torch.tensor([3, 1, 4, 2]),
        "hacpo_omega": torch.ones(4),
        "hacpo_valid": torch.ones(4, dtype=torch.bool),
    }
    ids = ["p0", "p0", "p1", "p1"]
    peer = RolloutBatch(
        agent="peer",
        global_rank=1,
        step=0,
        prompt_ids=["p0", "p0", "p1", "p1", "p1"],
        texts=["2", "", "4444444", "x", "y"],
        rewards=[1.0, 0.0, 1.0, float("nan"), 1.0],  # row 3: unscorable
        old_mean_logps=[-0.5, -0.7, -0.2, -0.3, float("-inf")],  # row 4: a broken log-prob
        num_tokens=[2, 1, 8, 1, 1],
        terminated=[True, True, False, False, True],
    )
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    rows = learner._peer_rows(ids, rewards, {"peer": [peer]}, ["peer"])
    out = learner._add_peer_rows(batch, rows, ids, 0.0, "train")
    return out, prompt, other


def test_peer_rows_are_built_in_the_learners_view(learner):
    out, prompt, other = _learner_batch(learner)

    # self rows first, then the 3 usable peer rows (NaN reward, -inf log-prob: rejected), then 1 padding row so that
    # the 8 rows split into steps_per_generation = 2 equal mini-batches
    assert out["hacpo_is_peer"].tolist() == [False] * 4 + [True] * 4
    assert out["hacpo_valid"].tolist() == [True] * 7 + [False]
    assert out["prompt_ids"].shape[0] == out["completion_ids"].shape[0] == 8
    # every peer row carries the learner's own prompt tokens for its prompt
    for row, pid in zip(range(4, 7), ["p0", "p0", "p1"], strict=True):
        tokens = out["prompt_ids"][row][out["prompt_mask"][row].bool()].tolist()
        assert tokens == (prompt if pid == "p0" else other)
    eos = CHAR.eos_token_id
    completions = [out["completion_ids"][r][out["completion_mask"][r].bool()].tolist() for r in range(4, 7)]
    assert completions[0] == CHAR("2", add_special_tokens=False)["input_ids"] + [eos]  # terminated: + EOS
    assert completions[1] == [eos]  # empty but terminated: the single EOS action
    assert completions[2] == CHAR("44444", add_special_tokens=False)["input_ids"]  # cut to 5, no EOS
    # generator statistics travel with the rows; ω(source, learner) = 0.75 / 0.25 = 3
    torch.testing.assert_close(out["hacpo_old_mean_logp"][4:7], torch.tensor([-0.5, -0.7, -0.2]))
    assert out["hacpo_old_len"][4:7].tolist() == [2, 1, 8]
    torch.testing.assert_close(out["hacpo_omega"][4:7], torch.full((3,), 3.0))
    # joint-group advantages for learner "policy" (P 0.25) vs peer (P 0.75): ω(k, j) = 1/3 scales peer rewards.
    # p0: rewards self [1, 0], peer [1, 0] -> μ̂ = (1 + 0 + 1/3 + 0) / 4 = 1/3, σ = std([1,0,1,0]) = 0.57735
    s = torch.tensor([1.0, 0.0, 1.0, 0.0]).std()
    expected_p0 = (torch.tensor([1.0, 0.0, 1.0, 0.0]) - 1 / 3) / (s + 1e-6)
    torch.testing.assert_close(out["advantages"][[0, 1, 4, 5]], expected_p0)
    # p1: self [0, 0], peer [1] (the NaN row left out) -> μ̂ = (0 + 0 + 1/3) / 3 = 1/9, σ = std([0,0,1])
    s1 = torch.tensor([0.0, 0.0, 1.0]).std()
    expected_p1 = (torch.tensor([0.0, 0.0, 1.0]) - 1 / 9) / (s1 + 1e-6)
    torch.testing.assert_close(out["advantages"][[2, 3, 6]], expected_p1)
    assert out["advantages"][7] == 0
    assert learner._metrics["train"]["hacpo/peer_rows_rejected"][-1] == 2  # counted, never propagated


@pytest.mark.parametrize("update_index", [0, 1])
def test_clipped_peer_rows_skip_backward_without_changing_loss_or_gradient(learner, update_index):
    """Peer rows outside the band are scored without gradient and left out of the backward pass; the loss and every
    gradient are the same as with one forward + backward over all rows."""
    import math

    batch, _, _ = _learner_batch(learner)
    model = learner.model
    model.train()
    learner.current_gradient_accumulation_steps = 1
    learner._step = update_index  # steps_per_generation = 2, GA = 1: m = update_index
    peer_rows = batch["hacpo_is_peer"] & batch["hacpo_valid"]
    with torch.no_grad():
        logps = learner._row_logps(model, batch, peer_rows)
        mask = batch["completion_mask"][peer_rows]
        current = (logps * mask).sum(-1) / mask.sum(-1)
    # one peer row inside the band (s = 0.9), one above it (s = 1.5), one far below (s = e^-3)
    batch["hacpo_old_mean_logp"][peer_rows] = current - torch.tensor([math.log(0.9), math.log(1.5), -3.0])
    batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, 0.7, -0.3, 0.0])
    params = [p for p in model.parameters() if p.requires_grad]
    results = {}
    for skip in (False, True):
        learner.args.skip_clipped_peer_backward = skip
        learner._metrics["train"].clear()
        loss = learner._compute_loss(model, batch)
        results[skip] = (loss.detach(), torch.autograd.grad(loss, params), dict(learner._metrics["train"]))
    learner.args.skip_clipped_peer_backward = True
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-5, atol=1e-7)
    for a, b in zip(results[True][1], results[False][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in results[True][1])
    # 2 of the 8 rows (the peer rows outside the band) had no backward pass; the metrics still count them
    assert results[True][2]["hacpo/backward_rows_fraction"] == [6 / 8]
    assert results[False][2]["hacpo/backward_rows_fraction"] == [1.0]
    for key in ("hacpo/peer_clipped_low", "hacpo/peer_clipped_high", "hacpo/peer_ratio_mean"):
        assert results[True][2][key] == pytest.approx(results[False][2][key], rel=1e-5)
    assert results[True][2]["hacpo/peer_clipped_high"] == [pytest.approx(1 / 3)]


def test_peer_filter_correct_keeps_only_rewarded_peer_rows(learner):
    checked = learner.sharing  # the trainer reads its checked sharing settings, not the config's copy
    learner.sharing = dataclasses.replace(checked, peer_filter="correct")
    try:
        learner._metrics["train"].clear()
        out, _, _ = _learner_batch(learner)
    finally:
        learner.sharing = checked
    # of the 5 peer records only "2" and "4444444" are usable and correct ("x" and "y" are unusable, "" is wrong)
    assert out["hacpo_is_peer"].tolist() == [False] * 4 + [True] * 2
    eos = CHAR.eos_token_id
    completions = [out["completion_ids"][r][out["completion_mask"][r].bool()].tolist() for r in (4, 5)]
    assert completions == [
        CHAR("2", add_special_tokens=False)["input_ids"] + [eos],
        [CHAR.convert_tokens_to_ids("4")] * 5,
    ]
    metrics = learner._metrics["train"]
    assert metrics["hacpo/peer_rows"][-1] == 2
    assert metrics["hacpo/peer_rows_filtered"][-1] == 1  # the 0.0 reward
    assert metrics["hacpo/peer_rows_rejected"][-1] == 2  # NaN reward and -inf log-prob: rejected before filtering
