"""Every refusal of the streaming JSON readers names the record and the field (issue 41): a
5,000-digit integer, a 50k-deep nesting, NUL, lone surrogates, invalid UTF-8 and invalid JSON;
and one module holds the hostile-JSON limits that file imports and API bodies obey."""

from __future__ import annotations

import json

import pytest

from annotation.assignment import hot_rows
from config import limits, parsing
from retrieval.importers import jsonstream
from retrieval.records import ParseError

PAD = ", ".join(json.dumps({"pairid": n, "caption": f"caption {n}"}) for n in range(11))  # records 1..11


@pytest.mark.parametrize(
    "record, field, says",
    [
        ('{"pairid": ' + "9" * 5000 + "}", "pairid", "an integer outside the 64-bit range"),
        (
            '{"pairid": 1, "caption": ' + "[" * 50_000 + "]" * 50_000 + "}",
            "caption[0][0][0][0][0][0][0]…",
            "nested deeper than 32 levels",
        ),
        ('{"img_set": {"members": ["a", "b", -' + "1" * 30 + "]}}", "img_set.members[2]", "64-bit range"),
        ('{"target_soft": {"x": "a\\u0000b"}}', "target_soft.x", "a string holds a NUL character"),
        ('{"caption": "a\\ud800b"}', "caption", "a string holds a lone surrogate"),
        ('{"caption": "ok", "extra": ["x", "y\\udc00"]}', "extra[1]", "a string holds a lone surrogate"),
        ('{"img\\u0000set": 1}', "img\\u0000set", "its name holds a NUL character"),
    ],
)
def test_hostile_values_name_record_and_field(tmp_path, record, field, says):
    path = tmp_path / "cap.rc2.val.json"
    path.write_text(f"[{PAD}, {record}]", encoding="utf-8")
    with pytest.raises(ParseError) as info:
        list(jsonstream.iter_list(path))
    err = info.value
    assert (err.record, err.field) == (11, field)
    assert str(err).startswith(f"{path}, record 12, field '{field}': ") and says in err.message


def test_a_lone_surrogate_far_into_a_large_file_names_its_field(tmp_path):
    """The raw-byte check holds back the bytes it has not judged, so the parser stops just before
    the escape, whichever chunk it falls in."""
    records = [{"pairid": n, "caption": "c" * 50} for n in range(5000)]
    text = json.dumps(records)
    for cut in (len(text) - 40, 65536 - 5, 65536 + 3):  # near the end, across a chunk's end
        at = text.index('"caption"', cut - 70)
        bad = text[:at] + '"caption": "x\\ud83d", "z' + text[at + len('"caption": "x') :]
        path = tmp_path / "val.json"
        path.write_text(bad)
        with pytest.raises(ParseError) as info:
            jsonstream.check_bounds(path)
        assert info.value.field == "caption" and "lone surrogate" in info.value.message, cut


def test_a_top_level_object_names_the_member_key(tmp_path):
    path = tmp_path / "retrieval_data_cirr_task7_x.json"
    path.write_text('{"metadata": {"k": ' + "9" * 5000 + '}, "samples": []}')
    with pytest.raises(ParseError) as info:
        jsonstream.check_bounds(path)
    assert (info.value.record, info.value.field) == (0, "metadata.k")


