"""What the audit should say about the demo world's planted query kinds (pure: no Django).

The demo (:mod:`retrieval.demo`) plants queries of known kinds and writes them to a truth
file only; ``manage.py demo_check`` compares the newest audit's labels with it here. The
expectations are stated with the label names of :mod:`audit.labels`, the audit rule.
"""

from __future__ import annotations

from typing import Any

from config.figures import fixed
from retrieval.demo import HUMAN_EXPECTED, PLANTED_SHARES, precision_recall

from .labels import BOTH_UNIMODAL, COMPOSITION_REQUIRED, IMAGE_ONLY, SHORTCUT_SOLVABLE, TEXT_ONLY, UNRESOLVED
from .suspicion import TOP_SHARE, queue_precision

#: What the audit should say about each planted kind: ``(label, details)``; a query of
#: the kind is *found* when its label is ``label`` and (if given) its detail is among ``details``.
AUDIT_EXPECTED: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "composition": (COMPOSITION_REQUIRED, None),
    "text_only": (SHORTCUT_SOLVABLE, (TEXT_ONLY, BOTH_UNIMODAL)),
    "image_only": (SHORTCUT_SOLVABLE, (IMAGE_ONLY, BOTH_UNIMODAL)),
    "vague": (UNRESOLVED, None),
    "wrong_target": (UNRESOLVED, None),
}


def check_audit(kinds: dict[Any, str], labels: dict[Any, str], details: dict[Any, str]) -> dict[str, dict[str, Any]]:
    """Per planted kind of :data:`AUDIT_EXPECTED`: precision and recall of the audit's labels.

    ``kinds`` maps query -> planted kind; ``labels``/``details`` the audit's label and
    detail label per query. Only queries the audit labelled take part.
    """
    out = {}
    for kind, (label, wanted) in AUDIT_EXPECTED.items():
        found = {q for q in labels if labels[q] == label and (wanted is None or details.get(q) in wanted)}
        out[kind] = precision_recall({q for q in labels if kinds.get(q) == kind}, found)
    return out


#: The planted defects the suspicion queue is measured on: every planted kind (the flawed
#: queries, and the shortcut ones the audit let through), and those a human should flag.
SUSPICION_DEFECTS: dict[str, frozenset[str]] = {
    "planted": frozenset(PLANTED_SHARES),
    "human": frozenset(HUMAN_EXPECTED),
}


def check_suspicion(
    kinds: dict[Any, str], scores: dict[Any, float | None], share: float = TOP_SHARE
) -> dict[str, dict[str, Any]]:
    """Precision and recall of the top ``share`` of the suspicion queue (``scores``: query ->
    score, the queries of the queue) against each set of :data:`SUSPICION_DEFECTS`."""
    return {
        name: queue_precision(scores, {q for q in scores if kinds.get(q) in wanted}, share)
        for name, wanted in SUSPICION_DEFECTS.items()
    }


#: CIRCUS's tables' sets, in order: the audit report's subset names and the columns' titles.
CIRCUS_SETS: tuple[tuple[str, str], ...] = (
    ("full", "Full"),
    ("shortcut-free", "Shortcut-free"),
    ("validated", "Validated"),
)


def circus_tables(subsets: list[dict[str, Any]], retrievers: list[str]) -> dict[str, Any]:
    """CIRCUS's two tables from the audit report's score subsets (:func:`audit.report.build_report`'s
    ``subsets``: name, n, stats per retriever): multimodal Recall@K and the Composition Gap on
    nDCG of every audit retriever on the full split, the shortcut-free and the validated subset
    (``None``: the subset is missing or the figure undefined)."""
    by_name = {s["name"]: s for s in subsets}
    sets = [
        {"name": name, "title": title, "queries": by_name[name]["n"] if name in by_name else None}
        for name, title in CIRCUS_SETS
    ]

    def cell(retriever: str, name: str, key: str) -> float | None:
        stats = (by_name.get(name) or {}).get("stats", {}).get(retriever)
        if not stats:
            return None
        value = stats.get(key)
        return value.get("multimodal") if isinstance(value, dict) else value

    return {
        "sets": sets,
        "recall": [{"retriever": r, **{n: cell(r, n, "recall_at_k") for n, _ in CIRCUS_SETS}} for r in retrievers],
        "comp_gap": [{"retriever": r, **{n: cell(r, n, "comp_gap_ndcg") for n, _ in CIRCUS_SETS}} for r in retrievers],
    }


def circus_lines(tables: dict[str, Any], k: int) -> list[str]:
    """The two tables as demo_check prints them (Recall in percent, the gap as a fraction)."""

    def fmt(v: float | None, percent: bool) -> str:
        return "-" if v is None else (fixed(100 * v, 1) if percent else fixed(v, 3))

    name_w = max([len("retriever")] + [len(r["retriever"]) for r in tables["recall"]]) + 2
    titles = [s["title"] if s["queries"] is None else f"{s['title']} ({s['queries']})" for s in tables["sets"]]
    head = "".join(f"{t:>22}" for t in titles)
    out = []
    for title, rows, percent in (
        (f"Recall@{k} (multimodal, %)", tables["recall"], True),
        ("Composition Gap on nDCG: 1 - max(image, text) / multimodal", tables["comp_gap"], False),
    ):
        out += [f"  {title}", f"    {'retriever':<{name_w}}{head}"]
        out += [
            f"    {r['retriever']:<{name_w}}" + "".join(f"{fmt(r[s['name']], percent):>22}" for s in tables["sets"])
            for r in rows
        ]
    return out
