"""audit.labels: the shortcut-audit label rule, supports and per-retriever scores."""

from __future__ import annotations

import json
import math

import pytest

from audit.labels import audit_json, label_queries

# Two retrievers, K = 10. Rows: (query, retriever, mm, text, image).
POOL = [
    ("q1", "A", 1, 10, 50),  # text == K -> hit
    ("q1", "B", 2, 30, 11),  # image == K + 1 -> miss
    ("q2", "A", 5, 11, 11),
    ("q2", "B", 12, 40, None),
    ("q3", "A", 11, 20, 30),
    ("q3", "B", None, None, None),
    ("q4", "A", 3, 4, 40),  # text by A ...
    ("q4", "B", 7, 60, 9),  # ... image by B -> both_unimodal
    ("q5", "A", None, None, 10),  # B has no row for q5
    ("q6", "A", 10, 11, 11),
    ("q6", "B", 1, None, 12),
]


def test_labels_and_details_at_k_boundary():
    audit = label_queries(POOL, k=10)
    assert audit.labels == {
        "q1": "shortcut_solvable",
        "q2": "composition_required",
        "q3": "unresolved",
        "q4": "shortcut_solvable",
        "q5": "shortcut_solvable",
        "q6": "composition_required",
    }
    assert audit.detail == {
        "q1": "text_only",
        "q2": "composition_required",
        "q3": "unresolved",
        "q4": "both_unimodal",
        "q5": "image_only",
        "q6": "composition_required",
    }
    assert audit.counts == {
        "composition_required": 2,
        "unresolved": 1,
        "shortcut_solvable": 3,
        "shortcut_free": 3,
    }
    assert audit.detail_counts == {
        "both_unimodal": 1,
        "text_only": 1,
        "image_only": 1,
        "composition_required": 2,
        "unresolved": 1,
    }
    assert audit.shortcut_free == ["q2", "q3", "q6"]
    assert audit.legacy["q4"] == "either"
    assert audit.legacy["q2"] == "multimodal_needed"


def test_k_parameter_moves_the_boundary():
    # with K = 9, q1's text rank 10 no longer hits and q6's mm ranks are 10 (A) and 1 (B)
    audit = label_queries(POOL, k=9)
    assert audit.labels["q1"] == "composition_required"  # mm 1 and 2 still <= 9
    assert audit.labels["q5"] == "unresolved"  # image 10 > 9, no mm
    assert audit.detail["q4"] == "both_unimodal"  # text 4, image 9


def test_min_mm_retrievers_two():
    audit = label_queries(POOL, k=10, min_mm_retrievers=2)
    assert audit.labels["q2"] == "unresolved"  # only A has mm <= 10
    assert audit.labels["q6"] == "composition_required"  # A (10) and B (1)
    assert audit.counts == {
        "composition_required": 1,
        "unresolved": 2,
        "shortcut_solvable": 3,
        "shortcut_free": 3,
    }


def test_support_and_histograms():
    audit = label_queries(POOL, k=10)
    assert audit.support["q1"] == {
        "multimodal": 2,
        "text_only": 1,
        "image_only": 0,
        "either_unimodal": 1,
    }
    assert audit.support["q4"] == {
        "multimodal": 2,
        "text_only": 1,
        "image_only": 1,
        "either_unimodal": 2,
    }
    assert audit.support_histograms == {
        "multimodal": {0: 2, 1: 1, 2: 3},
        "text_only": {0: 4, 1: 2},
        "image_only": {0: 4, 1: 2},
        "either_unimodal": {0: 3, 1: 2, 2: 1},
    }


def test_best_ranks_and_best_retriever():
    audit = label_queries(POOL, k=10)
    assert audit.best_ranks["q4"] == {"multimodal": 3, "text_only": 4, "image_only": 9}
    assert audit.best_retriever["q4"] == {"multimodal": "A", "text_only": "A", "image_only": "B"}
    assert audit.best_ranks["q3"] == {"multimodal": 11, "text_only": 20, "image_only": 30}
    # equal ranks: the retriever whose name sorts first wins
    tie = label_queries([("q", "zeta", 1, 5, None), ("q", "alpha", 1, 7, None)])
    assert tie.best_retriever["q"] == {
        "multimodal": "alpha",
        "text_only": "zeta",
        "image_only": None,
    }
    assert tie.best_ranks["q"]["image_only"] is None


def test_ties_between_modalities():
    audit = label_queries([("a", "R", 10, 10, 10), ("b", "R", 5, 5, 50), ("c", "R", 5, 50, 5), ("d", "R", 10, 11, 11)])
    assert audit.detail == {
        "a": "both_unimodal",
        "b": "text_only",
        "c": "image_only",
        "d": "composition_required",
    }


