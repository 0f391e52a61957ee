"""Smoke runs of the benchmark scripts (one seed, a few steps) so they cannot rot; the full runs are not tests."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(900)


def test_reproduce_and_overhead_write_their_sections(tmp_path, builtin_cache):
    results = tmp_path / "RESULTS.md"
    reproduce = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "reproduce.py"), "--seeds", "0", "--steps", "4", "--eval_every",
         "2", "--methods", "GSPO", "HACPO", "--out", str(tmp_path / "runs"), "--results", str(results)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert reproduce.returncode == 0, reproduce.stderr[-3000:]
    overhead = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--quick", "--steps", "4", "--results", str(results)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert overhead.returncode == 0, overhead.stderr[-3000:]
    text = results.read_text()
    # both sections, each once, with measured rows
    assert text.count("<!-- reproduce -->") == 2 and text.count("<!-- overhead -->") == 2
    for agent in ("tiny-llama", "tiny-qwen2"):
        assert re.search(rf"### {agent}\n\n\| method .*\n\|---.*\n\| GSPO \| 0\.\d+ \| 64 \| 1 \|", text)
        assert re.search(r"\| HACPO \| 0\.\d+ \| 64 \| 2 \|", text)
    assert re.search(r"\| 2 \| 4 \| \d+\.\d+ \| \d+\.\d+ \| \d+\.\d+ \| \d+\.\d+% \|", text)
    # where the time goes: generation, scoring, old log-probs, re-tokenize, exchange, wait, backward, optimizer, other
    assert re.search(r"\| 2 \| 4 \| (-?\d+\.\d%) \|( -?\d+\.\d% \|){8}\n", text)
    assert (tmp_path / "learning_curves.png").stat().st_size > 10_000
