"""A refused file that looks like another format says which (issue 41, item 1): the one table
of retrieval.importers.sniffing, on real files of every format (tests/fixtures/datasets)."""

from __future__ import annotations

import shutil

import pytest

from retrieval import importers
from retrieval.importers.sniffing import format_hint, looks_like
from retrieval.records import ParseError
from tests.conftest import FIXTURES

DS = FIXTURES / "datasets"

#: A real file of each format (and role) -> the formats it is a file of.
FILES = {
    "cirr/cap.rc2.val.sample.json": ("cirr",),
    "cirr/cap.ext.rc2.val.sample.json": ("cirr",),
    "cirr/split.rc2.val.sample.json": ("cirr",),
    "fashioniq/cap.dress.val.sample.json": ("fashioniq",),
    "fashioniq/split.dress.val.sample.json": ("fashioniq", "mtfiq"),
    "circo/val.json": ("circo",),
    "lasco/lasco_val.json": ("lasco",),
    "lasco/lasco_val_corpus.sample.json": ("lasco",),
    "circled/cirr_val.json": ("circled",),
    "mbeir/mbeir_cirr_task7_test.jsonl": ("mbeir",),
    "mbeir/mbeir_cirr_task7_cand_pool.jsonl": ("mbeir",),
    "mtfiq/dress.val.sample.json": ("mtfiq",),
    "mtfiq/asin2attr.dress.val.sample.json": ("mtfiq",),
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_format_s_files_are_told_apart(name) -> None:
    found = looks_like(DS / name)
    assert found is not None and found[0] == FILES[name], found
    for fmt in importers.FORMATS:
        hint = format_hint(DS / name, fmt)
        assert (hint == "") == (fmt in FILES[name]), (fmt, hint)


def test_a_fashioniq_file_given_as_cirr_is_named_as_such(tmp_path) -> None:
    # named as a CIRR caption file: refused for a field, and the refusal says what the file is
    path = tmp_path / "cap.rc2.val.json"
    shutil.copy(DS / "fashioniq" / "cap.dress.val.sample.json", path)
    with pytest.raises(ParseError) as err:
        importers.parse("cirr", [path])
    assert err.value.field == "pairid"
    assert str(err.value).endswith(
        "missing field; this file looks like a FashionIQ caption file "
        "(cap.<category>.<split>.json), not CIRR: import it as FashionIQ (--format fashioniq)"
    )
    # under its own name, through the streaming path the import uses
    with pytest.raises(ParseError, match=r"looks like a FashionIQ caption file .* \(--format fashioniq\)"):
        list(
            importers.stream(
                "cirr", [DS / "fashioniq" / "cap.dress.val.sample.json"], importers.ParsedDataset(format="cirr")
            )
        )


def test_no_hint_for_a_file_of_the_format_itself_or_for_an_unknown_layout(tmp_path) -> None:
    bad = tmp_path / "cap.rc2.val.json"
    bad.write_text('[{"pairid": "x"}]')
    with pytest.raises(ParseError) as err:
        importers.parse("cirr", [bad])
    assert "looks like" not in str(err.value)
    odd = tmp_path / "thing.json"
    odd.write_text('[{"foo": 1}]')
    assert looks_like(odd) is None and format_hint(odd, "cirr") == ""
    broken = tmp_path / "broken.json"
    broken.write_text('[{"pairid": ')
    assert looks_like(broken) is None  # the reader reports a damaged file, not the sniffer
