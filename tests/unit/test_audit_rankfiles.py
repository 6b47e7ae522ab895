"""Reading CIRCUS-layout rank files (hand-written fixtures; pure Python)."""

from __future__ import annotations

import json

import pytest

from audit.rankfiles import RankFileError, parse_rank_document, path_suffixes, read_rank_file
from retrieval.records import ParseError
from tests.conftest import FIXTURES

DIR = FIXTURES / "circus_audit"


def test_per_retriever_file():
    f = read_rank_file(DIR / "retrieval_data_tiny_task7_alpha.json")
    assert not f.aggregated and f.retriever == "alpha" and f.dataset == "tiny" and f.k == 10
    assert f.gallery_size == 16 and [s.query_idx for s in f.samples] == list(range(6))
    s4 = f.samples[4]
    assert (s4.mm, s4.text, s4.image) == (15, 60, 11)
    assert s4.query_text == "on a beach" and s4.label is None
    assert len(f.samples[0].top_mm) == 12 and f.samples[0].top_mm[1] == 1  # target (index 1) at rank 2


def test_aggregated_file():
    f = read_rank_file(DIR / "retrieval_data_tiny_task7_aggregated_best_rank_mm_any.json")
    assert f.aggregated and f.retriever == "aggregated:best_rank_mm_recoverable"
    assert f.pool == ["alpha", "beta"]
    s5 = f.samples[5]
    assert (s5.mm, s5.text, s5.image) == (4, 11, 10)
    assert (s5.label, s5.detail_label) == ("shortcut_solvable", "image_only")
    assert s5.support == {"multimodal": 2, "text_only": 0, "image_only": 1, "either_unimodal": 1}


def doc(**sample):
    base = {"query_idx": 0, "ranks": {"multimodal": 1, "text_only": None, "image_only": 3}}
    base.update(sample)
    return {"metadata": {"k": 10}, "gallery_paths": ["/x/a.png"], "samples": [base]}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"query_idx": -1}, "sample 0, field 'query_idx'"),
        ({"query_idx": "3"}, "sample 0, field 'query_idx'"),
        ({"ranks": {"multimodal": 1, "text_only": 2}}, "field 'ranks.image_only': missing"),
        ({"ranks": {"multimodal": 0, "text_only": 2, "image_only": 3}}, "field 'ranks.multimodal'"),
        ({"ranks": {"multimodal": 1, "text_only": True, "image_only": 3}}, "field 'ranks.text_only'"),
        ({"retrievals": {"multimodal": [0, 5]}}, "field 'retrievals.multimodal'"),
    ],
)
def test_malformed_samples_name_sample_and_field(change, message):
    with pytest.raises(RankFileError, match=message.replace("(", r"\(")):
        parse_rank_document(doc(**change), "f.json")


def test_duplicate_query_idx_and_bad_top_level(tmp_path):
    d = doc()
    d["samples"].append(dict(d["samples"][0]))
    with pytest.raises(RankFileError, match="sample 1, field 'query_idx': 0 appears twice"):
        parse_rank_document(d, "f.json")
    with pytest.raises(RankFileError, match="field 'samples'"):
        parse_rank_document({"metadata": {}}, "f.json")
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(RankFileError, match="not valid JSON"):
        read_rank_file(bad)


def test_names_and_null_ranks():
    f = parse_rank_document(doc(), "/some/dir/retrieval_data_cirr_task7_lamra_qwen25vl.json")
    assert f.retriever == "lamra_qwen25vl" and f.samples[0].text is None
    f = parse_rank_document(json.loads(json.dumps(doc())), "ranks.json")
    assert f.retriever == "ranks"
    assert path_suffixes("/home/x/CIRCO/img/1.jpg") == [
        "home/x/CIRCO/img/1.jpg",
        "x/CIRCO/img/1.jpg",
        "CIRCO/img/1.jpg",
        "img/1.jpg",
        "1.jpg",
    ]


