"""Functions and constants shared by the test files: `from helpers import ...` (tests/ is on the path through
pytest's `pythonpath` setting in pyproject.toml). What goes here and when a test is marked `launch`: see the top of
conftest.py."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from hacpo_trl.agents.tiny import bpe_tokenizer
from hacpo_trl.run.exchange import RolloutBatch
from hacpo_trl.run.placement import free_port

SCRIPTS = Path(__file__).parent / "scripts"

# ------------------------------------------------------------------------------------------ time bounds

# Every time bound in the suite is a guard against hangs, never a measure of speed: on a machine whose cores are busy
# with other work a launch takes several times longer, so each bound is multiplied by this (the pytest-timeout of
# every test, and the launches' subprocess bounds).
HANG_GUARD_SCALE = float(os.environ.get("HACPO_TEST_HANG_GUARD_SCALE", "3"))


def hang_guard(seconds: float) -> float:
    return seconds * HANG_GUARD_SCALE


# ------------------------------------------------------------------------------------------ seeds

# `HACPO_TEST_SEED=<n> make test`: every test that samples (a launch, an in-process training, a generation) adds n to
# its seed, so the suite can be run on other samples; 0 (unset) keeps each test's own seed. No test may depend on
# what a seed happened to sample: each asserts what the code must do with whatever was sampled.
TEST_SEED = int(os.environ.get("HACPO_TEST_SEED", "0") or 0)


def seeded(seed: int) -> int:
    """A test's own seed, moved by ``HACPO_TEST_SEED``."""
    return seed + TEST_SEED


# ------------------------------------------------------------------------------------------ launches

# Whether the running test is marked `launch`: set by conftest.py before each test's fixtures are set up; None
# outside a pytest run (nothing is checked then).
launch_allowed: bool | None = None


def accelerate_launch(num_processes: int, script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`accelerate launch --multi_gpu` on CPU (a gloo world), bounded in time so a hang fails the test.

    ``script`` is a file in tests/scripts, or ``"-m"`` followed by a module name in ``args``.
    """
    if launch_allowed is False:
        raise RuntimeError(
            "this test launches processes but is not marked `launch`, so `make test-fast` would run it: add "
            "@pytest.mark.launch to it (or `pytestmark = pytest.mark.launch` to its file)"
        )
    args = (*args, *_seed_flag(script, args))
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


def _seed_flag(script: str, args: tuple[str, ...]) -> list[str]:
    """``--seed`` for a launch of `hacpo-train` or `hacpo-probe` on a recipe: the recipe's seed moved by
    ``HACPO_TEST_SEED`` (the scripts of tests/scripts read the variable themselves). Nothing where the test gives a
    seed, or with the knob unset."""
    if not TEST_SEED or script != "-m" or "--seed" in args or "--config" not in args:
        return []
    import yaml

    recipe = yaml.safe_load(Path(args[args.index("--config") + 1]).read_text()) or {}
    return ["--seed", str(seeded(int(recipe.get("seed", 42))))]


def own_spread(summary: dict) -> bool:
    """Whether, in a tests/scripts/train_agents.py launch, some group of the agent's own completions (one prompt at
    one training generation batch, over the agent's ranks) had rewards that differ (the summary's `batch_rewards`).
    Its own rows then had advantages != 0 whatever the baseline (a joint one lies between the group's rewards), so
    the update over them had a gradient: every trainable weight of a fully fine-tuned agent must have moved. Tests
    that cannot choose such a spread by construction (`--first_of_group`) assert that much of whatever was sampled."""
    for batch in summary["batch_rewards"]:
        groups: dict[str, set[float]] = {}
        for agent, prompt, reward in batch:
            if agent == summary["agent"]:
                groups.setdefault(prompt, set()).add(reward)
        if any(len(rewards) > 1 for rewards in groups.values()):
            return True
    return False


def summaries(out: Path) -> list[dict]:
    """The per-process summaries a tests/scripts/train_agents.py launch wrote, in global-rank order."""
    return [json.loads(p.read_text()) for p in sorted(out.glob("summary-*.json"), key=lambda p: int(p.stem[8:]))]


# ------------------------------------------------------------------------------------------ hand-built peer rows

# One learner (A, the weakest) and two peers (B, C) on prompts p0 and p1, built without a trainer: the records of
# test_peer_rows.py and test_sharing_options.py.
BPE = bpe_tokenizer()
NAN, INF = float("nan"), float("inf")
LONG = "1234567890123 + 4567890123 = 1234567890123"  # over 12 tokens in either tokenizer
CAPS = {"A": 0.25, "B": 0.75, "C": 0.5}  # the learner A is the weakest
SELF_IDS = ["p0", "p0", "p1", "p1"]
SELF_REWARDS = torch.tensor([1.0, 0.0, NAN, 0.0])  # self row 2 is unscorable


def settings(**overrides):
    base = dict(
        peer_filter="all",
        taught_baseline="joint",
        taught_scale=1.0,
        taught_cap=0,
        mask_truncated_completions=True,
        max_completion_length=12,
        capability_baseline=True,
        zero_uniform_groups=True,
        max_reward=1.0,
        capability_ratio_min=0.1,
        capability_ratio_max=10.0,
    )
    return SimpleNamespace(**{**base, **overrides})


def records():
    """The learner's own record, then C's (rank order need not be agent order), then B's."""

    def batch(agent, rank, rows):
        pids, texts, rewards, logps, lengths, terminated = map(list, zip(*rows, strict=True))
        return RolloutBatch(agent, rank, 3, pids, texts, rewards, logps, lengths, terminated)

    own = batch("A", 0, [(p, "own", 1.0, -1.0, 3, True) for p in SELF_IDS])
    c = batch("C", 2, [
        ("p0", LONG, 1.0, -0.3, 20, True),  # cut to 12 learner tokens (its EOS too): truncated
        ("p1", "42", 1.0, INF, 2, True),  # broken old log-prob: rejected
        ("p1", "", 1.0, 0.0, 0, True),  # no generator tokens: the EOS action, never a loss (no ratio)
    ])  # fmt: skip
    b = batch("B", 1, [
        ("p0", "12 + 3 = 15", 1.0, -0.5, 9, True),
        ("p0", "7", 0.0, -0.4, 2, False),  # unfinished: no EOS appended
        ("p1", "x", NAN, -0.2, 1, True),  # unscorable: rejected
        ("p1", "", 0.0, -0.1, 1, False),  # empty and unfinished: in the baseline, nothing to learn from
        ("p9", "zzz", 1.0, -0.1, 3, True),  # not one of this process's prompts: ignored, not counted
    ])  # fmt: skip
    return [own, c, b]
