"""Real multi-process HACPO runs through `accelerate launch` on CPU (gloo), with heterogeneous tiny agents.

The agents differ in architecture (Llama / Qwen2), tokenizer (characters / byte-level BPE) and chat template.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import own_spread, summaries

pytestmark = [pytest.mark.launch, pytest.mark.timeout(900)]


def _metric(summary: dict, key: str) -> list:
    return [entry[key] for entry in summary["log_history"] if key in entry]


def _by_agent(runs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for s in runs:
        out.setdefault(s["agent"], []).append(s)
    return out


def test_two_heterogeneous_agents_train_and_share(two_agents):
    out, runs = two_agents
    assert [s["agent"] for s in runs] == ["llama0", "qwen1"]
    for s in runs:
        assert s["agent_world"] == 1  # each agent sees only its own world
        assert s["trainable"], s["agent"]
        if own_spread(s):  # a group of its own rows with different rewards: a learning signal, whatever was sampled
            assert s["trainable_changed"] == s["trainable"], s["agent"]
        peer_rows = _metric(s, "hacpo/peer_rows")
        assert peer_rows and all(n == 8 for n in peer_rows)  # 4 prompts x 2 completions of the other agent
        kept = _metric(s, "hacpo/peer_kept")
        assert kept, "peer rows reached the loss"
        # the share of peer rows inside the band at their update (8 own rows, then the 8 peer rows) is the share of
        # the batch's peer ratios in the band: how many were inside is a draw, which ones took part is not
        assert kept == pytest.approx(_metric(s, "hacpo/peer_ratio_in_band"), abs=1e-6), s["agent"]
    # capabilities were exchanged: both agents log the same P̂ of both agents at every step
    llama, qwen = runs
    for agent in ("llama0", "qwen1"):
        key = f"hacpo/capability/{agent}"
        # one capability update per generation batch: 4 optimizer steps, 2 updates each -> 2 entries
        assert _metric(llama, key) == _metric(qwen, key) and len(_metric(llama, key)) == 2
    assert llama["capability"] == qwen["capability"]
    # ω in each agent's log is the reciprocal view of the other's (inside the clamp)
    w_lq, w_ql = _metric(llama, "hacpo/omega/qwen1"), _metric(qwen, "hacpo/omega/llama0")
    for a, b in zip(w_lq, w_ql, strict=True):
        if 0.1 < a < 10:
            assert a * b == pytest.approx(1.0, rel=1e-6)


def test_logged_metrics_are_consistent(two_agents):
    """The per-agent metrics a user reads (docs/training.md, "Metrics"), checked for values, not just presence."""
    _, runs = two_agents
    llama, qwen = runs
    for s in runs:
        # m counts the updates made on a generation batch: 8 own rows, then 8 peer rows at m = 1 (δ = 0.99, step 0.025)
        assert _metric(s, "hacpo/lower_bound") == pytest.approx([0.01, 0.035, 0.01, 0.035])
        low, high, kept = (_metric(s, f"hacpo/peer_{k}") for k in ("clipped_low", "clipped_high", "kept"))
        assert len(kept) == 2  # one peer update per generation batch
        for lo, hi, k in zip(low, high, kept, strict=True):
            assert 0 <= lo <= 1 and 0 <= hi <= 1 and 0 <= k <= 1 and lo + hi + k == pytest.approx(1.0)
        assert all(r > 0 for r in _metric(s, "hacpo/peer_ratio_mean"))
        assert _metric(s, "hacpo/self_ratio_mean") == pytest.approx([1.0, 1.0], abs=1e-5)  # own rows, on-policy
        assert len(_metric(s, "hacpo/exchange_time")) == 2 and all(x > 0 for x in _metric(s, "hacpo/exchange_time"))
        assert all(x > 0 for x in _metric(s, "step_time"))
    # each agent's batch reward is exchanged: both logs hold the same values for both agents
    for agent in ("llama0", "qwen1"):
        key = f"hacpo/reward/{agent}"
        assert len(_metric(llama, key)) == 2 and _metric(llama, key) == _metric(qwen, key)
        assert all(0 <= r <= 1 for r in _metric(llama, key))


def test_each_agent_saves_a_standalone_model(two_agents):
    out, runs = two_agents
    for s in runs:
        folder = out / s["agent"]
        assert (folder / "checkpoint-2" / "hacpo_state.json").is_file()
        model = AutoModelForCausalLM.from_pretrained(folder)
        tok = AutoTokenizer.from_pretrained(folder)
        ids = tok.apply_chat_template(
            [{"role": "user", "content": "1+2="}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        gen = model.generate(**ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
        assert gen.shape[1] > ids["input_ids"].shape[1]
        expected = "LlamaForCausalLM" if s["agent"].startswith("llama") else "Qwen2ForCausalLM"
        assert type(model).__name__ == expected


def test_resume_continues_with_the_same_capability_history(two_agents, tmp_path, launch):
    _, reference = two_agents
    out = tmp_path / "resumed"
    launch(2, "train_agents.py", "--out", str(out), "--steps", "2", "--save_steps", "2", "--delta", "0.99")
    first = summaries(out)
    assert all(s["global_step"] == 2 for s in first)
    launch(2, "train_agents.py", "--out", str(out), "--steps", "4", "--save_steps", "2", "--delta", "0.99", "--resume")
    resumed = summaries(out)
    for ref, res in zip(reference, resumed, strict=True):
        assert res["global_step"] == 4
        # the tracker was restored from checkpoint-2 (one generation batch) and continued with the second one:
        # without the restore it would have counted 1 update; it has the same history as the run without a stop
        assert res["capability"]["steps"] == 2
        assert res["capability"] == ref["capability"]
        assert res["param_sum"] == pytest.approx(ref["param_sum"], rel=1e-5)


def test_two_agents_with_two_processes_each(tmp_path, launch):
    # `--first_of_group`: a reward spread in every group, so both agents train whatever was sampled
    launch(4, "train_agents.py", "--agents", "llama:2,qwen:2", "--out", str(tmp_path), "--steps", "2",
           "--first_of_group")  # fmt: skip
    runs = _by_agent(summaries(tmp_path))
    assert sorted(runs) == ["llama0", "qwen1"]
    for ranks in runs.values():
        assert [s["agent_world"] for s in ranks] == [2, 2]
        assert sorted(s["agent_rank"] for s in ranks) == [0, 1]
        # data-parallel inside the agent: both ranks hold the same, changed, parameters
        assert ranks[0]["param_sum"] == ranks[1]["param_sum"]
        assert ranks[0]["trainable_changed"] == ranks[0]["trainable"]
        # each rank learns from the peer completions of its own prompts: 2 prompts x 2 completions
        assert all(n == 8 for n in _metric(ranks[0], "hacpo/peer_rows"))  # summed over the agent's 2 ranks
    assert runs["llama0"][0]["param_sum"] != runs["qwen1"][0]["param_sum"]


def test_same_architecture_agents_never_average_gradients(tmp_path, launch):
    """The trap of one accelerate world for all ranks: DDP would silently average two same-architecture agents'
    gradients and keep them identical. Same model, same initial weights, same seed, different prompts (sharing off):
    in their own worlds they must end up different."""
    launch(2, "train_agents.py", "--agents", "llama:1,llama:1", "--no_share", "--other_prompts", "1",
           "--out", str(tmp_path), "--steps", "6", "--first_of_group")  # fmt: skip
    a, b = summaries(tmp_path)
    assert a["agent_world"] == b["agent_world"] == 1
    # both learn (`--first_of_group`: a reward spread in every group, whatever was sampled); one world would move
    # both by the same averaged gradient and keep them equal
    assert a["trainable_changed"] == a["trainable"] and b["trainable_changed"] == b["trainable"]
    assert a["param_sum"] != pytest.approx(b["param_sum"], rel=1e-9, abs=0)


def test_three_agents_lora_and_full_finetuning(tmp_path, launch):
    # 4 steps = 2 generation batches: LoRA's zero-initialised B must move before A can receive a gradient; with a
    # reward spread in every group (`--first_of_group`) the own rows of both batches have one, whatever was sampled
    launch(3, "train_agents.py", "--agents", "llama:1,qwen:1:lora,llama:1", "--out", str(tmp_path), "--steps", "4",
           "--first_of_group")  # fmt: skip
    runs = {s["agent"]: s for s in summaries(tmp_path)}
    assert sorted(runs) == ["llama0", "llama2", "qwen1"]
    for s in runs.values():
        assert s["trainable_changed"] == s["trainable"], s["agent"]
        assert all(n == 16 for n in _metric(s, "hacpo/peer_rows"))  # two peers x 4 prompts x 2 completions
        assert {k for e in s["log_history"] for k in e if k.startswith("hacpo/omega/")} == {
            f"hacpo/omega/{a}" for a in runs if a != s["agent"]
        }
    lora = runs["qwen1"]
    assert all("lora_" in n for n in lora["trainable"]) and lora["frozen_changed"] == []
    assert not any("lora_" in n for n in runs["llama0"]["trainable"])
    # the LoRA agent saved an adapter that loads on its base and merges into a standalone model
    from peft import AutoPeftModelForCausalLM

    merged = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "qwen1").merge_and_unload()
    assert type(merged).__name__ == "Qwen2ForCausalLM"
    assert torch.isfinite(next(merged.parameters())).all()


def test_different_sampling_settings_fail_at_start_up(tmp_path, launch):
    proc = launch(2, "train_agents.py", "--out", str(tmp_path), "--override", "1:temperature=0.7", expect_ok=False)
    assert proc.returncode != 0
    assert "`temperature` must be equal for every agent" in proc.stderr
    assert not list(tmp_path.glob("summary-*.json"))


@pytest.mark.parametrize(
    "options, message",
    [
        # per-agent GA: save_steps / max_steps (optimizer steps) would fall on different generation batches
        (["--override", "1:gradient_accumulation_steps=2"], "`gradient_accumulation_steps` must be equal for every agent"),
        # S = 3, GA = 2 for both: the stepwise peer bound's update index would be wrong
        (["--steps_per_generation", "3", "--override", "0:gradient_accumulation_steps=2",
          "--override", "1:gradient_accumulation_steps=2"], "would straddle generation batches"),
    ],
)  # fmt: skip
def test_schedules_that_desynchronise_agents_fail_at_start_up(tmp_path, launch, options, message):
    proc = launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "4", "--save_steps", "2", *options,
                  timeout=180, expect_ok=False)  # fmt: skip
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not list(tmp_path.glob("summary-*.json"))
    assert not list(tmp_path.glob("*/checkpoint-*"))  # refused before training


def test_unfinished_peer_completions_are_masked_like_trl_masks_its_own(tmp_path, launch):
    """mask_truncated_completions: TRL zeroes the mask of a completion without EOS, so its record carries 0 tokens
    and old log-prob 0. Every learner masks those peer rows (kept in the baseline, no loss), as TRL masks its own;
    as valid rows they gave a bogus ratio, and in ratio_mode="sum" crashed the loss. Same tokenizer on both sides:
    of the 8 peer rows built, exactly the finished ones are trained on, but for one that the learner's view cuts (a
    digit that stopped it is part of its text, so the learner's own EOS after it can make one token more than the
    8 allowed: masked as well). How many finished, and how many of those were cut, is a draw of the sampling."""
    options = [
        o for i in (0, 1) for o in ("--override", f"{i}:mask_truncated_completions=true", "--override", f'{i}:ratio_mode="sum"')
    ]  # fmt: skip
    launch(2, "train_agents.py", "--agents", "llama:1,llama:1", "--out", str(tmp_path), "--steps", "2",
           "--stop_on_digits", "--record_peers", *options)  # fmt: skip
    runs = summaries(tmp_path)
    assert len(runs) == 2
    for s in runs:
        assert s["global_step"] == 2
        assert len(s["peer_rows_here"]) == 1  # one generation batch of 4 prompts x 2 peer completions
        assert _metric(s, "hacpo/peer_rows") == [8]  # every peer completion is a row, finished or not
        records = s["peers"]["records"]  # (peer, prompt, text, finished) of each, in the peer's characters
        assert len(records) == 8 and s["peer_rows_finished"] == [sum(done for *_, done in records)]
        tok = AutoTokenizer.from_pretrained(s["base"])
        fit = [done and len(tok(text, add_special_tokens=False)["input_ids"]) + 1 <= 8 for *_, text, done in records]
        assert s["peer_rows_here"] == [sum(fit)] == [len(s["peers"]["rows"])]  # the others are masked: no loss
        assert all(ids[-1] == tok.eos_token_id for _, ids in s["peers"]["rows"])  # each ends with the learner's EOS


def test_agents_on_different_prompts_fail_instead_of_training(tmp_path, launch):
    proc = launch(2, "train_agents.py", "--out", str(tmp_path), "--other_prompts", "1", expect_ok=False)
    assert proc.returncode != 0
    assert "received different prompts" in proc.stderr
    assert not list(tmp_path.glob("summary-*.json"))


def _wandb_records(path):
    """Records of an offline wandb run file (LevelDB-style log of protobuf records, 32 KiB blocks)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:  # full
            out.append(payload)
        elif kind in (2, 3):  # first, middle
            buf = payload if kind == 2 else buf + payload
        elif kind == 4:  # last
            out.append(buf + payload)
    return [pb.Record.FromString(p) for p in out]


