"""Faults provoked for real in multi-process runs: a raising agent, a stuck agent, a killed process, a checkpoint
truncated while saving. Every launch is bounded by a subprocess timeout, so a hang fails the test."""

import shutil

import pytest

from conftest import summaries

pytestmark = pytest.mark.timeout(900)

LLAMA = "agent 'llama0' (its rank 0, global rank 0)"
QWEN = "agent 'qwen1' (its rank 0, global rank 1)"


def test_an_agent_that_raises_stops_every_process_with_its_name(tmp_path, launch):
    proc = launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "4", "--fail_reward", "1",
                  timeout=180, expect_ok=False)  # fmt: skip
    assert proc.returncode != 0
    assert f"hacpo: {QWEN} failed: RuntimeError: reward exploded" in proc.stderr
    # the other agent names the failing one (through its error, or when the launcher stops it)
    assert f"hacpo: {LLAMA}" in proc.stderr and f"Cause: {QWEN} failed: RuntimeError: reward exploded" in proc.stderr
    assert not list(tmp_path.glob("summary-*.json"))


def test_a_stuck_agent_makes_the_others_fail_after_the_exchange_timeout(tmp_path, launch):
    proc = launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "4", "--hang_reward", "1",
                  "--exchange_timeout", "8", timeout=180, expect_ok=False)  # fmt: skip
    assert proc.returncode != 0
    assert f"hacpo: {LLAMA} failed: ExchangeError" in proc.stderr
    assert f"{QWEN} never reached this exchange" in proc.stderr and "exchange_timeout=8s" in proc.stderr


def test_killed_run_and_truncated_checkpoint_resume_to_the_same_result(two_agents, tmp_path, launch):
    _, reference = two_agents
    out = tmp_path / "run"
    common = ("train_agents.py", "--out", str(out), "--save_steps", "2", "--delta", "0.99")
    # qwen1's process is SIGKILLed after step 3: the launch fails. llama0 needs no exchange for step 4 and may
    # still save checkpoint-4; qwen1 never does. Both have a complete checkpoint-2.
    proc = launch(2, *common, "--steps", "4", "--die_at_step", "1:3", timeout=180, expect_ok=False)
    assert proc.returncode != 0
    for agent in ("llama0", "qwen1"):
        assert (out / agent / "checkpoint-2" / "hacpo_state.json").is_file()
    assert not (out / "qwen1" / "checkpoint-4").exists()
    # and a crash while llama0 saved a later checkpoint: files truncated, no hacpo_state.json
    broken = out / "llama0" / "checkpoint-6"
    shutil.copytree(out / "llama0" / "checkpoint-2", broken)
    (broken / "hacpo_state.json").unlink()
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    # resume: both agents continue from step 2 (the newest step every agent saved completely) to step 4
    launch(2, *common, "--steps", "4", "--resume", timeout=300)
    resumed = summaries(out)
    for ref, res in zip(reference, resumed, strict=True):
        assert res["global_step"] == 4
        assert res["capability"] == ref["capability"]
        assert res["param_sum"] == pytest.approx(ref["param_sum"], rel=1e-5)
        # the same metrics at step k+1 = 3 as the run that was never interrupted
        at3 = [e for e in res["log_history"] if e.get("step") == 3 and "loss" in e]
        ref3 = [e for e in ref["log_history"] if e.get("step") == 3 and "loss" in e]
        assert at3 and at3[0]["loss"] == pytest.approx(ref3[0]["loss"], rel=1e-5, abs=1e-7)
