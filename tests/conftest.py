import os

# Nothing in the test suite may reach the Hugging Face Hub (there is none on CI).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from hacpo_trl.placement import free_port  # noqa: E402

SCRIPTS = Path(__file__).parent / "scripts"


# Every time bound in the suite is a guard against hangs, never a measure of speed: on a machine whose cores are busy
# with other work a launch takes several times longer, so each bound is multiplied by this (the pytest-timeout of
# every test, and the launches' subprocess bounds).
HANG_GUARD_SCALE = float(os.environ.get("HACPO_TEST_HANG_GUARD_SCALE", "3"))


def hang_guard(seconds: float) -> float:
    return seconds * HANG_GUARD_SCALE


def pytest_collection_modifyitems(config, items):
    default = float(config.getini("timeout") or 0)
    for item in items:
        mark = item.get_closest_marker("timeout")
        seconds = float(mark.args[0]) if mark is not None and mark.args else default
        if seconds > 0:
            item.add_marker(pytest.mark.timeout(hang_guard(seconds)), append=False)


def accelerate_launch(num_processes: int, script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`accelerate launch --multi_gpu` on CPU (a gloo world), bounded in time so a hang fails the test.

    ``script`` is a file in tests/scripts, or ``"-m"`` followed by a module name in ``args``.
    """
    for _ in range(3):
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--multi_gpu", "--num_processes", str(num_processes), "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
            *([str(SCRIPTS / script)] if script.endswith(".py") else [script]), *args,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=hang_guard(timeout))
        # the free port was taken between our check and the launch's bind (another test worker's launch): again
        if proc.returncode == 0 or "address already in use" not in proc.stderr.lower():
            return proc
    return proc


def summaries(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("summary-*.json"), key=lambda p: int(p.stem[8:]))]


@pytest.fixture
def launch():
    def run(num_processes: int, script: str, *args: str, timeout: float = 300, expect_ok: bool = True):
        proc = accelerate_launch(num_processes, script, *args, timeout=timeout)
        if expect_ok and proc.returncode != 0:
            pytest.fail(f"launch failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
        return proc

    return run


@pytest.fixture(scope="session", autouse=True)
def builtin_cache(tmp_path_factory):
    """One cache of the built-in agents for the whole session, built on first use, never the user's own: shared by
    the test workers of `make test` (pytest-xdist), which wait for each other's builds (`hacpo_trl.cache.build_lock`).
    Every test and every process it starts sees it through ``HACPO_CACHE``."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker has its own base below the session's
        root = root.parent
    path = root / "hacpo_cache"
    path.mkdir(exist_ok=True)
    os.environ["HACPO_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def two_agents(tmp_path_factory):
    """A reference run: llama (char tokenizer) + qwen (byte BPE), one process each, 4 steps, checkpoints every 2.

    Shared by the tests that need an uninterrupted run to compare with (resume, faults)."""
    out = tmp_path_factory.mktemp("two_agents")
    proc = accelerate_launch(
        2, "train_agents.py", "--out", str(out), "--steps", "4", "--save_steps", "2", "--delta", "0.99"
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out, summaries(out)
