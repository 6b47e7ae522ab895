"""Reading CIRCUS-layout rank files (hand-written fixtures; pure Python)."""
from __future__ import annotations

import json

import pytest

from audit.rankfiles import RankFileError, parse_rank_document, path_suffixes, read_rank_file
from tests.conftest import FIXTURES

DIR = FIXTURES / "circus_audit"


def test_per_retriever_file():
    f = read_rank_file(DIR / "retrieval_data_tiny_task7_alpha.json")
    assert not f.aggregated and f.retriever == "alpha" and f.dataset == "tiny" and f.k == 10
    assert len(f.gallery_paths) == 16 and [s.query_idx for s in f.samples] == list(range(6))
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
    assert path_suffixes("/home/x/CIRCO/img/1.jpg") == ["home/x/CIRCO/img/1.jpg", "x/CIRCO/img/1.jpg",
                                                       "CIRCO/img/1.jpg", "img/1.jpg", "1.jpg"]
