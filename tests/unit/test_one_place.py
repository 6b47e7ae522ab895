"""One place per concept: checks over the source that keep twins from coming back (issue 28)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from audit.labels import BOTH_UNIMODAL, LABELS, SHORTCUT_FREE_NAME

ROOT = Path(__file__).resolve().parents[2]
APPS = ("annotation", "audit", "retrieval", "config", "bench")


def source_files() -> list[Path]:
    return sorted(p for app in APPS for p in (ROOT / app).rglob("*.py") if "migrations" not in p.parts)


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once for all the checks (they only read it)."""
    return ast.parse(path.read_text(), filename=str(path.relative_to(ROOT)))


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of a module, its classes and functions (prose may name a label)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spelled(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each string constant of the tree equal to one of ``names`` (docstrings aside)."""
    skip = docstrings(tree)
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names and id(n) not in skip
    ]


def test_spelled_finds_a_label_literal_but_not_prose():
    tree = ast.parse('"""composition_required in prose."""\npool = ["composition_required", "x"]\n')
    assert spelled(tree, {"composition_required"}) == [(2, "composition_required")]


def test_audit_label_names_are_spelled_only_in_audit_labels():
    # text_only / image_only are modality names as well as detail labels: they are left out here
    names = {*LABELS, SHORTCUT_FREE_NAME, BOTH_UNIMODAL}
    offenders = {}
    for path in source_files():
        rel = str(path.relative_to(ROOT))
        if rel == "audit/labels.py":
            continue
        if found := spelled(parsed(path), names):
            offenders[rel] = found
    assert offenders == {}


def judgement_writes(tree: ast.AST) -> list[int]:
    """Lines that create Judgement rows: ``Judgement.objects.create/bulk_create/get_or_create``."""
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("create", "bulk_create", "get_or_create", "update_or_create")
        and isinstance(n.func.value, ast.Attribute)
        and n.func.value.attr == "objects"
        and isinstance(n.func.value.value, ast.Name)
        and n.func.value.value.id == "Judgement"
    ]


def test_judgement_rows_are_written_only_by_the_queues_store():
    """Annotators' submits and imports (import_circus) store judgements through
    annotation.assignment.queue (submit / store_judgement); bench/ builds synthetic loads."""
    assert judgement_writes(ast.parse("Judgement.objects.create(a=1)\nOther.objects.create()")) == [1]
    offenders = {
        str(p.relative_to(ROOT)): lines
        for p in source_files()
        if not p.is_relative_to(ROOT / "bench") and (lines := judgement_writes(parsed(p)))
    }
    assert set(offenders) == {"annotation/assignment/queue.py"}


def command_calls(tree: ast.AST) -> list[int]:
    """Lines that run a management command: ``call_command(...)`` or ``management.call_command(...)``."""
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and (
            (isinstance(n.func, ast.Name) and n.func.id == "call_command")
            or (isinstance(n.func, ast.Attribute) and n.func.attr == "call_command")
        )
    ]


def test_views_and_services_never_run_a_management_command():
    """Commands and views call the same service functions; a command may still call another
    command (make_demo runs the demo's steps), a view or service never does."""
    assert command_calls(ast.parse("call_command('x')\nmanagement.call_command('y')\nf()")) == [1, 2]
    offenders = {
        str(p.relative_to(ROOT)): lines
        for p in source_files()
        if "commands" not in p.parts and not p.is_relative_to(ROOT / "bench") and (lines := command_calls(parsed(p)))
    }
    assert offenders == {}


# ------------------------------------------------------------------ settings: each default stated once
# config/settings.py (through config/env.py) is the one reader of the environment and states
# each setting's default; every other module reads ``settings.X``, with no fallback of its own.

SETTINGS_FILE = ROOT / "config" / "settings.py"
#: Environment variables read by libraries, not settings of CIRVal.
LIBRARY_ENV = {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "DJANGO_SETTINGS_MODULE"}


def fallback_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``getattr(settings, "X", default)``: a setting read with a default of the call site's own."""
    return [
        (n.lineno, ast.unparse(n.args[1]))
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == "getattr"
        and len(n.args) == 3
        and isinstance(n.args[0], ast.Name)
        and n.args[0].id == "settings"
    ]


def environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``os.environ.get(X...)``, ``os.environ[X]``, ``os.getenv(X...)`` of names that are not a library's."""
    found = []
    for n in ast.walk(tree):
        name = None
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args:
            f = n.func
            if (f.attr == "get" and ast.unparse(f.value) == "os.environ") or ast.unparse(f) == "os.getenv":
                name = n.args[0]
        elif isinstance(n, ast.Subscript) and ast.unparse(n.value) == "os.environ" and isinstance(n.ctx, ast.Load):
            name = n.slice
        if name is not None:
            text = name.value if isinstance(name, ast.Constant) else ast.unparse(name)
            if text not in LIBRARY_ENV:
                found.append((n.lineno, text))
    return found


def settings_attributes(tree: ast.AST) -> set[str]:
    return {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "settings"
        and n.attr.isupper()
    }


def test_the_settings_checks_see_a_restated_default():
    tree = ast.parse(
        'a = getattr(settings, "EXPORT_YIELD_SECONDS", 0.0)\nb = getattr(settings, "X")\n'
        'c = os.environ.get("WORKER_NICE", "idle")\nd = os.environ["HF_HUB_OFFLINE"]\ne = settings.IMAGE_MAX_PIXELS'
    )
    assert fallback_reads(tree) == [(1, "'EXPORT_YIELD_SECONDS'")]
    assert environment_reads(tree) == [(3, "WORKER_NICE")]
    assert settings_attributes(tree) == {"IMAGE_MAX_PIXELS"}


def test_no_call_site_restates_a_settings_default():
    offenders = {str(p.relative_to(ROOT)): found for p in source_files() if (found := fallback_reads(parsed(p)))}
    assert offenders == {}


def test_only_the_settings_read_the_environment():
    allowed = {"config/env.py", "config/settings.py"}
    offenders = {
        rel: found
        for p in source_files()
        if (rel := str(p.relative_to(ROOT))) not in allowed
        and not p.is_relative_to(ROOT / "bench")
        and (found := environment_reads(parsed(p)))
    }
    assert offenders == {}


def test_every_setting_read_is_stated_in_the_settings_or_by_django():
    """``settings.X`` with no X in config/settings.py (nor a Django default) would need a fallback."""
    from django.conf import global_settings

    stated = {
        t.id
        for node in ast.parse(SETTINGS_FILE.read_text()).body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    }
    stated |= {name for name in dir(global_settings) if name.isupper()}
    offenders = {
        str(p.relative_to(ROOT)): missing
        for p in source_files()
        if (missing := sorted(settings_attributes(parsed(p)) - stated))
    }
    assert offenders == {}


def test_each_environment_variable_is_read_once_in_the_settings():
    reads = [
        n.args[0].value
        for n in ast.walk(ast.parse(SETTINGS_FILE.read_text()))
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id.startswith("env_")
        and n.args
        and isinstance(n.args[0], ast.Constant)
    ]
    assert reads and sorted(name for name in set(reads) if reads.count(name) > 1) == []
