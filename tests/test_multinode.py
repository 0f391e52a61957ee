"""A launch over two simulated machines: two `accelerate launch` invocations on this host with `num_machines: 2`,
machine ranks 0 and 1 and one master address (loopback), 2 processes each. Agents of 3 + 1 processes, so the
first agent spans both machines. Every launch is bounded by a timeout, so a hang fails the test."""

import shutil
import subprocess
import sys

import pytest

from helpers import SCRIPTS, free_port, summaries

pytestmark = [pytest.mark.launch, pytest.mark.multinode, pytest.mark.timeout(900)]

# `--first_of_group`: a reward spread in every group whatever was sampled, so every agent trains at every batch
AGENTS = ("train_agents.py", "--agents", "llama:3,qwen:1", "--generation_batch", "12", "--save_steps", "2",
          "--delta", "0.99", "--first_of_group")  # fmt: skip


def launch_two_machines(outs, *args, timeout=420):
    """Machine 0 and machine 1 of one launch (``outs``: each machine's ``--out``, the same folder or not)."""
    port = free_port()
    procs = []
    for machine, out in enumerate(outs):
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "2",
            "--machine_rank", str(machine), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
            "--num_processes", "4", "--mixed_precision", "no", "--dynamo_backend", "no",
            str(SCRIPTS / args[0]), *args[1:], "--out", str(out),
        ]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=timeout)
            results.append((proc.returncode, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


@pytest.fixture(scope="module")
def two_machines(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_machines")
    results = launch_two_machines([out, out], *AGENTS, "--steps", "2")
    for machine, (code, err) in enumerate(results):
        assert code == 0, f"machine {machine} failed ({code}):\n{err[-6000:]}"
    return out, summaries(out)


def test_an_agent_spanning_two_machines_trains_and_both_agents_save(two_machines):
    out, runs = two_machines
    placed = [
        (s["global_rank"], s["node_rank"], s["agent"], s["agent_rank"], s["agent_world"], s["local_rank"],
         s["local_world_size"], s["cuda_visible_devices"])
        for s in runs
    ]  # fmt: skip
    assert placed == [
        (0, "0", "llama0", 0, 3, "0", "2", "0,1"),
        (1, "0", "llama0", 1, 3, "1", "2", "0,1"),
        (2, "1", "llama0", 2, 3, "0", "1", "0"),  # the same agent on machine 1: its own local ranks and GPU
        (3, "1", "qwen1", 0, 1, "0", "1", "1"),
    ]
    llama = runs[:3]
    for s in runs:
        assert s["global_step"] == 2 and s["trainable_changed"] == s["trainable"], s["global_rank"]
        # the paper's rule: every completion of the other agent on the agent's 6 prompts (over its ranks), 6 x 2
        assert [e["hacpo/peer_rows"] for e in s["log_history"] if "hacpo/peer_rows" in e] == [12], s["global_rank"]
    # data-parallel across the machines: llama's three ranks hold the same parameters
    assert llama[0]["param_sum"] == llama[1]["param_sum"] == llama[2]["param_sum"]
    for agent in ("llama0", "qwen1"):
        assert (out / agent / "checkpoint-2" / "hacpo_state.json").is_file()
        assert (out / agent / "model.safetensors").is_file()


def test_resume_without_a_shared_filesystem_names_the_process_that_lacks_the_checkpoint(two_machines, tmp_path):
    """Machine 1's own disk holds qwen1's checkpoints (its only process is there) but not llama0's, whose main
    process saved on machine 0. Before the fix, llama0's rank on machine 1 died with `KeyError: 2`."""
    out, _ = two_machines
    local = tmp_path / "machine1"
    shutil.copytree(out / "bases", local / "bases")
    shutil.copytree(out / "qwen1", local / "qwen1")
    results = launch_two_machines([out, local], *AGENTS, "--steps", "4", "--resume", timeout=300)
    assert all(code != 0 for code, _ in results)
    errors = "".join(err for _, err in results)
    assert "KeyError" not in errors
    assert (
        "resuming from step 2, but agent 'llama0' (its rank 2, global rank 2) cannot see a complete checkpoint-2 "
        "in its agent's output_dir"
    ) in errors
    assert not (out / "llama0" / "checkpoint-4").exists()