@pytest.mark.parametrize(
    "line, field, says",
    [
        ('{"qid": "1", "pos_cand_list": [' + "7" * 5000 + "]}", "pos_cand_list[0]", "64-bit range"),
        (
            '{"qid": "1", "query_txt": ' + "[" * 100 + "]" * 100 + "}",
            "query_txt[0][0][0][0][0][0][0]…",
            "nested deeper",
        ),
        ('{"qid": "1", "query_txt": }', "query_txt", "invalid JSON at column"),
        ('{"qid": "1", "query_txt": "x", "task_id": NaN}', "task_id", "non-standard JSON number NaN"),
    ],
)
def test_json_lines_name_line_and_field(tmp_path, line, field, says):
    path = tmp_path / "mbeir_cirr_task7_test.jsonl"
    path.write_text('{"qid": "0"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ParseError) as info:
        list(jsonstream.iter_jsonl(path))
    assert (info.value.record, info.value.field) == (1, field)
    assert str(info.value).startswith(f"{path}, line 2, field '{field}': ") and says in info.value.message


def test_bytes_that_are_not_utf8_name_the_field(tmp_path):
    path = tmp_path / "mbeir_cirr_task7_test.jsonl"
    path.write_bytes(b'{"qid": "0"}\n{"qid": "1", "query_txt": "caf\xe9"}\n')
    with pytest.raises(ParseError) as info:
        list(jsonstream.iter_jsonl(path))
    assert (info.value.record, info.value.field) == (1, "query_txt") and "not UTF-8" in info.value.message


def test_invalid_json_names_the_field_it_stops_in(tmp_path):
    path = tmp_path / "val.json"
    path.write_text('[{"id": 0, "gt_img_ids": [1, 2]}, {"id": 1, "gt_img_ids": [3, }]')
    with pytest.raises(ParseError) as info:
        list(jsonstream.iter_list(path))
    assert (info.value.record, info.value.field) == (1, "gt_img_ids[1]")
    path.write_text('[{"id": 0, "gt_img_ids": [1, 2]}, {"id": 1, "relative_caption": "is red and')
    with pytest.raises(ParseError) as info:
        list(jsonstream.iter_list(path))
    assert (info.value.record, info.value.field) == (1, "relative_caption") and "truncated?" in info.value.message


def test_top_members_streams_a_list_member_item_by_item(tmp_path):
    path = tmp_path / "ranks.json"
    doc = {
        "samples": [{"a": 1}],
        "metadata": {"k": 3, "x": [1, {"y": 2}]},
        "gallery_paths": ["a", {"b": [1, 2]}, 3, None],
        "summary": {"big": list(range(100))},
        "other": "s",
    }
    path.write_text(json.dumps(doc))
    seen = []
    out = jsonstream.top_members(path, ("metadata",), stream={"gallery_paths": seen.append, "metadata": seen.append})
    assert out == {"samples": [], "metadata": doc["metadata"], "gallery_paths": [], "summary": {}, "other": "s"}
    assert seen == doc["gallery_paths"]  # a member both built and not a list is never streamed


def test_one_module_holds_the_limits_of_bodies_and_files(tmp_path):
    assert parsing.MAX_DEPTH is limits.MAX_DEPTH and jsonstream.MAX_DEPTH is limits.MAX_DEPTH
    assert parsing.fits_int64 is limits.fits_int64 and hot_rows.fits_int64 is limits.fits_int64
    assert (limits.INT_MIN, limits.INT_MAX) == (-(2**63), 2**63 - 1)
    assert limits.fits_int64(2**63 - 1) and limits.fits_int64(-(2**63))
    assert not limits.fits_int64(2**63) and not limits.fits_int64(-(2**63) - 1)
    body = "[" * (limits.MAX_DEPTH + 1) + "]" * (limits.MAX_DEPTH + 1)
    with pytest.raises(parsing.HostileInput, match=f"deeper than {limits.MAX_DEPTH} levels"):
        parsing.loads(body)
    parsing.loads("[" * limits.MAX_DEPTH + "]" * limits.MAX_DEPTH)  # the limit itself is allowed, in both
    path = tmp_path / "val.json"
    path.write_text("[" * limits.MAX_DEPTH + "]" * limits.MAX_DEPTH)
    jsonstream.check_bounds(path)
    path.write_text(body)
    with pytest.raises(ParseError, match=f"deeper than {limits.MAX_DEPTH} levels"):
        jsonstream.check_bounds(path)
    assert (
        limits.unstorable_name("a\x00") == "a NUL character" and limits.unstorable_name("\udc00") == "a lone surrogate"
    )
    assert limits.unstorable_name("fine") is None


@pytest.mark.parametrize(
    "body, field",
    [
        ('{"quotas": {"x": [1, 2, ' + "[" * 40 + "]" * 40 + "]}}", "quotas.x[2][0][0][0][0][0]…"),
        ('{"note": "[[[[ {{ is text", "a": ' + '{"b": ' * 40 + "1" + "}" * 41, "a.b.b.b.b.b.b.b…"),
        ("[" * 100_000 + "]" * 100_000, "[0][0][0][0][0][0][0][0]…"),
    ],
)
def test_a_body_nested_too_deep_names_the_field(body, field):
    with pytest.raises(parsing.HostileInput) as info:
        parsing.loads(body)
    assert (info.value.field, info.value.message) == (field, f"JSON nested deeper than {limits.MAX_DEPTH} levels")


def test_bodies_and_files_write_a_field_path_alike():
    assert limits.json_path(["img_set", "members", 2]) == "img_set.members[2]"
    assert limits.json_path([0, "a\x00b", "c" * 70]) == "[0].a\\u0000b." + "c" * 60 + "…"
    assert limits.json_path(["a"] * 9) == "a.a.a.a.a.a.a.a…" and limits.json_path([]) == ""
