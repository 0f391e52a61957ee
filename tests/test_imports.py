"""The dependency between `exchange` and `topology` goes one way: topology uses the exchange, never the reverse."""

import ast
import subprocess
import sys
from pathlib import Path

import hacpo_trl

PACKAGE = Path(hacpo_trl.__file__).parent


def _runtime_imports(module: str) -> set[str]:
    """The package modules ``module`` imports at run time (anywhere, lazily too; ``if TYPE_CHECKING:`` excluded)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for n in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found |= {n.split(".")[1] for n in names if n and n.startswith("hacpo_trl.")}
    return found


def test_exchange_never_imports_topology():
    assert "topology" not in _runtime_imports("exchange")
    assert "exchange" in _runtime_imports("topology")  # the one direction (the check above is not vacuous)


def test_exchange_alone_in_a_fresh_interpreter():
    code = "import sys, hacpo_trl.exchange; print('hacpo_trl.topology' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
