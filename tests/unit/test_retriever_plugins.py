"""The entry-point group ``cirval.retrievers`` (issue 37 item 6) and the prefix dispatch (item 5)."""

from __future__ import annotations

import pytest

from retrieval.retrievers import kinds, parse_spec, spec_facts
from tests.plugin_dist import forget_lab_kind, install_lab_plugin


@pytest.fixture
def lab(tmp_path, monkeypatch):
    forget_lab_kind()
    monkeypatch.syspath_prepend(str(install_lab_plugin(tmp_path)))
    yield
    forget_lab_kind()


def test_a_plugin_kind_is_found_through_its_entry_point(lab):
    kind, parsed = parse_spec("lab:toy@3")
    assert kind.prefix == "lab" and parsed == {"seed": 3}
    assert spec_facts(" lab:toy@3 ") == {
        "kind": "lab",
        "seed": 3,
        "backend": "lab",
        "canonical": "lab:toy@3",
        "fusion": "early",
    }
    assert {"openclip", "composer", "lab"} <= set(kinds())
    with pytest.raises(ValueError, match="expected lab:toy@SEED"):
        parse_spec("lab:nope")


def test_an_unknown_prefix_names_the_installed_kinds(lab):
    with pytest.raises(ValueError, match="unknown backend 'clip'.*'composer:'.*'lab:'.*'openclip:'"):
        parse_spec("clip:ViT-B-32")


def test_a_broken_plugin_breaks_only_itself(tmp_path, monkeypatch):
    forget_lab_kind()
    monkeypatch.syspath_prepend(str(install_lab_plugin(tmp_path, "no_such_lab_module:Kind")))
    try:
        assert "lab" not in kinds() and "openclip" in kinds()
        with pytest.raises(ValueError, match="unknown backend 'lab' \\(ModuleNotFoundError"):
            parse_spec("lab:toy@1")
    finally:
        forget_lab_kind()
