"""Import structure: no import cycle anywhere in the package; `exchange` never imports `topology`."""

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


def _import_graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return {m: (_runtime_imports(m) & modules) - {m} for m in modules}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), i.e. every import cycle."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    """Static check over every module's imports, module-level and function-level (lazy) alike, ``TYPE_CHECKING``
    blocks excluded: no module may reach itself. Recipe reading lives in `recipe` (not train <-> plan_cli) and the
    cache-folder naming in `cache` (not demo <-> pretrained)."""
    graph = _import_graph()
    assert "recipe" in graph["train"] and "recipe" in graph["plan_cli"]  # the graph is real (not vacuous)
    assert _cycles(graph) == []
