"""GPU isolation between agents and the agent world's backend and timeout, on a CPU machine.

Real `accelerate launch` runs of `scripts/devices_probe.py` (real ranks, environment, stores and gloo groups); only
`torch.cuda` is simulated (`scripts/fake_cuda.py`: GPUs fixed from CUDA_VISIBLE_DEVICES at the first CUDA call,
like the driver) and NCCL is recorded instead of created. accelerate's own device choice runs unchanged.
"""

import json
import os
import subprocess
import sys

import pytest

from hacpo_trl.run.placement import compute_placement
from helpers import accelerate_launch

pytestmark = [pytest.mark.devices, pytest.mark.timeout(300)]


def probe(tmp_path, num_processes, *args):
    out = tmp_path / "probe"
    out.mkdir()
    proc = accelerate_launch(num_processes, "devices_probe.py", "--out", str(out), *args, timeout=240)
    places = [json.loads(p.read_text()) for p in sorted(out.glob("place-*.json"))]
    return proc, sorted(places, key=lambda p: p["global_rank"])


@pytest.mark.launch
def test_each_agent_gets_its_own_gpus_and_accelerates_world_settings(tmp_path):
    proc, places = probe(tmp_path, 4, "--counts", "2,2", "--gpus", "4", "--config",
                         json.dumps({"ddp_timeout": 77, "exchange_timeout": 33}))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = [(p["agent"], p["agent_rank"], p["LOCAL_RANK"], p["LOCAL_WORLD_SIZE"], p["CUDA_VISIBLE_DEVICES"],
            p["accelerate_device"], p["physical_gpu"]) for p in places]  # fmt: skip
    assert got == [
        ("agent0", 0, "0", "2", "0,1", "cuda:0", 0),
        ("agent0", 1, "1", "2", "0,1", "cuda:1", 1),
        ("agent1", 0, "0", "2", "2,3", "cuda:0", 2),
        ("agent1", 1, "1", "2", "2,3", "cuda:1", 3),
    ]
    for p in places:
        # the agent world as accelerate would make it on GPUs, with ddp_timeout, not the exchange's bound
        assert p["agent_world"] == {"backend": "cuda:nccl,cpu:gloo", "timeout": 77.0}
        assert p["exchange_timeouts"] == [33.0, 3600.0]
        assert p["device"].endswith(f"GPU-node0-{p['physical_gpu']}")


@pytest.mark.launch
def test_cuda_initialised_by_an_import_before_the_setup_fails_loudly(tmp_path):
    """bitsandbytes (imported by trl -> transformers -> peft) initialises CUDA: the later device restriction would
    be ignored and agent1 would train on agent0's GPUs. Before the fix this launch succeeded that way."""
    proc, places = probe(tmp_path, 2, "--counts", "1,1", "--gpus", "2", "--cuda_before")
    assert proc.returncode != 0, f"ran with GPUs {[p['physical_gpu'] for p in places]}"
    assert "CUDA was initialised before HACPO restricted CUDA_VISIBLE_DEVICES" in proc.stderr
    assert "hacpo_trl.run.placement.place_process" in proc.stderr


@pytest.mark.launch
def test_placing_the_process_first_survives_an_early_cuda_import(tmp_path):
    """What hacpo-train does: devices are restricted before the import that initialises CUDA; `ddp_backend` is
    honoured for the agent world."""
    proc, places = probe(tmp_path, 2, "--counts", "1,1", "--gpus", "2", "--cuda_before", "--place_first",
                         "--config", json.dumps({"ddp_backend": "nccl"}))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [(p["CUDA_VISIBLE_DEVICES"], p["physical_gpu"]) for p in places] == [("0", 0), ("1", 1)]
    assert [p["agent_world"]["backend"] for p in places] == ["nccl", "nccl"]


@pytest.mark.launch
def test_two_processes_on_one_physical_gpu_are_refused(tmp_path):
    proc, _ = probe(tmp_path, 2, "--counts", "1,1", "--gpus", "2", "--same_uuid")
    assert proc.returncode != 0
    assert (
        "agent 'agent0' (its rank 0, global rank 0) (vm cuda:0 GPU-0000) and agent 'agent1' (its rank 0, global "
        "rank 1) (vm cuda:0 GPU-0000) use the same GPU"
    ).replace("vm", os.uname().nodename) in proc.stderr


