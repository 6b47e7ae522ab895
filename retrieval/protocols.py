"""Each benchmark's published figures, on its own terms, from one audit's ranks (pure Python).

An audit stores, per query, retriever and modality, the rank of every positive under
CIRVal's rule (:mod:`retrieval.ranking`: pessimistic ties, the reference removed unless
``--keep-reference``) and, per positive, whether the reference scored >= it
(``reference_ahead``). From these this module gives the figures the benchmarks' own
evaluation code reports, at every standard cut-off, whatever the audit's label K, each
with the protocol's own reference handling:

=============  ===========  =====================================================================
benchmark      reference    figures (source)
=============  ===========  =====================================================================
CIRR           removed      R@1/5/10/50 of ``target_hard``; Recall_subset@1/2/3 within the
                            query's ``img_set`` members; Avg = (R@5 + Recall_subset@1) / 2
                            (ABaldrati/CLIP4Cir ``src/validate.py``, ``compute_cirr_val_metrics``;
                            the CIRR leaderboard's average)
FashionIQ      kept         R@10 and R@50 per category against the category's gallery, their
                            means over the categories, and Avg = (mean R@10 + mean R@50) / 2
                            (CLIP4Cir ``src/validate.py``, ``compute_fiq_val_metrics``)
CIRCO          kept         mAP@5/10/25/50 over every ``gt_img_ids``; Recall@5/10/25/50 of
                            ``target_img_id`` only (miccunifi/CIRCO ``src/evaluation.py``;
                            miccunifi/SEARLE ``src/validate.py``, ``circo_compute_val_metrics``)
M-BEIR         as audited   R@5 and R@10 of any ``pos_cand_list`` positive (UniIR: Recall@5, and
                            Recall@10 for FashionIQ)
LaSCo          as audited   R@1/5/10/50 of the target (the LaSCo paper's table)
=============  ===========  =====================================================================

Reference handling: a protocol that *keeps* the reference ranks it like any gallery image,
so a positive's rank is the audited (reference removed) rank plus 1 when the reference
scored >= it; one that *removes* it, the audited rank of a ``--keep-reference`` audit minus
that. Rank rows without ``reference_ahead`` (imported rank files, older audits) give the
audited ranks, and :func:`protocol_report` says so (``reference`` = ``"as audited"``).
Audit labels never use this module: they keep CIRVal's rule.

Figures are fractions in [0, 1] (pages show percent); a figure over no query is ``None``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .metrics import map_at_ks, recall_at_k

KEPT, REMOVED, AS_AUDITED = "kept", "removed", "as audited"
AS_IN_FILE = "as in the rank file (not known)"


@dataclass(frozen=True)
class Protocol:
    """One benchmark's evaluation protocol."""

    key: str
    title: str
    reference: str  # KEPT, REMOVED or AS_AUDITED
    source: str
    recall_ks: tuple[int, ...] = ()
    subset_ks: tuple[int, ...] = ()
    map_ks: tuple[int, ...] = ()
    per_category: bool = False
    recall_of_primary: bool = False  # Recall@K of the primary target only (CIRCO)


PROTOCOLS: dict[str, Protocol] = {
    "cirr": Protocol(
        "cirr",
        "CIRR",
        REMOVED,
        "ABaldrati/CLIP4Cir src/validate.py (compute_cirr_val_metrics); CIRR leaderboard Avg",
        recall_ks=(1, 5, 10, 50),
        subset_ks=(1, 2, 3),
    ),
    "fashioniq": Protocol(
        "fashioniq",
        "FashionIQ",
        KEPT,
        "ABaldrati/CLIP4Cir src/validate.py (compute_fiq_val_metrics)",
        recall_ks=(10, 50),
        per_category=True,
    ),
    "circo": Protocol(
        "circo",
        "CIRCO",
        KEPT,
        "miccunifi/CIRCO src/evaluation.py; miccunifi/SEARLE src/validate.py (circo_compute_val_metrics)",
        recall_ks=(5, 10, 25, 50),
        map_ks=(5, 10, 25, 50),
        recall_of_primary=True,
    ),
    "mbeir": Protocol(
        "mbeir", "M-BEIR", AS_AUDITED, "TIGER-AI-Lab/UniIR (Recall@5; Recall@10 for FashionIQ)", recall_ks=(5, 10)
    ),
    "lasco": Protocol("lasco", "LaSCo", AS_AUDITED, "levymsn/LaSCo paper (Recall@1/5/10/50)", recall_ks=(1, 5, 10, 50)),
}


def protocol_for(fmt: str) -> Protocol | None:
    """The protocol of a dataset format (``None``: the format has no published protocol)."""
    return PROTOCOLS.get(fmt)


