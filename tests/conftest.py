"""Fixtures and hooks of the test suite; nothing imports this file.

Where things go: a function or constant that more than one test file needs lives in tests/helpers.py (`from helpers
import ...`; a large stand-in may have a module of its own beside it, like hub_stand_in.py), fixtures and hooks
here, and a test file never imports from another test file.

When to mark a test `@pytest.mark.launch` (a whole file: `pytestmark = pytest.mark.launch`): when it, or a fixture
it uses, starts the project's code in other processes: `accelerate launch` or torchrun (`helpers.accelerate_launch`,
the `launch` and `two_agents` fixtures), `hacpo-train`, `hacpo-eval`, `hacpo-probe` or a script of benchmarks/ or
tests/scripts in a subprocess, a notebook through nbclient. A fresh `python -c` that only checks what an import
pulls in is not a launch. `make test-fast` (`-m "not launch"`) runs the other tests in minutes; a test that calls
`accelerate_launch` without the mark fails, naming the mark.
"""

import os

# Nothing in the test suite may reach the Hugging Face Hub (there is none on CI).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

import helpers  # noqa: E402
from helpers import accelerate_launch, hang_guard, summaries  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if "real_pair" not in (config.getoption("markexpr") or ""):  # minutes of two real models: asked for by name only
        kept = [item for item in items if item.get_closest_marker("real_pair") is None]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    default = float(config.getini("timeout") or 0)
    for item in items:
        mark = item.get_closest_marker("timeout")
        seconds = float(mark.args[0]) if mark is not None and mark.args else default
        if seconds > 0:
            item.add_marker(pytest.mark.timeout(hang_guard(seconds)), append=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the test's fixtures are set up (a module- or session-wide launch runs in the setup of the first test
    that asks for it): `accelerate_launch` refuses to run for a test not marked `launch`."""
    helpers.launch_allowed = item.get_closest_marker("launch") is not None


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
    the test workers of `make test` (pytest-xdist), which wait for each other's builds (`hacpo_trl.agents.cache.build_lock`).
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
