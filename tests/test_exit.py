"""The hard exit of a finished process (`exit_process`, `os._exit`) still runs the clean-up TRL leaves to `atexit`."""

import subprocess
import sys

import pytest

from helpers import hang_guard

pytestmark = pytest.mark.launch

# A single-agent HACPOTrainer in vLLM server mode whose generation backend is a stand-in holding TRL's real
# `VLLMClient`, with a weight-transfer group shaped like vLLM's (a store and a socket to the server): TRL's own
# `close_communicator` drops them, which the group reports by writing a file.
SCRIPT = """
import sys, types
import trl.trainer.grpo_trainer as grpo
from datasets import Dataset
from trl.generation.vllm_client import VLLMClient

from hacpo_trl import HACPOConfig, HACPOTrainer
from hacpo_trl.agents.tiny import char_tokenizer, tiny_llama
from hacpo_trl.run.topology import exit_process

marker = sys.argv[1]


class Group:
    store = "store"
    _socket = "socket"

    @property
    def socket(self):
        return self._socket

    @socket.setter
    def socket(self, value):
        self._socket = value
        if value is None:
            open(marker, "w").write("closed")


class StandIn:
    def __init__(self, **kwargs):
        self.vllm_client = VLLMClient.__new__(VLLMClient)
        self.vllm_client.communicator = types.SimpleNamespace(group=Group())


grpo.VLLMGeneration = StandIn
import hacpo_trl.generation.vllm_cpu
hacpo_trl.generation.vllm_cpu.check = lambda *args: None  # the stand-in plays a GPU machine's server (refused on the CPU)
tok = char_tokenizer()
args = HACPOConfig(output_dir=sys.argv[2], use_cpu=True, bf16=False, report_to="none", use_vllm=True,
                   vllm_mode="server", vllm_importance_sampling_correction=False, per_device_train_batch_size=2,
                   num_generations=2, max_steps=1)
HACPOTrainer(model=tiny_llama(tok), reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
             train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 4}), processing_class=tok)
exit_process(0)
"""


def test_hard_exit_closes_the_vllm_communicator(tmp_path):
    marker = tmp_path / "closed"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(marker), str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=hang_guard(180))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.read_text() == "closed"
