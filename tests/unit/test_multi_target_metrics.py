"""mAP@K (CIRCO), graded nDCG and Recall_subset@K against hand-computed values."""

from __future__ import annotations

import math

import pytest

from retrieval.metrics import (
    MAP_KS,
    average_precision_at_k,
    hit_positions,
    map_at_k,
    mean_graded_ndcg,
    modality_scores,
    multi_target_scores,
)


def test_ap_at_k_hand_values():
    # G = 3 positives at ranks 1, 3, 6; K = 5: P@1 = 1, P@3 = 2/3, rank 6 is past K
    assert average_precision_at_k([1, 3, 6], 5) == pytest.approx((1 + 2 / 3) / 3)
    # K = 10 takes the third one too: P@6 = 3/6
    assert average_precision_at_k([6, 1, 3], 10) == pytest.approx((1 + 2 / 3 + 3 / 6) / 3)
    # single positive: 1 / rank within K, else 0
    assert average_precision_at_k([4], 5) == pytest.approx(0.25)


def test_ap_at_k_boundaries():
    assert average_precision_at_k([5], 5) == pytest.approx(1 / 5)  # rank == K is inside
    assert average_precision_at_k([6], 5) == 0.0  # rank == K + 1 is outside
    assert average_precision_at_k([50], 50) == pytest.approx(1 / 50)
    assert average_precision_at_k([51], 50) == 0.0


def test_ap_at_k_more_positives_than_k_divides_by_k():
    # G = 8 > K = 5, positives at ranks 1..8: the first five positions are all hits
    assert average_precision_at_k(list(range(1, 9)), 5) == pytest.approx(1.0)
    # G = 8, hits at 2 and 4 only within K = 5: (1/2 + 2/4) / min(5, 8)
    assert average_precision_at_k([2, 4, 9, 10, 11, 12, 13, 14], 5) == pytest.approx(1.0 / 5)


def test_ap_at_k_missing_ranks_count_in_g():
    # one positive not retrieved: G = 2, hit at 2 -> (1/2) / 2
    assert average_precision_at_k([None, 2], 10) == pytest.approx(0.25)
    assert average_precision_at_k([None, None], 10) == 0.0
    assert average_precision_at_k([], 10) is None


def test_tied_positives_take_the_last_positions_of_their_group():
    # two positives tied at pessimistic rank 2 occupy positions 1 and 2
    assert hit_positions([2, 2]) == [1, 2]
    assert average_precision_at_k([2, 2], 5) == pytest.approx(1.0)
    # tied at rank 3 (one other image ties or beats them): positions 2 and 3
    assert hit_positions([3, 3, None]) == [2, 3]
    assert average_precision_at_k([3, 3], 5) == pytest.approx((1 / 2 + 2 / 3) / 2)
    with pytest.raises(ValueError):
        hit_positions([1, 1])  # two positives cannot both be at position 1


def test_map_at_k_means_over_queries_with_positives():
    queries = [[1, 3, 6], [4], [None], []]
    expected = ((1 + 2 / 3) / 3 + 0.25 + 0.0) / 3
    assert map_at_k(queries, 5) == pytest.approx(expected)
    assert map_at_k([[]], 5) is None
    with pytest.raises(ValueError):
        map_at_k([[0]], 5)


def test_graded_ndcg_cirr_soft_relevance():
    # hard target (gain 1) at rank 2, a soft target scored 0.5 at rank 1
    dcg = 1 / math.log2(3) + 0.5 / math.log2(2)
    idcg = 1 / math.log2(2) + 0.5 / math.log2(3)
    assert mean_graded_ndcg([([2, 1], [1.0, 0.5])]) == pytest.approx(dcg / idcg)
    assert mean_graded_ndcg([([None], [0.0])]) is None


def test_multi_target_scores_and_recall_subset():
    mods = ("multimodal", "text_only", "image_only")
    all_ranks = {m: [[1, 3, 6], [None]] for m in mods}
    subset = {m: [1, None] for m in mods}
    subset["text_only"] = [3, None]
    out = multi_target_scores(all_ranks, subset_by_modality=subset)
    assert set(out["map_at_k"]) == {str(k) for k in MAP_KS}
    assert out["map_at_k"]["5"]["multimodal"] == pytest.approx((1 + 2 / 3) / 3 / 2)
    # the query without a group is left out of Recall_subset
    assert out["recall_subset"]["1"] == {"multimodal": 1.0, "text_only": 0.0, "image_only": 1.0}
    assert out["recall_subset"]["3"]["text_only"] == 1.0
    binary = (1 + 1 / math.log2(4) + 1 / math.log2(7)) / (1 + 1 / math.log2(3) + 1 / math.log2(4))
    assert out["ndcg_graded"]["multimodal"] == pytest.approx(binary / 2)
    assert (
        multi_target_scores({m: [[1]] for m in mods}, subset_by_modality={m: [None] for m in mods})["recall_subset"]
        is None
    )


def test_modality_scores_reports_map_beside_recall():
    mods = ("multimodal", "text_only", "image_only")
    best = {m: [1, None] for m in mods}
    every = {m: [[1, 2], [None, None]] for m in mods}
    out = modality_scores(best, k=10, all_ranks_by_modality=every)
    assert out["recall_at_k"]["multimodal"] == 0.5
    assert out["map_at_k"]["10"]["multimodal"] == pytest.approx(0.5)  # AP 1 and AP 0
    # without every rank, the best one stands for the only positive
    assert modality_scores(best, k=10)["map_at_k"]["5"]["text_only"] == pytest.approx(0.5)


@pytest.mark.parametrize("rank", [None, 1, 2, 7, 10, 11, 681])
@pytest.mark.parametrize("rel", [0.0, 0.5, 1.0, 1, 3.0])
@pytest.mark.parametrize("k", [None, 1, 10])
def test_one_positive_scores_as_the_general_path(rank, rel, k):
    """The one-positive shortcuts give what the general code gives: a second positive of
    relevance 0 (never retrieved, or far down) adds exactly 0.0 to both DCGs."""
    from retrieval.metrics import hit_positions, ndcg_multi

    assert ndcg_multi([rank], [rel], k) == ndcg_multi([rank, 1000], [rel, 0.0], k)
    assert ndcg_multi([rank], [rel], k) == ndcg_multi([rank, None], [rel, 0.0], k)
    if rel == 1.0:
        assert ndcg_multi([rank], None, k) == ndcg_multi([rank, None], [1.0, 0.0], k)
    assert hit_positions([rank]) == hit_positions([rank, None])


def test_map_at_ks_in_one_pass_equals_each_cut_off_alone():
    """AP at every cut-off from one pass over a query's hits: the same floats as one cut-off at a time."""
    import random

    from retrieval.metrics import _ap_from_hits, _aps_from_hits, hit_positions, map_at_k, map_at_ks

    rng = random.Random(7)
    queries = []
    for _ in range(300):
        g = rng.randint(1, 8)
        queries.append([rng.choice([None, rng.randint(1, 80)]) for _ in range(g)])
    ks = [50, 5, 25, 10, 5]
    for ranks in queries:
        hits = hit_positions(ranks)
        assert _aps_from_hits(hits, len(ranks), sorted(set(ks))) == [
            _ap_from_hits(hits, len(ranks), k) for k in (5, 10, 25, 50)
        ]
    assert map_at_ks(queries, ks) == {k: map_at_k(queries, k) for k in ks}
    assert list(map_at_ks(queries, ks)) == [50, 5, 25, 10]
