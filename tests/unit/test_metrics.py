"""Hand-checked values for retrieval.metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from retrieval.metrics import (
    check_rank,
    comp_gap,
    is_hit,
    mean_ndcg,
    modality_scores,
    mrr,
    ndcg,
    ndcg_multi,
    recall_at_k,
    reciprocal_rank,
)


def test_k_boundary_rank_equal_to_k_is_hit():
    assert is_hit(10, 10) is True
    assert is_hit(11, 10) is False
    assert is_hit(None, 10) is False
    assert is_hit(1, 1) is True


def test_recall_at_k_hand_values():
    ranks = [1, 10, 11, None]
    assert recall_at_k(ranks, 10) == 0.5
    assert recall_at_k(ranks, 11) == 0.75
    assert recall_at_k(ranks, 1) == 0.25
    assert recall_at_k([None, None], 10) == 0.0
    assert recall_at_k([], 10) is None


def test_mrr_hand_values():
    # (1/1 + 1/2 + 1/4 + 0) / 4 = 1.75 / 4
    assert mrr([1, 2, 4, None]) == pytest.approx(0.4375)
    # with a cut-off, rank 4 > 3 scores 0: (1 + 0.5) / 4
    assert mrr([1, 2, 4, None], k=3) == pytest.approx(0.375)
    assert reciprocal_rank(None) == 0.0
    assert reciprocal_rank(5) == 0.2
    assert mrr([]) is None


def test_single_target_ndcg():
    assert ndcg(1) == 1.0
    assert ndcg(3) == pytest.approx(0.5)  # 1/log2(4)
    assert ndcg(7) == pytest.approx(1 / 3)  # 1/log2(8)
    assert ndcg(None) == 0.0
    assert ndcg(3, k=3) == pytest.approx(0.5)
    assert ndcg(4, k=3) == 0.0
    # mean over queries: (1 + 0.5 + 0) / 3
    assert mean_ndcg([1, 3, None]) == pytest.approx(0.5)


def test_ndcg_multi_binary():
    # positives at ranks 1 and 3: DCG = 1 + 1/log2(4) = 1.5; IDCG = 1 + 1/log2(3)
    expected = 1.5 / (1 + 1 / math.log2(3))
    assert ndcg_multi([1, 3]) == pytest.approx(expected)
    assert ndcg_multi([3, 1]) == pytest.approx(expected)
    # all positives at the top -> 1
    assert ndcg_multi([2, 1]) == pytest.approx(1.0)
    # a missing positive adds nothing to the DCG but counts in the ideal
    assert ndcg_multi([1, None]) == pytest.approx(1 / (1 + 1 / math.log2(3)))


def test_ndcg_multi_graded():
    # relevance 2 at rank 3, relevance 1 at rank 1
    # DCG = 1/log2(2) + 2/log2(4) = 1 + 1 = 2; IDCG = 2/log2(2) + 1/log2(3)
    value = ndcg_multi([3, 1], relevances=[2, 1])
    assert value == pytest.approx(2 / (2 + 1 / math.log2(3)))
    # swapping grades puts the best one first -> ideal
    assert ndcg_multi([1, 3], relevances=[2, 0]) == pytest.approx(1.0)


def test_ndcg_multi_cutoff():
    # k=2: rank 3 is cut; DCG = 1; IDCG over 2 slots = 1 + 1/log2(3)
    assert ndcg_multi([1, 3], k=2) == pytest.approx(1 / (1 + 1 / math.log2(3)))
    # k=1: IDCG has one slot; positive at rank 1 -> 1
    assert ndcg_multi([1, 3, 5], k=1) == pytest.approx(1.0)
    # three positives, cut-off 2: ideal only counts min(3, 2) slots
    assert ndcg_multi([1, 2, 3], k=2) == pytest.approx(1.0)


def test_ndcg_multi_undefined():
    assert ndcg_multi([]) is None
    assert ndcg_multi([1, 2], relevances=[0, 0]) is None
    with pytest.raises(ValueError):
        ndcg_multi([1, 2], relevances=[1])
    with pytest.raises(ValueError):
        ndcg_multi([1], relevances=[-1])


def test_comp_gap():
    assert comp_gap(0.8, 0.2, 0.4) == pytest.approx(0.5)
    assert comp_gap(0.5, 0.5, 0.1) == pytest.approx(0.0)
    # a single modality beats the fused query: negative gap
    assert comp_gap(0.4, 0.6, 0.1) == pytest.approx(-0.5)
    # mm == 0: undefined, not NaN or inf
    assert comp_gap(0.0, 0.0, 0.0) is None
    assert comp_gap(0.0, 0.3, 0.1) is None
    assert comp_gap(None, 0.3, 0.1) is None
    assert comp_gap(0.5, None, 0.1) is None


def test_check_rank_rejects_bad_values():
    assert check_rank(np.int64(3)) == 3
    assert check_rank(None) is None
    for bad in (0, -1, 1.5, 2.0, True, "3"):
        with pytest.raises(ValueError):
            check_rank(bad)
    with pytest.raises(ValueError):
        recall_at_k([1], 0)


def test_modality_scores_hand_values():
    scores = modality_scores(
        {
            "multimodal": [1, 3, None, 10],
            "text_only": [2, None, None, 11],
            "image_only": [None, None, 1, None],
        },
        k=10,
    )
    assert scores["recall_at_k"] == {"multimodal": 0.75, "text_only": 0.25, "image_only": 0.25}
    mm_mrr = (1 + 1 / 3 + 0.1) / 4
    assert scores["mrr"]["multimodal"] == pytest.approx(mm_mrr)
    assert scores["mrr"]["text_only"] == pytest.approx((0.5 + 1 / 11) / 4)
    assert scores["mrr"]["image_only"] == pytest.approx(0.25)
    mm_ndcg = (1 + 0.5 + 1 / math.log2(11)) / 4
    text_ndcg = (1 / math.log2(3) + 1 / math.log2(12)) / 4
    assert scores["ndcg"]["multimodal"] == pytest.approx(mm_ndcg)
    assert scores["ndcg"]["text_only"] == pytest.approx(text_ndcg)
    assert scores["ndcg"]["image_only"] == pytest.approx(0.25)
    # image-only nDCG (0.25) beats text-only (~0.2275), so it is the max
    assert text_ndcg < 0.25
    assert scores["comp_gap_ndcg"] == pytest.approx(1 - 0.25 / mm_ndcg)
    assert scores["comp_gap_mrr"] == pytest.approx(1 - 0.25 / mm_mrr)


def test_modality_scores_mm_zero_gives_undefined_gap():
    scores = modality_scores({"multimodal": [None, None], "text_only": [1, None], "image_only": [None, None]})
    assert scores["ndcg"]["multimodal"] == 0.0
    assert scores["comp_gap_ndcg"] is None
    assert scores["comp_gap_mrr"] is None
