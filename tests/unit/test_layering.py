"""Imports run one way (annotation -> audit -> retrieval) and the maths modules import no Django."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "retrieval/records.py", "retrieval/validation.py", "retrieval/metrics.py", "retrieval/ranking.py",
    "retrieval/targets.py", "retrieval/sessions.py",
    "retrieval/encoders.py", "retrieval/specs.py", "retrieval/embcache.py", "retrieval/demo.py", "retrieval/demo_training.py",
    "retrieval/imagefiles.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "retrieval" / "importers").glob("*.py")),
    "audit/labels.py", "audit/democheck.py", "audit/suspicion.py", "audit/rankfiles.py", "audit/runs/encoding.py",
    "annotation/agreement/maths.py", "annotation/agreement/circus.py", "annotation/judging/rubric.py", "annotation/assignment/rules.py",
    "annotation/studies/sampling.py", "annotation/verdicts/consensus.py", "annotation/verdicts/turns.py", "annotation/verdicts/reliability.py", "annotation/verdicts/crowd.py", "annotation/quality/signals.py", "retrieval/fusion.py",
    "annotation/alternatives/payload.py", "annotation/alternatives/decisions.py", "annotation/alternatives/agreement.py",
    "annotation/studies/estimate.py",
]


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once for all the checks (they only read it)."""
    return ast.parse(path.read_text(), filename=str(path))


def imported_modules(path: Path) -> set[str]:
    tree = parsed(path)
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
    for node in ast.walk(parsed(path)):
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


# ------------------------------------------------------------------ imports by string
# A dotted path in a string (``import_string``, ``send_task``, a model reference, a setting
# whose value names a function) is an import all the same. It must run the same way.

LOWER = {"retrieval": {"audit", "annotation"}, "audit": {"annotation"}}
DOTTED = re.compile(r"^([a-z_]+)(\.[A-Za-z_]\w*)+$")


def dotted_strings(tree: ast.AST) -> set[str]:
    """Every string constant of the tree that is a whole dotted path (``app.module.name``)."""
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and DOTTED.match(n.value)}


def app_files(app: str) -> list[Path]:
    return [p for p in (ROOT / app).rglob("*.py") if "migrations" not in p.parts]


def string_imports_against_layers(files: dict[str, set[str]], lower: dict[str, set[str]]) -> dict[str, list[str]]:
    """For each file (``app/...``: its dotted strings) the strings that name a higher app."""
    offenders = {}
    for rel, strings in files.items():
        forbidden = lower.get(rel.split("/")[0], set())
        if bad := sorted(s for s in strings if s.split(".")[0] in forbidden):
            offenders[rel] = bad
    return offenders


def settings_read_against_layers(settings_values: dict[str, str], readers: dict[str, set[str]],
                                 lower: dict[str, set[str]]) -> dict[str, list[str]]:
    """Settings whose value names a module of a higher app than an app that reads them.

    ``settings_values`` maps a setting to its dotted value; ``readers`` maps each file
    (``app/...``) to the setting names it reads."""
    offenders: dict[str, list[str]] = {}
    for rel, names in readers.items():
        forbidden = lower.get(rel.split("/")[0], set())
        bad = sorted(f"{n} = {settings_values[n]!r}" for n in names
                     if n in settings_values and settings_values[n].split(".")[0] in forbidden)
        if bad:
            offenders[rel] = bad
    return offenders


def settings_read(tree: ast.AST) -> set[str]:
    """Names of settings a file reads: ``settings.X`` and ``getattr(settings, "X"...)``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "settings":
            names.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == "settings"
              and isinstance(node.args[1], ast.Constant)):
            names.add(node.args[1].value)
    return names


def dotted_settings() -> dict[str, str]:
    """Each setting of config/settings.py whose value is a dotted path string."""
    tree = parsed(ROOT / "config" / "settings.py")
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            and DOTTED.match(node.value.value) for t in node.targets if isinstance(t, ast.Name)}


def test_the_string_checks_see_a_reverse_dependency():
    # the shape of the old CIRVAL_IMAGE_ACCESS: a setting names an annotation function, retrieval reads it
    assert settings_read_against_layers(
        {"CIRVAL_IMAGE_ACCESS": "annotation.access.may_fetch_image", "ROOT_URLCONF": "config.urls"},
        {"retrieval/views.py": {"CIRVAL_IMAGE_ACCESS", "ROOT_URLCONF"}, "annotation/views.py": {"CIRVAL_IMAGE_ACCESS"}},
        LOWER,
    ) == {"retrieval/views.py": ["CIRVAL_IMAGE_ACCESS = 'annotation.access.may_fetch_image'"]}
    tree = ast.parse('x = import_string("annotation.access.may_fetch_image")\nFK = "audit.AuditRun"\n"""annotation.x in prose."""')
    assert string_imports_against_layers({"retrieval/views.py": dotted_strings(tree)}, LOWER) == {
        "retrieval/views.py": ["annotation.access.may_fetch_image", "audit.AuditRun"]}
    assert string_imports_against_layers({"audit/tasks.py": {"audit.tasks.coordinate", "retrieval.models"}}, LOWER) == {}
    tree = ast.parse('a = settings.IMAGE_ACCESS\nb = getattr(settings, "OTHER", None)')
    assert settings_read(tree) == {"IMAGE_ACCESS", "OTHER"}


@pytest.mark.parametrize("app", sorted(LOWER))
def test_no_string_names_a_higher_app(app):
    """import_string targets, task names and model references in strings run one way too."""
    files = {str(p.relative_to(ROOT)): dotted_strings(parsed(p)) for p in app_files(app)}
    assert string_imports_against_layers(files, LOWER) == {}


@pytest.mark.parametrize("app", sorted(LOWER))
def test_no_setting_points_a_lower_app_at_a_higher_one(app):
    """A setting whose value names a module of a higher app is a reverse import of every lower app that reads it."""
    readers = {str(p.relative_to(ROOT)): settings_read(parsed(p)) for p in app_files(app)}
    assert settings_read_against_layers(dotted_settings(), readers, LOWER) == {}