@pytest.mark.parametrize(
    "document, record, field, message",
    [
        ([1], None, None, "expected a JSON object for this rank file"),
        ({"samples": []}, None, "metadata", "missing field"),
        ({"metadata": [], "samples": []}, None, "metadata", "expected an object, got list"),
        ({"metadata": {}, "samples": {}}, None, "samples", "expected a list, got object"),
        (
            {"metadata": {}, "samples": [], "gallery_paths": ["a", 3]},
            None,
            "gallery_paths",
            "expected a list of strings, got list of number/string",
        ),
        ({"metadata": {"k": 0}, "samples": []}, None, "metadata.k", "must be an integer >= 1, got 0"),
        ({"metadata": {"k": "10"}, "samples": []}, None, "metadata.k", "expected an integer, got string"),
        ({"metadata": {}, "samples": ["x"]}, 0, None, "expected a JSON object for this sample, got string"),
    ],
)
def test_header_errors_are_parse_errors_naming_file_and_field(document, record, field, message):
    with pytest.raises(RankFileError) as info:
        parse_rank_document(document, "f.json")
    err = info.value
    assert isinstance(err, ParseError)  # what the importers raise; RankFileError is what callers catch
    assert (err.file, err.record, err.field) == ("f.json", record, field)
    assert message in err.message


@pytest.mark.parametrize(
    "change, field, message",
    [
        (
            {"ranks": {"multimodal": [1, [2]], "text_only": 2, "image_only": 3}},
            "ranks.multimodal[1]",
            "cannot hold another list",
        ),
        (
            {"ranks": {"multimodal": [1, 0], "text_only": 2, "image_only": 3}},
            "ranks.multimodal[1]",
            "a rank must be an integer >= 1",
        ),
        ({"ranks": {"multimodal": [], "text_only": 2, "image_only": 3}}, "ranks.multimodal", "an empty list of ranks"),
        ({"ranks": [1, 2, 3]}, "ranks", "expected an object, got list"),
        ({"retrievals": {"multimodal": ["0"]}}, "retrievals.multimodal", "expected a list of integers"),
        (
            {"retrievals": {"multimodal": [3]}},
            "retrievals.multimodal",
            "3 is not a gallery index (the file lists 1 paths)",
        ),
        ({"query_text": 5}, "query_text", "expected a string, got number"),
    ],
)
def test_sample_errors_name_the_sample_and_the_nested_field(change, field, message):
    with pytest.raises(RankFileError) as info:
        parse_rank_document(doc(**change), "f.json")
    err = info.value
    assert (err.file, err.record, err.field) == ("f.json", 0, field)
    assert str(err).startswith(f"f.json, sample 0, field '{field}': ") and message in err.message


def test_aggregated_file_needs_an_aggregation_block_per_sample():
    d = doc()
    d["metadata"]["aggregation"] = {"name": "best", "retrievers": ["a", "b"]}
    with pytest.raises(RankFileError, match="f.json, sample 0, field 'aggregation': missing in an aggregated file"):
        parse_rank_document(d, "f.json")
    d["samples"][0]["aggregation"] = {"label": 3}
    with pytest.raises(RankFileError, match="field 'aggregation.label': expected a string, got number"):
        parse_rank_document(d, "f.json")
    d["samples"][0]["aggregation"] = {"label": "unresolved", "retriever_support_at_k": {"multimodal": 1, "x": "2"}}
    sample = parse_rank_document(d, "f.json").samples[0]
    assert (sample.label, sample.support) == ("unresolved", {"multimodal": 1})


def test_duplicate_query_idx_names_both_samples():
    d = doc()
    d["samples"].append(dict(d["samples"][0]))
    with pytest.raises(RankFileError) as info:
        parse_rank_document(d, "f.json")
    assert (info.value.record, info.value.field) == (1, "query_idx")
    assert info.value.message == "0 appears twice (first in sample 0)"


