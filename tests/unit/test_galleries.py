"""The gallery rule (retrieval.galleries.search_key) and audit scopes (parse_scope)."""

from __future__ import annotations

import pytest

from retrieval.galleries import ScopeError, parse_scope, scope_text, search_key, split_of_scope

FIQ_KEYS = {"dress/val", "shirt/val", "toptee/val"}


def test_a_query_searches_its_named_gallery_then_its_category_then_its_split():
    assert search_key("val", "dress", "dress/val", FIQ_KEYS) == "dress/val"
    assert search_key("val", "dress", None, FIQ_KEYS) == "dress/val"  # caption file imported without its split file
    assert search_key("val", "", "val", {"val"}) == "val"  # CIRR, LaSCo, M-BEIR
    assert search_key("val", "", None, {"val", "test"}) == "val"  # CIRCO with import_gallery
    assert search_key("val", "dress", "dress/val", set()) is None  # no gallery: every image of the dataset
    assert search_key("val", "", "gone", {"test"}) is None


def test_scopes():
    splits, cats = {"val"}, {"dress", "shirt", "toptee"}
    assert parse_scope("val", splits, cats) == ("val", "")
    assert parse_scope("dress/val", splits, cats) == ("val", "dress")
    assert parse_scope("dress", splits, cats) == ("val", "dress")
    assert parse_scope("", splits, cats) == ("val", "")
    assert split_of_scope(scope_text("val", "dress")) == ("val", "dress")
    assert split_of_scope(scope_text("val", "")) == ("val", "")
    with pytest.raises(ScopeError, match="no category 'skirt'"):
        parse_scope("skirt/val", splits, cats)
    with pytest.raises(ScopeError, match="no split 'test'"):
        parse_scope("dress/test", splits, cats)
    with pytest.raises(ScopeError, match="category 'dress' is in several splits"):
        parse_scope("dress", {"val", "test"}, cats)
    with pytest.raises(ScopeError, match="several splits"):
        parse_scope("", {"val", "test"}, cats)
