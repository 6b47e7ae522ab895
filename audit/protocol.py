"""An audit's figures as the benchmark's own protocol computes them (thin; the maths is
:mod:`retrieval.protocols`).

Read from the run's stored rank rows: one table per benchmark, a row per retriever and
modality, at every standard cut-off whatever the audit's K; the reference handled as the
benchmark's code handles it (``reference_ahead`` of each rank row). Warnings say when the
figures cannot be put next to a paper's: CIRCO ranked on fewer images than its 123,403-image
COCO gallery, queries of the split that were not ranked, ranks stored without the
reference's position.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from retrieval.evaltargets import facts_by_query
from retrieval.galleries import mixed_fallback_text, split_of_scope
from retrieval.protocols import REMOVED, Protocol, QueryRanks, protocol_for, protocol_report
from retrieval.targets import positive_targets

from .models import AuditRank, AuditRun
from .rankfiles import RANK_KEYS
from .runs.base import plain_rows

#: The size of CIRCO's gallery (COCO 2017 unlabeled), that its published figures rank against.
CIRCO_GALLERY = 123_403


def _primary_index(fmt: str, facts: list[Any]) -> int | None:
    """Position of the primary target among the query's positives (CIRCO's ``target_img_id``)."""
    for n, target in enumerate(positive_targets(fmt, facts)):
        if target.is_primary:
            return n
    return None


def gallery_mixed_warning(run: AuditRun) -> str:
    """The warning of a run whose queries of some scopes searched every image of the dataset, the
    other scopes' images included (:func:`retrieval.galleries.mixed_fallback`, at planning); ``""`` if none."""
    mixed = (((run.summary or {}).get("plan") or {}).get("gallery") or {}).get("mixed") or []
    return mixed_fallback_text(mixed) if mixed else ""


def _warnings(run: AuditRun, fmt: str, n_ranked: int, protocol: Any) -> list[str]:
    out: list[str] = [w for w in [gallery_mixed_warning(run)] if w]
    if run.source == AuditRun.Source.IMPORTED:
        out.extend(_reference_warnings(run, protocol))
    missing = (run.summary or {}).get("no_positive_in_gallery") or 0
    if missing:
        out.append(
            f"{missing} of the ranked queries had no ground truth in the gallery they searched: each counts as "
            f"a miss at every K (the benchmark's own gallery holds every target; import it whole)"
        )
    category = split_of_scope(run.split)[1]
    if protocol.per_category and category:
        out.append(
            f"the audit's scope is category {category!r} only: the benchmark's published R@K is the mean "
            f"over its categories, so compare this row with that category's figure, not the mean"
        )
    plan = (run.summary or {}).get("plan") or {}
    gallery = (plan.get("gallery") or {}).get("images")
    if fmt == "circo" and gallery is not None and gallery < CIRCO_GALLERY:
        out.append(
            f"ranked against {gallery:,} images, not CIRCO's {CIRCO_GALLERY:,}-image COCO unlabeled2017 "
            f"gallery: not comparable with published CIRCO figures (import it with import_gallery)"
        )
    in_split = plan.get("queries_in_split")
    if in_split and n_ranked < in_split:
        out.append(
            f"{in_split - n_ranked} of the scope's {in_split} queries were not ranked "
            f"(see the skipped queries); the figures cover {n_ranked}"
        )
    return out


def reference_evidence(run: AuditRun) -> dict[str, dict[str, int]]:
    """Per imported retriever, how many of its rank file's top lists hold the query's reference
    image (``seen`` of ``lists``), as the import counted them: a rank file does not say whether
    its gallery kept the reference, but a reference in its top lists shows that it did."""
    summary = run.summary or {}
    out: dict[str, dict[str, int]] = {}
    for report in [summary.get("import") or {}, *(summary.get("imports") or [])]:
        out.update(report.get("reference_in_top_lists") or {})
    return out


def _reference_warnings(run: AuditRun, protocol: Any) -> list[str]:
    out = []
    for retriever, counts in reference_evidence(run).items():
        if not counts.get("seen"):
            continue
        kept = f"{retriever}: the query's reference image is in {counts['seen']} of the {counts['lists']} top lists of its rank file, so that file's gallery kept the reference"
        if protocol.reference == REMOVED:
            out.append(
                f"{kept}; {protocol.title} removes it, so a target ranked after its reference is one place "
                f"lower here than under the protocol (the figures are understated)"
            )
        else:
            out.append(f"{kept}, as {protocol.title} does")
    return out


