"""FSDP2 inside each agent's world, on CPU over gloo (a real launch; see tests/scripts/cpu_fsdp.py).

Under FSDP every forward is a collective over the agent's ranks: a forward that only some ranks run (HACPO's peer
scoring forward, when the ranks of one agent hold different numbers of peer rows) makes the world crash on a
mismatched collective or hang.
"""

import pytest
from transformers import AutoModelForCausalLM

from helpers import summaries

pytestmark = [pytest.mark.fsdp, pytest.mark.timeout(600)]


@pytest.mark.launch
def test_fsdp_per_agent_with_uneven_peer_rows(tmp_path, launch):
    # peer_filter=correct and only rank 0's completions correct: rank 0 of each agent trains on 4 peer rows, rank 1
    # on none, so only rank 0 has peer rows to score in the second micro-step. The first completion of each group
    # scores 1, the other 0.5 (`--first_of_group`): a spread in every group of rank 0, so both agents train whatever
    # was sampled
    launch(4, "train_agents.py", "--agents", "llama:2,qwen:2", "--out", str(tmp_path), "--steps", "2", "--fsdp",
           "--save_steps", "2", "--peer_filter", "correct", "--correct_on_rank0", "--first_of_group",
           "--exchange_timeout", "60", timeout=240)  # fmt: skip
    runs = summaries(tmp_path)
    assert [(s["agent"], s["agent_rank"]) for s in runs] == [("llama0", 0), ("llama0", 1), ("qwen1", 0), ("qwen1", 1)]
    for s in runs:
        assert s["fsdp"] and s["sharded"] == ["DTensor"], s  # parameters are sharded over the agent's 2 ranks
        assert s["agent_world"] == 2
        assert s["peer_rows_here"] == ([4] if s["agent_rank"] == 0 else [0])
        assert s["global_step"] == 2
        assert s["trainable"] and s["trainable_changed"] == s["trainable"]
    for agent in ("llama0", "qwen1"):
        ranks = [s for s in runs if s["agent"] == agent]
        assert ranks[0]["param_sum"] == ranks[1]["param_sum"]  # one model, gathered from its shards
        # the checkpoint completed on every rank, and the saved model is the whole trained model
        assert (tmp_path / agent / "checkpoint-2" / "hacpo_state.json").is_file()
        saved = AutoModelForCausalLM.from_pretrained(tmp_path / agent)
        total = float(sum(p.detach().double().sum() for p in saved.parameters()))
        assert total == pytest.approx(ranks[0]["param_sum"], rel=1e-6)
    assert runs[0]["param_sum"] != runs[2]["param_sum"]


@pytest.mark.parametrize("sharded", [True, False])
def test_held_out_evaluation_runs_on_every_rank_when_forwards_are_collective(monkeypatch, sharded):
    """hacpo-train's evaluation generated on the agent's rank 0 alone: under FSDP / ZeRO-3 that forward waits for the
    other ranks' shards forever. (Stubbed: the launch above shows what a one-rank forward does to an FSDP world.)
    When every rank generates, each sizes its ``generate`` calls by the least free memory of the agent's ranks (10
    and 6 GiB here: 6 on both), or the rank with more would make fewer calls and leave the other in a collective."""
    from types import SimpleNamespace

    import torch

    import hacpo_trl.evaluation.evaluate
    from hacpo_trl.launch.train import _evaluate

    calls, free, rank_now = [], {0: 10 * 2**30, 1: 6 * 2**30}, []
    monkeypatch.setattr(
        hacpo_trl.evaluation.evaluate,
        "evaluate_model",
        lambda *a, **k: calls.append(k["memory_bytes"]) or SimpleNamespace(avg_at_k=0.5),
    )
    monkeypatch.setattr(hacpo_trl.evaluation.evaluate, "_free_bytes", lambda device: free[rank_now[-1]])  # as on a GPU
    monkeypatch.setattr("hacpo_trl.tasks.rewards.get_reward_funcs", lambda names: [None])

    class Rows(list):  # the held-out split: a datasets.Dataset in the CLI
        def select(self, rows):
            return Rows(self[i] for i in rows)

    script_args = SimpleNamespace(eval_samples=2, reward_funcs=["accuracy"], task="arithmetic")
    for rank in (0, 1):
        rank_now.append(rank)
        gather = lambda t: torch.tensor([free[0], free[1]])  # noqa: E731  accelerate's gather: every rank's value
        trainer = SimpleNamespace(
            is_fsdp_enabled=sharded,
            accelerator=SimpleNamespace(process_index=rank, unwrap_model=lambda m: m, device="cpu", gather=gather),
            model=None, processing_class=None, args=SimpleNamespace(max_completion_length=8, chat_template_kwargs=None),
        )  # fmt: skip
        assert _evaluate(trainer, Rows([1, 2, 3, 4]), script_args) == (0.5 if rank == 0 else None)
    assert calls == ([6 * 2**30] * 2 if sharded else [None])  # rank 0 alone sizes its calls by its own memory
    assert len(calls) == (2 if sharded else 1)


