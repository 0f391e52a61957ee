"""Import structure: no import cycle anywhere in the package; `exchange` never imports `topology`."""

import ast
import subprocess
import sys
from pathlib import Path

import hacpo_trl

PACKAGE = Path(hacpo_trl.__file__).parent


def _module_files() -> dict[str, Path]:
    """Every module of the package by its dotted name below `hacpo_trl` (``run.exchange``; a subpackage's
    ``__init__.py`` by the subpackage's name, the package's own by "")."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _module_files()


def _imports(module: str, typing: bool = False) -> set[str]:
    """The package modules ``module`` imports, at the top or inside a function alike (lazily); ``if TYPE_CHECKING:``
    blocks only with ``typing``. A name imported from a module counts as that module."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    here = module.split(".") if module else []
    package = here if path.name == "__init__.py" else here[:-1]
    typing_only = set()
    if not typing:
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
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
            elif node.module == "hacpo_trl" or (node.module or "").startswith("hacpo_trl."):
                base = node.module.split(".")[1:]
            else:
                continue
            targets = [[*base, a.name] for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name.split(".")[1:] for a in node.names if a.name.startswith("hacpo_trl.")]
        else:
            continue
        for target in targets:
            while target and ".".join(target) not in MODULES:
                target = target[:-1]  # a name defined in the module, not a module
            if target:
                found.add(".".join(target))
    return found - {module}


def test_exchange_never_imports_topology():
    assert "run.topology" not in _imports("run.exchange", typing=True)
    assert "run.exchange" in _imports("run.topology")  # the one direction (the check above is not vacuous)


def test_exchange_alone_in_a_fresh_interpreter():
    code = "import sys, hacpo_trl.run.exchange; print('hacpo_trl.run.topology' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def _import_graph(typing: bool = False) -> dict[str, set[str]]:
    """Module -> the modules it imports; subpackages' ``__init__`` files hold docstrings only and are left out."""
    modules = {m for m, path in MODULES.items() if path.name != "__init__.py"}
    return {m: _imports(m, typing) & modules for m in modules}


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
    """Static check over every module's imports, module-level, function-level (lazy) and ``TYPE_CHECKING`` alike: no
    module may reach itself. Recipe reading lives in `launch.recipe` (not train <-> plan_cli) and the cache-folder
    naming in `agents.cache` (not demo <-> pretrained)."""
    graph = _import_graph(typing=True)
    assert "launch.recipe" in graph["launch.train"] and "launch.recipe" in graph["launch.plan_cli"]  # not vacuous
    assert _cycles(graph) == []