def run_query_ranks(run: AuditRun, protocol: Protocol) -> dict[tuple[str, str], dict[int, QueryRanks]]:
    """Per (retriever, modality), query id -> the :class:`QueryRanks` the protocol reads from
    the run's stored rank rows (in the run's retriever order, then modality order); the one
    reading of rank rows behind :func:`run_protocol` and the leaderboard's audit entries."""
    fmt = run.dataset.format
    fields = (
        "query_id",
        "retriever",
        "mm_all",
        "text_all",
        "image_all",
        "subset",
        "reference_ahead",
        "query__category",
        "mm",
        "text",
        "image",
    )
    rows = plain_rows(
        AuditRank.objects.filter(run=run).order_by("query__ordinal", "query_id"), fields, json_at=(2, 3, 4, 5, 6)
    )
    imported = run.source == AuditRun.Source.IMPORTED
    facts = facts_by_query(sorted({r[0] for r in rows})) if protocol.recall_of_primary else {}
    per_row: dict[tuple[str, str], dict[int, QueryRanks]] = defaultdict(dict)
    order = {name: n for n, name in enumerate(run.retrievers)}
    for qid, retriever, mm_all, text_all, image_all, subset, ahead, category, mm, text, image in rows:
        every = {"mm": mm_all or [], "text": text_all or [], "image": image_all or []}
        best = {"mm": mm, "text": text, "image": image}
        primary = _primary_index(fmt, facts.get(qid, [])) if protocol.recall_of_primary else 0
        for modality, field in RANK_KEYS.items():
            # a rank file's one number per query: the best positive's rank, all the protocol knows
            one_number = imported and not every[field]
            per_row[(retriever, modality)][qid] = QueryRanks(
                [best[field]] if one_number else every[field],
                (ahead or {}).get(field) or (),
                primary,
                (subset or {}).get(field),
                category or "",
                every_positive=not one_number,
                subset_known=not imported or field in (subset or {}),
            )
    return dict(
        sorted(
            per_row.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0][0], list(RANK_KEYS).index(kv[0][1]))
        )
    )


def run_protocol(run: AuditRun) -> dict[str, Any] | None:
    """The protocol report of a run as JSON (:meth:`retrieval.protocols.ProtocolReport.as_json`
    plus ``queries``), or ``None`` when its dataset format has no published protocol."""
    fmt = run.dataset.format
    protocol = protocol_for(fmt)
    if protocol is None:
        return None
    per_row = run_query_ranks(run, protocol)
    query_ids = {q for ranks in per_row.values() for q in ranks}
    imported = run.source == AuditRun.Source.IMPORTED
    report = protocol_report(
        protocol,
        {key: list(ranks.values()) for key, ranks in per_row.items()},
        audited_removed=run.exclude_reference,
        imported=imported,
    )
    report.warnings.extend(_warnings(run, fmt, len(query_ids), protocol))
    return {**report.as_json(), "queries": len(query_ids)}


def _columns(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(header, key path) of a protocol table: per category first (FashionIQ), then the rest."""
    first = data["rows"][0] if data["rows"] else {}
    cols: list[tuple[str, str]] = []
    for cat, values in (first.get("categories") or {}).items():
        cols += [(f"{cat} {k}", f"{cat}|{k}") for k in values if k != "queries"]
    prefix = "mean " if first.get("categories") else ""
    cols += [
        (f"{prefix}{k}" if k.startswith("R@") else k, k)
        for k in first
        if k not in ("retriever", "modality", "queries", "categories")
    ]
    return cols


def protocol_table(data: dict[str, Any] | None, modality_names: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The protocol report as the audit page shows it: percent, one row per retriever and
    modality (the retriever named on its first row), as the papers print their tables."""
    if not data:
        return None
    cols = _columns(data)
    rows = []
    for row in data["rows"]:
        cells = []
        for _, key in cols:
            cat, _, name = key.rpartition("|")
            value = (row.get("categories") or {}).get(cat, {}).get(name) if cat else row.get(name)
            cells.append(None if value is None else 100 * value)
        first = not rows or rows[-1]["retriever"] != row["retriever"]
        rows.append(
            {
                "retriever": row["retriever"],
                "first": first,
                "cells": cells,
                "modality": (modality_names or {}).get(row["modality"], row["modality"]),
            }
        )
    return {
        **{k: data[k] for k in ("benchmark", "reference", "source", "warnings", "queries")},
        "columns": [header for header, _ in cols],
        "rows": rows,
    }
