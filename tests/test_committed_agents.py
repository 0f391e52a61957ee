"""The benchmark's agents are committed (benchmarks/agents): `builtin:<name>` loads them on every machine, they are
what their record says, and `builtin:<name>@seed` still builds from the seed."""

import hashlib
import json
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from hacpo_trl.agents import builtin, demo
from hacpo_trl.agents.cache import builtin_name

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ROOT / "benchmarks" / "agents"
RECORD = json.loads((AGENTS / "agents.json").read_text())


def test_every_benchmark_pair_and_the_demo_train_from_committed_agents():
    needed = {a for pair in demo.PAIRS.values() for a in pair} | {"tiny-llama", "tiny-qwen2"}
    assert set(RECORD) == needed
    for name in needed:
        assert builtin.resolve_model(f"builtin:{name}") == str(AGENTS / name), name
    recipes = [p for p in (ROOT / "recipes").glob("tiny_*.yaml")] + [ROOT / "recipes" / "demo_cpu.yaml"]
    named = {
        line.split("builtin:")[1].strip() for p in recipes for line in p.read_text().splitlines() if "builtin:" in line
    }
    assert named <= needed, named - needed


@pytest.mark.parametrize("name", sorted(RECORD))
def test_a_committed_agent_is_what_its_record_says(name):
    """Its weights hash as recorded, its build record and config match its spec in `BUILTIN_AGENTS`, the accuracy it
    was built to lies in its band, and its tokenizer loads."""
    folder, record, spec = AGENTS / name, RECORD[name], demo.BUILTIN_AGENTS[name]
    assert hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest() == record["sha256"]
    build = demo.build_record(str(folder))
    assert build["agent"] == name and build["band"] == list(spec.band) and build["steps"] == record["steps"]
    low, high = spec.band
    assert low <= build["validation_accuracy"] <= high and build["measure"] == spec.measure
    assert build["folder"].startswith(f"{name}-")  # the cache folder it was built as, named in runs' agents.json
    config = AutoConfig.from_pretrained(folder)
    assert (config.hidden_size, config.num_hidden_layers) == (spec.hidden_size, spec.layers)
    assert config.model_type == spec.architecture
    tok = AutoTokenizer.from_pretrained(folder)
    assert len(tok) <= config.vocab_size
    assert all(0 <= v <= 1 for v in record["accuracy_before"].values())
    assert builtin_name(str(folder)) == f"builtin:{name}"  # model cards name it as the recipe does


def test_the_readme_table_is_the_record():
    text = (AGENTS / "README.md").read_text()
    for name, record in RECORD.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        assert f"`{record['sha256'][:12]}`" in row and f"| {record['steps']} |" in row, name
        assert all(f"{value:.3f}" in row for value in record["accuracy_before"].values()), name


def test_at_seed_builds_and_a_missing_copy_builds_with_one_line(monkeypatch, tmp_path, capsys):
    built = []
    monkeypatch.setattr(demo, "build_agent", lambda name: built.append(name) or f"built/{name}")
    assert builtin.resolve_model("builtin:trace-small@seed") == "built/trace-small"
    monkeypatch.setenv("HACPO_AGENTS", str(tmp_path))  # a folder without the agents
    monkeypatch.setattr(builtin, "_said", {})
    assert builtin.resolve_model("builtin:trace-small") == "built/trace-small"
    assert builtin.resolve_model("builtin:trace-small") == "built/trace-small"
    assert built == ["trace-small"] * 3
    lines = [line for line in capsys.readouterr().err.splitlines() if "no committed copy" in line]
    assert len(lines) == 1 and "building it from its seed" in lines[0] and "HACPO_AGENTS" in lines[0]
    assert builtin.resolve_model("outputs/my-model") == "outputs/my-model"
