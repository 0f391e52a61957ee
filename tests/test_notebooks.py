"""Both notebooks run top to bottom on CPU (shortened by HACPO_NOTEBOOK_STEPS)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch, builtin_cache):
    monkeypatch.setenv("HACPO_NOTEBOOK_OUT", str(tmp_path))
    monkeypatch.setenv("HACPO_NOTEBOOK_STEPS", "4")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    errors = [
        o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"
    ]
    assert not errors
    assert any(c.cell_type == "code" and c.get("outputs") for c in notebook.cells)
