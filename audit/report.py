"""What the audit report page shows, computed from a finished run (Django; thin)."""

from __future__ import annotations

from typing import Any

from django.utils.safestring import SafeString, mark_safe

from retrieval.metrics import MAP_KS, MODALITIES, SUBSET_KS
from retrieval.models import VALIDATED_SUBSET, QuerySubset
from retrieval.sessions import curve_mean
from retrieval.targets import rule_text

from . import charts
from .alternatives import before_after
from .labels import COUNT_HEADINGS, COUNT_KEYS, SHORTCUT_FREE_NAME, audit_json
from .models import AuditLabel, AuditRun
from .protocol import gallery_mixed_warning, protocol_table, run_protocol
from .runs.aggregation import stored_labels, subset_scores


def audit_report_json(run: AuditRun) -> dict[str, Any]:
    """The audit report of a finished run as ``audit_report --format json`` prints it and a
    release ships it: :func:`audit.labels.audit_json` of the stored ranks plus ``protocol``
    (:func:`audit.protocol.run_protocol`)."""
    return {**audit_json(stored_labels(run)), "protocol": run_protocol(run)}


MODALITY_NAMES = {"multimodal": "multimodal", "text_only": "text only", "image_only": "image only"}
FILTER_NAMES = {
    "success": "success",
    "multi_turn": "multi-turn",
    "epsilon_consistency": "epsilon-consistency",
    "tau_diversity": "tau-diversity",
}
FILTER_HELP = {
    "success": "target within K at some turn",
    "multi_turn": "target not within K at turn 1",
    "epsilon_consistency": "no turn worsens the rank by more than epsilon",
    "tau_diversity": "no two texts with cosine >= tau",
}


def _g(v: Any) -> str:
    """A parameter as written by a person: 30, 0.8 (not 30.0, 0.80)."""
    return "" if v is None else f"{float(v):g}"


def _num(v: Any) -> Any:
    return None if v is None else float(v)


def _sessions_y_max(metrics: dict[str, Any]) -> float:
    """One y scale for every retriever's chart, so that the charts compare at a glance."""
    peak = max(
        [
            float(v)
            for per in metrics.values()
            for mods in per.values()
            for cell in mods.values()
            for v in cell.get("hits_at_k", [])
            if v is not None
        ]
        + [0.0]
    )
    return next((y for y in charts.Y_STEPS if peak <= y + 1e-12), 1.0)


def _sessions_curve(
    name: str, per: dict[str, Any], strategies: list[str], modalities: list[str], k: int, l_max: int, y_max: float
) -> SafeString:
    panels = [
        (MODALITY_NAMES.get(m, m), {st: per.get(st, {}).get(m, {}).get("hits_at_k", []) for st in strategies})
        for m in modalities
    ]
    what = f"cumulative Hits@{k} after each turn (target within {k} at some turn ≤ l)"
    # the heading holds about 125 characters of 12 px bold across the chart's 960 units: a
    # long retriever spec is cut in its middle there, and stays whole in the tooltip
    shown = charts.elided(name, max(24, 123 - len(": ") - len(what)))
    return mark_safe(
        charts.line_panels_svg(
            panels,
            [str(n) for n in range(1, l_max + 1)],
            f"{shown}: {what}",
            x_label="turn l",
            y_label=f"Hits@{k}",
            y_max=y_max,
            full_title=f"{name}: {what}",
        )
    )


def _sessions_rows(
    s: dict[str, Any], name: str, per: dict[str, Any], strategies: list[str], modalities: list[str]
) -> list[dict[str, Any]]:
    rows = []
    for st in strategies:
        cells = per.get(st, {})
        auc = [_num(cells.get(m, {}).get("auc")) for m in modalities]
        auc_mean = [_num(curve_mean(cells.get(m, {}).get("hits_at_k") or [])) for m in modalities]
        rows.append(
            {
                "retriever": name,
                "strategy": st,
                "final": [_num(cells.get(m, {}).get("final_recall_at_k")) for m in modalities],
                "auc": auc,
                "auc_mean": auc_mean,
                "auc_pairs": list(zip(auc, auc_mean)),
                "kept": [s.get("kept_per_ranking", {}).get(name, {}).get(st, {}).get(m) for m in modalities],
            }
        )
    return rows


