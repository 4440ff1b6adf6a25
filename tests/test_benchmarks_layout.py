"""benchmarks/ as a newcomer reads it: files named for what they measure or hold, no import circle, and the fault
battery's cases filed under the classes their modules declare.

The benchmark scripts run with their own folder first on `sys.path` (a model file's folder too, as `mpt tune` puts
it), so a module there imports a sibling by its bare name. The import graph resolves `import x` and
`from x import y` to `x.py` beside the importing file, else to `benchmarks/x.py`; every import statement counts,
function-local and `if TYPE_CHECKING:` ones included, since a circle hidden in either still ties the files together.
"""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
# an issue, bug or ticket number in a name ("fault_cases_issue34.py", "i17_cases.py", "gh_12.py"): the number
# says when a file was written, not what it holds
NUMBERED = re.compile(r"(issue|bug|ticket|gh|pr)[-_]?\d+|(^|[-_])i\d+([-_.]|$)", re.IGNORECASE)


def _imported(path: Path) -> set[Path]:
    """The benchmarks/ files `path` imports."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            target = next((f / f"{top}.py" for f in (path.parent, BENCH) if (f / f"{top}.py").is_file()), None)
            if target is not None and target != path:
                found.add(target)
    return found


def import_graph(root: Path = BENCH) -> dict[Path, set[Path]]:
    return {path: _imported(path) for path in sorted(root.rglob("*.py"))}


def find_cycle(graph: dict[Path, set[Path]]) -> list[Path] | None:
    """One import circle (its files, the first repeated at the end), or None."""
    state: dict[Path, int] = {}  # 1: on the current path, 2: done
    path: list[Path] = []

    def visit(node: Path) -> list[Path] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in graph:
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_benchmarks_have_no_import_circle():
    graph = import_graph()
    assert graph[BENCH / "fault_battery.py"], "the graph found none of the battery's imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(str(p.relative_to(BENCH)) for p in cycle)


def test_find_cycle_sees_a_circle_through_a_type_checking_import(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from c import X\n")
    (tmp_path / "c.py").write_text("def f():\n    from a import g\n")
    cycle = find_cycle(import_graph(tmp_path))
    assert cycle is not None and [p.name for p in cycle] == ["a.py", "b.py", "c.py", "a.py"]
    (tmp_path / "c.py").write_text("import json\n")
    assert find_cycle(import_graph(tmp_path)) is None


def test_no_benchmark_file_is_named_after_an_issue_number():
    named = [str(p.relative_to(BENCH)) for p in BENCH.rglob("*") if "__pycache__" not in p.parts
             and NUMBERED.search(p.name)]
    assert named == [], f"named after an issue number, not what they hold: {named}"
    assert NUMBERED.search("fault_cases_issue34.py") and NUMBERED.search("i17_cases.py")
    assert not NUMBERED.search("fault_cases_fused.py") and not NUMBERED.search("resnet18.py")


@pytest.fixture
def battery(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("fault_battery")


def test_fault_cases_are_filed_under_their_modules_classes(battery, capsys):
    seen: dict[str, str] = {}
    names: list[str] = []
    for module in battery.CASE_MODULES:
        assert re.fullmatch(r"fault_cases_[a-z]+", module.__name__), module.__name__
        cases = module.cases()
        classes = {battery.case_class(c) for c in cases}
        assert classes == set(module.CLASSES), f"{module.__name__}: cases in {classes}, declared {module.CLASSES}"
        for cls in classes:
            assert seen.setdefault(cls, module.__name__) == module.__name__, f"class {cls} in two modules"
        names += [c.name for c in cases]
    assert len(names) == len(set(names)), "two cases share a name"
    assert [c.name for c in battery.cases()] == names
    assert battery.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "fault_cases_hooks.py: hooks (11)" in listed and "fault_cases_resume.py: resume (15)" in listed
