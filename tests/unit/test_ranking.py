"""retrieval.ranking: chunked ranking against hand-made galleries and the naive reference.

Tie tests use small integer-valued embeddings so that every dot product is exact in
floating point and ties are real ties whatever the summation order.
"""

from __future__ import annotations

import pytest
import torch

from retrieval.ranking import rank_queries
from tests.reference_impl import naive_rank

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _gallery_1d(values: list[float]) -> torch.Tensor:
    """Gallery of 1-D embeddings: with query [1.0] the scores equal ``values``."""
    return torch.tensor(values, dtype=torch.float32)[:, None]


def test_hand_ranks_single_query():
    # scores:        0    1    2    3    4
    gallery = _gallery_1d([0.9, 0.5, 0.7, 0.1, 0.3])
    q = torch.tensor([[1.0]])
    # order: 0 (0.9), 2 (0.7), 1 (0.5), 4 (0.3), 3 (0.1)
    res = rank_queries(q, gallery, [[1]], top_k=3)
    assert res.best_rank == [3]
    assert res.topk.tolist() == [[0, 2, 1]]
    assert res.topk_scores[0].tolist() == pytest.approx([0.9, 0.7, 0.5])
    # several positives: best one counts
    assert rank_queries(q, gallery, [[3, 4, 2]]).best_rank == [2]
    # no positive -> None
    assert rank_queries(q, gallery, [[]]).best_rank == [None]


def test_ties_are_pessimistic():
    # items 0, 1 and 3 tie at score 2; item 2 scores 3
    gallery = _gallery_1d([2.0, 2.0, 3.0, 2.0, 1.0])
    q = torch.tensor([[1.0]])
    res = rank_queries(q, gallery, [[3]])
    # 1 + the OTHER items scoring >= 2 (items 0, 1, 2): rank 4, not 2
    assert res.best_rank == [4]
    res = rank_queries(q.repeat(3, 1), gallery, [[3], [4], [1, 4]], return_per_positive=True)
    assert res.best_rank == [4, 5, 4]
    assert res.per_positive_ranks == [[4], [5], [4, 5]]
    # two tied positives: each counts the other (1 + items 2 and the other positive)
    res = rank_queries(q, gallery, [[0, 1]], return_per_positive=True)
    assert res.per_positive_ranks == [[4, 4]]
    # an excluded tie no longer counts: items 1 and 2 remain above-or-equal
    assert rank_queries(q, gallery, [[3]], exclude=[0]).best_rank == [3]
    # the same rule across gallery chunks of every size
    for chunk in (1, 2, 3, 5):
        assert rank_queries(q, gallery, [[3]], chunk_size=chunk).best_rank == [4]


def test_group_rank_within_subset():
    # scores 0..5 = [2, 5, 2, 3, 1, 4]; group of query = items {0, 2, 3, 4, 5}
    gallery = _gallery_1d([2.0, 5.0, 2.0, 3.0, 1.0, 4.0])
    q = torch.tensor([[1.0], [1.0]])
    res = rank_queries(q, gallery, [[2], [2]], exclude=[5, None], groups=[[0, 2, 3, 4, 5], [0, 2, 3, 4, 5]])
    # query 0: 5 excluded; members >= 2 other than 2: 0 (tie), 3 -> rank 3
    # query 1: members 0, 3, 5 -> rank 4 (item 1 is outside the group)
    assert res.group_rank == [3, 4]
    assert res.best_rank == [4, 5]
    assert rank_queries(q[:1], gallery, [[]], groups=[[0, 1]]).group_rank == [None]


def test_exclusion_removes_item_from_ranks_and_topk():
    gallery = _gallery_1d([0.9, 0.5, 0.7, 0.1, 0.3])
    q = torch.tensor([[1.0], [1.0], [1.0]])
    res = rank_queries(q, gallery, [[1], [1], [0, 4]], exclude=[0, None, 0], top_k=5, return_per_positive=True)
    # query 0: item 0 removed -> order 2, 1, 4, 3 -> positive 1 at rank 2
    # query 1: nothing removed -> rank 3
    # query 2: positive 0 is the excluded item -> only 4 counts: order 2, 1, 4 -> rank 3
    assert res.best_rank == [2, 3, 3]
    assert res.per_positive_ranks == [[2], [3], [None, 3]]
    # the top list keeps the excluded item (the candidate panel filters it)
    assert res.topk[0].tolist() == [0, 2, 1, 4, 3]
    assert res.topk[1].tolist() == [0, 2, 1, 4, 3]
    # the only positive excluded -> None
    assert rank_queries(q[:1], gallery, [[0]], exclude=[0]).best_rank == [None]


