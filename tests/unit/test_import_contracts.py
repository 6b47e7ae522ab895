"""The custom contract types of ``.importlinter`` (tests/import_contracts.py) see what they
are for; ``lint-imports`` itself runs in tests/integration/test_import_contracts.py."""

from __future__ import annotations

import ast

from tests.import_contracts import (
    dotted_settings,
    dotted_strings,
    private_uses,
    setting_offenders,
    settings_read,
    string_offenders,
)

LAYERS = ["annotation", "audit", "retrieval"]


def test_a_setting_that_names_a_higher_app_is_a_reverse_import_of_its_readers():
    # the shape of the old CIRVAL_IMAGE_ACCESS: a setting names an annotation function, retrieval reads it
    values = {"CIRVAL_IMAGE_ACCESS": "annotation.access.may_fetch_image", "ROOT_URLCONF": "config.urls"}
    readers = {"retrieval.views": {"CIRVAL_IMAGE_ACCESS", "ROOT_URLCONF"}, "annotation.views": {"CIRVAL_IMAGE_ACCESS"}}
    assert setting_offenders(values, readers, LAYERS) == {
        "retrieval.views": ["CIRVAL_IMAGE_ACCESS = 'annotation.access.may_fetch_image'"]
    }
    tree = ast.parse('a = settings.IMAGE_ACCESS\nb = getattr(settings, "OTHER", None)')
    assert settings_read(tree) == {"IMAGE_ACCESS", "OTHER"}
    assert dotted_settings(ast.parse('X = "annotation.access.f"\nY = "plain words"\nZ = 3')) == {
        "X": "annotation.access.f"
    }


def test_a_dotted_string_that_names_a_higher_app_is_an_import():
    tree = ast.parse(
        'x = import_string("annotation.access.may_fetch_image")\nFK = "audit.AuditRun"\n"""annotation.x in prose."""'
    )
    assert string_offenders({"retrieval.views": dotted_strings(tree)}, LAYERS) == {
        "retrieval.views": ["annotation.access.may_fetch_image", "audit.AuditRun"]
    }
    assert string_offenders({"audit.tasks": {"audit.tasks.coordinate", "retrieval.models"}}, LAYERS) == {}


def test_private_names_of_another_module_are_seen_imported_or_read():
    modules = {"app", "app.a", "app.b", "app.pkg", "app.pkg.c"}
    tree = ast.parse(
        "from app.a import _x, y\nfrom . import b\nfrom .pkg import c as see\nimport app.a as a\n"
        "b._hidden()\nsee._z\na.__doc__\nb.public\n"
    )
    assert private_uses("app.d", tree, modules.__contains__) == [
        "line 1: from app.a import _x",
        "line 5: app.b._hidden",
        "line 6: app.pkg.c._z",
    ]
    # its own private names, and dunders, are the module's business
    assert private_uses("app.a", ast.parse("from app.a import _x\n"), modules.__contains__) == []
