"""Where each process of a launch lands: agent, agent-local ranks, GPUs, and the agent world's backend and timeout.

Launched by tests/test_devices.py; GPUs are simulated by `fake_cuda` (this machine has none). NCCL cannot run on
CPU, so the agent world's `init_process_group` is recorded and then made with gloo. Writes
`<out>/place-<global rank>.json`.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--counts", default="2,2", help="processes per agent")
parser.add_argument("--gpus", type=int, default=0, help="simulated GPUs per node (0: the real CPU machine)")
parser.add_argument("--same_uuid", action="store_true", help="every simulated GPU reports one UUID")
parser.add_argument("--cuda_before", action="store_true", help="an import initialises CUDA before the setup")
parser.add_argument("--place_first", action="store_true", help="place the process first, as hacpo-train does")
parser.add_argument("--config", default="{}", help="HACPOConfig settings (JSON)")
opts = parser.parse_args()
counts = [int(c) for c in opts.counts.split(",")]
launch_env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")}

if opts.place_first:
    from hacpo_trl.run.placement import place_process

    place_process(counts)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

gpu = {}
if opts.gpus:
    import fake_cuda

    gpu = fake_cuda.install(opts.gpus, same_uuid=opts.same_uuid)
if opts.cuda_before:
    torch.cuda.get_device_capability()  # what `import bitsandbytes` does, through trl -> transformers -> peft

made = {}
real_init = dist.init_process_group


def init_process_group(backend=None, **kwargs):
    made.update(backend=backend, timeout=kwargs["timeout"].total_seconds())
    return real_init(backend="gloo", **kwargs)


dist.init_process_group = init_process_group

from hacpo_trl import AgentSpec, HACPOConfig  # noqa: E402

args = HACPOConfig(
    output_dir=os.path.join(opts.out, "run"),
    agents=[AgentSpec(name=f"agent{i}", num_processes=n, model_name_or_path="none") for i, n in enumerate(counts)],
    report_to=[],
    **json.loads(opts.config),
)
from hacpo_trl.run.topology import current_topology  # noqa: E402

topology = current_topology()
record = {
    "launch": launch_env,
    "agent": args.agent_name,
    "agent_rank": topology.agent_rank,
    "global_rank": topology.global_rank,
    "RANK": os.environ["RANK"],
    "WORLD_SIZE": os.environ["WORLD_SIZE"],
    "LOCAL_RANK": os.environ["LOCAL_RANK"],
    "LOCAL_WORLD_SIZE": os.environ["LOCAL_WORLD_SIZE"],
    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "device": getattr(topology, "device", None),
    "accelerate_device": str(args.device),
    "physical_gpu": gpu.get("physical"),  # the node's GPU that accelerate's device is
    "agent_world": made,
    "exchange_timeouts": [topology.timeout_seconds, getattr(topology, "startup_timeout_seconds", None)],
}
with open(os.path.join(opts.out, f"place-{topology.global_rank}.json"), "w") as f:
    json.dump(record, f)
topology.shutdown()
from hacpo_trl.run.topology import exit_process  # noqa: E402

exit_process(0)