def test_top_k_larger_than_gallery_is_padded():
    gallery = _gallery_1d([0.2, 0.8])
    res = rank_queries(torch.tensor([[1.0]]), gallery, [[0]], top_k=4)
    assert res.topk.tolist() == [[1, 0, -1, -1]]
    assert res.best_rank == [2]
    assert rank_queries(torch.tensor([[1.0]]), gallery, [[0]], top_k=0).topk.shape == (1, 0)


def test_chunking_does_not_change_results():
    gallery = _gallery_1d([0.9, 0.5, 0.7, 0.1, 0.3, 0.8, 0.6])
    q = torch.tensor([[1.0], [-1.0]])
    full = rank_queries(q, gallery, [[1, 3], [0]], exclude=[5, 3], top_k=4)
    for chunk in (1, 2, 3, 7, 100):
        for qchunk in (1, 2):
            res = rank_queries(
                q,
                gallery,
                [[1, 3], [0]],
                exclude=[5, 3],
                top_k=4,
                chunk_size=chunk,
                query_chunk_size=qchunk,
            )
            assert res.best_rank == full.best_rank
            assert res.topk.tolist() == full.topk.tolist()
    # hand check: query 0 without item 5 -> order 0,2,6,1 ... positive 1 at rank 4
    # query 1 scores are negated, item 3 removed -> order 4,1,6,2,5,0 -> item 0 rank 6
    assert full.best_rank == [4, 6]
    # top lists keep the excluded items (5 for query 0, 3 for query 1)
    assert full.topk.tolist() == [[0, 5, 2, 6], [3, 4, 1, 6]]


@pytest.mark.parametrize("device", DEVICES)
def test_agrees_with_naive_on_random_ties_and_exclusions(device):
    gen = torch.Generator().manual_seed(1234)
    n_q, n_g, dim = 37, 211, 4
    # integers in [-2, 2]: many exact ties
    queries = torch.randint(-2, 3, (n_q, dim), generator=gen).float()
    gallery = torch.randint(-2, 3, (n_g, dim), generator=gen).float()
    positives = []
    exclude = []
    for q in range(n_q):
        n_pos = int(torch.randint(0, 4, (1,), generator=gen))
        pos = torch.randint(0, n_g, (n_pos,), generator=gen).tolist()
        positives.append(pos)
        if q % 3 == 0:
            exclude.append(None)
        elif q % 3 == 1 and pos:
            exclude.append(pos[0])  # exclude a positive
        else:
            exclude.append(int(torch.randint(0, n_g, (1,), generator=gen)))
    ref = naive_rank(queries, gallery, positives, exclude, top_k=15, return_per_positive=True)
    res = rank_queries(
        queries.to(device),
        gallery.to(device),
        positives,
        exclude,
        top_k=15,
        chunk_size=50,
        query_chunk_size=8,
        return_per_positive=True,
    )
    cpu_gallery = rank_queries(  # a CPU (memory-mapped) gallery read block by block
        queries.to(device),
        gallery,
        positives,
        exclude,
        top_k=15,
        chunk_size=50,
        query_chunk_size=8,
    )
    assert cpu_gallery.best_rank == ref.best_rank
    assert res.best_rank == ref.best_rank
    assert res.per_positive_ranks == ref.per_positive_ranks
    assert any(r is None for r in ref.best_rank)
    # top-K scores agree exactly; indices may differ only inside groups of equal scores
    assert torch.equal(res.topk_scores, ref.topk_scores)
    for q in range(n_q):
        scores = queries[q] @ gallery.T
        for idx, val in zip(res.topk[q].tolist(), res.topk_scores[q].tolist()):
            assert scores[idx].item() == val
        assert len(set(res.topk[q].tolist())) == 15


@pytest.mark.parametrize("device", DEVICES)
def test_agrees_with_naive_on_random_floats(device):
    gen = torch.Generator().manual_seed(7)
    queries = torch.nn.functional.normalize(torch.randn(20, 16, generator=gen), dim=1)
    gallery = torch.nn.functional.normalize(torch.randn(300, 16, generator=gen), dim=1)
    positives = [[(q * 13) % 300, (q * 7 + 1) % 300] for q in range(20)]
    exclude = [q % 300 for q in range(20)]
    ref = naive_rank(queries, gallery, positives, exclude, top_k=10)
    res = rank_queries(queries.to(device), gallery.to(device), positives, exclude, top_k=10, chunk_size=64)
    assert res.best_rank == ref.best_rank
    assert res.topk.tolist() == ref.topk.tolist()


