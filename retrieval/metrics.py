"""Retrieval metrics over 1-based ranks (pure Python, no Django, no torch).

Conventions used throughout:

* A *rank* is the 1-based position of the (best) ground truth in the ranked gallery,
  or ``None`` when the target was not retrieved at all. ``None`` is always a miss and
  contributes 0 to MRR and nDCG.
* A rank ``r`` is a hit at cut-off ``K`` when ``r <= K`` (so ``r == K`` is a hit and
  ``r == K + 1`` is not).
* Scores are fractions in ``[0, 1]``, not percentages.
* A quantity that is undefined (a mean over no queries, a Composition Gap whose
  multimodal score is 0, an nDCG whose ideal DCG is 0) is returned as ``None``,
  never as NaN or a silent 0.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

Rank = int | None

MODALITIES: tuple[str, str, str] = ("multimodal", "text_only", "image_only")


def check_rank(rank: Any) -> Rank:
    """Validate one rank: ``None`` or an integer >= 1 (numpy integers accepted).

    Raises ``ValueError`` for 0, negatives, booleans, floats and anything else, so that
    importer conventions such as ``-1`` for "absent" cannot slip through as ranks.
    """
    if type(rank) is int:  # the common case, without the slower abstract-base-class check
        if rank >= 1:
            return rank
        raise ValueError(f"a rank must be an int >= 1 or None, got {rank!r}")
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise ValueError(f"a rank must be an int >= 1 or None, got {rank!r}")
    value = int(rank)
    if value < 1:
        raise ValueError(f"a rank must be an int >= 1 or None, got {rank!r}")
    return value


def check_k(k: Any, name: str = "k") -> int:
    """Validate a cut-off: an integer >= 1."""
    if type(k) is int and k >= 1:
        return k
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or int(k) < 1:
        raise ValueError(f"{name} must be an int >= 1, got {k!r}")
    return int(k)


def is_hit(rank: Rank, k: int) -> bool:
    """True when the target is within the top ``k`` (``rank <= k``); ``None`` is a miss."""
    r = check_rank(rank)
    return r is not None and r <= check_k(k)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _checked(ranks: Iterable[Any]) -> list[Rank]:
    """:func:`check_rank` of each rank (a plain int >= 1 passes without the call)."""
    return [r if type(r) is int and r >= 1 else check_rank(r) for r in ranks]


def recall_at_k(ranks: Iterable[Rank], k: int) -> float | None:
    """Share of queries whose rank is ``<= k``; ``None`` counts as a miss.

    Returns ``None`` for an empty input (undefined).
    """
    k = check_k(k)
    return _mean([1.0 if r is not None and r <= k else 0.0 for r in _checked(ranks)])


def reciprocal_rank(rank: Rank, k: int | None = None) -> float:
    """``1 / rank``; 0 for ``None`` or, when a cut-off ``k`` is given, for ``rank > k``."""
    return _reciprocal(check_rank(rank), k)


def _reciprocal(r: Rank, k: int | None) -> float:
    """:func:`reciprocal_rank` of a checked rank."""
    if r is None or (k is not None and r > check_k(k)):
        return 0.0
    return 1.0 / r


def mrr(ranks: Iterable[Rank], k: int | None = None) -> float | None:
    """Mean reciprocal rank (untruncated unless ``k`` is given); ``None`` for no queries."""
    return _mean([_reciprocal(r, k) for r in _checked(ranks)])


def ndcg(rank: Rank, k: int | None = None) -> float:
    """nDCG of one query with a single relevant target: ``1 / log2(1 + rank)``.

    The ideal DCG is 1 (target at rank 1). Over the full gallery by default; with a
    cut-off ``k`` a rank beyond ``k`` scores 0. ``None`` scores 0.
    """
    return _ndcg_single(check_rank(rank), k)


def _ndcg_single(r: Rank, k: int | None) -> float:
    """:func:`ndcg` of a checked rank."""
    if r is None or (k is not None and r > check_k(k)):
        return 0.0
    return 1.0 / math.log2(1 + r)


def mean_ndcg(ranks: Iterable[Rank], k: int | None = None) -> float | None:
    """Mean single-target nDCG over queries (see :func:`ndcg`); ``None`` for no queries."""
    return _mean([_ndcg_single(r, k) for r in _checked(ranks)])


def ndcg_multi(
    ranks_of_positives: Sequence[Rank],
    relevances: Sequence[float] | None = None,
    k: int | None = None,
) -> float | None:
    """nDCG of one query with several (binary or graded) positives.

    ``ranks_of_positives[i]`` is the 1-based rank of positive ``i`` (``None``: not
    retrieved) and ``relevances[i]`` its grade (default 1 for every positive). Gains are
    linear: ``DCG = sum_i rel_i / log2(1 + rank_i)`` over the retrieved positives (with a
    cut-off ``k``: only those with ``rank_i <= k``). The ideal DCG places the positives
    in decreasing order of relevance at ranks 1, 2, ... (only the first ``k`` positions
    with a cut-off). Returns ``None`` when the ideal DCG is 0 (no positive, or every
    relevance 0): the score is undefined.
    """
    if len(ranks_of_positives) == 1 and (relevances is None or len(relevances) == 1):
        return _ndcg_one(check_rank(ranks_of_positives[0]), 1.0 if relevances is None else float(relevances[0]), k)
    ranks = [check_rank(r) for r in ranks_of_positives]
    if relevances is None:
        rels = [1.0] * len(ranks)
    else:
        rels = [float(x) for x in relevances]
        if len(rels) != len(ranks):
            raise ValueError("relevances and ranks_of_positives differ in length")
        if any(not math.isfinite(x) or x < 0 for x in rels):
            raise ValueError("relevances must be finite and >= 0")
    cutoff = None if k is None else check_k(k)
    dcg = sum(
        rel / math.log2(1 + r) for r, rel in zip(ranks, rels) if r is not None and (cutoff is None or r <= cutoff)
    )
    ideal_rels = sorted(rels, reverse=True)
    if cutoff is not None:
        ideal_rels = ideal_rels[:cutoff]
    idcg = _ideal_dcg(tuple(ideal_rels))
    if idcg <= 0:
        return None
    return dcg / idcg


def _ndcg_one(rank: Rank, rel: float, k: int | None) -> float | None:
    """:func:`ndcg_multi` of a query with one positive, the same arithmetic without the lists
    (most queries of most benchmarks have one target)."""
    if not math.isfinite(rel) or rel < 0:
        raise ValueError("relevances must be finite and >= 0")
    cutoff = None if k is None else check_k(k)
    idcg = rel / math.log2(2)
    if idcg <= 0:
        return None
    dcg = rel / math.log2(1 + rank) if rank is not None and (cutoff is None or rank <= cutoff) else 0
    return dcg / idcg


@lru_cache(maxsize=1024)
def _ideal_dcg(ideal_rels: tuple[float, ...]) -> float:
    """DCG of relevances at ranks 1, 2, ... (most queries share a handful of ideal lists)."""
    return sum(rel / math.log2(2 + i) for i, rel in enumerate(ideal_rels))


def comp_gap(mm: float | None, image: float | None, text: float | None) -> float | None:
    """Composition Gap ``1 - max(image, text) / mm`` of one retriever.

    ``mm``, ``image`` and ``text`` are the same score (for example mean nDCG or MRR) of
    the multimodal, image-only and text-only queries. Undefined, hence ``None``, when
    ``mm`` is 0 (the fused query solves nothing, so there is nothing to compare with) or
    when any input is ``None``. The gap is negative when a single modality beats the
    fused query.
    """
    if mm is None or image is None or text is None:
        return None
    for value in (mm, image, text):
        if not math.isfinite(value):
            raise ValueError("comp_gap inputs must be finite")
    if mm == 0:
        return None
    return 1.0 - max(image, text) / mm


#: CIRCO's cut-offs for mAP@K; CIRR's for Recall_subset@K.
MAP_KS: tuple[int, ...] = (5, 10, 25, 50)
SUBSET_KS: tuple[int, ...] = (1, 2, 3)


def hit_positions(ranks_of_positives: Sequence[Rank]) -> list[int]:
    """Distinct 1-based list positions of the retrieved positives, ascending.

    Ranks follow the pessimistic tie rule (``1 + #others scoring >= it``), so ``c``
    positives tied with each other share the rank ``r`` at the end of their group;
    they occupy positions ``r - c + 1 .. r``. ``None`` (not retrieved) is left out.
    """
    if len(ranks_of_positives) == 1:  # one positive: its rank, if retrieved
        rank = check_rank(ranks_of_positives[0])
        return [] if rank is None else [rank]
    ranks = sorted(r for r in (check_rank(x) for x in ranks_of_positives) if r is not None)
    out: list[int] = []
    n = 0
    while n < len(ranks):
        r = ranks[n]
        c = ranks.count(r)
        if c > r:
            raise ValueError(f"{c} positives cannot share rank {r}")
        out.extend(range(r - c + 1, r + 1))
        n += c
    return out


def average_precision_at_k(ranks_of_positives: Sequence[Rank], k: int) -> float | None:
    """CIRCO's AP@K of one query: ``(1 / min(K, G)) * sum_{i <= K} P@i * rel(i)``.

    ``G`` = number of positives (``len(ranks_of_positives)``, including those not
    retrieved, ``None``); ``P@i`` = precision at cut-off ``i``; ``rel(i)`` = 1 when
    position ``i`` holds a positive (see :func:`hit_positions`). ``None`` when G = 0.
    """
    k = check_k(k)
    g = len(ranks_of_positives)
    if g == 0:
        return None
    return _ap_from_hits(hit_positions(ranks_of_positives), g, k)


def _ap_from_hits(hits: Sequence[int], g: int, k: int) -> float:
    """AP@K from the ascending hit positions of a query with ``g >= 1`` positives."""
    total = 0.0
    for j, p in enumerate(hits):
        if p > k:
            break
        total += (j + 1) / p
    return total / min(k, g)


def _aps_from_hits(hits: Sequence[int], g: int, ks: Sequence[int]) -> list[float]:
    """:func:`_ap_from_hits` at each of the ascending cut-offs ``ks``, in one pass over the hits:
    each cut-off's sum is a prefix of the same additions, in the same order (the same floats)."""
    out: list[float] = []
    total = 0.0
    j = 0
    for k in ks:
        while j < len(hits) and hits[j] <= k:
            total += (j + 1) / hits[j]
            j += 1
        out.append(total / min(k, g))
    return out


def map_at_ks(per_query: Iterable[Sequence[Rank]], ks: Sequence[int]) -> dict[int, float | None]:
    """:func:`map_at_k` at several cut-offs, each query's hit positions found once."""
    ks = [check_k(k) for k in ks]
    ascending = sorted(set(ks))
    aps = [_aps_from_hits(hit_positions(r), len(r), ascending) for r in per_query if len(r)]
    column = {k: n for n, k in enumerate(ascending)}
    return {k: _mean([ap[column[k]] for ap in aps]) for k in ks}


def map_at_k(per_query: Iterable[Sequence[Rank]], k: int) -> float | None:
    """Mean AP@K over queries with at least one positive; ``None`` when there is none."""
    return map_at_ks(per_query, [k])[check_k(k)]


def mean_graded_ndcg(per_query: Iterable[tuple[Sequence[Rank], Sequence[float]]]) -> float | None:
    """Mean :func:`ndcg_multi` over ``(ranks, gains)`` per query (full gallery, linear gains);
    queries whose ideal DCG is 0 are left out."""
    values = [ndcg_multi(ranks, gains) for ranks, gains in per_query]
    return _mean([v for v in values if v is not None])


def _check_modalities(data: Mapping[str, Sequence[Any]], what: str) -> int:
    missing = [m for m in MODALITIES if m not in data]
    if missing:
        raise ValueError(f"{what}: missing modalities: {missing}")
    lengths = {len(data[m]) for m in MODALITIES}
    if len(lengths) != 1:
        raise ValueError(f"{what}: every modality must list the same queries")
    return lengths.pop()


def multi_target_scores(
    all_ranks_by_modality: Mapping[str, Sequence[Sequence[Rank]]],
    graded_by_modality: Mapping[str, Sequence[tuple[Sequence[Rank], Sequence[float]]]] | None = None,
    subset_by_modality: Mapping[str, Sequence[Rank]] | None = None,
) -> dict[str, Any]:
    """Metrics that need the rank of every target, per modality::

        {"map_at_k": {"5"|"10"|"25"|"50": {modality: float|None}},
         "ndcg_graded": {modality: float|None},
         "recall_subset": {"1"|"2"|"3": {modality: float|None}} or None}

    ``all_ranks_by_modality[m][q]`` lists the ranks of query ``q``'s positives.
    ``graded_by_modality[m][q]`` = ``(ranks, gains)`` of every graded target (positives
    with gain 1 and, for CIRR, the soft targets); without it the positives count with
    gain 1. ``subset_by_modality[m][q]`` = rank within the query's subset group, ``None``
    for queries without a group (left out of Recall_subset).
    """
    _check_modalities(all_ranks_by_modality, "all ranks")
    if graded_by_modality is None:
        graded_by_modality = {m: [(r, [1.0] * len(r)) for r in all_ranks_by_modality[m]] for m in MODALITIES}
    _check_modalities(graded_by_modality, "graded ranks")
    maps = {m: map_at_ks(all_ranks_by_modality[m], MAP_KS) for m in MODALITIES}
    out: dict[str, Any] = {
        "map_at_k": {str(k): {m: maps[m][k] for m in MODALITIES} for k in MAP_KS},
        "ndcg_graded": {m: mean_graded_ndcg(graded_by_modality[m]) for m in MODALITIES},
        "recall_subset": None,
    }
    if subset_by_modality is not None:
        _check_modalities(subset_by_modality, "subset ranks")
        if any(r is not None for m in MODALITIES for r in subset_by_modality[m]):
            out["recall_subset"] = {
                str(k): {m: recall_at_k([r for r in subset_by_modality[m] if r is not None], k) for m in MODALITIES}
                for k in SUBSET_KS
            }
    return out


def modality_scores(
    ranks_by_modality: Mapping[str, Sequence[Rank]],
    k: int = 10,
    all_ranks_by_modality: Mapping[str, Sequence[Sequence[Rank]]] | None = None,
    graded_by_modality: Mapping[str, Sequence[tuple[Sequence[Rank], Sequence[float]]]] | None = None,
    subset_by_modality: Mapping[str, Sequence[Rank]] | None = None,
) -> dict[str, Any]:
    """Per-retriever aggregates over its queries, one list of ranks per modality.

    ``ranks_by_modality`` maps each of :data:`MODALITIES` to the (best) ranks of the
    same queries in the same order (``None`` = not retrieved). Returns::

        {"recall_at_k": {modality: float|None}, "mrr": {...}, "ndcg": {...},
         "comp_gap_ndcg": float|None, "comp_gap_mrr": float|None,
         "map_at_k": ..., "ndcg_graded": ..., "recall_subset": ...}

    MRR and nDCG are over the full gallery (no cut-off) on the best rank; the
    Composition Gaps compare the multimodal score with the better of image-only and
    text-only. The last three come from :func:`multi_target_scores`, on
    ``all_ranks_by_modality`` (the rank of every positive; when absent, the best rank
    stands for the query's only positive).
    """
    k = check_k(k)
    _check_modalities(ranks_by_modality, "ranks")
    if all_ranks_by_modality is None:
        all_ranks_by_modality = {m: [[r] for r in ranks_by_modality[m]] for m in MODALITIES}
    recall = {m: recall_at_k(ranks_by_modality[m], k) for m in MODALITIES}
    rr = {m: mrr(ranks_by_modality[m]) for m in MODALITIES}
    nd = {m: mean_ndcg(ranks_by_modality[m]) for m in MODALITIES}
    return {
        "recall_at_k": recall,
        "mrr": rr,
        "ndcg": nd,
        "comp_gap_ndcg": comp_gap(nd["multimodal"], nd["image_only"], nd["text_only"]),
        "comp_gap_mrr": comp_gap(rr["multimodal"], rr["image_only"], rr["text_only"]),
        **multi_target_scores(all_ranks_by_modality, graded_by_modality, subset_by_modality),
    }
