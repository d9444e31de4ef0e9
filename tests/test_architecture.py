"""The layout rules of core/ (issue 9): every core module imports alone in a fresh interpreter
without streamlit or ui; the import graph between core modules has no cycle; core modules import
each other at the top (no hidden function-level imports); no function in core/ is longer than 80
lines except the compiler's single-pass driver."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "core"
MAX_FUNCTION_LINES = 80
LONG_FUNCTION_ALLOWED = {("core/compile.py", "run")}  # the compiler's single-pass driver


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
    assert ("core.errors", True) in {(t, top) for t, top, _ in graph["core.model"]}
    assert len(MODULES) > 20
