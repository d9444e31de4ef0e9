"""The layout rules of core/ (issue 9): every core module imports alone in a fresh interpreter
without streamlit or ui; the import graph between core modules has no cycle; core modules import
each other at the top (no hidden function-level imports); no function in core/ is longer than 80
lines except the compiler's single-pass driver; and (issue 20) core/ stands in wings by role, in a declared
order from the ground up, with no import that runs from a lower wing up to a higher one."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import ROOT

CORE = ROOT / "core"
MAX_FUNCTION_LINES = 80
LONG_FUNCTION_ALLOWED = {("core/quant/compile.py", "run")}  # the compiler's single-pass driver


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = sorted(_module_name(p) for p in CORE.rglob("*.py") if p.name != "__main__.py")


def _resolve(module: str, is_package: bool, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The core modules an import statement names (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name == "core" or a.name.startswith("core.")]
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not (target == "core" or target.startswith("core.")):
        return []
    names = [target]
    for a in node.names:  # `from . import tensorrt` names a submodule
        if f"{target}.{a.name}" in MODULES:
            names.append(f"{target}.{a.name}")
    return names


def _imports() -> dict[str, list[tuple[str, bool, int]]]:
    """module -> [(imported core module, at top level?, line)]."""
    out = {}
    for p in CORE.rglob("*.py"):
        mod = _module_name(p)
        tree = ast.parse(p.read_text())
        top = {id(n) for n in tree.body}
        # imports under `if TYPE_CHECKING:` or module-level try/if count as top level
        for n in tree.body:
            if isinstance(n, (ast.If, ast.Try)):
                top |= {id(c) for c in ast.walk(n)}
        found = []
        for n in ast.walk(tree):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                for target in _resolve(mod, p.name == "__init__.py", n):
                    if target != mod:
                        found.append((target, id(n) in top, n.lineno))
        out[mod] = found
    return out


def _owning_module(name: str) -> str:
    """``core.search.budget`` -> itself; a name imported from a package resolves to the package."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def test_core_modules_import_each_other_at_the_top():
    late = [f"{m}:{line} imports {t} inside a function" for m, found in _imports().items()
            for t, at_top, line in found if not at_top]
    assert not late, "\n".join(late)


def test_no_import_cycle_between_core_modules():
    graph = {m: sorted({_owning_module(t) for t, _, _ in found} - {m}) for m, found in _imports().items()}
    # a package's __init__ importing its own submodules is not a cycle of concern, but a
    # submodule importing its own package (and so its siblings) back is
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "active"
        stack.append(m)
        for t in graph.get(m, []):
            if state.get(t) == "active":
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# The wings of core/, from the ground up. A module may import its own unit and the units below it, never
# one above: the model wing reads models and knows nothing of precision; precision knows nothing of
# measuring; the base (workspace.py) names every folder, and only the store wing reads and writes stored
# results; the CLI is the roof.
LAYERS = [
    ("base", ("core.errors", "core.records", "core.workspace")),
    ("model", ("core.model",)),
    ("quant", ("core.quant",)),
    ("project", ("core.project",)),
    ("backends", ("core.backends",)),
    ("measure", ("core.measure",)),
    ("estimate", ("core.estimate",)),
    ("sensitivity", ("core.sensitivity",)),
    ("search", ("core.search",)),
    ("store", ("core.store",)),
    ("display", ("core.display",)),
    ("export", ("core.export",)),
    ("jobs", ("core.jobs",)),
    ("cli", ("core.cli", "core.__main__")),
]


def _unit(module: str) -> int | None:
    """The index in LAYERS of the unit a core module belongs to (None for the bare ``core`` package)."""
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def upward_imports(graph: dict[str, list[tuple[str, bool, int]]]) -> list[str]:
    """Every import in ``graph`` (as :func:`_imports` returns it) from a lower unit to a higher one."""
    bad = []
    for mod, found in graph.items():
        here = _unit(mod)
        for target, _, line in found:
            there = _unit(_owning_module(target))
            if here is not None and there is not None and there > here:
                bad.append(f"{mod}:{line} ({LAYERS[here][0]}) imports {target} ({LAYERS[there][0]}, higher)")
    return bad


def test_every_core_module_stands_in_a_declared_unit():
    homeless = [m for m in MODULES + ["core.__main__"] if m != "core" and _unit(m) is None]
    assert not homeless, f"core modules in no unit of LAYERS (add a wing or move them): {homeless}"
    top = sorted(p.name for p in CORE.iterdir() if p.name not in ("__pycache__", "__init__.py", "__main__.py"))
    assert len([n for n in top if n.endswith(".py")]) <= 5, f"core's top level is for wings and a few base modules: {top}"


def test_no_import_runs_up_the_wings():
    bad = upward_imports(_imports())
    assert not bad, "imports that run upward between the wings:\n" + "\n".join(bad)


def test_the_layering_check_fails_on_a_planted_upward_import():
    """A model-wing module importing the store (higher) is caught, and a downward import is not."""
    graph = _imports()
    planted = dict(graph)
    planted["core.model.shapes"] = list(graph["core.model.shapes"]) + [("core.store.results", True, 1)]
    assert upward_imports(graph) == []
    assert upward_imports(planted) == ["core.model.shapes:1 (model) imports core.store.results (store, higher)"]
    assert upward_imports({"core.store.results": [("core.model.shapes", True, 1)]}) == []


_PROBE = """
import importlib, json, sys
mod = importlib.import_module(sys.argv[1])
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('streamlit', 'ui', 'pages'))
print(json.dumps(bad))
"""


@pytest.mark.parametrize("module", MODULES)
def test_each_core_module_imports_alone_without_ui(module):
    r = subprocess.run([sys.executable, "-c", _PROBE, module], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"import {module} failed in a fresh interpreter:\n{r.stderr[-2000:]}"
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [], f"{module} imports streamlit/ui"


def test_no_long_functions_in_core():
    long = []
    for p in CORE.rglob("*.py"):
        rel = str(p.relative_to(ROOT))
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = n.end_lineno - n.lineno + 1
                if lines > MAX_FUNCTION_LINES and (rel, n.name) not in LONG_FUNCTION_ALLOWED:
                    long.append(f"{rel}:{n.lineno} {n.name} has {lines} lines")
    assert not long, "\n".join(long)


def test_the_checks_see_the_real_graph():
    """The analysis finds known edges (a check that sees nothing would pass vacuously)."""
    graph = _imports()
    assert ("core.errors", True) in {(t, top) for t, top, _ in graph["core.model.load"]}
    assert len(MODULES) > 20
