"""FSDP2 inside each agent's world on CPU, for the tests.

`accelerate launch --use_fsdp --fsdp_version 2` sets these variables; accelerate then turns on FSDP only for GPU-like
devices (`AcceleratorState` keeps `MULTI_CPU` on CPU), although torch's FSDP2 (`fully_shard`) runs on CPU over gloo.
The one patch below lets the CPU world become an FSDP world; everything after it (wrapping, all-gathers in every
forward, reduce-scatters, optimizer, saving) is accelerate's and torch's own code.
"""

import os

FSDP_ENV = {  # what `accelerate launch --use_fsdp --fsdp_version 2 --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP` sets
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "2",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
    "FSDP_RESHARD_AFTER_FORWARD": "true",
    "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
    "FSDP_OFFLOAD_PARAMS": "false",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "false",
    "FSDP_SYNC_MODULE_STATES": "true",
    "FSDP_ACTIVATION_CHECKPOINTING": "false",
}


def enable_cpu_fsdp() -> None:
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    os.environ.update(FSDP_ENV)
    init = AcceleratorState.__init__

    def cpu_fsdp_init(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # later AcceleratorState()s copy it

    AcceleratorState.__init__ = cpu_fsdp_init
