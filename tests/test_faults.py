"""Faults provoked for real in multi-process runs: a raising agent, a stuck agent, a killed process, a checkpoint
truncated while saving. Every launch is bounded by a subprocess timeout, so a hang fails the test."""

import shutil

import pytest
import torch

from helpers import summaries

pytestmark = [pytest.mark.launch, pytest.mark.timeout(900)]

LLAMA = "agent 'llama0' (its rank 0, global rank 0)"
QWEN = "agent 'qwen1' (its rank 0, global rank 1)"


def test_an_agent_that_raises_stops_every_process_with_its_name(tmp_path, launch):
    proc = launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "4", "--fail_reward", "1",
                  timeout=180, expect_ok=False)  # fmt: skip
    assert proc.returncode != 0
    failure = "RewardError: reward function 'has_digit' raised RuntimeError: reward exploded during training"
    assert f"hacpo: {QWEN} failed: {failure}" in proc.stderr
    # the other agent names the failing one, whatever the load: the failing process leaves only once every other live
    # process has printed its failure (its exit is what makes the launcher stop them)
    assert f"hacpo: {LLAMA} is stopping. Cause: {QWEN} failed: {failure}" in proc.stderr
    # the reward's one line (naming it, the phase and its arguments) is also the console's last, once
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"hacpo-train: error: {failure.split(': ', 1)[1]}; it was called with prompts: ")
    assert proc.stderr.count("hacpo-train: error:") == 1
    assert not list(tmp_path.glob("summary-*.json"))


def test_a_stuck_agent_makes_the_others_fail_after_the_exchange_timeout(tmp_path, launch):
    proc = launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "4", "--hang_reward", "1",
                  "--exchange_timeout", "8", timeout=180, expect_ok=False)  # fmt: skip
    assert proc.returncode != 0
    assert f"hacpo: {LLAMA} failed: ExchangeError" in proc.stderr
    assert f"{QWEN} never reached this exchange" in proc.stderr and "exchange_timeout=8s" in proc.stderr


def test_until_the_first_step_is_done_the_longer_start_up_bound_applies(tmp_path, launch):
    """The first exchange of rollouts also waits for downloads and vLLM start-up: a hang there is reported after
    `exchange_startup_timeout`, not `exchange_timeout` (the test above: a hang later uses `exchange_timeout`). The
    start-up bound also covers the processes' start-up (joining the exchange group, the first exchanges), so it is
    long enough for a loaded machine."""
    proc = launch(2, "train_agents.py", "--out", str(tmp_path), "--steps", "4", "--hang_reward", "1",
                  "--hang_at_call", "1", "--exchange_timeout", "2", "--exchange_startup_timeout", "40",
                  timeout=180, expect_ok=False)  # fmt: skip
    assert proc.returncode != 0
    assert f"hacpo: {LLAMA} failed: ExchangeError" in proc.stderr and "rollouts of step 0" in proc.stderr
    assert f"{QWEN} never reached this exchange" in proc.stderr and "exchange_startup_timeout=40s" in proc.stderr


