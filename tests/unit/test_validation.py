"""retrieval.validation.Record: the generic parts the rubric reader needs (allowed fields,
lists of objects named by path, non-blank strings, optional booleans, records that are not
one of a file's records)."""

from __future__ import annotations

import pytest

from retrieval.records import ParseError
from retrieval.validation import Record


def _fail(fn) -> ParseError:
    with pytest.raises(ParseError) as err:
        fn()
    return err.value


def test_allowed_refuses_unknown_fields_naming_the_first_and_listing_the_allowed():
    err = _fail(lambda: Record("f.json", 2, {"a": 1, "zz": 2, "b": 3}, allowed={"a"}))
    assert (err.file, err.record, err.field) == ("f.json", 2, "b")
    assert err.message == "unknown field (also unknown: ['zz']); allowed: ['a']"
    assert Record("f.json", 2, {"a": 1}, allowed={"a", "c"}).req_int("a") == 1


def test_a_value_that_is_not_a_file_record_is_named_by_source_and_path():
    top = Record("rubric 'r' v1", None, {"items": [{"key": "x"}, {"key": " ", "n": 1}]}, prefix="rubric")
    first, second = top.objects("items", "item", allowed={"key", "n"})
    assert first.req_str("key", non_blank=True) == "x"
    err = _fail(lambda: second.req_str("key", non_blank=True))
    assert (err.record, err.field, err.message) == (None, "rubric.items[1].key", "must not be blank")
    assert str(err) == "rubric 'r' v1, field 'rubric.items[1].key': must not be blank"
    err = _fail(lambda: top.objects("items", "item", allowed={"key"}))
    assert (err.field, err.message) == ("rubric.items[1].n", "unknown field; allowed: ['key']")


def test_objects_absent_or_null_is_empty_and_other_types_are_refused():
    rec = Record("f", 0, {"none": None, "text": "x", "mixed": [{}, 3]})
    assert rec.objects("absent", "thing") == [] and rec.objects("none", "thing") == []
    assert _fail(lambda: rec.objects("text", "thing")).message == "expected a list, got string"
    err = _fail(lambda: rec.objects("mixed", "thing"))
    assert (err.field, err.message) == ("mixed[1]", "expected a JSON object for this thing, got number")


def test_opt_bool_and_strict_integers_say_what_they_got():
    rec = Record("f", 0, {"yes": True, "none": None, "one": 1, "two": 2.0, "flag": False})
    assert (rec.opt_bool("yes"), rec.opt_bool("none"), rec.opt_bool("absent")) == (True, None, None)
    assert _fail(lambda: rec.opt_bool("one")).message == "expected true or false, got number"
    assert _fail(lambda: rec.req_int("two")).message == "expected an integer, got number (2.0)"
    assert _fail(lambda: rec.req_int("flag")).message == "expected an integer, got boolean (False)"
