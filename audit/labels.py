"""The audit rule: a shortcut-audit label for every query from per-retriever ranks (pure Python; no Django, no torch).

This module is the one place the rule and its label names live; everything else imports them from here.

Input rows are ``(query, retriever, mm, text, image)``: the 1-based rank of the best
positive target (:func:`retrieval.targets.positive_targets`) for the multimodal,
text-only and image-only query of one retriever, or ``None`` when it was not retrieved;
each rank may instead be the list of the ranks of every positive (its minimum is the
best rank). Ranks follow the pessimistic tie rule of :mod:`retrieval.ranking`. With cut-off ``K`` and ``M`` =
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

#: The label names. Every other module imports them from here (never spells them).
COMPOSITION_REQUIRED = "composition_required"
UNRESOLVED = "unresolved"
SHORTCUT_SOLVABLE = "shortcut_solvable"
LABELS: tuple[str, str, str] = (COMPOSITION_REQUIRED, UNRESOLVED, SHORTCUT_SOLVABLE)
#: Detail labels of a shortcut-solvable query (the other queries' detail is their label).
BOTH_UNIMODAL = "both_unimodal"
TEXT_ONLY = "text_only"
IMAGE_ONLY = "image_only"
DETAIL_LABELS: tuple[str, ...] = (BOTH_UNIMODAL, TEXT_ONLY, IMAGE_ONLY, COMPOSITION_REQUIRED, UNRESOLVED)
SUPPORT_KEYS: tuple[str, ...] = (*MODALITIES, "either_unimodal")
#: The labels no retriever could shortcut, in order, and their union's name (a count and a subset).
SHORTCUT_FREE_LABELS: tuple[str, str] = (COMPOSITION_REQUIRED, UNRESOLVED)
SHORTCUT_FREE: frozenset[str] = frozenset(SHORTCUT_FREE_LABELS)
SHORTCUT_FREE_NAME = "shortcut_free"
#: The counts of an audit, in the order reports show them.
COUNT_KEYS: tuple[str, ...] = (*LABELS, SHORTCUT_FREE_NAME)
#: How pages head the label counts, in :data:`COUNT_KEYS` order: the one place their names on
#: screen are spelled (templates loop over it with each row's ``counts``).
COUNT_HEADINGS: tuple[str, ...] = tuple(k.replace("_", "-") if k == SHORTCUT_FREE_NAME else k for k in COUNT_KEYS)


def count_lines(counts: dict[str, int]) -> list[str]:
    """An audit's counts as every command prints them (run_audit, audit_labels, audit_report,
    make_demo): the three labels, which partition the queries, and their sum; then, apart,
    shortcut_free, which is the union of two of them and no fourth label (printed in the
    same column as the labels, the column summed to more than the queries)."""
    lines = [f"  {label:<22}{counts.get(label, 0):>8}" for label in LABELS]
    lines.append(f"  {'= queries labelled':<22}{sum(counts.get(label, 0) for label in LABELS):>8}")
    lines.append(
        f"  {SHORTCUT_FREE_NAME:<22}{counts.get(SHORTCUT_FREE_NAME, 0):>8}"
        f"  (= {' + '.join(SHORTCUT_FREE_LABELS)}: what no retriever shortcut)"
    )
    return lines


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
        return TEXT_ONLY
    if image_hit:
        return IMAGE_ONLY
    return "multimodal_needed"


def _best(per_retriever: dict[Hashable, tuple[Rank, Rank, Rank]], m: int) -> tuple[Rank, Hashable | None]:
    candidates = [(r[m], str(name), name) for name, r in per_retriever.items() if r[m] is not None]
    if not candidates:
        return None, None
    rank, _, name = min(candidates, key=lambda c: (c[0], c[1]))
    return rank, name


RankList = list[Rank]


def _rank_value(value: Any) -> tuple[Rank, RankList]:
    """One modality of a row: a rank or a list of the ranks of every positive -> (best, every)."""
    if isinstance(value, (list, tuple)):
        every = [check_rank(r) for r in value]
        return min((r for r in every if r is not None), default=None), every
    rank = check_rank(value)
    return rank, [rank]


def _merge_lists(old: RankList, new: RankList) -> RankList:
    if len(old) == len(new):
        return [_min_rank(a, b) for a, b in zip(old, new)]
    return old


@dataclass
class _Pool:
    """The rows read: queries and retrievers in order, best ranks, every rank and extras per pair."""

    queries: dict[Hashable, None] = field(default_factory=dict)
    retrievers: dict[Hashable, None] = field(default_factory=dict)
    best: dict[tuple[Hashable, Hashable], tuple[Rank, Rank, Rank]] = field(default_factory=dict)
    every: dict[tuple[Hashable, Hashable], tuple[RankList, ...]] = field(default_factory=dict)
    extras: dict[tuple[Hashable, Hashable], dict[str, Any]] = field(default_factory=dict)


def read_pool(rows: Iterable[Sequence[Any]]) -> _Pool:
    """The rows of :func:`label_queries`, checked and merged per (query, retriever)."""
    pool = _Pool()
    for n, row in enumerate(rows):
        if len(row) not in (5, 6):
            raise ValueError(f"row {n}: expected (query, retriever, mm, text, image[, extras])")
        query, retriever = row[0], row[1]
        values = [_rank_value(v) for v in row[2:5]]
        best = tuple(v[0] for v in values)
        every = tuple(v[1] for v in values)
        pool.queries.setdefault(query, None)
        pool.retrievers.setdefault(retriever, None)
        key = (query, retriever)
        if key in pool.best:
            best = tuple(_min_rank(a, b) for a, b in zip(pool.best[key], best))
            every = tuple(_merge_lists(a, b) for a, b in zip(pool.every[key], every))
        pool.best[key], pool.every[key] = best, every  # type: ignore[assignment]
        if len(row) == 6 and row[5]:
            pool.extras[key] = dict(row[5])
    return pool


def _label_one(per_r: dict[Hashable, tuple[Rank, Rank, Rank]], k: int, min_mm: int) -> dict[str, Any]:
    """Label, detail, legacy label, best ranks, best retrievers and supports of one query."""
    bests = {m: _best(per_r, i) for i, m in enumerate(MODALITIES)}
    sup = {m: sum(_hit(r[i], k) for r in per_r.values()) for i, m in enumerate(MODALITIES)}
    sup["either_unimodal"] = sum(_hit(r[1], k) or _hit(r[2], k) for r in per_r.values())
    text_hit = _hit(bests["text_only"][0], k)
    image_hit = _hit(bests["image_only"][0], k)
    if text_hit or image_hit:
        label = SHORTCUT_SOLVABLE
        detail = BOTH_UNIMODAL if text_hit and image_hit else (TEXT_ONLY if text_hit else IMAGE_ONLY)
    else:
        label = detail = COMPOSITION_REQUIRED if sup["multimodal"] >= min_mm else UNRESOLVED
    return {
        "label": label,
        "detail": detail,
        "legacy": _legacy(text_hit, image_hit),
        "support": sup,
        "best_ranks": {m: bests[m][0] for m in MODALITIES},
        "best_retriever": {m: bests[m][1] for m in MODALITIES},
    }


def _graded(
    every: tuple[RankList, ...], extras: dict[str, Any], i: int, field_name: str
) -> tuple[RankList, list[float]]:
    """(ranks, gains) of every graded target: the positives (gain 1), then the graded-only ones."""
    graded = extras.get("graded") or {}
    if not graded:  # the positives only (most datasets)
        return every[i], [1.0] * len(every[i])
    ranks = list(every[i]) + list(graded.get(field_name) or [])
    return ranks, [1.0] * len(every[i]) + [float(g) for g in graded.get("gains") or []]


def retriever_scores(pool: _Pool, retriever: Hashable, k: int) -> dict[str, Any]:
    """:func:`retrieval.metrics.modality_scores` of one retriever over every query of the pool."""
    fields = ("mm", "text", "image")
    missing: tuple[Rank, Rank, Rank] = (None, None, None)
    keys = [(q, retriever) for q in pool.queries]
    best = [pool.best.get(key, missing) for key in keys]
    every = [pool.every.get(key, ([None], [None], [None])) for key in keys]
    extras = [pool.extras.get(key, {}) for key in keys]
    subset = {m: [(x.get("subset") or {}).get(fields[i]) for x in extras] for i, m in enumerate(MODALITIES)}
    return modality_scores(
        {m: [t[i] for t in best] for i, m in enumerate(MODALITIES)},
        k=k,
        all_ranks_by_modality={m: [e[i] for e in every] for i, m in enumerate(MODALITIES)},
        graded_by_modality={
            m: [_graded(e, x, i, fields[i]) for e, x in zip(every, extras)] for i, m in enumerate(MODALITIES)
        },
        subset_by_modality=subset,
    )


def _check_min_mm(min_mm_retrievers: Any) -> int:
    if isinstance(min_mm_retrievers, bool) or int(min_mm_retrievers) < 0:
        raise ValueError("min_mm_retrievers must be an int >= 0")
    return int(min_mm_retrievers)


def label_queries(rows: Iterable[Sequence[Any]], k: int = 10, min_mm_retrievers: int = 1) -> AuditLabels:
    """Label every query seen in ``rows`` (see the module notes for the rule).

    A rank may be given as one rank or as the list of the ranks of every positive
    target (the labels use the best; mAP@K uses them all). An optional sixth element
    carries ``{"graded": {"gains", "mm", "text", "image"}, "subset": {"mm", "text", "image"}}``
    (CIRR's soft targets and subset ranks, see :class:`audit.models.AuditRank`).
    """
    k = check_k(k)
    min_mm = _check_min_mm(min_mm_retrievers)
    return label_pool(read_pool(rows), k, min_mm)


def sub_pool(pool: _Pool, queries: Iterable[Hashable]) -> _Pool:
    """``pool`` over ``queries`` only, in the order given (a query without rows counts as not
    retrieved). The rows are shared, not copied; the same as :func:`read_pool` over those
    queries' rows, since rows merge per (query, retriever)."""
    return _Pool(
        queries=dict.fromkeys(queries), retrievers=pool.retrievers, best=pool.best, every=pool.every, extras=pool.extras
    )


def label_pool(pool: _Pool, k: int = 10, min_mm_retrievers: int = 1) -> AuditLabels:
    """:func:`label_queries` over rows already read by :func:`read_pool`."""
    k = check_k(k)
    min_mm = _check_min_mm(min_mm_retrievers)
    missing: tuple[Rank, Rank, Rank] = (None, None, None)
    per_query = {
        q: _label_one({r: pool.best.get((q, r), missing) for r in pool.retrievers}, k, min_mm) for q in pool.queries
    }
    support = {q: v["support"] for q, v in per_query.items()}
    label_counter = Counter(v["label"] for v in per_query.values())
    counts = {name: label_counter.get(name, 0) for name in LABELS}
    counts[SHORTCUT_FREE_NAME] = sum(counts[name] for name in SHORTCUT_FREE_LABELS)
    detail_counter = Counter(v["detail"] for v in per_query.values())
    return AuditLabels(
        k=k,
        min_mm_retrievers=min_mm,
        queries=list(pool.queries),
        retrievers=list(pool.retrievers),
        labels={q: v["label"] for q, v in per_query.items()},
        detail={q: v["detail"] for q, v in per_query.items()},
        legacy={q: v["legacy"] for q, v in per_query.items()},
        best_ranks={q: v["best_ranks"] for q, v in per_query.items()},
        best_retriever={q: v["best_retriever"] for q, v in per_query.items()},
        support=support,
        counts=counts,
        detail_counts={name: detail_counter.get(name, 0) for name in DETAIL_LABELS},
        support_histograms={
            key: dict(sorted(Counter(s[key] for s in support.values()).items())) for key in SUPPORT_KEYS
        },
        retriever_stats={r: retriever_scores(pool, r, k) for r in pool.retrievers},
    )


def label_shares(counts: dict[str, int]) -> dict[str, float | None]:
    """Each label's share of the audited queries (:data:`LABELS` partition them; the
    ``shortcut_free`` union too): count / (sum of the three labels), ``None`` when none."""
    total = sum(int(counts.get(label, 0)) for label in LABELS)
    return {key: (int(counts.get(key, 0)) / total if total else None) for key in COUNT_KEYS}


def audit_json(audit: AuditLabels) -> dict[str, Any]:
    """The JSON document of the audit CLI, exactly::

        {"counts": {"composition_required", "unresolved", "shortcut_solvable",
                    "shortcut_free"},
         "detail_counts": {"both_unimodal", "text_only", "image_only",
                           "composition_required", "unresolved"},
         "labels": {query: label},
         "retrievers": {name: {"recall_at_k": {"multimodal", "text_only", "image_only"},
                               "mrr": {...}, "ndcg": {...},
                               "comp_gap_ndcg", "comp_gap_mrr",
                               "map_at_k": {"5"|"10"|"25"|"50": {modality: ...}}}}}

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
                "map_at_k": {key: dict(v) for key, v in s["map_at_k"].items()},
            }
            for name, s in audit.retriever_stats.items()
        },
    }
