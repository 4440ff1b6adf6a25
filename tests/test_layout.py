"""The shape of the code a newcomer reads: stages that import only downwards, short functions, a tidy public API.

Every import of a project module counts, function-local ones included: a layer may import from itself and
from the layers before it in `LAYERS`, never from a later one, so there is no cycle to hide.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import tuner

ROOT = Path(__file__).resolve().parents[1]
# tuner's subpackages in data-flow order; `testing` (planted models) sits on top of the library.
LAYERS = ("core", "policy", "options", "engine", "measure", "workspace", "search", "report", "jobs", "testing")
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(p for p in (ROOT / "tuner").rglob("*.py"))


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "tuner" else None


def _imports(path: Path) -> set[str]:
    """The tuner modules `path` imports, wherever the import statement is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (use absolute tuner.* imports)"
            if node.module and node.module.split(".")[0] == "tuner":
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "tuner"}
    return found


def _name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_imports_only_its_own_layer_and_those_below(path):
    own = _layer(_name(path))
    if own is None:  # tuner/__init__.py: the public names, loaded lazily
        return
    allowed = set(LAYERS[: LAYERS.index(own) + 1])
    for module in _imports(path):
        layer = _layer(module)
        assert layer is None or layer in allowed, f"{_name(path)} ({own}) imports {module} ({layer})"


def test_the_library_imports_its_own_modules_at_the_top():
    """A function-local import hides a dependency from the reader (and once hid a cycle)."""
    hidden = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                hidden += [f"{path.relative_to(ROOT)}:{sub.lineno}" for sub in ast.walk(node)
                           if isinstance(sub, (ast.Import, ast.ImportFrom)) and "tuner" in _imports_of(sub)]
    assert not hidden, hidden


def _imports_of(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.ImportFrom):
        return {(node.module or "").split(".")[0]}
    return {a.name.split(".")[0] for a in node.names}


def test_there_is_no_import_cycle():
    graph = {_name(p): {m for m in _imports(p) if m != "tuner"} for p in _modules()}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt in graph and not state.get(nxt):
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node, [node])


def _functions() -> list[tuple[str, int]]:
    out = []
    for path in [*_modules(), *sorted((ROOT / "cli").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", node.end_lineno - node.lineno + 1))
    return out


def test_no_function_is_longer_than_80_lines():
    long = [f"{where} ({n} lines)" for where, n in _functions() if n > MAX_FUNCTION_LINES]
    assert not long, "functions over 80 lines: " + ", ".join(long)


def test_no_module_is_named_after_a_standard_library_module():
    clash = [str(p.relative_to(ROOT)) for p in [*_modules(), *(ROOT / "cli").glob("*.py")]
             if p.stem in sys.stdlib_module_names]
    assert not clash, clash


def test_tuner_exports_its_public_api_and_nothing_else():
    public = {n for n in dir(tuner) if not n.startswith("_")}
    assert public == set(tuner.__all__) - {"__version__"}
    for name in tuner.__all__:
        assert getattr(tuner, name) is not None, name
    for leaked in ("Any", "sys", "types", "importlib", "annotations"):
        assert not hasattr(tuner, leaked), leaked


def test_the_public_api_functions_have_docstrings():
    missing = [n for n in tuner.__all__ if n != "__version__" and callable(getattr(tuner, n))
               and not (getattr(tuner, n).__doc__ or "").strip()]
    assert not missing, missing


def test_at_most_a_handful_of_modules_at_tuners_top_level():
    top = sorted(p.name for p in (ROOT / "tuner").glob("*.py"))
    assert len(top) <= 3, top
