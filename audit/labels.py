"""Shortcut-audit labels from per-retriever ranks (pure Python; no Django, no torch).

Input rows are ``(query, retriever, mm, text, image)``: the 1-based rank of the best
ground truth for the multimodal, text-only and image-only query of one retriever, or
``None`` when the target was not retrieved. With cut-off ``K`` and ``M`` =
``min_mm_retrievers``, for each query over the retriever pool:

* ``shortcut_solvable`` when some retriever has ``text <= K`` or ``image <= K``;
  detail ``both_unimodal`` when the best text rank and the best image rank over the
  pool are both ``<= K`` (possibly from two different retrievers), else ``text_only`` or
  ``image_only``;
* ``composition_required`` when not shortcut-solvable and at least ``M`` distinct
  retrievers have ``mm <= K``;
* ``unresolved`` otherwise; ``shortcut_free`` = composition_required + unresolved.

The multimodal ranks play no part in the shortcut decision. Conventions:

* A query that has no row for some retriever counts as not retrieved (all three ranks
  ``None``) by that retriever, both for the labels and for that retriever's scores.
* Several rows for the same (query, retriever) are merged by keeping the best
  (minimum) rank per modality, ``None`` being worse than any rank.
* The pool's best rank per modality is the minimum over retrievers; among equal ranks
  the retriever whose name sorts first (as a string) is reported as the best one.
* Per-retriever scores (Recall@K, MRR, nDCG over the full gallery, Composition Gaps)
  are fractions over every query of the audit; see :mod:`retrieval.metrics`.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from retrieval.metrics import MODALITIES, Rank, check_k, check_rank, modality_scores

LABELS: tuple[str, str, str] = ("composition_required", "unresolved", "shortcut_solvable")
DETAIL_LABELS: tuple[str, ...] = (
    "both_unimodal",
    "text_only",
    "image_only",
    "composition_required",
    "unresolved",
)
SUPPORT_KEYS: tuple[str, ...] = (*MODALITIES, "either_unimodal")
SHORTCUT_FREE: frozenset[str] = frozenset({"composition_required", "unresolved"})


@dataclass
class AuditLabels:
    """Everything :func:`label_queries` derives; dicts keep first-appearance order.

    ``labels``/``detail``/``legacy`` map query -> label; ``best_ranks`` and
    ``best_retriever`` map query -> {modality: value}; ``support`` maps query ->
    {multimodal, text_only, image_only, either_unimodal: number of retrievers within
    K}; ``support_histograms`` maps each support key -> {n retrievers: n queries}
    (only values that occur, ascending); ``retriever_stats`` maps retriever -> the
    :func:`retrieval.metrics.modality_scores` dict.
    """

    k: int
    min_mm_retrievers: int
    queries: list[Hashable]
    retrievers: list[Hashable]
    labels: dict[Hashable, str]
    detail: dict[Hashable, str]
    legacy: dict[Hashable, str]
    best_ranks: dict[Hashable, dict[str, Rank]]
    best_retriever: dict[Hashable, dict[str, Hashable | None]]
    support: dict[Hashable, dict[str, int]]
    counts: dict[str, int]
    detail_counts: dict[str, int]
    support_histograms: dict[str, dict[int, int]]
    retriever_stats: dict[Hashable, dict[str, Any]] = field(default_factory=dict)

    @property
    def shortcut_free(self) -> list[Hashable]:
        """Queries labelled composition_required or unresolved, in query order."""
        return [q for q in self.queries if self.labels[q] in SHORTCUT_FREE]

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON document; see :func:`audit_json`."""
        return audit_json(self)


def _min_rank(a: Rank, b: Rank) -> Rank:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _hit(rank: Rank, k: int) -> bool:
    return rank is not None and rank <= k


def _legacy(text_hit: bool, image_hit: bool) -> str:
    if text_hit and image_hit:
        return "either"
    if text_hit:
        return "text_only"
    if image_hit:
        return "image_only"
    return "multimodal_needed"


def _best(
    per_retriever: dict[Hashable, tuple[Rank, Rank, Rank]], m: int
) -> tuple[Rank, Hashable | None]:
    candidates = [(r[m], str(name), name) for name, r in per_retriever.items() if r[m] is not None]
    if not candidates:
        return None, None
    rank, _, name = min(candidates, key=lambda c: (c[0], c[1]))
    return rank, name


