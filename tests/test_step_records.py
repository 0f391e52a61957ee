"""What a process contributes to a step and checks about it, without a trainer or process group: the self rows'
columns and record (`peer_rows.add_self_columns`), prompt ids, the same-prompts check and each agent's rewards
(`exchange`), and an agent's model / tokenizer / LoRA resolution (`loading`)."""

import math

import pytest
import torch
from datasets import Dataset

from hacpo_trl.config import AgentSpec
from hacpo_trl.run.exchange import (
    PROMPT_ID_COLUMN,
    ExchangeError,
    RolloutBatch,
    check_same_prompts,
    rewards_by_agent,
    with_prompt_ids,
)
from hacpo_trl.sharing.peer_rows import add_self_columns, order_rows, own_rewards
from hacpo_trl.training.loading import check_batch_supported, check_supported, moe_loss_message, resolve_agent

EOS = 2


def test_self_columns_and_record_from_trl_batch():
    batch = {
        "completion_ids": torch.tensor([[5, 6, EOS], [7, 0, 0], [0, 0, 0], [8, 9, 9]]),
        "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 1]]),
    }
    old_logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -9.0, -9.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, 2.0]])
    rewards = torch.tensor([1.0, float("nan"), 0.0, 0.5])
    record = add_self_columns(batch, old_logps, rewards, [EOS, 99])
    assert record["old_mean_logps"] == pytest.approx([-2.0, -0.5, 0.0, 0.0])  # means over the completion's tokens
    assert record["num_tokens"] == [3, 1, 0, 3]
    assert record["terminated"] == [True, False, False, False]  # only row 0 ends with an EOS id
    assert math.isnan(record["rewards"][1]) and record["rewards"][3] == 0.5
    assert batch["hacpo_valid"].tolist() == [True, False, False, True]  # NaN reward, empty completion: invalid
    assert batch["hacpo_is_peer"].tolist() == [False] * 4
    assert batch["hacpo_old_len"].tolist() == [3, 1, 0, 3]
    assert batch["hacpo_omega"].tolist() == [1.0] * 4
    torch.testing.assert_close(batch["hacpo_old_mean_logp"], torch.tensor([-2.0, -0.5, 0.0, 0.0]))
    assert len(RolloutBatch("a", 0, 3, ["p"] * 4, ["t"] * 4, **record)) == 4


def test_prompt_ids_are_row_index_and_content_hash():
    data = with_prompt_ids(Dataset.from_dict({"prompt": ["1+1=", "2+2=", "1+1="]}))
    ids = data[PROMPT_ID_COLUMN]
    assert [i.split(":")[0] for i in ids] == ["0", "1", "2"]
    assert ids[0].split(":")[1] == ids[2].split(":")[1] != ids[1].split(":")[1]  # same prompt, same hash
    assert with_prompt_ids(data) is data and with_prompt_ids(None) is None


def _record(agent, step, prompts, rewards=None):
    return RolloutBatch(agent, 0, step, prompts, rewards=rewards or [1.0] * len(prompts))


def test_same_prompts_check_names_the_agent_and_the_difference():
    check_same_prompts([_record("a", 1, ["p0", "p1"]), _record("b", 1, ["p1"]), _record("b", 1, ["p0"])], "a", 1)
    with pytest.raises(ExchangeError, match=r"step 4: agent 'b' received different prompts than agent 'a' "):
        check_same_prompts([_record("a", 4, ["p0", "p1"]), _record("b", 4, ["p0", "p2"])], "a", 4)
    with pytest.raises(ExchangeError, match=r"missing \['p1'\], unexpected \['p2'\]"):
        check_same_prompts([_record("a", 4, ["p0", "p1"]), _record("b", 4, ["p0", "p2"])], "a", 4)
    with pytest.raises(ExchangeError, match=r"different steps \[1, 2\]"):
        check_same_prompts([_record("a", 1, ["p0"]), _record("b", 2, ["p0"])], "a", 1)


def test_rewards_by_agent_keeps_finite_rewards_of_every_rank():
    records = [
        _record("a", 0, ["p", "p"], [1.0, float("nan")]),
        _record("b", 0, ["p"], [0.5]),
        _record("a", 0, ["q"], [0.0]),
    ]
    assert rewards_by_agent(records, ["a", "b", "c"]) == {"a": [1.0, 0.0], "b": [0.5], "c": [0.0]}


def test_resolve_agent_takes_missing_pieces_from_the_spec(tmp_path):
    with pytest.raises(ValueError, match="agent 'x' has no `model_name_or_path` and no model was passed"):
        resolve_agent(AgentSpec(name="x"))

    class Model:
        class config:  # noqa: N801
            _name_or_path = ""

    with pytest.raises(ValueError, match="agent 'x': pass `processing_class` or set `tokenizer_name_or_path`"):
        resolve_agent(AgentSpec(name="x"), Model())
    tokenizer = object()
    spec = AgentSpec(name="x", model_name_or_path=str(tmp_path), lora={"r": 4})
    model, base, processing_class, peft = resolve_agent(spec, processing_class=tokenizer)
    assert (model, base, processing_class) == (str(tmp_path), str(tmp_path), tokenizer)
    assert peft.r == 4 and peft.task_type == "CAUSAL_LM"
    Model.config._name_or_path = "org/m"
    assert resolve_agent(AgentSpec(name="x"), Model(), tokenizer, "peft")[1:] == ("org/m", tokenizer, "peft")


def test_own_rewards_are_this_processs_weighted_sums():
    # 2 processes x 2 completions, 2 reward functions weighted 1 and 0.5; a row NaN in every function is NaN
    per_func = torch.tensor([[1.0, 0.0], [0.0, 2.0], [float("nan"), 1.0], [float("nan"), float("nan")]])
    weights = torch.tensor([1.0, 0.5])
    assert own_rewards(per_func, weights, 0, 2).tolist() == [1.0, 1.0]
    second = own_rewards(per_func, weights, 1, 2)
    assert second[0] == 0.5 and math.isnan(second[1])


def test_order_rows_keeps_self_rows_first_and_every_column_aligned():
    torch.manual_seed(0)
    batch = {"prompt_ids": torch.arange(6).unsqueeze(1), "advantages": torch.arange(6.0), "num_items": 6}
    out = order_rows(batch, 2, 2, "self_first")
    assert sorted(out["prompt_ids"][:2, 0].tolist()) == [0, 1] and sorted(out["prompt_ids"][2:, 0].tolist()) == [
        2,
        3,
        4,
        5,
    ]
    assert out["advantages"].tolist() == out["prompt_ids"][:, 0].float().tolist() and out["num_items"] == 6
    dealt = order_rows(batch, 2, 2, "interleaved")["prompt_ids"][:, 0].tolist()
    assert {dealt[0], dealt[3]} == {0, 1}  # one self row in each of the 2 chunks of 3


def test_unsupported_inputs_are_named():
    with pytest.raises(TypeError, match=r"needs `args=HACPOConfig\(...\)`"):
        check_supported(None, {})
    with pytest.raises(ValueError, match="does not support `pixel_values`"):
        check_batch_supported({"prompt_ids": 1, "pixel_values": 2})
    check_batch_supported({"prompt_ids": 1})
    message = moe_loss_message("big", "Qwen3MoeForCausalLM", 0.001)
    assert message.startswith("agent 'big': Qwen3MoeForCausalLM is a Mixture-of-Experts model")
    assert "router_aux_loss_coef=0.001" in message and "`router_aux_loss_coef: 0.0`" in message
