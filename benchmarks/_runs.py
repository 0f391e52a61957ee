"""The committed record of a grid's finished runs: one line per run in ``<out>/runs.jsonl.gz``, holding the run's
``hacpo_summary.json`` and, per agent, what the tables read from its training log. The full logs stay in the run
folders, which git ignores: a run makes them again (docs/benchmark.md).

Per agent: the first logged learning rate (`reproduce.check_run_schedule`), the mean over the run of each peer-ratio
metric (`reproduce.peer_stats`), and the generation batches' sharing decisions (`hacpo/learns_from/<peer>`,
`hacpo/taught_prompts/<peer>`, `hacpo/peer_rows`, one column per key over the log entries that hold a decision), and
the learner's solved, unsure and failed prompts with what its peers wrote there (`hacpo/prompts/...`).
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

RECORDS = "runs.jsonl.gz"
SUMMARY = "hacpo_summary.json"
LOG = "log_history.json"
# the peer-ratio metrics reproduce.py's tables show, by column
PEER_KEYS = {
    "median": "hacpo/peer_ratio_median",
    "geomean": "hacpo/peer_ratio_geomean",
    "in_band": "hacpo/peer_ratio_in_band",
    "lower_bound": "hacpo/peer_ratio_lower_bound",
    "mean": "hacpo/peer_ratio_mean",
    "low": "hacpo/peer_clipped_low",
    "high": "hacpo/peer_clipped_high",
}
# logged once per generation batch: the sharing decisions, and where the learner's own groups carry a signal
DECISIONS = ("hacpo/learns_from/", "hacpo/taught_prompts/", "hacpo/negative_prompts/", "hacpo/prompts/")
_loaded: dict[Path, dict[str, dict]] = {}


def digest(history: list[dict]) -> dict:
    """What the tables read from one agent's `log_history.json`."""
    rows = [e for e in history if any(k.startswith(DECISIONS) for k in e)]
    keys = sorted({k for e in rows for k in e if k.startswith(DECISIONS) or k == "hacpo/peer_rows"})
    means = {}
    for metric in PEER_KEYS.values():
        values = [e[metric] for e in history if metric in e]
        if values:
            means[metric] = statistics.mean(values)
    return {
        "first_learning_rate": history[0].get("learning_rate") if history else None,
        "peer_means": means,
        "batches": {k: [e.get(k) for e in rows] for k in keys},
    }


def batches(agent_record: dict) -> list[dict]:
    """The log entries holding a sharing decision, with only the keys `digest` keeps."""
    columns = agent_record["batches"]
    count = len(next(iter(columns.values()), []))
    return [{k: v[i] for k, v in columns.items() if v[i] is not None} for i in range(count)]


def from_folder(folder: Path) -> dict:
    """A finished run's record, from its summary and its agents' logs on disk."""
    summary = json.loads((folder / SUMMARY).read_text())
    agents = [a for a, v in summary.items() if isinstance(v, dict)]
    logs = {a: digest(json.loads((folder / a / LOG).read_text())) for a in agents if (folder / a / LOG).exists()}
    return {"summary": summary, "logs": logs}


def load(out: Path) -> dict[str, dict]:
    """``<pair>/<run folder>`` -> record, of every run recorded in ``out`` (read once per process)."""
    key = Path(out).resolve()
    if key not in _loaded:
        path = key / RECORDS
        lines = gzip.decompress(path.read_bytes()).decode().splitlines() if path.exists() else []
        _loaded[key] = {r["run"]: r for r in map(json.loads, lines)}
    return _loaded[key]


def save(out: Path, records: dict[str, dict]) -> None:
    """Write ``out``'s records, sorted by run, byte-stable (no timestamp in the gzip header)."""
    lines = [json.dumps({"run": run, **records[run]}, ensure_ascii=False, sort_keys=True) for run in sorted(records)]
    data = gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=9, mtime=0)
    (Path(out) / RECORDS).write_bytes(data)
    _loaded[Path(out).resolve()] = dict(records)


def _where(folder: Path) -> tuple[Path, str]:
    """A run folder ``<out>/<pair>/<run>`` as its grid folder and its key there."""
    return folder.parent.parent, f"{folder.parent.name}/{folder.name}"


def record(folder: Path) -> dict | None:
    """The record of the run in ``folder`` (``<out>/<pair>/<run>``): committed, else made from the folder's files when
    the run finished here (and then added to ``<out>``'s records); None for a run that has not finished."""
    out, run = _where(folder)
    records = load(out)
    if run not in records and (folder / SUMMARY).exists():
        records[run] = {"run": run, **from_folder(folder)}
        save(out, records)
    return records.get(run)


def main(argv: list[str]) -> int:
    """Record every finished run under the given grid folders that is not recorded yet."""
    for out in map(Path, argv):
        records = load(out)
        for folder in sorted(summary.parent for summary in out.glob(f"*/*/{SUMMARY}")):
            run = _where(folder)[1]
            records[run] = records.get(run) or {"run": run, **from_folder(folder)}
        save(out, records)
        print(f"{out / RECORDS}: {len(records)} runs")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