@pytest.mark.launch
def test_fewer_visible_gpus_than_processes_is_an_error(tmp_path, monkeypatch):
    """Before the fix the restriction was skipped and agent1 silently shared agent0's GPU (cuda:0 % 1)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    proc, places = probe(tmp_path, 2, "--counts", "1,1", "--gpus", "2")
    assert proc.returncode != 0, f"ran with GPUs {[p['physical_gpu'] for p in places]}"
    assert "agent 'agent1' (its rank 0, global rank 1): this agent has 1 process(es) on this node but not enough " \
           "GPU(s) are visible to it (CUDA_VISIBLE_DEVICES 0)" in proc.stderr  # fmt: skip


@pytest.mark.launch
def test_an_agent_left_without_a_gpu_is_an_error(tmp_path):
    """One GPU on the node, two agents: agent1's device list names a GPU the node does not have, so CUDA shows it
    none and it would train on CPU while agent0 uses the GPU."""
    proc, _ = probe(tmp_path, 2, "--counts", "1,1", "--gpus", "1")
    assert proc.returncode != 0
    assert "agent 'agent1' (its rank 0, global rank 1) see no GPU while other processes train on GPUs" in proc.stderr


FAKE_BITSANDBYTES = """
import json, os, sys
# what `import bitsandbytes` does on a GPU machine: initialise CUDA (which fixes the visible devices)
json.dump({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "importing": [m for m in ("trl", "transformers", "peft") if m in sys.modules]},
          open(os.environ["FAKE_BNB_OUT"], "w"))
os._exit(0)
"""


@pytest.mark.launch
def test_hacpo_train_restricts_devices_before_importing_trl(tmp_path):
    """The real import chain of `hacpo-train`: a bitsandbytes stand-in records CUDA_VISIBLE_DEVICES at the moment
    peft imports it (where the real one initialises CUDA). Rank 2 of agents 2 + 2 must already see only GPUs 2,3."""
    (tmp_path / "bitsandbytes").mkdir()
    (tmp_path / "bitsandbytes" / "__init__.py").write_text(FAKE_BITSANDBYTES)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("agents:\n  - {name: a, model_name_or_path: x, num_processes: 2}\n"
                      "  - {name: b, model_name_or_path: y, num_processes: 2}\n")  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "FAKE_BNB_OUT": str(tmp_path / "seen.json"),
        "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
    }  # fmt: skip
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, "-m", "hacpo_trl.train", "--config", str(recipe)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and (tmp_path / "seen.json").exists(), proc.stderr[-3000:]
    seen = json.loads((tmp_path / "seen.json").read_text())
    # reached through trl's own imports (trl -> transformers -> peft -> bitsandbytes), after the restriction
    assert seen == {"CUDA_VISIBLE_DEVICES": "2,3", "importing": ["trl", "transformers", "peft"]}


def _placed(counts, rank, local_rank, local_world, visible=None):
    env = {"WORLD_SIZE": str(sum(counts)), "RANK": str(rank), "LOCAL_RANK": str(local_rank),
           "LOCAL_WORLD_SIZE": str(local_world)}  # fmt: skip
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    p = compute_placement(counts, env)
    return p.agent_index, p.agent_rank, p.local_rank, p.local_world_size, p.devices


def test_placement_of_agents_spanning_nodes():
    """The review's example: agents of 12 + 4 processes on 2 nodes x 8 GPUs (ranks numbered per node)."""
    node0 = [_placed([12, 4], r, r, 8) for r in range(8)]
    node1 = [_placed([12, 4], 8 + r, r, 8) for r in range(8)]
    all_eight = tuple(str(i) for i in range(8))
    assert node0 == [(0, r, r, 8, all_eight) for r in range(8)]
    assert node1[:4] == [(0, 8 + r, r, 4, ("0", "1", "2", "3")) for r in range(4)]
    assert node1[4:] == [(1, r, r, 4, ("4", "5", "6", "7")) for r in range(4)]
    # a scheduler that shows each node only some GPUs: the agent gets its slice of that list, in order
    assert _placed([2, 2], 3, 3, 4, visible="4,5,6,7") == (1, 1, 1, 2, ("6", "7"))
    assert _placed([2, 2], 3, 3, 4, visible="4,5") == (1, 1, 1, 2, None)  # too few listed: refused on GPUs
    assert _placed([1, 1], 1, 1, 2, visible="") == (1, 0, 0, 1, None)  # all hidden (CPU): never unhidden