def _length_chart(hist: dict[int, int], kept_hist: dict[int, int], lengths: list[int]) -> SafeString | None:
    if not lengths:
        return None
    return mark_safe(
        charts.histogram_svg(
            {"scored sessions": hist, "kept by all filters": kept_hist},
            max(lengths),
            "Sessions by number of turns",
            x_label="turns in the session",
            x_min=min(lengths),
            tip=lambda series, count, x: f"{series}: {count} session{'' if count == 1 else 's'} of {x} turns",
        )
    )


def build_sessions_report(run: AuditRun) -> dict[str, Any] | None:
    """The 'Sessions' section: Hits@K curves, metric table, filter table, turn lengths (None: no sessions)."""
    s = run.summary.get("sessions")
    if not s:
        return None
    k = s.get("k", run.k)
    strategies = s.get("strategies", ["latest", "average", "weighted"])
    modalities = s.get("modalities", list(MODALITIES))
    metrics = s.get("metrics", {})
    l_max = int(s.get("l_max", 0))
    curves: list[SafeString] = []
    rows: list[dict[str, Any]] = []
    y_max = _sessions_y_max(metrics)
    for name in run.retrievers:
        per = metrics.get(name)
        if not per:
            continue
        if l_max:
            curves.append(_sessions_curve(name, per, strategies, modalities, k, l_max, y_max))
        rows.extend(_sessions_rows(s, name, per, strategies, modalities))
    filters = s.get("filters", {})
    steps = [
        {**step, "title": FILTER_NAMES.get(step["name"], step["name"]), "help": FILTER_HELP.get(step["name"], "")}
        for step in filters.get("steps", [])
    ]
    hist = {int(n): int(c) for n, c in s.get("turn_histogram", {}).items()}
    kept_hist = {int(n): int(c) for n, c in s.get("kept_turn_histogram", {}).items()}
    lengths = sorted(set(hist) | set(kept_hist))
    length_chart = _length_chart(hist, kept_hist, lengths)
    return {
        "n": s.get("n_sessions", 0),
        "in_split": s.get("sessions_in_split", 0),
        "k": k,
        "alpha": _g(s.get("alpha")),
        "epsilon": _g(s.get("epsilon")),
        "tau": _g(s.get("tau")),
        "y_max": y_max,
        "tau_encoder": s.get("tau_encoder"),
        "l_max": l_max,
        "curves": curves,
        "modalities": [MODALITY_NAMES.get(m, m) for m in modalities],
        "rows": rows,
        "basis": s.get("filter_basis", {}),
        "basis_modality": MODALITY_NAMES.get(s.get("filter_basis", {}).get("modality", ""), ""),
        "filter_total": filters.get("n_sessions", 0),
        "filter_steps": steps,
        "n_kept": filters.get("n_kept", 0),
        "tau_missing": filters.get("tau_missing", 0),
        "length_chart": length_chart,
        "length_rows": [(n, hist.get(n, 0), kept_hist.get(n, 0)) for n in lengths],
        "skipped": s.get("skipped", {}),
        "skipped_total": s.get("skipped_total", 0),
        "no_positive_in_gallery": s.get("no_positive_in_gallery", 0),
        "text_cosine": s.get("text_cosine", {}),
        "subset": s.get("subset", ""),
        "checks": _checks_report(s.get("checks")),
    }