@pytest.mark.launch
def test_recommended_preset_under_fsdp_with_a_gated_off_agent_and_uneven_peer_rows(tmp_path, launch):
    """The recommended preset on two 2-rank FSDP agents (every forward a collective over the agent's ranks). llama1
    solves nothing (P̂ = 0); llama0's completions are correct on its rank 0 only (P̂ = 0.5, z = 2.83 against llama1).
    So llama0's gate stays closed and it makes 2 of the 4 updates of each batch (the other 2 skipped on both ranks),
    with a reward spread in every group of its rank 0 (`--first_of_group`: 1 and 0.5), so it trains whatever was
    sampled; llama1's gate opens, its rank 0 holds llama0's 4 correct rows of its prompts and rank 1 none, and the
    band gate's no-gradient forwards over them must not leave rank 1 out of a collective. Both agents start from the
    same weights, so at the first batch the peer ratios are 1, inside the band; at the second, after both trained,
    whether a row is in the band is a draw, and llama1 learns from llama0 exactly when one is."""
    launch(4, "train_agents.py", "--agents", "llama:2,llama:2", "--out", str(tmp_path), "--steps", "8", "--fsdp",
           "--steps_per_generation", "4", "--peer_filter", "correct", "--correct_on_rank0", "--zero_reward", "1",
           "--first_of_group", "--exchange_timeout", "60", "--record_forwards",
           *[f"--override={i}:{k}={v}" for i in (0, 1) for k, v in [("capability_gate", "1.0"),
             ("capability_gate_confidence", "0.95"), ("band_gate", "true"), ("solo_steps_per_generation", "2")]],
           timeout=300)  # fmt: skip
    runs = summaries(tmp_path)
    strong, weak = [s for s in runs if s["agent"] == "llama0"], [s for s in runs if s["agent"] == "llama1"]
    for ranks in (strong, weak):
        assert [s["agent_rank"] for s in ranks] == [0, 1] and all(s["sharded"] == ["DTensor"] for s in ranks)
        assert ranks[0]["param_sum"] == ranks[1]["param_sum"]  # one model, gathered from its shards
        assert all(s["global_step"] == 8 and s["trainable_changed"] == s["trainable"] for s in ranks)

    def logged(s, key):
        return [e[key] for e in s["log_history"] if key in e]

    for s in strong:  # gated off at both batches: GSPO's 2 updates, then 2 skipped (loss 0, no forward)
        assert logged(s, "hacpo/learns_from/llama1") == [0.0, 0.0] and s["peer_rows_here"] == []
        losses = logged(s, "loss")
        assert len(losses) == 8 and losses[2::4] == losses[3::4] == [0.0, 0.0]
    for s in weak:  # open to llama0 at both batches by its gate, its correct rows on rank 0 only
        in_band = logged(s, "hacpo/band_rows/llama0")  # the band gate ran at both (its forwards below)
        assert len(in_band) == 2 and in_band[0] > 0  # the same weights at the first batch: ratios of 1
        opened = [float(n > 0) for n in in_band]  # the band gate closes llama0 at a batch with no row in the band
        assert logged(s, "hacpo/learns_from/llama0") == opened
        assert s["peer_rows_here"] == [4 if s["agent_rank"] == 0 else 0] * int(sum(opened))
        # the band gate scores in forwards of per_device_train_batch_size (1) rows, as many on rank 1 (no peer row:
        # one row scored and dropped) as rank 0 needs for its 4: one forward of all of them would be 4 rows on rank 0
        assert [f for f in s["forwards"] if f[0] == "band_gate"] == [["band_gate", 1]] * 8
    for ranks in (strong, weak):  # under FSDP / ZeRO-3 a forward is a collective: both ranks run each pass alike
        passes = [[f[0] for f in s["forwards"]] for s in ranks]
        assert passes[0] == passes[1] and {"old_logps", "train"} <= set(passes[0]), passes
