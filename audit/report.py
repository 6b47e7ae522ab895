"""What the audit report page shows, computed from a finished run (Django; thin)."""
from __future__ import annotations

from typing import Any

from django.utils.safestring import SafeString, mark_safe

from retrieval.metrics import MODALITIES
from retrieval.models import QuerySubset

from . import charts
from .labels import LABELS
from .models import AuditLabel, AuditRun
from .services import subset_scores

VALIDATED_SUBSET = "validated"
MODALITY_NAMES = {"multimodal": "multimodal", "text_only": "text only", "image_only": "image only"}


def _score_rows(run: AuditRun, stats: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name in run.retrievers:
        s = stats.get(name)
        if not s:
            continue
        rows.append({
            "retriever": name,
            "external": name in run.external_retrievers,
            "cells": [(metric, m, s[metric][m]) for metric in ("recall_at_k", "mrr", "ndcg") for m in MODALITIES],
            "comp_gap_ndcg": s["comp_gap_ndcg"],
            "comp_gap_mrr": s["comp_gap_mrr"],
        })
    return rows


def build_report(run: AuditRun) -> dict[str, Any]:
    """Label counts, per-subset score tables, Composition Gap and support charts."""
    s = run.summary
    counts = s.get("counts", {})
    subsets: list[dict[str, Any]] = [
        {"name": "full", "title": "All audited queries", "n": s.get("n_queries", 0),
         "stats": s.get("retriever_stats", {})},
        {"name": "shortcut-free", "title": "Shortcut-free subset", "n": counts.get("shortcut_free", 0),
         "stats": s.get("shortcut_free_stats", {})},
    ]
    validated = QuerySubset.objects.filter(dataset=run.dataset, name=VALIDATED_SUBSET).first()
    validated_note = None
    if validated is not None:
        ids = set(validated.queries.values_list("pk", flat=True))
        n = AuditLabel.objects.filter(run=run, query_id__in=ids).count()
        if n:
            subsets.append({"name": "validated", "title": f"Validated subset ({validated.source or 'export'})",
                            "n": n, "stats": subset_scores(run, ids)})
        else:
            validated_note = "The dataset has a 'validated' subset, but none of its queries is in this audit."
    for sub in subsets:
        sub["rows"] = _score_rows(run, sub["stats"])

    series = [sub["name"] for sub in subsets if sub["stats"]]
    gap_charts: list[SafeString] = []
    for key, label in (("comp_gap_ndcg", "nDCG"), ("comp_gap_mrr", "MRR")):
        values = {
            (name, sub["name"]): sub["stats"].get(name, {}).get(key)
            for sub in subsets if sub["stats"] for name in run.retrievers
        }
        finite = [v for v in values.values() if v is not None]
        gap_charts.append(mark_safe(charts.grouped_hbar_svg(
            run.retrievers, series, values, f"Composition Gap on {label}: 1 − max(image, text) / multimodal",
            lo=max(-1.0, min(finite + [0.0])), hi=1.0,
        )))

    hist = s.get("support_histograms", {})
    shown = {key: {int(n): c for n, c in hist.get(key, {}).items()} for key in ("multimodal", "either_unimodal")}
    n_max = max([len(run.retrievers)] + [n for h in shown.values() for n in h])
    support_chart = mark_safe(charts.histogram_svg(
        {"multimodal within K": shown["multimodal"], "text or image within K": shown["either_unimodal"]},
        n_max, f"How many retrievers solve each query (K = {run.k})",
    ))
    table1 = {
        "dataset": run.dataset.name, "split": run.split, "total": s.get("n_queries", 0),
        **{label: counts.get(label, 0) for label in (*LABELS, "shortcut_free")},
    }
    return {
        "table1": table1,
        "detail_counts": s.get("detail_counts", {}),
        "subsets": subsets,
        "validated_note": validated_note,
        "gap_charts": gap_charts,
        "support_chart": support_chart,
        "support_columns": list(range(n_max + 1)),
        "support_rows": [
            (key, [int(hist[key].get(str(n), 0)) for n in range(n_max + 1)]) for key in hist
        ],
        "skipped": s.get("skipped", {}),
        "skipped_total": s.get("skipped_total", 0),
        "no_positive_in_gallery": s.get("no_positive_in_gallery", 0),
        "plan": s.get("plan", {}),
        "imports": [s["import"]] if "import" in s else list(s.get("imports", [])),
        "modalities": [MODALITY_NAMES[m] for m in MODALITIES],
    }
