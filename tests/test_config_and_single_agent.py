"""`HACPOConfig` resolution and validation, and one agent without sharing == TRL's own GSPO."""

import os

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from hacpo_trl import AgentSpec, HACPOConfig, HACPOTrainer
from hacpo_trl.agents.tiny import char_tokenizer, tiny_llama
from helpers import seeded

COMMON = dict(use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False)


def test_single_agent_mapping_resolves_this_process(tmp_path):
    cfg = HACPOConfig(
        output_dir=str(tmp_path),
        agents={"solo": {"learning_rate": 3e-3, "overrides": {"weight_decay": 0.1}}},
        **COMMON,
    )
    assert cfg.agent_name == "solo" and cfg.agent_spec.learning_rate == 3e-3
    assert cfg.learning_rate == 3e-3 and cfg.weight_decay == 0.1
    assert cfg.output_dir == str(tmp_path)  # one agent: the run's folder (several: <output_dir>/<name>)
    assert cfg.epsilon == 3e-4 and cfg.epsilon_high == 4e-4  # the paper's GSPO clip by default
    assert cfg.loss_config().delta == 0.2 and cfg.loss_config().delta_step == 0.025


def test_no_agents_is_one_implicit_agent(tmp_path):
    cfg = HACPOConfig(output_dir=str(tmp_path), **COMMON)
    assert cfg.agent_name == "policy" and [s.name for s in cfg.specs] == ["policy"]


@pytest.mark.parametrize(
    "agents, match",
    [
        ([{"name": "a"}, {"name": "b"}], r"add up to 2 .* the launch has 1 process\(es\): launch with `accelerate"),
        ([{"name": "a"}, {"name": "a"}], r"used more than once: \['a'\]"),
        ([{"name": "a", "modle_name_or_path": "x"}], r"unknown key\(s\) \['modle_name_or_path'\]"),
        ([{"name": "a", "num_processes": 0}], "num_processes"),
        ([{"name": "a", "overrides": {"temprature": 0.5}}], "cannot override 'temprature'"),
        ([{"name": "a", "overrides": {"output_dir": "x"}}], "set it on the agent itself"),
        ([{"name": "a", "overrides": {"share_gpus": True}}], "`share_gpus` is a setting of the whole launch"),
        ([{"name": "a", "num_processes": True}], r"`num_processes` must be an integer >= 1, got True"),
        ([{"name": "a", "overrides": ["peer_filter"]}], r"`overrides` must be a mapping of HACPOConfig fields"),
        (  # another agent's bad override stops this process too (it used to be checked by that agent's only)
            [{"name": "a"}, {"name": "b", "overrides": {"temprature": 0.5}}],
            r"agent 'b': cannot override 'temprature'",
        ),
        ([], "non-empty"),
        ([{"name": "a", "output_dir": "o"}, {"name": "b", "output_dir": "o"}], "share an `output_dir`"),
    ],
)
def test_bad_agents_are_rejected_with_the_key(tmp_path, agents, match):
    with pytest.raises(ValueError, match=match):
        HACPOConfig(output_dir=str(tmp_path), agents=agents, **COMMON)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"peer_filter": "some"}, "peer_filter"),
        ({"alpha": -1.0}, "alpha"),
        ({"peer_delta": 1.2}, "delta"),
        ({"capability_window": 0}, "window"),
        ({"importance_sampling_level": "token"}, "importance_sampling_level"),
        ({"exchange_timeout": 0}, "exchange_timeout"),
    ],
)
def test_bad_hacpo_settings(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        HACPOConfig(output_dir=str(tmp_path), **kwargs, **COMMON)


def test_push_to_hub_needs_a_repo_per_agent(tmp_path):
    agents = [{"name": "a", "hub_model_id": "me/a"}, {"name": "b"}]
    with pytest.raises(ValueError, match=r"`hub_model_id` for every agent .* missing for \['b'\]"):
        HACPOConfig(output_dir=str(tmp_path), agents=agents, push_to_hub=True, **COMMON)


def test_num_generations_must_divide_the_batch(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"generation_batch_size 4 \(.*\) must be a multiple of num_generations 3.*use num_generations 2 or 4",
    ):
        HACPOConfig(output_dir=str(tmp_path), num_generations=3, per_device_train_batch_size=4, **COMMON)


def test_each_process_must_hold_whole_prompt_groups_to_share(tmp_path):
    """TRL only checks the generation batch of the agent's whole world; sharing matches peers' completions prompt by
    prompt inside each process, so HACPO checks each process's share (in the config, before any exchange)."""
    cfg = HACPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=4, **COMMON)
    cfg.per_device_train_batch_size = 1  # as on an agent of 4 processes: TRL sees 4 x 1 row, a whole group
    with pytest.raises(
        ValueError, match=r"per_device_train_batch_size x steps_per_generation = 1 .* num_generations = 4"
    ):
        cfg._check_whole_prompt_groups()


