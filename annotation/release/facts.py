"""The numbers a release states (dataset card and croissant.json), read from the dicts the
report services return (:func:`annotation.agreement.reports.study_report`,
:func:`annotation.alternatives.study.alternatives_report`, :func:`audit.report.audit_report_json`,
the export manifests): picked, never computed again, so the card equals the report pages."""

from __future__ import annotations

from typing import Any

from annotation.release.sources import source_of
from audit.labels import COUNT_KEYS, LABELS, label_shares
from retrieval.models import Dataset

AGREEMENT_KEYS = ("krippendorff_alpha", "fleiss_kappa", "gwet_ac1", "percent_agreement")


def agreement_facts(report: dict[str, Any]) -> dict[str, Any]:
    """Each agreement coefficient of the report with its 95% interval (``None`` when undefined)."""
    a = report["agreement"]
    intervals = (a.get("confidence_intervals") or {}).get("intervals") or {}
    out: dict[str, Any] = {}
    for key in AGREEMENT_KEYS:
        iv = intervals.get(key) or {}
        out[key] = {"value": a.get(key), "low": iv.get("low"), "high": iv.get("high")}
    out["n_boot"] = (a.get("confidence_intervals") or {}).get("n_boot")
    out["statement"] = (a.get("spec") or {}).get("statement")
    return out


def audit_facts(audit: dict[str, Any], k: int, retrievers: list[str]) -> dict[str, Any]:
    """Queries audited, each label's count and share, K, the retriever pool, the protocol's warnings."""
    counts = audit["counts"]
    return {
        "queries": sum(int(counts.get(label, 0)) for label in LABELS),
        "counts": {key: counts.get(key, 0) for key in COUNT_KEYS},
        "shares": label_shares(counts),
        "k": k,
        "retrievers": list(retrievers),
        "warnings": list(((audit.get("protocol") or {}).get("warnings")) or []),
    }


def study_facts(part) -> dict[str, Any]:
    """Everything the card and croissant.json say about one study of a release."""
    study, report = part.study, part.report
    status = (report.get("consensus") or {}).get("status") or {}
    first = next(iter(part.exports.values()))
    counts = first["counts"]
    alts = (part.alternatives or {}).get("accepted_per_query") if part.alternatives else None
    return {
        "id": study.pk,
        "name": study.name,
        "folder": part.folder,
        "layouts": list(part.layouts),
        "rubric": {
            "key": study.rubric.key,
            "version": study.rubric.version,
            "title": study.rubric.title,
            "description": study.rubric.rubric.description,
        },
        "guidelines_version": part.guidelines_version,
        "items": report["study"]["items"],
        "judgements": report["study"]["judgements"],
        "annotators": len(report["study"]["annotators"]),
        "overlap": study.overlap,
        "quorum": report["study"]["quorum"],
        "gold_rate": study.gold_rate,
        "training_items": study.training_items,
        "validated": counts["validated"],
        "rejected": counts["rejected"],
        "adjudicated": counts["adjudicated"],
        "pending": counts["pending"],
        "unjudged": counts.get("unjudged", 0),
        "awaiting_adjudication": counts["awaiting_adjudication"],
        "report_validated": status.get("validated"),
        "consensus_rule": first["consensus"]["rule"],
        "agreement": agreement_facts(report),
        "alternatives_per_query": None
        if alts is None
        else {
            "mean": alts["mean"],
            "items": alts["n_items"],
            "with_alternatives": alts["items_with_alternatives"],
            "rule": part.alternatives["rule"],
        },
        "audits": {
            name: audit_facts(part.audits[name], run.k, list(run.retrievers)) for name, run in part.runs.items()
        },
        "datasets": sorted(first["datasets"]),
        "sources": {
            name: {"format": fmt, "source": source_of(fmt)}
            for name, fmt in sorted(
                Dataset.objects.filter(name__in=list(first["datasets"])).values_list("name", "format")
            )
        },
    }


def source_lines(facts: list[dict[str, Any]], placeholder: str) -> list[tuple[str, str, str, str]]:
    """(dataset, format, licence, citation) of every source dataset of a release; what CIRVal
    does not know is ``placeholder`` + what to write."""
    out = []
    seen = set()
    for f in facts:
        for name, s in f["sources"].items():
            if name in seen:
                continue
            seen.add(name)
            src = s["source"] or {}
            out.append(
                (
                    name,
                    s["format"],
                    src.get("licence") or f"{placeholder} the source dataset's licence",
                    src.get("citation") or f"{placeholder} the source dataset's citation",
                )
            )
    return out
