"""A stand-in for `torch.cuda` on a CPU machine, for tests of GPU placement (no GPU here).

It behaves like the CUDA driver in the one respect that matters: the devices a process sees are read from
``CUDA_VISIBLE_DEVICES`` once, at the first CUDA call, and never again; the list stops at the first ordinal the
node does not have. ``get_device_capability`` / ``get_device_properties`` initialise torch's CUDA state (as
bitsandbytes' import does through ``get_device_capability``); ``is_available`` / ``device_count`` only enumerate.
"""

import os
import types

import torch


def install(gpus_per_node: int, same_uuid: bool = False) -> dict:
    """Patch torch.cuda; returns the fake's state (``physical``: the node GPU accelerate picked)."""
    state = {"seen": None, "initialised": False, "current": 0}

    def devices() -> list[int]:
        if state["seen"] is None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            seen = []
            for item in visible.split(",") if visible is not None else map(str, range(gpus_per_node)):
                if not item.strip().isdigit() or int(item) >= gpus_per_node:
                    break
                seen.append(int(item))
            state["seen"] = seen
        return state["seen"]

    def initialise() -> list[int]:
        state["initialised"] = True
        return devices()

    def properties(index: int):
        physical = initialise()[index]
        uuid = "GPU-0000" if same_uuid else f"GPU-{os.environ.get('FAKE_NODE', 'node0')}-{physical}"
        return types.SimpleNamespace(uuid=uuid, name=f"Fake GPU {physical}")

    torch.cuda.is_available = lambda: len(devices()) > 0
    torch.cuda.device_count = lambda: len(devices())
    torch.cuda.is_initialized = lambda: state["initialised"]
    torch.cuda.get_device_capability = lambda device=None: (initialise(), (8, 0))[1]
    torch.cuda.get_device_properties = properties
    torch.cuda.is_bf16_supported = lambda *args, **kwargs: True  # asked by TrainingArguments' checks

    def set_device(device) -> None:  # accelerate's PartialState picks the process's GPU with this
        index = device.index if isinstance(device, torch.device) else int(device)
        state["current"] = index
        state["physical"] = initialise()[index]

    torch.cuda.set_device = set_device
    torch.cuda.current_device = lambda: state["current"]
    return state