def test_a_config_makes_no_exchange_and_writes_no_environment(tmp_path, monkeypatch):
    """Creating the config of one agent of two splits the launch into agent worlds (faked here) and nothing more: the
    agreement between agents, an exchange over the whole launch that also writes the wandb run group into the
    environment, is `agree_with_other_agents`, which the trainer calls before it loads the model. It used to run
    inside `__post_init__`."""
    import types

    import hacpo_trl.config as config_module
    from hacpo_trl.run.exchange import Exchange

    topology = types.SimpleNamespace(agent="a", global_rank=0)
    monkeypatch.setattr(config_module, "init_agent_worlds", lambda *args, **kwargs: topology)
    monkeypatch.setattr(config_module, "current_topology", lambda: topology)
    gathered = []
    monkeypatch.setattr(Exchange, "all_gather", lambda self, obj, what="": gathered.append(what) or [obj])
    monkeypatch.delenv("WANDB_RUN_GROUP", raising=False)
    agents = [{"name": "a", "model_name_or_path": "x"}, {"name": "b", "model_name_or_path": "y"}]
    cfg = HACPOConfig(output_dir=str(tmp_path / "run"), agents=agents, **COMMON)  # agent a saves to run/a
    assert (cfg.agent_name, gathered, os.environ.get("WANDB_RUN_GROUP")) == ("a", [], None)
    try:
        cfg.agree_with_other_agents()
        assert gathered == ["start-up settings"] and os.environ["WANDB_RUN_GROUP"].startswith("run-")
    finally:
        os.environ.pop("WANDB_RUN_GROUP", None)


def test_hacpo_fields_never_shadow_trl_fields_with_another_meaning():
    """A HACPOConfig field named like a GRPOConfig field would silently change TRL's behaviour (as `delta`, TRL's
    two-sided ratio clip, once did); only deliberate default changes may share a name."""
    import dataclasses

    ours = {f.name for f in dataclasses.fields(HACPOConfig)} - {f.name for f in dataclasses.fields(GRPOConfig)}
    shared = set(HACPOConfig.__dataclass_fields__) & set(GRPOConfig.__dataclass_fields__)
    overridden = {
        name
        for name in shared
        if HACPOConfig.__dataclass_fields__[name].default != GRPOConfig.__dataclass_fields__[name].default
    }
    assert overridden == {"epsilon", "epsilon_high", "importance_sampling_level", "loss_type"}, overridden
    assert "delta" not in ours and {"peer_delta", "peer_delta_step", "alpha"} <= ours
    cfg = HACPOConfig(output_dir="unused", **COMMON)
    assert cfg.delta is None  # TRL's own two-sided clip stays off


def test_agent_spec_validation():
    with pytest.raises(ValueError, match="name"):
        AgentSpec(name="a/b")
    with pytest.raises(ValueError, match="lora"):
        AgentSpec(name="a", lora="yes")