#: What each automatic session check looks for (the staff report's wording).
CHECK_HELP: dict[str, str] = {
    "duplicate": "the target repeats the previous turn's target (cosine ≥ {duplicate}) although the turn starts "
    "from another image",
    "circle": "the target returns to an image the session had left (cosine ≥ {circle} with an image two or more "
    "turns back)",
    "conflict": "two turns ask for opposite changes: their centred text embeddings have cosine ≤ −{conflict}",
    "conflict/image": "two turns make opposite changes: their image changes (target − reference) have cosine "
    "≤ −{conflict}",
    "noop": "the target is nearly the turn's (effective) reference (cosine ≥ {noop})",
    "reference_not_earlier": "the text names a turn that does not exist or is not earlier",
    "keep_names_no_turn": "a “keep the <attribute>” claim names no turn",
    "refers_to_later_turn": "the text refers to a later turn",
}


def _checks_report(c: dict[str, Any] | None) -> dict[str, Any] | None:
    """The 'Automatic checks' part of the sessions section (staff only; None for runs before them)."""
    if not c:
        return None
    th = c.get("thresholds", {})
    image = c.get("conflict_directions") == "image"
    rows = [
        {
            "key": key,
            "kind": kind,
            "help": CHECK_HELP.get(f"{key}/image" if image and key == "conflict" else key, "").format(**th),
            **counts,
        }
        for kind, part in (("embedding", c.get("consistency", {})), ("reference", c.get("reference", {})))
        for key, counts in part.items()
    ]
    return {
        "rows": rows,
        "retriever": c.get("retriever"),
        "retrospective_turns": c.get("retrospective_turns", 0),
        "flagged_turns": c.get("flagged_turns", 0),
        "flagged": c.get("flagged", []),
        "thresholds": th,
    }


