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
from typing import Any

Rank = int | None

MODALITIES: tuple[str, str, str] = ("multimodal", "text_only", "image_only")


def check_rank(rank: Any) -> Rank:
    """Validate one rank: ``None`` or an integer >= 1 (numpy integers accepted).

    Raises ``ValueError`` for 0, negatives, booleans, floats and anything else, so that
    importer conventions such as ``-1`` for "absent" cannot slip through as ranks.
    """
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
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or int(k) < 1:
        raise ValueError(f"{name} must be an int >= 1, got {k!r}")
    return int(k)


def is_hit(rank: Rank, k: int) -> bool:
    """True when the target is within the top ``k`` (``rank <= k``); ``None`` is a miss."""
    r = check_rank(rank)
    return r is not None and r <= check_k(k)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def recall_at_k(ranks: Iterable[Rank], k: int) -> float | None:
    """Share of queries whose rank is ``<= k``; ``None`` counts as a miss.

    Returns ``None`` for an empty input (undefined).
    """
    k = check_k(k)
    return _mean([1.0 if is_hit(r, k) else 0.0 for r in ranks])


def reciprocal_rank(rank: Rank, k: int | None = None) -> float:
    """``1 / rank``; 0 for ``None`` or, when a cut-off ``k`` is given, for ``rank > k``."""
    r = check_rank(rank)
    if r is None or (k is not None and r > check_k(k)):
        return 0.0
    return 1.0 / r


def mrr(ranks: Iterable[Rank], k: int | None = None) -> float | None:
    """Mean reciprocal rank (untruncated unless ``k`` is given); ``None`` for no queries."""
    return _mean([reciprocal_rank(r, k) for r in ranks])


def ndcg(rank: Rank, k: int | None = None) -> float:
    """nDCG of one query with a single relevant target: ``1 / log2(1 + rank)``.

    The ideal DCG is 1 (target at rank 1). Over the full gallery by default; with a
    cut-off ``k`` a rank beyond ``k`` scores 0. ``None`` scores 0.
    """
    r = check_rank(rank)
    if r is None or (k is not None and r > check_k(k)):
        return 0.0
    return 1.0 / math.log2(1 + r)


def mean_ndcg(ranks: Iterable[Rank], k: int | None = None) -> float | None:
    """Mean single-target nDCG over queries (see :func:`ndcg`); ``None`` for no queries."""
    return _mean([ndcg(r, k) for r in ranks])


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
        rel / math.log2(1 + r)
        for r, rel in zip(ranks, rels)
        if r is not None and (cutoff is None or r <= cutoff)
    )
    ideal_rels = sorted(rels, reverse=True)
    if cutoff is not None:
        ideal_rels = ideal_rels[:cutoff]
    idcg = sum(rel / math.log2(2 + i) for i, rel in enumerate(ideal_rels))
    if idcg <= 0:
        return None
    return dcg / idcg


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


def modality_scores(
    ranks_by_modality: Mapping[str, Sequence[Rank]], k: int = 10
) -> dict[str, Any]:
    """Per-retriever aggregates over its queries, one list of ranks per modality.

    ``ranks_by_modality`` maps each of :data:`MODALITIES` to the ranks of the same
    queries in the same order (``None`` = not retrieved). Returns::

        {"recall_at_k": {modality: float|None}, "mrr": {...}, "ndcg": {...},
         "comp_gap_ndcg": float|None, "comp_gap_mrr": float|None}

    MRR and nDCG are over the full gallery (no cut-off); the Composition Gaps compare
    the multimodal score with the better of image-only and text-only.
    """
    k = check_k(k)
    missing = [m for m in MODALITIES if m not in ranks_by_modality]
    if missing:
        raise ValueError(f"missing modalities: {missing}")
    lengths = {len(ranks_by_modality[m]) for m in MODALITIES}
    if len(lengths) != 1:
        raise ValueError("every modality must list the same queries")
    recall = {m: recall_at_k(ranks_by_modality[m], k) for m in MODALITIES}
    rr = {m: mrr(ranks_by_modality[m]) for m in MODALITIES}
    nd = {m: mean_ndcg(ranks_by_modality[m]) for m in MODALITIES}
    return {
        "recall_at_k": recall,
        "mrr": rr,
        "ndcg": nd,
        "comp_gap_ndcg": comp_gap(nd["multimodal"], nd["image_only"], nd["text_only"]),
        "comp_gap_mrr": comp_gap(rr["multimodal"], rr["image_only"], rr["text_only"]),
    }
