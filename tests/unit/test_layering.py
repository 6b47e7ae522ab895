"""Imports run one way (annotation -> audit -> retrieval) and the maths modules import no Django."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "retrieval/records.py", "retrieval/validation.py", "retrieval/metrics.py", "retrieval/ranking.py",
    "retrieval/targets.py", "retrieval/sessions.py",
    "retrieval/encoders.py", "retrieval/specs.py", "retrieval/embcache.py", "retrieval/demo.py", "retrieval/demo_training.py",
    "retrieval/imagefiles.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "retrieval" / "importers").glob("*.py")),
    "audit/labels.py", "audit/rankfiles.py", "audit/runs/encoding.py",
    "annotation/agreement/maths.py", "annotation/agreement/circus.py", "annotation/judging/rubric.py", "annotation/assignment/rules.py",
    "annotation/studies/sampling.py", "annotation/verdicts/consensus.py", "annotation/quality/signals.py", "retrieval/fusion.py",
    "annotation/alternatives/payload.py", "annotation/alternatives/decisions.py", "annotation/alternatives/agreement.py",
]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("rel", PURE)
def test_maths_modules_import_no_django_or_celery(rel):
    path = ROOT / rel
    assert not imported_modules(path) & {"django", "celery", "rest_framework"}, rel


@pytest.mark.parametrize("app,forbidden", [("retrieval", {"audit", "annotation"}), ("audit", {"annotation"})])
def test_imports_run_one_way(app, forbidden):
    offenders = {
        str(p.relative_to(ROOT)): sorted(imported_modules(p) & forbidden)
        for p in (ROOT / app).rglob("*.py")
        if imported_modules(p) & forbidden
    }
    assert not offenders


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module this file imports, at any depth of the file (lazy imports count too)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph (a list of modules that leads back to its first), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_find_cycle_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("app", ["retrieval", "audit", "annotation", "config"])
def test_no_import_cycle_inside_an_app(app):
    files = [p for p in (ROOT / app).rglob("*.py") if "migrations" not in p.parts]
    modules = {module_name(p): p for p in files}
    graph = {
        # a package's __init__ is not an edge: importing `a.b` runs `a/__init__`, which imports nothing here
        name: {m for m in imports_of(path) if m in modules and m != name and not path.name == "__init__.py"}
        for name, path in modules.items()
    }
    assert find_cycle(graph) is None