def test_duplicate_rows_take_best_rank_per_modality():
    audit = label_queries([("q", "A", 20, None, 15), ("q", "A", None, 12, 9)])
    assert audit.best_ranks["q"] == {"multimodal": 20, "text_only": 12, "image_only": 9}
    assert audit.detail["q"] == "image_only"
    assert audit.support["q"]["image_only"] == 1
    # the same retriever twice still counts once towards min_mm_retrievers
    dup = label_queries([("q", "A", 3, 50, 50), ("q", "A", 4, 50, 50)], min_mm_retrievers=2)
    assert dup.labels["q"] == "unresolved"
    assert dup.support["q"]["multimodal"] == 1


def test_missing_rows_count_as_not_retrieved():
    # B never saw q2: no shortcut, no multimodal hit from B
    audit = label_queries([("q1", "A", 1, 1, 1), ("q1", "B", 1, 1, 1), ("q2", "A", 20, 20, 20)])
    assert audit.labels["q2"] == "unresolved"
    stats_b = audit.retriever_stats["B"]
    assert stats_b["recall_at_k"] == {"multimodal": 0.5, "text_only": 0.5, "image_only": 0.5}
    assert stats_b["mrr"]["multimodal"] == 0.5


def test_per_retriever_scores():
    audit = label_queries(POOL, k=10)
    a = audit.retriever_stats["A"]
    # A over q1..q6: mm [1,5,11,3,None,10], text [10,11,20,4,None,11], image [50,11,30,40,10,11]
    assert a["recall_at_k"] == pytest.approx({"multimodal": 4 / 6, "text_only": 2 / 6, "image_only": 1 / 6})
    mm_mrr = (1 + 1 / 5 + 1 / 11 + 1 / 3 + 0 + 1 / 10) / 6
    text_mrr = (1 / 10 + 1 / 11 + 1 / 20 + 1 / 4 + 0 + 1 / 11) / 6
    image_mrr = (1 / 50 + 1 / 11 + 1 / 30 + 1 / 40 + 1 / 10 + 1 / 11) / 6
    assert a["mrr"]["multimodal"] == pytest.approx(mm_mrr)
    assert a["mrr"]["text_only"] == pytest.approx(text_mrr)
    assert a["comp_gap_mrr"] == pytest.approx(1 - max(text_mrr, image_mrr) / mm_mrr)

    def nd(ranks):
        return sum(0.0 if r is None else 1 / math.log2(1 + r) for r in ranks) / len(ranks)

    mm_nd = nd([1, 5, 11, 3, None, 10])
    text_nd = nd([10, 11, 20, 4, None, 11])
    image_nd = nd([50, 11, 30, 40, 10, 11])
    assert a["ndcg"]["multimodal"] == pytest.approx(mm_nd)
    assert a["comp_gap_ndcg"] == pytest.approx(1 - max(text_nd, image_nd) / mm_nd)

    b = audit.retriever_stats["B"]
    # B: mm [2,12,None,7,None,1], text [30,40,None,60,None,None], image [11,None,None,9,None,12]
    assert b["recall_at_k"] == pytest.approx({"multimodal": 3 / 6, "text_only": 0.0, "image_only": 1 / 6})
    assert b["mrr"]["image_only"] == pytest.approx((1 / 11 + 1 / 9 + 1 / 12) / 6)


def test_comp_gap_undefined_when_multimodal_never_retrieves():
    audit = label_queries([("q", "R", None, 3, None)])
    assert audit.retriever_stats["R"]["comp_gap_ndcg"] is None
    assert audit.retriever_stats["R"]["comp_gap_mrr"] is None