@dataclass(frozen=True)
class QueryRanks:
    """One query's audited ranks in one modality for one retriever.

    ``positives``: rank of each positive (:func:`retrieval.targets.positive_targets` order,
    ``None``: not in the gallery); ``ahead``: per positive, whether the reference scored >=
    it (empty: not known); ``primary``: index of the primary target in ``positives`` (CIRCO's
    ``target_img_id``; ``None``: none); ``subset``: rank within the query's subset group
    (CIRR's ``img_set``); ``category``: the query's category (FashionIQ); ``every_positive``:
    ``positives`` ranks every positive (``False``: only the best is known, so figures that need
    every positive or the primary one are undefined); ``subset_known``: ``subset`` was stored."""

    positives: Sequence[int | None]
    ahead: Sequence[bool | None] = ()
    primary: int | None = 0
    subset: int | None = None
    category: str = ""
    every_positive: bool = True  # False: ``positives`` holds only the best rank (a rank file's one number)
    subset_known: bool = True  # False: no rank within the subset group was stored (rank files carry none)


def adjusted_rank(rank: int | None, ahead: bool | None, audited_removed: bool, reference: str) -> int | None:
    """The rank a protocol with ``reference`` handling gives, from the audited one."""
    if rank is None or reference == AS_AUDITED or not ahead:
        return rank
    if reference == KEPT and audited_removed:
        return rank + 1
    if reference == REMOVED and not audited_removed:
        return rank - 1
    return rank


def _protocol_ranks(q: QueryRanks, audited_removed: bool, reference: str) -> list[int | None]:
    ahead = list(q.ahead) if len(q.ahead) == len(q.positives) else [None] * len(q.positives)
    return [adjusted_rank(r, a, audited_removed, reference) for r, a in zip(q.positives, ahead)]


def _best(ranks: Sequence[int | None]) -> int | None:
    return min((r for r in ranks if r is not None), default=None)


def _recalls(ranks: Sequence[int | None], ks: Iterable[int], prefix: str = "R") -> dict[str, float | None]:
    return {f"{prefix}@{k}": recall_at_k(ranks, k) for k in ks}


def _subset_rank(q: QueryRanks, audited_removed: bool, reference: str) -> int | None:
    """The Recall_subset rank under the protocol (the reference is a member of CIRR's img_set)."""
    best_slot = min((n for n, r in enumerate(q.positives) if r is not None), key=lambda n: q.positives[n], default=None)
    ahead = q.ahead[best_slot] if best_slot is not None and len(q.ahead) == len(q.positives) else None
    return adjusted_rank(q.subset, ahead, audited_removed, reference)


def figures(protocol: Protocol, queries: Sequence[QueryRanks], audited_removed: bool) -> dict[str, Any]:
    """The protocol's figures over ``queries`` (one retriever, one modality).

    Keys: ``R@K`` (``recall_ks``), ``Recall_subset@K``, ``mAP@K``, ``Avg`` (CIRR: (R@5 +
    Recall_subset@1) / 2; FashionIQ: (R@10 + R@50) / 2 of the category means), and for
    FashionIQ ``categories`` = {category: {R@10, R@50, queries}} with the ``R@K`` keys the
    means over the categories (each category weighs the same, as CLIP4Cir averages them)."""
    ranked = [(q, _protocol_ranks(q, audited_removed, protocol.reference)) for q in queries]
    if protocol.per_category:
        return _per_category(protocol, ranked)
    every = all(q.every_positive for q, _ in ranked)
    out: dict[str, Any] = {"queries": len(ranked), **_target_recalls(protocol, ranked, every)}
    if protocol.subset_ks:
        out.update(_subset_recalls(protocol, [q for q, _ in ranked], audited_removed))
        r5, s1 = out.get("R@5"), out.get("Recall_subset@1")
        out["Avg"] = None if r5 is None or s1 is None else (r5 + s1) / 2
    if protocol.map_ks:
        maps = map_at_ks([ranks for _, ranks in ranked], protocol.map_ks) if every else {}
        out.update({f"mAP@{k}": maps.get(k) for k in protocol.map_ks})
    return out


def _target_recalls(
    protocol: Protocol, ranked: list[tuple[QueryRanks, list[int | None]]], every: bool
) -> dict[str, float | None]:
    """R@K of the best positive, or of the primary one (undefined when only the best is known)."""
    if not protocol.recall_of_primary:
        return _recalls([_best(ranks) for _, ranks in ranked], protocol.recall_ks)
    if not every:
        return {f"R@{k}": None for k in protocol.recall_ks}
    hits = [ranks[q.primary] if q.primary is not None and q.primary < len(ranks) else None for q, ranks in ranked]
    return _recalls(hits, protocol.recall_ks)


