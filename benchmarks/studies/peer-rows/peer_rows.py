"""Which peer rows HACPO's band keeps, split by whether the peer's answer is correct (the mechanism behind RESULTS.md).

    python benchmarks/studies/peer-rows/peer_rows.py            # every pair, both directions, at the warm-started agents

A thin wrapper over ``hacpo-probe`` (:mod:`hacpo_trl.probe`): for each pair it probes the pair's recipe
(``recipes/tiny_<pair>.yaml``: G = 8 completions at T = 1, as in training) on the first 64 RL-train prompts, so each
completion is generated, rewarded, re-tokenized into the learner's view and scored by the trainer's own code. A peer
row trains only if lb <= s <= 1, and its advantage has the sign of (reward - the learner's baseline), so for a
stronger learner nearly every wrong peer row is pushed down. The table gives, for correct and wrong peer rows
separately, the share below the band, in it and above 1, with lb = 0.85 by default (the first bound self-first peers
see with 4 updates; the probe's band is [1 - peer_delta, 1], so this passes ``--peer_delta 0.15``). This is the
first step's view; training moves it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hacpo_trl.agents.demo import PAIRS

ROOT = Path(__file__).resolve().parents[3]


def probe(pair: str, prompts: int, lb: float, output: Path) -> dict:
    """The probe's report for one pair's recipe (its own launch, one process per agent)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "hacpo_trl.probe", "--config", str(ROOT / "recipes" / f"tiny_{pair}.yaml"),
           "--prompts", str(prompts), "--peer_delta", str(1 - lb), "--output", str(output)]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(output.read_text())


def _cell(split: dict) -> str:
    if not split["rows"]:
        return "–"
    return f"{split['median']:.3f}, {split['below']:.2f} / {split['in_band']:.2f} / {split['above']:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--lb", type=float, default=0.85)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results = []
    print("| pair | generator → learner | peer correct | correct rows: median s, low / in band / high | "
          "wrong rows: median s, low / in band / high | wrong share of kept rows |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for pair in args.pairs:
            report = probe(pair, args.prompts, args.lb, Path(tmp) / f"{pair}.json")
            for p in report["pairs"]:
                gen, learn = p["generator"], p["learner"]
                cells = [_cell(p[label]) for label in ("correct", "wrong")]
                wrong = p["wrong_share_of_would_train"]
                accuracy = report["agents"][gen]["accuracy"]
                print(f"| {pair} | {gen} → {learn} | {accuracy:.2f} | {cells[0]} | {cells[1]} | "
                      f"{'–' if wrong is None else f'{wrong:.2f}'} |", flush=True)  # fmt: skip
                results.append({"pair": pair, **p, "peer_accuracy": accuracy})
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