def test_killed_run_and_truncated_checkpoint_resume_to_the_same_result(two_agents, tmp_path, launch):
    _, reference = two_agents
    out = tmp_path / "run"
    common = ("train_agents.py", "--out", str(out), "--save_steps", "2", "--delta", "0.99", "--save_total_limit", "1")
    # qwen1's process is SIGKILLed halfway through saving checkpoint-4 (weights written, the rest not): the launch
    # fails. llama0 may complete its checkpoint-4, but with save_total_limit=1 it must not delete checkpoint-2
    # before every agent has completed step 4, or the agents would share no step to resume from.
    proc = launch(2, *common, "--steps", "4", "--die_while_saving", "1:4", timeout=180, expect_ok=False)
    assert proc.returncode != 0
    for agent in ("llama0", "qwen1"):
        assert (out / agent / "checkpoint-2" / "hacpo_state.json").is_file()
    assert (out / "qwen1" / "checkpoint-4" / "model.safetensors").is_file()
    assert not (out / "qwen1" / "checkpoint-4" / "hacpo_state.json").exists()
    # and a crash while llama0 saved a later checkpoint: files truncated, no hacpo_state.json
    broken = out / "llama0" / "checkpoint-6"
    shutil.copytree(out / "llama0" / "checkpoint-2", broken)
    (broken / "hacpo_state.json").unlink()
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    # resume: both agents continue from step 2 (the newest step every agent saved completely) to step 4
    launch(2, *common, "--steps", "4", "--resume", timeout=300)
    resumed = summaries(out)
    # save_total_limit counts complete checkpoints: step 4 is kept, step 2 is gone, the newer broken folder untouched
    for agent in ("llama0", "qwen1"):
        assert sorted(p.name for p in (out / agent).glob("checkpoint-*")) == (
            ["checkpoint-4", "checkpoint-6"] if agent == "llama0" else ["checkpoint-4"]
        )
        assert (out / agent / "checkpoint-4" / "hacpo_state.json").is_file()
    for ref, res in zip(reference, resumed, strict=True):
        assert res["global_step"] == 4
        assert res["capability"] == ref["capability"]
        assert res["param_sum"] == pytest.approx(ref["param_sum"], rel=1e-5)
        # the same metrics at step k+1 = 3 as the run that was never interrupted
        at3 = [e for e in res["log_history"] if e.get("step") == 3 and "loss" in e]
        ref3 = [e for e in ref["log_history"] if e.get("step") == 3 and "loss" in e]
        assert at3 and at3[0]["loss"] == pytest.approx(ref3[0]["loss"], rel=1e-5, abs=1e-7)


def test_agents_resuming_from_different_steps_are_refused(two_agents, tmp_path, launch):
    reference, _ = two_agents
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    proc = launch(2, "train_agents.py", "--out", str(out), "--steps", "6", "--resume_step", "0:2", "--resume_step",
                  "1:4", timeout=180, expect_ok=False)  # fmt: skip
    assert proc.returncode != 0
    assert "agents would resume from different steps: [('llama0', 2), ('qwen1', 4)]" in proc.stderr
    assert not list(out.glob("checkpoint-6")) and not list(out.glob("*/checkpoint-6"))


def test_a_path_to_one_agents_checkpoint_resumes_every_agent_from_its_own(tmp_path, launch):
    """Two agents of one architecture (the paper's Qwen3-4B x Qwen3-4B-Instruct), different weights: a resume path
    inside llama0's folder means that step for both, so llama1 continues from its own checkpoint and ends as its
    uninterrupted run did, not as a copy of llama0 (which it became when the path was applied to every agent)."""
    from safetensors.torch import load_file

    first, second = tmp_path / "first", tmp_path / "second"
    common = ("--agents", "llama:1,llama:1", "--base_seed", "1:11", "--steps", "4", "--save_steps", "2")
    launch(2, "train_agents.py", "--out", str(first), *common, timeout=300)
    shutil.copytree(first, second)
    launch(2, "train_agents.py", "--out", str(second), *common, "--resume_path",
           str(second / "llama0" / "checkpoint-2"), timeout=300)  # fmt: skip
    agents = ("llama0", "llama1")
    weights = {(run.name, a): load_file(run / a / "model.safetensors") for run in (first, second) for a in agents}
    for agent in ("llama0", "llama1"):
        resumed, uninterrupted = weights[("second", agent)], weights[("first", agent)]
        assert all(torch.allclose(resumed[k], uninterrupted[k], rtol=1e-4, atol=1e-6) for k in resumed), agent
    a, b = weights[("second", "llama0")], weights[("second", "llama1")]
    assert any(not torch.equal(a[k], b[k]) for k in a), "llama1 became a copy of llama0"
