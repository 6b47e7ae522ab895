"""Sessions side by side: the session report of one audit beside other audits' sessions, each
split into sessions written by people and generated ones.

A session is *written by people* when every one of its turns has provenance ``human`` (an
interactive study's export re-imported: :mod:`annotation.interactive.session_export`); any other
session (a generated dataset, CIRCLED's LLM turns, the demo's synthetic ones) is *generated*.
For each audit, group and retriever the rows give, on the multimodal ranks of one history
strategy, Hits@K per turn, Final Recall@K and AUC (:func:`retrieval.sessions.session_metrics`,
the report's own rule) and the rank curve (:func:`retrieval.sessions.rank_curve`); the two
charts draw every row as one series. Unless the page names audits to compare, the newest audit of
each dataset sharing the run's images is shown beside it (sessions written over the demo's gallery
beside the demo's own generated ones).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from audit import charts
from audit.models import AuditRun, AuditSessionRank
from config.figures import fixed
from retrieval.models import Image, Turn
from retrieval.sessions import STRATEGIES, rank_curve, session_metrics

PEOPLE = "written by people"
GENERATED = "generated"
MODALITY = "multimodal"


def session_groups(query_ids) -> dict[int, str]:
    """query id -> PEOPLE or GENERATED (module notes)."""
    kinds: dict[int, set[str]] = defaultdict(set)
    for qid, provenance in Turn.objects.filter(query_id__in=list(query_ids)).values_list("query_id", "provenance"):
        kinds[qid].add(provenance)
    return {qid: PEOPLE if seen == {"human"} else GENERATED for qid, seen in kinds.items()}


def comparable_runs(run: AuditRun, limit: int = 30) -> list[AuditRun]:
    """Other finished audits with scored sessions, newest first (the page's choice)."""
    runs = (
        AuditRun.objects.filter(status=AuditRun.Status.DONE)
        .exclude(pk=run.pk)
        .select_related("dataset")
        .order_by("-finished_at", "-pk")[: limit * 3]
    )
    return [r for r in runs if (r.summary or {}).get("sessions", {}).get("n_sessions")][:limit]


def _rows_of(run: AuditRun, strategy: str, k: int) -> list[dict[str, Any]]:
    ranks = list(
        AuditSessionRank.objects.filter(run=run, strategy=strategy, modality=MODALITY).values_list(
            "retriever", "query_id", "ranks"
        )
    )
    groups = session_groups({q for _, q, _ in ranks})
    by: dict[tuple[str, str], dict[int, list]] = defaultdict(dict)
    for retriever, qid, r in ranks:
        if r:
            by[(groups.get(qid, GENERATED), retriever)][qid] = r
    rows = []
    for (group, retriever), sessions in sorted(by.items(), key=lambda kv: (kv[0][0] != PEOPLE, kv[0][1])):
        m = session_metrics(sessions, k)
        rows.append(
            {
                "run": run,
                "dataset": run.dataset.name,
                "group": group,
                "retriever": retriever,
                "n": m["n_sessions"],
                "hits": m["hits_at_k"],
                "final": m["final_recall_at_k"],
                "auc": m["auc"],
                "ranks": rank_curve(sessions),
            }
        )
    return rows


def _label(row: dict[str, Any], n: int) -> str:
    """A legend entry short enough for the charts' legend (the table names the rest)."""
    return f"{'people' if row['group'] == PEOPLE else 'generated'} · audit {row['run'].pk} · r{n}"


def _charts(rows: list[dict[str, Any]], k: int) -> list[SafeString]:
    l_max = max([len(r["hits"]) for r in rows] + [0])
    if not l_max:
        return []
    turns = [str(n) for n in range(1, l_max + 1)]
    hits = {r["label"]: r["hits"] for r in rows}
    ranks = {r["label"]: r["ranks"] for r in rows}
    peak = max([v for r in rows for v in r["ranks"] if v is not None] + [1.0])
    # a scale whose four ticks are whole ranks: 4, 8, 20, 40, 80, 200, ...
    top = next(m * 10**e for e in range(12) for m in (4, 8, 20) if m * 10**e >= peak)
    return [
        mark_safe(
            charts.line_panels_svg(
                [("multimodal", hits)], turns, f"Hits@{k} per turn, side by side", x_label="turn l", y_label=f"Hits@{k}"
            )
        ),
        mark_safe(
            charts.line_panels_svg(
                [("multimodal", ranks)],
                turns,
                "Rank curve: median rank of the target after each turn (lower is better)",
                x_label="turn l",
                y_label="median rank",
                y_max=top,
            )
        ),
    ]


def sharing_datasets(run: AuditRun) -> set[int]:
    """Datasets that share image files (sha256) with the run's: re-imported sessions written
    by people over the gallery a generated dataset was made from share its images."""
    mine = Image.objects.filter(dataset_id=run.dataset_id).exclude(sha256="").values("sha256")
    return set(
        Image.objects.filter(sha256__in=mine)
        .exclude(dataset_id=run.dataset_id)
        .order_by()
        .values_list("dataset_id", flat=True)
        .distinct()
    )


def _default_others(run: AuditRun, choices: list[AuditRun]) -> list[int]:
    """The newest audit (choices are newest first) of each dataset sharing the run's images."""
    sharing = sharing_datasets(run)
    newest: dict[int, int] = {}
    for r in choices:
        if r.dataset_id in sharing:
            newest.setdefault(r.dataset_id, r.pk)
    return list(newest.values())


def _cells(rows: list[dict[str, Any]]) -> int:
    """The table's cells of every row, one per turn up to the longest session of any row; the
    longest session's length."""
    l_max = max([len(r["hits"]) for r in rows] + [0])
    numbers = {name: n for n, name in enumerate(dict.fromkeys(r["retriever"] for r in rows), start=1)}
    for r in rows:
        r["label"] = _label(r, numbers[r["retriever"]])
        r["hit_cells"] = [fixed(v, 3) if v is not None else "—" for v in r["hits"]] + ["—"] * (l_max - len(r["hits"]))
        r["rank_text"] = " → ".join(f"{v:g}" if v is not None else "not retrieved" for v in r["ranks"])
        r["retriever_short"] = charts.elided(r["retriever"], 34)  # the whole spec in the cell's tooltip
    return l_max


def compare_sessions(run: AuditRun, others: list[int] | None, strategy: str | None = None) -> dict[str, Any] | None:
    """The side-by-side section of ``run``'s report with the audits ``others`` (ids; ``None``:
    the newest audit of each dataset that shares the run's images); None when the run has no
    scored session."""
    s = (run.summary or {}).get("sessions") or {}
    if not s.get("n_sessions"):
        return None
    k = int(s.get("k", run.k))
    strategy = strategy if strategy in STRATEGIES else s.get("filter_basis", {}).get("strategy") or "latest"
    choices = comparable_runs(run)
    if others is None:
        others = _default_others(run, choices)
    chosen = [r for r in choices if r.pk in set(others)]
    rows = _rows_of(run, strategy, k)
    for other in chosen:
        rows.extend(_rows_of(other, strategy, k))
    l_max = _cells(rows)
    return {
        "k": k,
        "strategy": strategy,
        "strategies": STRATEGIES,
        "rows": rows,
        "charts": _charts(rows, k),
        "choices": choices,
        "chosen": [r.pk for r in chosen],
        "turns": list(range(1, l_max + 1)),
    }
