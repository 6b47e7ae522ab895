"""Importers take real files as they come: non-standard numbers, names, duplicates, streaming.

Real records come from tests/fixtures/datasets (see the README there for their origin);
malformed variants are written into temporary folders.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from retrieval import importers
from retrieval.importers import circled, circo, cirr, fashioniq, lasco, mbeir, mtfiq
from retrieval.importers.jsonstream import iter_list
from retrieval.records import ParsedDataset, ParseError

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"


def raises(fn, *args, **kwargs) -> ParseError:
    with pytest.raises(ParseError) as info:
        fn(*args, **kwargs)
    return info.value


def real(*parts: str):
    return json.loads(DATA.joinpath(*parts).read_text(encoding="utf-8"))


def copy(tmp_path: Path, source: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copyfile(source, target)
    return target


# --------------------------------------------------------------------------- non-standard numbers


def _with_token(records: list, index: int, key_path: list[str], token: str) -> str:
    """``records`` as JSON text, with the value at ``records[index][key_path...]`` replaced by ``token``."""
    marker = "__NONSTANDARD__"
    target = records[index]
    for key in key_path[:-1]:
        target = target[key]
    target[key_path[-1]] = marker
    return json.dumps(records).replace(f'"{marker}"', token)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_cirr_soft_score_that_is_not_a_finite_number_names_file_record_and_field(tmp_path, token):
    records = real("cirr", "cap.rc2.val.sample.json")
    soft_key = next(iter(records[3]["target_soft"]))
    path = tmp_path / "cap.rc2.val.json"
    path.write_text(_with_token(records, 3, ["target_soft", soft_key], token))
    err = raises(cirr.parse, [path])
    assert (err.file, err.record, err.field) == (str(path), 3, f"target_soft.{soft_key}")
    assert "finite" in err.message or token in err.message


def test_circo_nan_in_a_list_names_the_list_field(tmp_path):
    records = real("circo", "val.json")[:5]
    path = tmp_path / "val.json"
    path.write_text(
        json.dumps(records).replace(f'"gt_img_ids": [{records[2]["gt_img_ids"][0]}', '"gt_img_ids": [NaN', 1)
    )
    err = raises(circo.parse, [path])
    assert (err.record, err.field) == (2, "gt_img_ids[0]")
    assert "NaN" in err.message


def test_mbeir_jsonl_nan_and_infinity_name_line_record_and_field(tmp_path):
    lines = (DATA / "mbeir" / "mbeir_cirr_task7_test.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad["task_id"] = "__X__"
    path = tmp_path / "mbeir_cirr_task7_test.jsonl"
    path.write_text("\n".join([lines[0], json.dumps(bad).replace('"__X__"', "Infinity")]) + "\n")
    err = raises(mbeir.parse, [path])
    assert (err.record, err.field) == (1, "task_id")
    assert ", line 2, field" in str(err) and "Infinity" in err.message


def test_mbeir_qrels_nan_relevance_is_refused(tmp_path):
    queries = copy(tmp_path, DATA / "mbeir" / "mbeir_cirr_task7_test.jsonl", "mbeir_cirr_task7_test.jsonl")
    qrels = tmp_path / "mbeir_cirr_task7_test_qrels.txt"
    qrels.write_text("8:1 0 8:2 1\n8:1 0 8:3 nan\n")
    err = raises(mbeir.parse, [queries, qrels])
    assert (err.file, err.record, err.field) == (str(qrels), 1, "relevance")


# --------------------------------------------------------------------------- error positions


def test_truncated_single_line_file_names_the_record_not_a_column(tmp_path):
    records = real("cirr", "cap.rc2.val.sample.json")
    text = json.dumps(records)  # one line
    cut = text.index(json.dumps(records[40])) + 25  # inside record 40
    path = tmp_path / "cap.rc2.val.json"
    path.write_text(text[:cut])
    err = raises(cirr.parse, [path])
    assert (err.record, err.field) == (40, None)
    assert "record 40 is the last complete one" in err.message and ", record 41:" in str(err)  # 1-based
    assert "column" not in err.message


def test_records_stream_before_the_end_of_the_file_is_read(tmp_path):
    records = real("circo", "val.json")[:3]
    path = tmp_path / "val.json"
    path.write_text(json.dumps(records)[:-1] + ", {broken")
    seen = []
    with pytest.raises(ParseError) as info:
        for index, record in iter_list(path):
            seen.append((index, record))
    assert seen == list(enumerate(records))
    assert info.value.record == 3


# --------------------------------------------------------------------------- roles from content


def test_circled_file_named_otherwise_takes_the_subset_from_its_records(tmp_path):
    path = copy(tmp_path, DATA / "circled" / "cirr_val.json", "sessions-download (1).json")
    ds = circled.parse([path])
    expected = real("circled", "cirr_val.json")
    assert [q.external_id for q in ds.queries] == [s["session_id"] for s in expected]
    assert {q.category for q in ds.queries} == {"cirr_val"} and {q.split for q in ds.queries} == {"val"}
    assert ds.images["dev-244-0-img0"].path == "dev/dev-244-0-img0.png"


def test_circled_records_win_over_a_misleading_name_with_a_warning(tmp_path):
    path = copy(tmp_path, DATA / "circled" / "cirr_val.json", "circo_val.json")
    ds = circled.parse([path])
    assert {q.category for q in ds.queries} == {"cirr_val"}
    assert any("used the records'" in w for w in ds.warnings)


def test_circled_subset_override(tmp_path):
    path = copy(tmp_path, DATA / "circled" / "fashioniq_dress_val.json", "x.json")
    ds = circled.parse([path], subset="fashioniq_dress_train")
    assert {q.split for q in ds.queries} == {"train"} and {q.category for q in ds.queries} == {"fashioniq_dress_train"}


def test_circled_without_subset_anywhere_says_what_was_expected(tmp_path):
    sessions = [{k: v for k, v in s.items() if k != "subset"} for s in real("circled", "cirr_val.json")]
    path = tmp_path / "download.json"
    path.write_text(json.dumps(sessions))
    err = raises(circled.parse, [path])
    assert err.file == str(path)
    assert "--subset" in err.message and "cirr_<split>" in err.message


def test_mtfiq_release_dress_json_is_accepted(tmp_path):
    path = copy(tmp_path, DATA / "mtfiq" / "dress.val.sample.json", "dress.json")
    ds = mtfiq.parse([path])
    expected = real("mtfiq", "dress.val.sample.json")
    assert len(ds.queries) == len(expected)
    assert {q.category for q in ds.queries} == {"dress"} and {q.split for q in ds.queries} == {mtfiq.UNSPLIT}
    assert any("--split" in w for w in ds.warnings)
    assert {q.split for q in mtfiq.parse([path], split="extra").queries} == {"extra"}


def test_fashioniq_odd_names_take_role_from_content_and_tokens(tmp_path):
    cap = copy(tmp_path, DATA / "fashioniq" / "cap.dress.val.sample.json", "dress_val_captions.json")
    gallery = copy(tmp_path, DATA / "fashioniq" / "split.dress.val.sample.json", "dress-val-images.json")
    ds = fashioniq.parse([cap, gallery])
    assert len(ds.queries) == len(real("fashioniq", "cap.dress.val.sample.json"))
    assert set(ds.galleries) == {"dress/val"}
    assert {q.extra.get("gallery") for q in ds.queries} == {"dress/val"}


def test_fashioniq_name_without_category_needs_subset(tmp_path):
    cap = copy(tmp_path, DATA / "fashioniq" / "cap.dress.val.sample.json", "captions_val.json")
    err = raises(fashioniq.parse, [cap])
    assert "category" in err.message and "--subset" in err.message and "cap.<category>.<split>.json" in err.message
    ds = fashioniq.parse([cap], subset="dress")
    assert {q.category for q in ds.queries} == {"dress"} and {q.split for q in ds.queries} == {"val"}


def test_cirr_roles_from_content_and_split_override(tmp_path):
    cap = copy(tmp_path, DATA / "cirr" / "cap.rc2.val.sample.json", "captions.json")
    ext = copy(tmp_path, DATA / "cirr" / "cap.ext.rc2.val.sample.json", "captions_more.json")
    split = copy(tmp_path, DATA / "cirr" / "split.rc2.val.sample.json", "images.json")
    err = raises(cirr.parse, [cap])
    assert "split" in err.message and "--split" in err.message
    ds = cirr.parse([cap, ext, split], split="val")
    ref = cirr.parse(
        [
            DATA / "cirr" / n
            for n in ("cap.rc2.val.sample.json", "cap.ext.rc2.val.sample.json", "split.rc2.val.sample.json")
        ]
    )
    assert [(q.external_id, [t.text for t in q.turns[0].texts]) for q in ds.queries] == [
        (q.external_id, [t.text for t in q.turns[0].texts]) for q in ref.queries
    ]
    assert ds.galleries == ref.galleries


def test_circo_lasco_names_from_content(tmp_path):
    val = copy(tmp_path, DATA / "circo" / "val.json", "circo_val_annotations.json")
    assert len(circo.parse([val]).queries) == 220
    corpus = copy(tmp_path, DATA / "lasco" / "lasco_val_corpus.sample.json", "gallery.json")
    triplets = copy(tmp_path, DATA / "lasco" / "lasco_val.json", "lasco_val.json")
    ds = lasco.parse([triplets, corpus])
    assert len(ds.galleries["val"]) == len(real("lasco", "lasco_val_corpus.sample.json"))


def test_unknown_content_and_name_says_what_was_expected(tmp_path):
    path = tmp_path / "notes.json"
    path.write_text(json.dumps([{"hello": 1}]))
    err = raises(cirr.parse, [path])
    assert err.file == str(path) and "cap.rc2.<split>.json" in err.message


# --------------------------------------------------------------------------- gallery duplicates


def test_duplicate_gallery_asins_are_stored_once_with_a_warning(tmp_path):
    asins = real("mtfiq", "split.dress.val.sample.json")
    path = tmp_path / "split.dress.val.json"
    path.write_text(json.dumps(asins + asins[:3]))
    ds = mtfiq.parse([path])
    assert ds.galleries["dress/val"] == asins
    assert any("3 gallery entries are listed more than once" in w for w in ds.warnings)


def test_cirr_split_file_with_a_repeated_key_warns(tmp_path):
    text = (DATA / "cirr" / "split.rc2.val.sample.json").read_text()
    first = text.split("\n")[1]  # '"dev-...": "./dev/....png",'
    path = tmp_path / "split.rc2.val.json"
    path.write_text(text.replace(first, first + "\n" + first, 1))
    ds = cirr.parse([path])
    assert len(ds.galleries["val"]) == len(real("cirr", "split.rc2.val.sample.json"))
    assert any("1 gallery entry is listed more than once" in w for w in ds.warnings)


# --------------------------------------------------------------------------- stream and parse agree


@pytest.mark.parametrize(
    "fmt, files",
    [
        (
            "cirr",
            ["cirr/cap.rc2.val.sample.json", "cirr/cap.ext.rc2.val.sample.json", "cirr/split.rc2.val.sample.json"],
        ),
        (
            "mbeir",
            [
                "mbeir/mbeir_cirr_task7_test.jsonl",
                "mbeir/mbeir_cirr_task7_cand_pool.jsonl",
                "mbeir/mbeir_cirr_task7_test_qrels.txt",
            ],
        ),
    ],
)
def test_stream_yields_what_parse_collects(fmt, files):
    paths = [DATA / f for f in files]
    sink = ParsedDataset(format=fmt)
    streamed = list(importers.stream(fmt, paths, sink))
    parsed = importers.parse(fmt, paths)
    assert streamed == parsed.queries and sink.images == parsed.images and sink.galleries == parsed.galleries


def test_circled_session_id_repeated_in_another_file_of_the_split_is_refused(tmp_path):
    sessions = real("circled", "cirr_val.json")
    first = copy(tmp_path, DATA / "circled" / "cirr_val.json", "cirr_val.json")
    other = real("circled", "circo_val.json")
    other = [other[0], {**other[0], "session_id": sessions[0]["session_id"]}]
    second = tmp_path / "circo_val.json"
    second.write_text(json.dumps(other))
    err = raises(circled.parse, [first, second])
    assert (err.file, err.record, err.field) == (str(second), 1, "session_id")
    assert "cirr_val.json record 1" in err.message


def test_mbeir_qid_repeated_in_another_query_file_is_refused(tmp_path):
    source = DATA / "mbeir" / "mbeir_cirr_task7_test.jsonl"
    first = copy(tmp_path, source, "mbeir_cirr_task7_test.jsonl")
    second = copy(tmp_path, source, "mbeir_cirr_task8_test.jsonl")
    err = raises(mbeir.parse, [first, second])
    assert (err.file, err.record, err.field) == (str(second), 0, "qid")
