"""Reciprocal-rank fusion of several rankings and the fixed-size candidate list built from it.

Pure: no Django. Image ids are plain integers.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

#: Cormack, Clarke & Büttcher (SIGIR 2009): score(d) = sum over rankings of 1 / (RRF_K + rank(d)).
RRF_K = 60

#: The RRF constant that chooses which images a panel holds (:func:`candidate_list`'s ``k``).
#: Smaller than :data:`RRF_K`, so a list's top hits enter the panel even when no other list
#: ranks them: with k = 60 over a query's eight lists (two retrievers, four each) an image
#: ranked in the middle of four lists beat one ranked first by a single list, and the demo's
#: wrong-target fits that one retriever's multimodal list put first or second were left out
#: (seed 11). With the text-only lists at a quarter weight
#: (:data:`audit.runs.panels.POOL_WEIGHTS`) the 50-deep panels of seeds 3, 5, 7, 11 and 13
#: held 0.94, 0.95, 0.95, 0.83 and 0.85 of the fitting images over all audited queries,
#: where k = 60 with every list alike held 0.93, 0.92, 0.94, 0.80 and 0.81 (issue 39, item 1).
POOL_K = 15

#: Most candidates a study may show per item.
MAX_CANDIDATES = 50

#: The RRF constant of the panel's *order* (:func:`candidate_list`'s ``order``): small, so an
#: image near the top of one list comes before one in the middle of all of them. With the
#: multimodal lists at weight 1 and the lists nearest the targets at 0.5
#: (:data:`audit.runs.panels.ORDER_WEIGHTS`) it put 0.90 and 0.91 of the demo's fitting
#: images within an annotator's reach (seeds 7 and 3, when a tick opened one page only),
#: where the pool's own order (k = 60, every list alike) put 0.85 and 0.90, and the
#: multimodal lists alone 0.93 and 0.82 (issue 39, item 1).
ORDER_K = 10


def reciprocal_rank_fusion(
    rankings: Iterable[Sequence[int]], k: int = RRF_K, weights: Sequence[float] = ()
) -> list[int]:
    """Every id of ``rankings`` (each best first), ordered by fused score, best first; each
    ranking counts its weight (:func:`weighted_scores`; 1 each by default).

    Ties are broken by the best single rank, then by id, so the order does not depend on
    the order of the rankings. A repeated id within one ranking counts once (its first rank).
    """
    if k < 0:
        raise ValueError("the RRF constant must be >= 0")
    rankings = [list(r) for r in rankings]
    score = weighted_scores(rankings, weights or [1.0] * len(rankings), k)
    best: dict[int, int] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            best[item] = min(best.get(item, rank), rank)
    return sorted(score, key=lambda i: (-score[i], best[i], i))


def weighted_scores(rankings: Sequence[Sequence[int]], weights: Sequence[float], k: int = RRF_K) -> dict[int, float]:
    """id -> sum over ``rankings`` of weight / (k + rank): reciprocal-rank fusion where each
    ranking counts its weight (a repeated id within one ranking counts once, its first rank)."""
    if len(weights) != len(rankings):
        raise ValueError("one weight per ranking")
    score: dict[int, float] = {}
    for ranking, weight in zip(rankings, weights):
        seen: set[int] = set()
        for rank, item in enumerate(ranking, start=1):
            if item not in seen:
                seen.add(item)
                score[item] = score.get(item, 0.0) + weight / (k + rank)
    return score


def seeded_padding(ids: Sequence[int], key: str, n: int) -> Iterator[int]:
    """A deterministic, seeded draw from ``ids`` (e.g. the gallery, in id order): first ``n``
    sampled ids (``random.Random(key)``, O(n) for any gallery size), then the rest in order."""
    rng = random.Random(key)
    drawn = rng.sample(range(len(ids)), min(n, len(ids)))
    yield from (ids[i] for i in drawn)
    chosen = set(drawn)
    yield from (x for i, x in enumerate(ids) if i not in chosen)


@dataclass(frozen=True)
class Candidates:
    """A fixed-size candidate list: ``ids`` best first; ``fused`` of them came from the fused
    ranking, the last ``padded`` from the padding order (the pool ran short)."""

    ids: list[int]
    fused: int
    padded: int
    short: int = 0  # still missing after padding (the gallery itself is too small)
    excluded: list[int] = field(default_factory=list)


def blind_depth(rankings: Sequence[Sequence[int]], n_excluded: int) -> int:
    """How many fused candidates a panel may take without its length (and so its padding)
    telling whether the excluded targets were retrieved: every ranking is at least ``min``
    long, so the fusion minus ``n_excluded`` ids always holds ``min - n_excluded`` of them."""
    if not rankings:
        return 0
    return max(0, min(len(set(r)) for r in rankings) - n_excluded)


def candidate_list(
    rankings: Sequence[Sequence[int]],
    exclude: Iterable[int],
    size: int,
    padding: Iterable[int] = (),
    k: int = POOL_K,
    order: Sequence[Sequence[int]] = (),
    order_weights: Sequence[float] = (),
    weights: Sequence[float] = (),
) -> Candidates:
    """``size`` candidates: the fused ranking minus ``exclude`` (every labelled target and the
    reference), then the next ids of ``padding`` (a deterministic order of the gallery) that
    are neither excluded nor taken.

    Which images the fused part holds is decided by ``rankings`` alone: their reciprocal-rank
    fusion with ``k`` (:data:`POOL_K`), each ranking counting ``weights`` (1 each by default).
    ``order`` (e.g. the multimodal lists, those that read the query as a whole) only orders
    them, likely fits first: by their fusion with :data:`ORDER_K`, each list counting
    ``order_weights`` (1 each by default), the images none of them ranked after, in fused
    order. An annotator sees the panel page by page, so its order decides how much of it they
    reach (:mod:`annotation.alternatives.paging`).

    Blind: the fused part is at most :func:`blind_depth` long, a depth every item reaches
    whether or not its targets were retrieved, so how much is padded never depends on the
    audit's outcome (with top lists of 64 and a panel of 20 nothing is padded). The list never
    holds an excluded id, and its length is ``size`` unless the gallery itself has fewer
    eligible images (``short`` says by how many).
    """
    if isinstance(size, bool) or not 0 <= int(size) <= MAX_CANDIDATES:
        raise ValueError(f"the candidate count must be between 0 and {MAX_CANDIDATES}")
    size = int(size)
    rankings = [list(r) for r in rankings]
    banned = set(exclude)
    depth = min(size, blind_depth(rankings, len(banned)))
    ids: list[int] = []
    for item in reciprocal_rank_fusion(rankings, k, weights):
        if len(ids) == depth:
            break
        if item not in banned:
            ids.append(item)
    if order:
        score = weighted_scores(order, order_weights or [1.0] * len(order), ORDER_K)
        fused_at = {c: n for n, c in enumerate(ids)}
        ids.sort(key=lambda c: (-score.get(c, 0.0), fused_at[c]))
    fused = len(ids)
    taken = set(ids)
    if len(ids) < size:
        for item in padding:
            if item not in banned and item not in taken:
                ids.append(item)
                taken.add(item)
                if len(ids) == size:
                    break
    return Candidates(ids=ids, fused=fused, padded=len(ids) - fused, short=size - len(ids), excluded=sorted(banned))