def test_audit_json_exact_shape():
    doc = audit_json(label_queries(POOL[:2], k=10))
    assert doc == {
        "counts": {
            "composition_required": 0,
            "unresolved": 0,
            "shortcut_solvable": 1,
            "shortcut_free": 0,
        },
        "detail_counts": {
            "both_unimodal": 0,
            "text_only": 1,
            "image_only": 0,
            "composition_required": 0,
            "unresolved": 0,
        },
        "labels": {"q1": "shortcut_solvable"},
        "retrievers": {
            "A": {
                "recall_at_k": {"multimodal": 1.0, "text_only": 1.0, "image_only": 0.0},
                "mrr": {"multimodal": 1.0, "text_only": 0.1, "image_only": 0.02},
                "ndcg": {
                    "multimodal": 1.0,
                    "text_only": pytest.approx(1 / math.log2(11)),
                    "image_only": pytest.approx(1 / math.log2(51)),
                },
                "comp_gap_ndcg": pytest.approx(1 - 1 / math.log2(11)),
                "comp_gap_mrr": pytest.approx(0.9),
                # one positive per query: AP@K = 1 / rank within K
                "map_at_k": {
                    "5": {"multimodal": 1.0, "text_only": 0.0, "image_only": 0.0},
                    "10": {"multimodal": 1.0, "text_only": pytest.approx(0.1), "image_only": 0.0},
                    "25": {"multimodal": 1.0, "text_only": pytest.approx(0.1), "image_only": 0.0},
                    "50": {"multimodal": 1.0, "text_only": pytest.approx(0.1), "image_only": pytest.approx(0.02)},
                },
            },
            "B": {
                "recall_at_k": {"multimodal": 1.0, "text_only": 0.0, "image_only": 0.0},
                "mrr": {"multimodal": 0.5, "text_only": pytest.approx(1 / 30), "image_only": pytest.approx(1 / 11)},
                "ndcg": {
                    "multimodal": pytest.approx(1 / math.log2(3)),
                    "text_only": pytest.approx(1 / math.log2(31)),
                    "image_only": pytest.approx(1 / math.log2(12)),
                },
                "comp_gap_ndcg": pytest.approx(1 - math.log2(3) / math.log2(12)),
                "comp_gap_mrr": pytest.approx(1 - (1 / 11) / 0.5),
                "map_at_k": {
                    "5": {"multimodal": 0.5, "text_only": 0.0, "image_only": 0.0},
                    "10": {"multimodal": 0.5, "text_only": 0.0, "image_only": 0.0},
                    "25": {"multimodal": 0.5, "text_only": 0.0, "image_only": pytest.approx(1 / 11)},
                    "50": {"multimodal": 0.5, "text_only": pytest.approx(1 / 30), "image_only": pytest.approx(1 / 11)},
                },
            },
        },
    }
    json.dumps(doc)  # serialisable


def test_empty_and_invalid_input():
    audit = label_queries([])
    assert audit.counts == {
        "composition_required": 0,
        "unresolved": 0,
        "shortcut_solvable": 0,
        "shortcut_free": 0,
    }
    assert audit.labels == {} and audit.retriever_stats == {}
    with pytest.raises(ValueError):
        label_queries([("q", "R", -1, 3, 4)])
    with pytest.raises(ValueError):
        label_queries([("q", "R", 1, 3)])
    with pytest.raises(ValueError):
        label_queries([("q", "R", [1, 0], 3, 4)])


def test_rank_lists_use_the_best_for_labels_and_every_rank_for_map():
    # query x: positives at ranks (mm) 3 and 12, text 40 and 8 -> best text 8 <= K: shortcut
    audit = label_queries([("x", "R", [3, 12], [40, 8], [None, 60]), ("y", "R", 20, 30, 40)], k=10)
    assert audit.labels == {"x": "shortcut_solvable", "y": "unresolved"}
    assert audit.best_ranks["x"] == {"multimodal": 3, "text_only": 8, "image_only": 60}
    stats = audit.retriever_stats["R"]
    # AP@10 of x (mm): hit at 3 only, G = 2 -> (1/3) / 2; y: 0
    assert stats["map_at_k"]["10"]["multimodal"] == pytest.approx((1 / 3) / 2 / 2)
    # AP@25 of x: (1/3 + 2/12) / 2; y: rank 20 -> 1/20
    assert stats["map_at_k"]["25"]["multimodal"] == pytest.approx(((1 / 3 + 2 / 12) / 2 + 1 / 20) / 2)
    assert stats["recall_at_k"]["multimodal"] == 0.5
    assert audit_json(audit)["retrievers"]["R"]["map_at_k"]["10"]["text_only"] == pytest.approx((1 / 8) / 2 / 2)


# Seven rows of the CIRCUS CIRCO shortcut-free export
# (reference/circus/croissant/exports/circo_shortcut_free.csv, commit 067e7277):
# query_idx, best rank (mm, text, image), aggregate_label / detail_label.
CIRCO_ROWS = [
    (2, 1, 14, 11, "composition_required"),
    (21, 1, 11, 15, "composition_required"),
    (127, 4, 104, 11, "composition_required"),
    (140, 9, 90, 62, "composition_required"),
    (134, 16, 66, 737, "unresolved"),
    (157, 245, 1320, 1405, "unresolved"),
    (207, 70, 60, 604, "unresolved"),
]


def test_circus_best_rank_rows_reproduce_published_labels():
    audit = label_queries([(q, "best", mm, t, i) for q, mm, t, i, _ in CIRCO_ROWS], k=10)
    for q, _, _, _, label in CIRCO_ROWS:
        assert audit.labels[q] == label
        assert audit.detail[q] == label
        assert audit.legacy[q] == "multimodal_needed"
