"""Import structure: layers that import one way (each subpackage's docstring says what it may import, and the
torch-free modules it holds), no import cycle anywhere in the package, and `exchange` never imports `topology`."""

import ast
import json
import re
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


# The package's layers, lowest first: a module may import its own layer and the layers before it, never one after.
# A name is a subpackage or a module left flat beside them (docs/architecture.md).
LAYERS = (
    ("algorithm",),  # the equations: torch only
    ("run",),
    ("generation",),
    ("sharing",),
    ("tasks",),
    ("planning",),
    ("evaluation",),
    ("agents",),
    ("config",),  # HACPOConfig
    ("training",),
    ("trainer",),  # HACPOTrainer
    ("launch",),
    ("train", "probe", "evaluate"),  # `python -m hacpo_trl.<command>`: one-line shims over `launch`
)
HEAVY = ("torch", "trl", "transformers", "accelerate")  # what a torch-free module must not import at import time


def _layer(module: str) -> int:
    top = module.split(".")[0]
    return next(i for i, names in enumerate(LAYERS) if top in names)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a higher layer's module, as "importer -> imported"."""
    return sorted(f"{m} -> {t}" for m, imported in graph.items() for t in imported if _layer(t) > _layer(m))


SUBPACKAGES = sorted(m for m, path in MODULES.items() if m and path.name == "__init__.py")


def _docstring(package: str) -> str:
    return ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""


def _may_import(package: str) -> set[str]:
    """The layers a subpackage's docstring says it may import ("May import `a` and `b`.", "every layer below")."""
    said = re.search(r"May import ([^.]*)\.", _docstring(package))
    assert said, f"{package}/__init__.py does not say what it may import"
    if "every layer below" in said.group(1):
        return {n for names in LAYERS[: _layer(package)] for n in names}
    return set(re.findall(r"`(\w+)`", said.group(1)))


def _torch_free(package: str) -> list[str]:
    """The modules a subpackage's docstring calls torch-free at import ("Torch-free at import: `a`, `b` (...)")."""
    said = re.search(r"Torch-free at import: ([^.(]*)", _docstring(package))
    return [f"{package}.{name}" for name in re.findall(r"`(\w+)`", said.group(1))] if said else []


def test_every_module_has_a_layer_and_few_stay_flat():
    tops = {m.split(".")[0] for m in MODULES if m}
    assert tops == {name for names in LAYERS for name in names}
    flat = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(flat) <= 10, flat  # __init__, the TRL pair (config, trainer), algorithm and the three shims


def test_no_module_imports_a_higher_layer():
    """Every import counts: at the top, inside a function (lazy) and under ``TYPE_CHECKING``."""
    assert _upward({"run.placement": {"launch.recipe"}, "launch.recipe": {"run.placement"}}) == [
        "run.placement -> launch.recipe"
    ]  # the check sees an upward import
    graph = _import_graph(typing=True)
    assert "launch.start" in graph["launch.train"] and "run.resolve" in graph["run.placement"]  # not vacuous
    assert _upward(graph) == []


def test_each_subpackage_says_what_lives_there_and_imports_only_what_it_says():
    graph = _import_graph(typing=True)
    for package in SUBPACKAGES:
        doc = _docstring(package)
        named = set(re.findall(r"`(\w+)`", doc))
        held = {m.split(".", 1)[1] for m in MODULES if m.startswith(f"{package}.")}
        assert held <= named, f"{package}/__init__.py does not name {sorted(held - named)}"
        may = _may_import(package)
        assert all(_layer(name) < _layer(package) for name in may), (package, may)  # it may only import below
        imported = {t.split(".")[0] for m in graph if m.startswith(f"{package}.") for t in graph[m]} - {package}
        assert imported <= may, f"{package} imports {sorted(imported - may)}, which its docstring does not allow"


def test_torch_free_modules_import_no_ml_library():
    """The modules documented as torch-free (each subpackage's docstring names them) import no torch, trl,
    transformers or accelerate when imported: the placement must run before CUDA can initialise, every rank's checks
    take a second, and `--plan` and `--help` work without TRL. Each is imported in one fresh interpreter, in turn."""
    torch_free = [m for package in SUBPACKAGES for m in _torch_free(package)]
    brief = ("sharing.presets", "sharing.settings", "run.resolve", "launch.recipe", "run.placement", "planning.plan")
    assert set(brief + ("planning.balance", "run.schedule", "run.checkpoints")) <= set(torch_free)
    code = (
        "import importlib, json, sys\n"
        f"heavy, found = {HEAVY!r}, {{}}\n"
        f"for name in {torch_free!r}:\n"
        "    importlib.import_module('hacpo_trl.' + name)\n"
        "    found[name] = [m for m in heavy if m in sys.modules]\n"
        "print(json.dumps(found))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    first = next(((m, libs) for m, libs in json.loads(out.stdout).items() if libs), None)
    assert first is None, f"importing hacpo_trl.{first[0]} imports {first[1]}"