def _digit_share(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def _first_then_digit_share(completions, **kwargs):
    """0.6 for the first completion of each group of 2 (scored consecutively) plus 0.4 x its share of digits: the
    first always scores more than the second (>= 0.6 against <= 0.4), a spread in every group whatever was sampled."""
    return [0.6 * (i % 2 == 0) + 0.4 * d for i, d in enumerate(_digit_share(completions))]


@pytest.mark.parametrize("share_rollouts", [True, False], ids=["hacpo_loss", "trl_loss"])
@pytest.mark.parametrize("steps_per_generation", [1, 2])
def test_one_agent_equals_trl_gspo(tmp_path, steps_per_generation, share_rollouts):
    """One agent (no peers: HACPO's own loss) and `share_rollouts=False` (TRL's loss) both train exactly like
    `GRPOTrainer` with GSPO settings, through the whole HACPOTrainer pipeline."""
    tok = char_tokenizer()
    dataset = Dataset.from_dict({"prompt": [f"{a}+{b}=" for a in range(4) for b in range(4)]})
    common = dict(
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        max_steps=6,
        learning_rate=0.2,
        steps_per_generation=steps_per_generation,
        seed=seeded(3),
        logging_steps=1,
        save_strategy="no",
        **COMMON,
    )
    trl_args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        importance_sampling_level="sequence",
        loss_type="grpo",
        epsilon=3e-4,
        epsilon_high=4e-4,
        **common,
    )
    trl_trainer = GRPOTrainer(
        model=tiny_llama(tok, seed=5),
        reward_funcs=_first_then_digit_share,
        args=trl_args,
        train_dataset=dataset,
        processing_class=tok,
    )
    trl_trainer.train()

    hacpo_args = HACPOConfig(output_dir=str(tmp_path / "hacpo"), share_rollouts=share_rollouts, **common)
    hacpo_trainer = HACPOTrainer(
        model=tiny_llama(tok, seed=5),
        reward_funcs=_first_then_digit_share,
        args=hacpo_args,
        train_dataset=dataset,
        processing_class=tok,
    )
    start = {n: p.detach().clone() for n, p in hacpo_trainer.model.named_parameters()}
    hacpo_trainer.train()

    moved = 0
    for (name, a), (_, b) in zip(
        hacpo_trainer.model.named_parameters(), trl_trainer.model.named_parameters(), strict=True
    ):
        moved += not torch.equal(a, start[name])
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert moved > 0  # trained models are compared (a reward spread in every group), not two copies of the initial one
    # the same share of rows cut by the ratio clip at every update (whether the off-policy second updates of
    # `steps_per_generation: 2` cut any is a draw of the sampling)
    trl_clipped = [e["clip_ratio/region_mean"] for e in trl_trainer.state.log_history if "clip_ratio/region_mean" in e]
    hacpo_clipped = [
        e["clip_ratio/region_mean"] for e in hacpo_trainer.state.log_history if "clip_ratio/region_mean" in e
    ]
    assert len(trl_clipped) == 6 and hacpo_clipped == pytest.approx(trl_clipped, abs=1e-6)
    trl_losses = [e["loss"] for e in trl_trainer.state.log_history if "loss" in e]
    hacpo_losses = [e["loss"] for e in hacpo_trainer.state.log_history if "loss" in e]
    assert hacpo_losses == pytest.approx(trl_losses, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"loss_type": "dapo"}, r"loss_type='dapo'"),
        ({"entropy_coef": 0.01}, "entropy_coef"),
        ({"use_adaptive_entropy": True}, "entropy_coef / use_adaptive_entropy"),
        ({"delta": 2.0}, r"delta=2.0 \(TRL's two-sided ratio clip"),
        ({"scale_rewards": "batch"}, r"scale_rewards='batch'"),
        ({"scale_rewards": False}, r"scale_rewards='none'"),
        ({"multi_objective_aggregation": "normalize_then_sum"}, "multi_objective_aggregation='normalize_then_sum'"),
        ({"router_aux_loss_coef": 0.01}, r"router_aux_loss_coef=0.01 \(the MoE load-balancing loss"),
    ],
)
def test_trl_settings_hacpo_would_ignore_are_refused_when_sharing(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=r"HACPO's loss \(share_rollouts=True\) would silently ignore: " + match):
        HACPOConfig(output_dir=str(tmp_path), **kwargs, **COMMON)
    cfg = HACPOConfig(output_dir=str(tmp_path), share_rollouts=False, **kwargs, **COMMON)  # TRL's own loss uses them
    assert all(getattr(cfg, k) == v or k == "scale_rewards" for k, v in kwargs.items())


def test_moe_router_loss_is_refused_when_sharing(tmp_path):
    """TRL turns the router load-balancing loss on from the model's own config; HACPO's loss would drop it."""
    from transformers import MixtralConfig, MixtralForCausalLM

    tok = char_tokenizer()
    config = MixtralConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=2, num_experts_per_tok=1, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    assert config.router_aux_loss_coef > 0
    dataset = Dataset.from_dict({"prompt": ["1+1="] * 4})
    common = dict(per_device_train_batch_size=2, num_generations=2, **COMMON)
    with pytest.raises(ValueError, match=r"Mixture-of-Experts .* Set `router_aux_loss_coef: 0.0`"):
        HACPOTrainer(
            model=MixtralForCausalLM(config),
            reward_funcs=_digit_share,
            args=HACPOConfig(output_dir=str(tmp_path), **common),
            train_dataset=dataset,
            processing_class=tok,
        )
    trainer = HACPOTrainer(
        model=MixtralForCausalLM(config),
        reward_funcs=_digit_share,
        args=HACPOConfig(output_dir=str(tmp_path), router_aux_loss_coef=0.0, **common),
        train_dataset=dataset,
        processing_class=tok,
    )
    assert not trainer.aux_loss_enabled


@pytest.mark.parametrize(
    "steps_per_generation, accumulation, num_iterations, ok",
    [(4, 2, 1, True), (2, 4, 1, True), (3, 3, 1, True), (3, 2, 1, False), (3, 2, 2, True), (2, 3, 1, False)],
)
def test_updates_must_not_straddle_generation_batches(tmp_path, steps_per_generation, accumulation, num_iterations, ok):
    """m = (micro-step mod S·I) // GA is the index of the optimizer update on a generation batch only when S·I is a
    multiple of GA (or GA of S·I). E.g. S = 3, GA = 2: the second update takes micro-steps 2 and 3, one from each
    generation batch."""
    cfg = HACPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        steps_per_generation=steps_per_generation,
        gradient_accumulation_steps=accumulation,
        num_iterations=num_iterations,
        save_strategy="no",  # the save-point check would refuse the default save_steps first (tested elsewhere)
        **COMMON,
    )
    if ok:
        cfg._check_update_schedule()
    else:
        with pytest.raises(ValueError, match="would straddle generation batches"):
            cfg._check_update_schedule()
