"""No function of the application is more complex than cyclomatic complexity 20 (radon).

The same check by hand: ``python -m radon cc -s -n D -e "tests/*,*/migrations/*,.venv/*,bench/*" .``
"""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 20
SKIP_DIRS = {"tests", "bench", "migrations", ".venv", "node_modules", "var", ".git"}
#: Exceptions, each named with its reason (none today).
KNOWN: set[str] = set()


def _sources():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if not SKIP_DIRS.intersection(rel.parts):
            yield rel, path.read_text(encoding="utf-8")


def _name(block) -> str:
    return f"{block.classname}.{block.name}" if getattr(block, "classname", None) else block.name


def test_no_function_above_complexity_20():
    too_complex: set[str] = set()
    for rel, code in _sources():
        for block in cc_visit(code):
            blocks = [block, *getattr(block, "methods", []), *getattr(block, "closures", [])]
            for b in blocks:
                key = f"{rel.as_posix()}:{_name(b)}"
                if b.complexity > LIMIT and key not in KNOWN:
                    too_complex.add(f"{key} ({b.complexity})")
    assert not too_complex, "break these into named steps: " + ", ".join(sorted(too_complex))