def label_queries(
    rows: Iterable[Sequence[Any]], k: int = 10, min_mm_retrievers: int = 1
) -> AuditLabels:
    """Label every query seen in ``rows`` (see the module notes for the rule)."""
    k = check_k(k)
    if isinstance(min_mm_retrievers, bool) or int(min_mm_retrievers) < 0:
        raise ValueError("min_mm_retrievers must be an int >= 0")
    min_mm = int(min_mm_retrievers)

    queries: dict[Hashable, None] = {}
    retrievers: dict[Hashable, None] = {}
    ranks: dict[tuple[Hashable, Hashable], tuple[Rank, Rank, Rank]] = {}
    for n, row in enumerate(rows):
        if len(row) != 5:
            raise ValueError(f"row {n}: expected (query, retriever, mm, text, image)")
        query, retriever, mm, text, image = row
        new = (check_rank(mm), check_rank(text), check_rank(image))
        queries.setdefault(query, None)
        retrievers.setdefault(retriever, None)
        old = ranks.get((query, retriever))
        if old is not None:
            new = tuple(_min_rank(a, b) for a, b in zip(old, new))  # type: ignore[assignment]
        ranks[(query, retriever)] = new

    missing: tuple[Rank, Rank, Rank] = (None, None, None)
    labels: dict[Hashable, str] = {}
    detail: dict[Hashable, str] = {}
    legacy: dict[Hashable, str] = {}
    best_ranks: dict[Hashable, dict[str, Rank]] = {}
    best_retriever: dict[Hashable, dict[str, Hashable | None]] = {}
    support: dict[Hashable, dict[str, int]] = {}
    for q in queries:
        per_r = {r: ranks.get((q, r), missing) for r in retrievers}
        bests = {m: _best(per_r, i) for i, m in enumerate(MODALITIES)}
        best_ranks[q] = {m: bests[m][0] for m in MODALITIES}
        best_retriever[q] = {m: bests[m][1] for m in MODALITIES}
        sup = {m: sum(_hit(r[i], k) for r in per_r.values()) for i, m in enumerate(MODALITIES)}
        sup["either_unimodal"] = sum(_hit(r[1], k) or _hit(r[2], k) for r in per_r.values())
        support[q] = sup

        text_hit = _hit(best_ranks[q]["text_only"], k)
        image_hit = _hit(best_ranks[q]["image_only"], k)
        legacy[q] = _legacy(text_hit, image_hit)
        if text_hit and image_hit:
            labels[q], detail[q] = "shortcut_solvable", "both_unimodal"
        elif text_hit:
            labels[q], detail[q] = "shortcut_solvable", "text_only"
        elif image_hit:
            labels[q], detail[q] = "shortcut_solvable", "image_only"
        elif sup["multimodal"] >= min_mm:
            labels[q] = detail[q] = "composition_required"
        else:
            labels[q] = detail[q] = "unresolved"

    label_counter = Counter(labels.values())
    counts = {name: label_counter.get(name, 0) for name in LABELS}
    counts["shortcut_free"] = counts["composition_required"] + counts["unresolved"]
    detail_counter = Counter(detail.values())
    detail_counts = {name: detail_counter.get(name, 0) for name in DETAIL_LABELS}
    histograms = {
        key: dict(sorted(Counter(s[key] for s in support.values()).items()))
        for key in SUPPORT_KEYS
    }

    stats: dict[Hashable, dict[str, Any]] = {}
    for r in retrievers:
        per_q = [ranks.get((q, r), missing) for q in queries]
        stats[r] = modality_scores(
            {m: [t[i] for t in per_q] for i, m in enumerate(MODALITIES)}, k=k
        )

    return AuditLabels(
        k=k,
        min_mm_retrievers=min_mm,
        queries=list(queries),
        retrievers=list(retrievers),
        labels=labels,
        detail=detail,
        legacy=legacy,
        best_ranks=best_ranks,
        best_retriever=best_retriever,
        support=support,
        counts=counts,
        detail_counts=detail_counts,
        support_histograms=histograms,
        retriever_stats=stats,
    )


def audit_json(audit: AuditLabels) -> dict[str, Any]:
    """The JSON document of the audit CLI, exactly::

        {"counts": {"composition_required", "unresolved", "shortcut_solvable",
                    "shortcut_free"},
         "detail_counts": {"both_unimodal", "text_only", "image_only",
                           "composition_required", "unresolved"},
         "labels": {query: label},
         "retrievers": {name: {"recall_at_k": {"multimodal", "text_only", "image_only"},
                               "mrr": {...}, "ndcg": {...},
                               "comp_gap_ndcg", "comp_gap_mrr"}}}

    Scores are fractions; undefined values are ``None`` (JSON null). Query and retriever
    keys are kept as given (``json.dumps`` writes integer keys as strings).
    """
    return {
        "counts": dict(audit.counts),
        "detail_counts": dict(audit.detail_counts),
        "labels": dict(audit.labels),
        "retrievers": {
            name: {
                "recall_at_k": dict(s["recall_at_k"]),
                "mrr": dict(s["mrr"]),
                "ndcg": dict(s["ndcg"]),
                "comp_gap_ndcg": s["comp_gap_ndcg"],
                "comp_gap_mrr": s["comp_gap_mrr"],
            }
            for name, s in audit.retriever_stats.items()
        },
    }
