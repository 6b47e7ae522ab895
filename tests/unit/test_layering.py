"""Imports run one way (annotation -> audit -> retrieval) and the maths modules import no Django."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "retrieval/records.py", "retrieval/metrics.py", "retrieval/ranking.py", "retrieval/sessions.py",
    "retrieval/encoders.py", "retrieval/embcache.py", "retrieval/demo.py", "retrieval/imagefiles.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "retrieval" / "importers").glob("*.py")),
    "audit/labels.py",
    "annotation/agreement.py", "annotation/circus.py", "annotation/rubric.py", "annotation/assignment.py",
    "annotation/sampling.py", "annotation/consensus.py",
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
