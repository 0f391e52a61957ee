"""Both notebooks run top to bottom on CPU (shortened by HACPO_NOTEBOOK_STEPS)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.launch

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.timeout(1200)  # the custom-agents notebook runs the probe, training and evaluation: slow under load
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch, builtin_cache):
    monkeypatch.setenv("HACPO_NOTEBOOK_OUT", str(tmp_path))
    # a few optimizer steps: 2 generation batches of the quickstart's tiny agents, 1 of SmolLM2's (its CPU time)
    monkeypatch.setenv("HACPO_NOTEBOOK_STEPS", "4" if path.stem == "quickstart" else "2")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    errors = [
        o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"
    ]
    assert not errors
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    printed = "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in outputs)
    # what each notebook promises its reader: both agents trained, saved as loadable models, and reported
    if path.stem == "quickstart":  # TRL's shape: data, reward, config and trainer, metrics, probe, eval, push
        run, agents = tmp_path / "quickstart" / "run", ["trace-large", "trace-small"]
        assert "'answer':" in printed and "[1.0, 0.0]" in printed  # the dataset row, the reward on two texts
        assert "trained both agents for 4 optimizer steps" in printed and "reward_std" in printed
        assert (
            "| trace-large <- trace-small" in printed
            and "| trace-small <- trace-large" in printed
            and "Red flags" in printed
        )
        for agent in agents:
            assert f"{agent:12s} held-out accuracy" in printed and f"{agent} ->" in printed
            assert (tmp_path / "quickstart" / "hub" / "you" / agent / "model.safetensors").is_file()
            assert (run / agent / "trainer_state.json").is_file()
    else:  # a real pretrained model (SmolLM2-135M-Instruct, LoRA) and a tiny model built from a config
        run, agents = tmp_path / "custom" / "run", ["smollm2", "char-llama"]
        for agent in agents:
            assert printed.count(f"{agent:10s} before ") == 1 and printed.count(f"{agent:10s} after ") == 1
        assert "stop token '<|im_end|>'" in printed and "You are a helpful AI assistant named SmolLM" in printed
        assert "| smollm2 <- char-llama |" in printed and "Red flags" in printed  # hacpo-probe ran before training
        adapter = run / "smollm2"
        assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
        assert "HuggingFaceTB/SmolLM2-135M-Instruct" in (adapter / "README.md").read_text()
        agents = ["char-llama"]
    for agent in agents:
        assert (run / agent / "config.json").is_file() and (run / agent / "model.safetensors").is_file()
