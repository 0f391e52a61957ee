"""Smoke runs of the benchmark scripts (a few steps) so they cannot rot; the full runs are not tests."""

import json
import math
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
        [sys.executable, str(ROOT / "benchmarks" / "reproduce.py"), "--pairs", "state", "--seeds", "0", "1",
         "--steps", "2", "--eval_every", "1", "--methods", "GSPO", "HACPO", "HACPO interleaved", "--ablation_pair", "",
         "--out", str(tmp_path / "runs"), "--results", str(results)],
        capture_output=True, text=True, timeout=800,
    )  # fmt: skip
    assert reproduce.returncode == 0, reproduce.stderr[-3000:] + reproduce.stdout[-3000:]
    overhead = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--quick", "--steps", "4", "--results", str(results)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert overhead.returncode == 0, overhead.stderr[-3000:]
    text = results.read_text()
    # both sections, each once, with measured rows
    assert text.count("<!-- reproduce -->") == 2 and text.count("<!-- overhead -->") == 2
    assert "### state (trace-instruct + trace-base)" in text
    assert re.search(r"\| GSPO \| 64 \| 2 \| 0\.\d+ ± 0\.\d+ \| – \|", text)
    assert re.search(
        r"\| HACPO \| 64 \| 4 \| 0\.\d+ ± 0\.\d+ \| [+-]0\.\d+ \[[+-]\d+\.\d+, [+-]\d+\.\d+\] \| 0\.\d+ / ", text
    )
    # the schema other tools read: per-seed accuracies per pair, agent and method; a peer-ratio median per agent
    report = json.loads((tmp_path / "results.json").read_text())
    state = report["settings"]["state"]
    for agent in ("trace-instruct", "trace-base"):
        for method in ("GSPO", "HACPO"):
            accuracies = state["accuracy"][agent][method]
            assert len(accuracies) == 2 and all(0 <= a <= 1 for a in accuracies)
        assert 0 < state["peer_ratio_median"][agent] < math.inf
        paired = state["paired_vs_GSPO"][agent]["HACPO"]
        diffs = [
            h - g for h, g in zip(state["accuracy"][agent]["HACPO"], state["accuracy"][agent]["GSPO"], strict=True)
        ]
        assert paired["mean"] == pytest.approx(sum(diffs) / 2) and paired["ci95"][0] <= paired["mean"]
        # 64 self rows then 64 peer rows in 4 updates of 32: self-first peers see lb 0.85 and 0.875 only,
        # interleaved peers all four bounds 0.8 ... 0.875
        assert state["peer"][agent]["HACPO"]["lower_bound"] == pytest.approx(0.8625)
        assert state["peer"][agent]["HACPO interleaved"]["lower_bound"] == pytest.approx(0.8375)
    assert state["rollouts_per_step"] == {"GSPO": 64, "HACPO": 64, "HACPO interleaved": 64}
    assert (tmp_path / "learning_curves.png").stat().st_size > 10_000
    # where the time goes: generation, scoring, old log-probs, re-tokenize, exchange, wait, backward, optimizer, other
    assert re.search(r"\| 2 \| 4 \| \d+\.\d+ \| \d+\.\d+ \| \d+\.\d+ \| \d+\.\d+% \|", text)
    assert re.search(r"\| 2 \| 4 \| (-?\d+\.\d%) \|( -?\d+\.\d% \|){8}\n", text)
