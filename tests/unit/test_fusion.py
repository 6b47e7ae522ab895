"""Reciprocal-rank fusion and the fixed-size candidate list (retrieval.fusion), by hand."""

from __future__ import annotations

import pytest

from retrieval.fusion import (
    MAX_CANDIDATES,
    ORDER_K,
    POOL_K,
    RRF_K,
    blind_depth,
    candidate_list,
    reciprocal_rank_fusion,
    seeded_padding,
)


def test_rrf_scores_by_hand():
    # k = 60. a: 1/61 + 1/62; b: 1/62 + 1/61 (tie with a: best rank 1 both -> id order);
    # c: 1/63 only; d: 1/61 only.  a = b = 0.032520 > d = 0.016393 > c = 0.015873
    fused = reciprocal_rank_fusion([[1, 2, 3], [2, 1], [4]])
    assert fused == [1, 2, 4, 3]
    # order of the rankings does not matter
    assert reciprocal_rank_fusion([[4], [2, 1], [1, 2, 3]]) == fused
    # k = 0: 1/1 + 1/3 for 7 beats 1/2 + 1/2 for 8
    assert reciprocal_rank_fusion([[7, 8], [9, 8, 7]], k=0) == [7, 9, 8]
    # a repeated id within one ranking counts once
    assert reciprocal_rank_fusion([[5, 5, 6]]) == [5, 6]


def test_candidate_list_drops_targets_and_reference_and_keeps_its_size():
    pool = [[10, 11, 12, 13, 15, 16], [11, 10, 14, 17, 18]]
    # fused with POOL_K = 15: 10, 11 (1/16 + 1/17 each; 10 has the lower id), 12 (1/18), 14 (1/18), 13, 17, ...
    c = candidate_list(pool, exclude={11, 99}, size=3)
    assert c.ids == [10, 12, 14] and c.fused == 3 and c.padded == 0
    # too few in the pool: padded from the padding order, skipping excluded and taken ids
    c = candidate_list([[10, 11, 12]], exclude={11}, size=4, padding=[11, 10, 20, 21, 22])
    assert c.ids == [10, 12, 20, 21] and (c.fused, c.padded, c.short) == (2, 2, 0)
    # a gallery too small says so
    c = candidate_list([[10, 40]], exclude=set(), size=4, padding=[10, 30])
    assert c.ids == [10, 40, 30] and c.short == 1
    with pytest.raises(ValueError):
        candidate_list([], set(), MAX_CANDIDATES + 1)


def test_the_fused_depth_does_not_tell_whether_a_target_was_retrieved():
    # two items, both with one target and lists of 4: one retriever found the target (7)
    # for the first item, none did for the second; both take 4 - 1 = 3 fused candidates
    found = candidate_list([[7, 1, 2, 3], [1, 4, 5, 6]], exclude={7}, size=5, padding=[90, 91, 92])
    missed = candidate_list([[1, 2, 3, 8], [1, 4, 5, 6]], exclude={9}, size=5, padding=[90, 91, 92])
    assert blind_depth([[7, 1, 2, 3], [1, 4, 5, 6]], 1) == 3
    assert (found.fused, found.padded) == (missed.fused, missed.padded) == (3, 2)
    # 4 is second in one list (1/17) and beats 2, third (1/18); in "missed" both are second (id order)
    assert found.ids == [1, 4, 2, 90, 91] and missed.ids == [1, 2, 4, 90, 91]
    assert candidate_list([], {1}, 2, padding=[1, 5, 6]).ids == [5, 6]


def test_padding_is_not_read_when_the_pool_suffices():
    def padding():
        raise AssertionError("read")
        yield 0

    assert candidate_list([[1, 2, 3]], {2}, 2, padding()).ids == [1, 3]


def test_seeded_padding_is_deterministic_and_a_permutation():
    ids = list(range(100))
    a = list(seeded_padding(ids, "panel:7", 10))
    assert sorted(a) == ids and a == list(seeded_padding(ids, "panel:7", 10))
    assert a[:10] != list(seeded_padding(ids, "panel:8", 10))[:10] and a[:10] != ids[:10]
    assert a[10:] == [i for i in ids if i not in a[:10]]  # after the draw, the rest in order


def test_order_reorders_the_fused_part_only() -> None:
    """Issue 39, item 1: ``order`` (the multimodal lists) puts likely fits first; which images
    the panel holds, its padding and its length stay those of ``rankings`` (blind)."""
    rankings = [[1, 2, 3, 4, 5, 6], [2, 1, 4, 3, 6, 5]]
    plain = candidate_list(rankings, {6}, 6, padding=[10, 11, 12])
    ordered = candidate_list(rankings, {6}, 6, padding=[10, 11, 12], order=[[5, 9, 3]])
    assert ORDER_K == 10
    assert ordered.ids[:2] == [5, 3]  # ranked by the order lists (9 is not in the panel: it stays out)
    assert sorted(ordered.ids[: ordered.fused]) == sorted(plain.ids[: plain.fused])
    assert ordered.ids[2 : ordered.fused] == [
        i for i in plain.ids[: plain.fused] if i not in (5, 3)
    ]  # the rest as fused
    assert ordered.ids[ordered.fused :] == plain.ids[plain.fused :] and ordered.padded == plain.padded


def test_order_weights_count_each_ordering_list() -> None:
    rankings = [[1, 2, 3, 4]]
    # 3 first in the heavy list, 4 first in the light one: 3 leads; unranked 1 and 2 keep their fused order
    ordered = candidate_list(rankings, set(), 4, order=[[3], [4]], order_weights=[1.0, 0.5])
    assert ordered.ids == [3, 4, 1, 2]
    assert candidate_list(rankings, set(), 4, order=[[3], [4]], order_weights=[0.5, 1.0]).ids == [4, 3, 1, 2]
    with pytest.raises(ValueError, match="one weight per ranking"):
        candidate_list(rankings, set(), 4, order=[[3], [4]], order_weights=[1.0])


def test_the_pool_lets_a_lists_top_hit_in_and_weighs_each_list() -> None:
    """Issue 39, item 1: with POOL_K (15) an image one list puts first beats one in the middle
    of two lists, which k = 60 puts ahead; ``weights`` count each ranking."""
    top_hit, middle = 1, 2
    fill = iter(range(100, 1000))
    lists = [[top_hit, *[next(fill) for _ in range(40)]]] + [
        [*[next(fill) for _ in range(29)], middle] for _ in range(2)
    ]
    assert POOL_K == 15 and RRF_K == 60
    at60, at15 = reciprocal_rank_fusion(lists, RRF_K), reciprocal_rank_fusion(lists, POOL_K)
    assert at60.index(middle) < at60.index(top_hit)  # 2/90 > 1/61
    assert at15.index(top_hit) < at15.index(middle)  # 1/16 > 2/45
    assert candidate_list(lists, set(), 1).ids == [top_hit]
    # the first list at a quarter: 0.25/16 < 2/45, the image in the middle of two lists leads again
    quarter = reciprocal_rank_fusion(lists, POOL_K, [0.25, 1.0, 1.0])
    assert quarter.index(middle) < quarter.index(top_hit)
    assert candidate_list(lists, set(), 3, weights=[0.25, 1.0, 1.0]).ids == quarter[:3]
    # weights of 1 are the plain fusion; one weight per ranking
    assert reciprocal_rank_fusion(lists, POOL_K, [1.0, 1.0, 1.0]) == at15
    with pytest.raises(ValueError, match="one weight per ranking"):
        reciprocal_rank_fusion(lists, POOL_K, [1.0])