def test_unreadable_and_invalid_json_files_are_rank_file_errors(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"metadata": {}, ')
    with pytest.raises(RankFileError) as info:
        read_rank_file(bad)
    assert info.value.file == str(bad) and str(info.value).startswith(f"{bad}: not valid JSON")
    assert "premature EOF" in str(info.value)
    with pytest.raises(RankFileError, match="cannot read"):
        read_rank_file(tmp_path / "missing.json")


@pytest.mark.parametrize(
    "text,words",
    [
        ('{"metadata": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper than 32 levels"),
        ('{"metadata": {"k": ' + "9" * 5000 + "}}", "64-bit range"),
        ('{"metadata": {}, "samples": [{"query_idx": ' + "1" * 30 + "}]}", "64-bit range"),
        ('{"metadata": {"dataset": "a\\u0000b"}}', "NUL character"),
        ('{"metadata": {"dataset": "a\\ud800b"}}', "lone surrogate"),
    ],
)
def test_hostile_rank_files_are_refused_before_they_are_parsed(tmp_path, text, words):
    """Deep nesting, huge integers, NUL and lone surrogates: a RankFileError in words, from
    the bounded pre-pass (never a RecursionError, a ValueError or a "?" stored for a surrogate)."""
    bad = tmp_path / "retrieval_data_cirr_task7_x.json"
    bad.write_text(text)
    with pytest.raises(RankFileError, match=words):
        read_rank_file(bad)


def test_rank_files_are_streamed_sample_by_sample(tmp_path):
    """Samples may come before the header; the result is the same as from the loaded document."""
    d = doc()
    reordered = {"samples": d["samples"], **{k: v for k, v in d.items() if k != "samples"}}
    path = tmp_path / "retrieval_data_cirr_task7_lamra_qwen25vl.json"
    path.write_text(json.dumps(reordered))
    streamed = read_rank_file(path)
    loaded = parse_rank_document(json.loads(json.dumps(d)), str(path))
    assert streamed == loaded and len(streamed.samples) == len(d["samples"])


@pytest.mark.parametrize(
    "text, where, says",
    [
        (
            '{"metadata": {"k": 10}, "gallery_paths": [], "samples": [{"query_idx": 0, "ranks": {"multimodal": 1,'
            ' "text_only": 2, "image_only": 3}}, {"query_idx": 1, "ranks": {"multimodal": NaN, "text_only": 2}}]}',
            "sample 1, field 'ranks.multimodal'",
            "non-standard JSON number NaN",
        ),
        (
            '{"metadata": {"k": 10}, "gallery_paths": [], "samples": [{"query_idx": 0, "ranks": {"multimodal": -Infinity}}]}',
            "sample 0, field 'ranks.multimodal'",
            "non-standard JSON number -Infinity",
        ),
        (
            '{"metadata": {"k": 10}, "gallery_paths": [], "samples": [{"query_idx": 0, "ranks": {"multimodal": 1}},'
            ' {"query_idx": 1, "ranks": {"text_only": 4',
            "sample 1, field 'ranks.text_only'",
            "not valid JSON: the file ends inside this sample; truncated?",
        ),
    ],
)
def test_invalid_json_in_a_sample_names_the_sample_and_the_field(tmp_path, text, where, says):
    bad = tmp_path / "retrieval_data_tiny_task7_x.json"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(RankFileError) as err:
        read_rank_file(bad)
    assert f"{bad}, {where}: {says}" in str(err.value)


def test_gallery_paths_are_streamed_and_only_the_named_ones_kept(tmp_path):
    """gallery_paths is counted and type-checked item by item; the file keeps only the paths the
    samples' top lists name, or what ``keep`` makes of them (memory does not grow with the gallery: bench/rankfile_memory.py)."""
    d = doc(retrievals={"multimodal": [7, 2]})
    d["gallery_paths"] = [f"/x/{n}.png" for n in range(10)]
    d["samples"].append(
        {
            "query_idx": 1,
            "ranks": {"multimodal": None, "text_only": 1, "image_only": 2},
            "retrievals": {"multimodal": [2, 9]},
        }
    )
    path = tmp_path / "retrieval_data_cirr_task7_alpha.json"
    path.write_text(
        json.dumps({"samples": d["samples"], "gallery_paths": d["gallery_paths"], "metadata": d["metadata"]})
    )
    streamed = read_rank_file(path)
    assert streamed.gallery_size == 10
    assert streamed.gallery_paths == {2: "/x/2.png", 7: "/x/7.png", 9: "/x/9.png"}
    assert streamed == parse_rank_document(json.loads(json.dumps(d)), str(path))
    ids = {"/x/2.png": 12, "/x/9.png": 19}  # what the importer keeps: the dataset's image ids, not the paths
    assert (
        read_rank_file(path, keep=ids.get).gallery_paths
        == {2: 12, 9: 19}
        == parse_rank_document(d, "f", ids.get).gallery_paths
    )


@pytest.mark.parametrize(
    "gallery, message",
    [
        (["a", 3, None], "expected a list of strings, got list of null/number/string"),
        ({"a": 1}, "expected a list of strings, got object"),
        ("a", "expected a list of strings, got string"),
    ],
)
def test_a_streamed_gallery_that_is_not_a_list_of_strings_is_refused_as_a_loaded_one(tmp_path, gallery, message):
    d = {"metadata": {}, "gallery_paths": gallery, "samples": []}
    path = tmp_path / "retrieval_data_cirr_task7_alpha.json"
    path.write_text(json.dumps(d))
    for read in (lambda: read_rank_file(path), lambda: parse_rank_document(d, str(path))):
        with pytest.raises(RankFileError) as info:
            read()
        assert (info.value.field, info.value.message) == ("gallery_paths", message)