def _subset_recalls(protocol: Protocol, queries: list[QueryRanks], audited_removed: bool) -> dict[str, float | None]:
    """Recall_subset@K (undefined when some query's rank within its subset group was not stored)."""
    if not all(q.subset_known for q in queries):
        return {f"Recall_subset@{k}": None for k in protocol.subset_ks}
    subset = [_subset_rank(q, audited_removed, protocol.reference) for q in queries]
    return _recalls(subset, protocol.subset_ks, "Recall_subset")


def _per_category(protocol: Protocol, ranked: list[tuple[QueryRanks, list[int | None]]]) -> dict[str, Any]:
    by_cat: dict[str, list[int | None]] = defaultdict(list)
    for q, ranks in ranked:
        by_cat[q.category].append(_best(ranks))
    categories = {
        cat: {"queries": len(best), **_recalls(best, protocol.recall_ks)} for cat, best in sorted(by_cat.items())
    }
    out: dict[str, Any] = {"queries": len(ranked), "categories": categories}
    for k in protocol.recall_ks:
        values = [c[f"R@{k}"] for c in categories.values() if c[f"R@{k}"] is not None]
        out[f"R@{k}"] = sum(values) / len(values) if values else None
    means = [out[f"R@{k}"] for k in protocol.recall_ks]
    out["Avg"] = None if not means or None in means else sum(means) / len(means)
    return out


@dataclass
class ProtocolReport:
    """The figures of one audit: ``rows[(retriever, modality)]`` = :func:`figures`."""

    protocol: Protocol
    reference: str
    rows: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.protocol.title,
            "format": self.protocol.key,
            "reference": self.reference,
            "source": self.protocol.source,
            "warnings": list(self.warnings),
            "rows": [{"retriever": r, "modality": m, **values} for (r, m), values in self.rows.items()],
        }


def _incomplete_warnings(protocol: Protocol, queries: list[QueryRanks]) -> list[str]:
    """What a protocol cannot compute from ranks stored as one number per query, or without
    the rank within the subset group (rank files carry neither every positive nor the subset)."""
    out = []
    if (protocol.recall_of_primary or protocol.map_ks) and not all(q.every_positive for q in queries):
        needs = " and ".join(
            x
            for x in (
                "mAP@K" if protocol.map_ks else "",
                "Recall@K of the primary target" if protocol.recall_of_primary else "",
            )
            if x
        )
        out.append(
            f"some ranks were stored as one number per query (the best positive's): {protocol.title}'s "
            f"{needs} need every positive's rank, so they are left undefined"
        )
    if protocol.subset_ks and not all(q.subset_known for q in queries):
        out.append(
            f"{protocol.title}'s Recall_subset@K needs each query's rank within its subset group, which "
            "was not stored (rank files carry none): Recall_subset and Avg are left undefined"
        )
    return out


def protocol_report(
    protocol: Protocol,
    per_row: Mapping[tuple[str, str], Sequence[QueryRanks]],
    audited_removed: bool,
    imported: bool = False,
) -> ProtocolReport:
    """:func:`figures` for every (retriever, modality); ``reference`` says how the reference
    was handled: the protocol's own, ``"as audited (...)"`` when some ranks lack
    ``reference_ahead`` and the protocol's handling differs from the audit's, or
    :data:`AS_IN_FILE` for ranks imported from rank files (``imported``: CIRVal cannot know
    what the file's retriever did with the reference)."""
    differs = (protocol.reference == KEPT and audited_removed) or (
        protocol.reference == REMOVED and not audited_removed
    )
    unknown = differs and any(len(q.ahead) != len(q.positives) for qs in per_row.values() for q in qs if q.positives)
    reference = protocol.reference
    report = ProtocolReport(protocol, reference)
    report.warnings.extend(_incomplete_warnings(protocol, [q for qs in per_row.values() for q in qs]))
    if imported:
        report.reference = AS_IN_FILE
        report.warnings.append(
            f"{protocol.title} {protocol.reference} the reference; these ranks were imported "
            "from rank files, whose handling of the reference CIRVal cannot check"
        )
    elif unknown:
        audited = "removed" if audited_removed else "kept"
        report.reference = f"{AS_AUDITED} ({audited})"
        report.warnings.append(
            f"{protocol.title} {protocol.reference} the reference, but some ranks were stored "
            f"without it ({audited}); the figures use the audited ranks"
        )
    for key, queries in per_row.items():
        report.rows[key] = figures(protocol, queries, audited_removed)
    return report