def _score_rows(run: AuditRun, stats: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name in run.retrievers:
        s = stats.get(name)
        if not s:
            continue
        rows.append(
            {
                "retriever": name,
                "external": name in run.external_retrievers,
                "cells": [(metric, m, s[metric][m]) for metric in ("recall_at_k", "mrr", "ndcg") for m in MODALITIES],
                "comp_gap_ndcg": s["comp_gap_ndcg"],
                "comp_gap_mrr": s["comp_gap_mrr"],
            }
        )
    return rows


TIE_RULE = (
    "Ties are pessimistic: a target's rank is 1 + the number of other gallery images "
    "(the reference excluded) scoring at least as high as it."
)


def _multi_rows(run: AuditRun, stats: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per retriever and modality: Recall@K beside mAP@K (5, 10, 25, 50), graded nDCG and
    Recall_subset@K (when the data has subsets). Runs aggregated before these existed give none."""
    rows = []
    for name in run.retrievers:
        s = stats.get(name) or {}
        if "map_at_k" not in s:
            continue
        subset = s.get("recall_subset")
        for m in MODALITIES:
            rows.append(
                {
                    "retriever": name,
                    "modality": MODALITY_NAMES[m],
                    "first": m == MODALITIES[0],
                    "recall": s["recall_at_k"][m],
                    "maps": [s["map_at_k"].get(str(k), {}).get(m) for k in MAP_KS],
                    "ndcg_graded": (s.get("ndcg_graded") or {}).get(m),
                    "subset": [subset.get(str(k), {}).get(m) for k in SUBSET_KS] if subset else None,
                }
            )
    return rows


def _subsets(run: AuditRun) -> tuple[list[dict[str, Any]], str | None]:
    """The score tables: all queries, the shortcut-free subset and the validated one when present."""
    s = run.summary
    subsets: list[dict[str, Any]] = [
        {
            "name": "full",
            "title": "All audited queries",
            "n": s.get("n_queries", 0),
            "stats": s.get("retriever_stats", {}),
        },
        {
            "name": "shortcut-free",
            "title": "Shortcut-free subset",
            "n": s.get("counts", {}).get(SHORTCUT_FREE_NAME, 0),
            "stats": s.get("shortcut_free_stats", {}),
        },
    ]
    validated = QuerySubset.objects.filter(dataset=run.dataset, name=VALIDATED_SUBSET).first()
    validated_note = None
    if validated is not None:
        ids = set(validated.queries.values_list("pk", flat=True))
        n = AuditLabel.objects.filter(run=run, query_id__in=ids).count()
        if n:
            subsets.append(
                {
                    "name": VALIDATED_SUBSET,
                    "title": f"Validated subset ({validated.source or 'export'})",
                    "n": n,
                    "stats": subset_scores(run, ids),
                }
            )
        else:
            validated_note = "The dataset has a 'validated' subset, but none of its queries is in this audit."
    for sub in subsets:
        sub["rows"] = _score_rows(run, sub["stats"])
        sub["multi_rows"] = _multi_rows(run, sub["stats"])
        sub["has_subset"] = any(r["subset"] for r in sub["multi_rows"])
    return subsets, validated_note


def _gap_charts(run: AuditRun, subsets: list[dict[str, Any]]) -> list[SafeString]:
    series = [sub["name"] for sub in subsets if sub["stats"]]
    gap_charts: list[SafeString] = []
    for key, label in (("comp_gap_ndcg", "nDCG"), ("comp_gap_mrr", "MRR")):
        values = {
            (name, sub["name"]): sub["stats"].get(name, {}).get(key)
            for sub in subsets
            if sub["stats"]
            for name in run.retrievers
        }
        finite = [v for v in values.values() if v is not None]
        gap_charts.append(
            mark_safe(
                charts.grouped_hbar_svg(
                    run.retrievers,
                    series,
                    values,
                    f"Composition Gap on {label}: 1 − max(image, text) / multimodal",
                    lo=max(-1.0, min(finite + [0.0])),
                    hi=1.0,
                )
            )
        )
    return gap_charts


def build_report(run: AuditRun) -> dict[str, Any]:
    """Label counts, per-subset score tables, Composition Gap and support charts."""
    s = run.summary
    counts = s.get("counts", {})
    subsets, validated_note = _subsets(run)
    gap_charts = _gap_charts(run, subsets)

    hist = s.get("support_histograms", {})
    shown = {key: {int(n): c for n, c in hist.get(key, {}).items()} for key in ("multimodal", "either_unimodal")}
    n_max = max([len(run.retrievers)] + [n for h in shown.values() for n in h])
    support_chart = mark_safe(
        charts.histogram_svg(
            {"multimodal within K": shown["multimodal"], "text or image within K": shown["either_unimodal"]},
            n_max,
            f"How many retrievers solve each query (K = {run.k})",
        )
    )
    table1 = {
        "dataset": run.dataset.name,
        "split": run.split,
        "total": s.get("n_queries", 0),
        **{label: counts.get(label, 0) for label in COUNT_KEYS},
        "counts": [counts.get(label, 0) for label in COUNT_KEYS],
        "headings": COUNT_HEADINGS,
    }
    sessions = build_sessions_report(run)
    return {
        "alternatives": before_after(run),
        "sessions": sessions,
        "session_seconds": sum(
            float(run.timings.get(key, 0.0) or 0.0)
            for key in ("encode_sessions", "rank_sessions", "encode_session_texts")
        ),
        "has_single": bool(s.get("n_queries")) or sessions is None,
        "table1": table1,
        "detail_counts": s.get("detail_counts", {}),
        "subsets": subsets,
        "validated_note": validated_note,
        "gap_charts": gap_charts,
        "support_chart": support_chart,
        "support_columns": list(range(n_max + 1)),
        "support_rows": [(key, [int(hist[key].get(str(n), 0)) for n in range(n_max + 1)]) for key in hist],
        "skipped": s.get("skipped", {}),
        "skipped_total": s.get("skipped_total", 0),
        "no_positive_in_gallery": s.get("no_positive_in_gallery", 0),
        "plan": s.get("plan", {}),
        "gallery_mixed": gallery_mixed_warning(run),
        "imports": [s["import"]] if "import" in s else list(s.get("imports", [])),
        "modalities": [MODALITY_NAMES[m] for m in MODALITIES],
        "map_ks": list(MAP_KS),
        "subset_ks": list(SUBSET_KS),
        "tie_rule": TIE_RULE,
        "target_rule": rule_text(run.dataset.format),
        "dataset_format": run.dataset.format,
        "protocol": protocol_table(run_protocol(run), MODALITY_NAMES),
    }