def test_placement_needs_the_node_layout():
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE is not set: launch with `accelerate launch` or `torchrun`"):
        compute_placement([1, 1], {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    with pytest.raises(ValueError, match=r"add up to 3, the launch has 2"):
        compute_placement([2, 1], {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})


@pytest.mark.launch
def test_two_agents_share_one_gpu_on_purpose(tmp_path, monkeypatch):
    """`share_gpus`: a one-GPU machine runs two agents, both on its GPU (time-shared); every other check stays."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    proc, places = probe(tmp_path, 2, "--counts", "1,1", "--gpus", "1", "--config", json.dumps({"share_gpus": True}))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [(p["agent"], p["CUDA_VISIBLE_DEVICES"], p["accelerate_device"], p["physical_gpu"]) for p in places] == [
        ("agent0", "0", "cuda:0", 0),
        ("agent1", "0", "cuda:0", 0),
    ]
    assert places[0]["device"] == places[1]["device"]  # the same GPU, by UUID


@pytest.mark.launch
def test_one_gpu_without_share_gpus_is_still_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    proc, _ = probe(tmp_path, 2, "--counts", "1,1", "--gpus", "1")
    assert proc.returncode != 0
    assert "agent 'agent1' (its rank 0, global rank 1): this agent has 1 process(es) on this node but not enough " \
           "GPU(s) are visible to it (CUDA_VISIBLE_DEVICES 0)" in proc.stderr  # fmt: skip
    assert "set `share_gpus: true` in the recipe" in proc.stderr


@pytest.mark.launch
def test_share_gpus_keeps_an_agents_own_ranks_apart(tmp_path, monkeypatch):
    """Two ranks of one agent on one GPU would break its NCCL group: refused with share_gpus too."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    proc, _ = probe(tmp_path, 3, "--counts", "2,1", "--gpus", "1", "--config", json.dumps({"share_gpus": True}))
    assert proc.returncode != 0
    assert "agent 'agent0' (its rank 0, global rank 0): this agent has 2 process(es) on this node" in proc.stderr
    assert "an agent's own processes each need their own" in proc.stderr


@pytest.mark.launch
def test_share_gpus_by_uuid_refuses_one_agents_ranks_on_one_gpu(tmp_path):
    """The UUID check behind the device lists: with share_gpus, two agents on one GPU pass, one agent's two ranks
    on one GPU (a scheduler that maps two listed ordinals to one device) do not."""
    ok, _ = probe(tmp_path, 2, "--counts", "1,1", "--gpus", "2", "--same_uuid", "--config", '{"share_gpus": true}')
    assert ok.returncode == 0, ok.stderr[-4000:]
    (tmp_path / "probe").rename(tmp_path / "first")
    bad, _ = probe(tmp_path, 2, "--counts", "2", "--gpus", "2", "--same_uuid", "--config", '{"share_gpus": true}')
    assert bad.returncode != 0
    assert "use the same GPU. An agent's own processes each need their own GPU, also with share_gpus" in bad.stderr


def test_placement_with_shared_gpus():
    def devices(counts, rank, local_world, visible=None, node_gpus=None):
        env = {"WORLD_SIZE": str(sum(counts)), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(local_world)}  # fmt: skip
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        return compute_placement(counts, env, share_gpus=True, node_gpus=node_gpus).devices

    assert [devices([1, 1], r, 2, "0") for r in range(2)] == [("0",), ("0",)]
    assert [devices([1, 1, 1], r, 3, "4,5") for r in range(3)] == [("4",), ("5",), ("4",)]  # round robin
    assert [devices([2, 2], r, 4, "0,1") for r in range(4)] == [("0", "1")] * 4
    assert [devices([2, 1], r, 3, "0") for r in range(3)] == [None, None, ("0",)]  # agent0's two ranks: refused
    # unset CUDA_VISIBLE_DEVICES: the node's GPUs as the driver counts them (one here), else one per process
    assert [devices([1, 1], r, 2, node_gpus=1) for r in range(2)] == [("0",), ("0",)]
    assert [devices([1, 1], r, 2) for r in range(2)] == [("0",), ("1",)]


def test_node_gpu_count_reads_the_driver_folder(tmp_path):
    from hacpo_trl.run.placement import node_gpu_count

    assert node_gpu_count(str(tmp_path / "absent"), str(tmp_path / "no-nvidia-smi")) is None
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-1)'\n")
    smi.chmod(0o755)
    assert node_gpu_count(str(tmp_path / "absent"), str(smi)) == 1
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        (tmp_path / "gpus" / bus).mkdir(parents=True)
    assert node_gpu_count(str(tmp_path / "gpus"), str(smi)) == 2


def test_share_gpus_is_one_setting_of_the_launch():
    """The value is checked by `placement.share_gpus`; an agent setting it for itself (as a field or an override)
    where agents are read (`hacpo_trl.run.resolve`), so the checks before any ML library loads refuse it."""
    from hacpo_trl.launch.recipe import RecipeError, preflight
    from hacpo_trl.run.placement import share_gpus
    from hacpo_trl.run.resolve import resolve

    assert share_gpus({}) is False and share_gpus({"share_gpus": True}) is True
    with pytest.raises(ValueError, match="recipe key 'share_gpus' must be true or false, got 'yes'"):
        share_gpus({"share_gpus": "yes"})
    for agent in ({"name": "a", "overrides": {"share_gpus": True}}, {"name": "a", "share_gpus": True}):
        with pytest.raises(ValueError, match=r"`share_gpus` is a setting of the whole launch .* \(agent 'a'\)"):
            resolve({"agents": [agent]})
        with pytest.raises(RecipeError, match=r"recipe key 'agents': `share_gpus` is a setting of the whole launch"):
            preflight({"agents": [{**agent, "model_name_or_path": "x"}]})


@pytest.mark.launch
def test_hacpo_train_places_a_shared_gpu_before_importing_trl(tmp_path):
    """`hacpo-train` with `share_gpus: true` on a one-GPU machine (CUDA_VISIBLE_DEVICES=0 for the launch): the second
    agent's process sees GPU 0 when bitsandbytes would initialise CUDA, not an ordinal the node does not have, and
    the allocator already has expandable segments."""
    (tmp_path / "bitsandbytes").mkdir()
    (tmp_path / "bitsandbytes" / "__init__.py").write_text(
        FAKE_BITSANDBYTES.replace('os.environ.get("CUDA_VISIBLE_DEVICES"),', 'os.environ.get("CUDA_VISIBLE_DEVICES"), '
                                  '"alloc": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),')
    )  # fmt: skip
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("share_gpus: true\nagents:\n  - {name: a, model_name_or_path: x}\n"
                      "  - {name: b, model_name_or_path: y}\n")  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "FAKE_BNB_OUT": str(tmp_path / "seen.json"), "CUDA_VISIBLE_DEVICES": "0",
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
    }  # fmt: skip
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    proc = subprocess.run([sys.executable, "-m", "hacpo_trl.train", "--config", str(recipe)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and (tmp_path / "seen.json").exists(), proc.stderr[-3000:]
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["CUDA_VISIBLE_DEVICES"] == "0" and seen["alloc"] == "expandable_segments:True"


def test_the_allocator_gets_expandable_segments_unless_the_user_chose():
    from hacpo_trl.run.placement import set_cuda_allocator

    env = {}
    said = set_cuda_allocator({}, env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} and "fragment" in said
    for chosen in ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}, {"PYTORCH_ALLOC_CONF": "backend:native"}):
        env = dict(chosen)
        assert set_cuda_allocator({}, env) is None and env == chosen
    for recipe in ({"use_cpu": True}, {"use_vllm": True, "vllm_enable_sleep_mode": True}):  # sleep mode: its pool
        env = {}
        assert set_cuda_allocator(recipe, env) is None and env == {}
    env = {}
    assert set_cuda_allocator({"use_vllm": True}, env) and env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_an_agents_own_vllm_sleep_mode_keeps_the_allocator_as_it_is():
    """`use_vllm` and `vllm_enable_sleep_mode` may be set for one agent (`overrides`): the allocator and `--plan` used
    to read the run's keys only, so such a launch got expandable segments, which vLLM's sleep mode cannot use."""
    from hacpo_trl.run.placement import allocator_expandable, set_cuda_allocator
    from hacpo_trl.run.resolve import resolve

    sleeping = {"use_vllm": True, "vllm_enable_sleep_mode": True}
    recipe = {"agents": [{"name": "a", "model_name_or_path": "x", "overrides": sleeping},
                         {"name": "b", "model_name_or_path": "y"}]}  # fmt: skip
    for resolved in (None, resolve(recipe)):  # the agents read here, or as the caller resolved them
        env = {}
        assert set_cuda_allocator(recipe, env, resolved=resolved) is None and env == {}
        assert not allocator_expandable(recipe, {}, resolved=resolved)
    awake = {"agents": [{**recipe["agents"][0], "overrides": {"use_vllm": True}}, recipe["agents"][1]]}
    assert set_cuda_allocator(awake, {}) and allocator_expandable(awake, {})