def test_half_precision_inputs_are_upcast():
    gallery = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=torch.float16)
    q = torch.tensor([[0.8, 0.6]], dtype=torch.bfloat16)
    res = rank_queries(q, gallery, [[1]], top_k=3)
    # scores 0.8, 0.6, 0.96 -> order 2, 0, 1
    assert res.topk.tolist() == [[2, 0, 1]]
    assert res.best_rank == [3]
    assert res.topk_scores.dtype == torch.float32


def test_naive_rank_hand_values():
    gallery = _gallery_1d([2.0, 2.0, 3.0, 2.0, 1.0])
    res = naive_rank(torch.tensor([[1.0]]), gallery, [[3]], exclude=[2], top_k=3)
    # item 2 removed: items 0, 1, 3 tie at 2 -> positive 3 placed after them: rank 3
    assert res.best_rank == [3]
    assert res.topk.tolist() == [[2, 0, 1]]


def test_input_validation():
    g = _gallery_1d([1.0, 2.0])
    q = torch.tensor([[1.0]])
    with pytest.raises(ValueError):
        rank_queries(q, g, [[2]])
    with pytest.raises(ValueError):
        rank_queries(q, g, [[0], [1]])
    with pytest.raises(ValueError):
        rank_queries(q, g, [[0]], exclude=[5])
    with pytest.raises(ValueError):
        rank_queries(torch.ones(1, 3), g, [[0]])


def test_extra_targets_are_ranked_but_never_positives():
    gallery = _gallery_1d([2.0, 5.0, 2.0, 3.0, 1.0, 4.0])
    q = torch.tensor([[1.0]])
    res = rank_queries(q, gallery, [[4]], extra=[[1, 0]], groups=[[0, 2, 4]], return_per_positive=True)
    # the extras (ranks 1 and 5: item 0 ties with item 2) do not make the query's best rank
    assert res.best_rank == [6]
    assert res.per_positive_ranks == [[6]]
    assert res.extra_ranks == [[1, 5]]
    # within the group, the positive (score 1) is below items 0 and 2
    assert res.group_rank == [3]


@pytest.mark.parametrize("device", DEVICES)
def test_kept_chunk_scores_equal_the_stacked_ones(device, monkeypatch):
    """The positives', group members' and references' scores read from the pass's own
    chunk products (few chunks hold them) give the same ranks, group ranks and
    reference-ahead flags as the rows stacked into chunk-wide blocks (many chunks), and as
    the naive ranking, with duplicate gallery rows (exact ties) among the positives."""
    import retrieval.ranking as ranking

    gen = torch.Generator().manual_seed(30)
    queries = torch.nn.functional.normalize(torch.randn(23, 8, generator=gen), dim=1)
    gallery = torch.nn.functional.normalize(torch.randn(90, 8, generator=gen), dim=1)
    gallery[50:60] = gallery[0:10]  # duplicates of the first positives: ties
    positives = [[q % 10, (q * 7) % 90] for q in range(23)]
    exclude = [(q * 5 + 3) % 90 for q in range(23)]
    groups = [[q % 10, q % 10 + 50, (q + 1) % 90, (q * 3) % 90] for q in range(23)]
    refs = [(q * 11) % 90 for q in range(23)]
    args = (queries.to(device), gallery.to(device), positives, exclude)
    kw = dict(top_k=5, chunk_size=30, query_chunk_size=8, return_per_positive=True, groups=groups, references=refs)
    kept = rank_queries(*args, **kw)
    monkeypatch.setattr(ranking, "KEEP_CHUNKS", 0)
    stacked = rank_queries(*args, **kw)
    ref = naive_rank(queries, gallery, positives, exclude, top_k=5, return_per_positive=True)
    assert kept.per_positive_ranks == stacked.per_positive_ranks == ref.per_positive_ranks
    assert kept.best_rank == stacked.best_rank == ref.best_rank
    assert kept.group_rank == stacked.group_rank
    assert kept.reference_ahead == stacked.reference_ahead
    assert torch.equal(kept.topk_scores, stacked.topk_scores)
    # the duplicate of positive q % 10 ties with it and is counted ahead of it
    assert all(r[0] is None or r[0] >= 2 for r in kept.per_positive_ranks)
    assert any(g is not None and g >= 2 for g in kept.group_rank)
