"""The benchmarks' prediction files as the leaderboard reads them (audit.leaderboard.files)."""

from __future__ import annotations

import json

import pytest

from audit.leaderboard.files import (
    PredictionFileError,
    SplitFacts,
    check_complete,
    check_predictions,
    positions,
    read_predictions,
)

FACTS = SplitFacts("val", ["q1", "q2"], {"t9": "test1"}, {f"img{i}" for i in range(8)}, {"q1": "img0", "q2": "img1"}, 5)


def _cirr(**lists) -> str:
    return json.dumps({"version": "rc2", "metric": "recall", **lists}, indent=1)


def test_cirr_recall_file_reads_its_lists_and_their_lines():
    text = _cirr(q1=[f"img{i}" for i in range(1, 7)], q2=[f"img{i}" for i in range(2, 8)])
    pred = check_predictions(read_predictions(text, "cirr", "r.json"), FACTS)
    assert pred.metric == "recall" and pred.lists["q1"][:2] == ["img1", "img2"]
    assert pred.line("q2") == text.splitlines().index(' "q2": [') + 1
    check_complete([pred], FACTS)
    assert positions(pred.lists["q1"], ["img3", "img0"]) == [3, None]


@pytest.mark.parametrize(
    "lists,words",
    [
        ({"t9": ["img1"] * 1}, ["belongs to split 'test1'", "another split", "query 't9'"]),
        ({"zz": [f"img{i}" for i in range(6)]}, ["unknown query id 'zz'"]),
        ({"q1": ["img1", "imgX", "img2", "img3", "img4"]}, ["unknown image id 'imgX'", "query 'q1'"]),
        ({"q1": ["img1", "img2"]}, ["fewer than the cut-off 5", "query 'q1'"]),
        ({"q1": ["img1", "img1", "img2", "img3", "img4"]}, ["listed twice"]),
    ],
)
def test_bad_cirr_files_name_line_and_query(lists, words):
    text = _cirr(**lists)
    with pytest.raises(PredictionFileError) as exc:
        check_predictions(read_predictions(text, "cirr", "r.json"), FACTS)
    assert "r.json, line " in str(exc.value)
    for word in words:
        assert word in str(exc.value)


def test_a_missing_query_and_a_bad_metric_are_refused():
    pred = check_predictions(read_predictions(_cirr(q1=[f"img{i}" for i in range(5)]), "cirr", "r.json"), FACTS)
    with pytest.raises(PredictionFileError, match="1 queries of split 'val' have no list, e.g. q2"):
        check_complete([pred], FACTS)
    with pytest.raises(PredictionFileError, match="'metric' must be one of recall, recall_subset"):
        read_predictions(json.dumps({"metric": "map"}), "cirr", "r.json")
    with pytest.raises(PredictionFileError, match="line 1.*not valid JSON"):
        read_predictions("{", "circo", "c.json")


def test_recall_subset_needs_three_and_circo_needs_integers():
    subset = json.dumps({"version": "rc2", "metric": "recall_subset", "q1": ["img1", "img2", "img3"]})
    assert check_predictions(read_predictions(subset, "cirr"), FACTS).metric == "recall_subset"
    with pytest.raises(PredictionFileError, match="image ids must be integers"):
        read_predictions(json.dumps({"0": ["a"]}), "circo", "c.json")


def test_fashioniq_lines_by_position_check_their_candidate():
    facts = SplitFacts(
        "val",
        ["dress/val/00000", "dress/val/00001"],
        {},
        {f"img{i}" for i in range(8)},
        {"dress/val/00000": "img0", "dress/val/00001": "img1"},
        5,
    )
    ranking = [f"img{i}" for i in range(2, 8)]
    good = "\n".join(json.dumps({"category": "dress", "candidate": f"img{n}", "ranking": ranking}) for n in range(2))
    pred = check_predictions(read_predictions(good, "fashioniq", "f.jsonl"), facts)
    assert set(pred.lists) == {"dress/val/00000", "dress/val/00001"}
    bad = good.replace('"candidate": "img1"', '"candidate": "img5"')
    with pytest.raises(PredictionFileError, match=r"f.jsonl, line 2, query 'dress/val/00001': candidate 'img5'"):
        check_predictions(read_predictions(bad, "fashioniq", "f.jsonl"), facts)