def test_wandb_makes_one_grouped_run_per_agent(tmp_path, launch, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "hacpo-test")
    monkeypatch.delenv("WANDB_RUN_GROUP", raising=False)
    launch(2, "train_agents.py", "--out", str(tmp_path / "run"), "--steps", "2", "--report_to", "wandb")
    runs = {}
    for file in (tmp_path / "wandb").glob("offline-run-*/run-*.wandb"):
        records = _wandb_records(file)
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        keys = {
            i.nested_key[0] if i.nested_key else i.key
            for r in records
            if r.WhichOneof("record_type") == "history"
            for i in r.history.item
        }
        runs[run.display_name] = (run.run_group, run.project, keys)
    assert sorted(runs) == ["llama0", "qwen1"]  # one run per agent, named after it
    groups = {group for group, _, _ in runs.values()}
    assert len(groups) == 1 and groups.pop().startswith("run-")  # grouped under one run group
    for _, project, keys in runs.values():
        assert project == "hacpo-test"
        assert {"train/hacpo/capability/llama0", "train/hacpo/capability/qwen1", "train/reward"} <= keys


def test_tensorboard_and_trackio_log_every_agent(tmp_path, launch, monkeypatch):
    import json
    import sqlite3

    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    out = tmp_path / "run"
    launch(2, "train_agents.py", "--out", str(out), "--steps", "2", "--report_to", "tensorboard,trackio")
    for agent in ("llama0", "qwen1"):
        assert list((out / agent / "runs").glob("*/events.out.tfevents.*")), f"no tensorboard events for {agent}"
    (db,) = (tmp_path / "trackio").glob("*.db")
    rows = sqlite3.connect(db).execute("select run_name, metrics from metrics").fetchall()
    keys = {}
    for run_name, metrics in rows:
        keys.setdefault(run_name, set()).update(json.loads(metrics))
    assert sorted(keys) == ["llama0", "qwen1"]  # one trackio run per agent
    assert all("train/hacpo/capability/llama0" in k or "hacpo/capability/llama0" in k for k in keys.values())
