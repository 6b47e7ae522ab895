"""A study's suspicion scores (:mod:`audit.suspicion`), stored on its items for serving and staff pages.

:func:`refresh_suspicion` computes every single-turn item's score from the newest finished
audit of its query (:func:`audit.runs.suspicion_signals.audit_signals`) and the item's counted
judgements (the annotators' disagreement), and stores it on the item (``suspicion``, with
its parts in ``suspicion_parts``), so that serving by suspicion reads one indexed column.
It runs on a worker after the candidate panels are filled (``annotation.tasks.fill_candidates``:
when a study is built and when an audit of its dataset finishes), in ``make_demo`` and from
the staff's button on the suspicion page (which also takes in new votes: a submit does not
recompute it). Sessions have no score (0). Annotators never see any of it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.db import transaction
from django.utils import timezone

from annotation.models import StudyItem
from annotation.verdicts.state import counted_judgements
from audit.runs.suspicion_signals import audit_signals
from audit.suspicion import PARTS, WEIGHTS, Signals, score


def item_votes(study_id: int) -> dict[int, tuple[bool, ...]]:
    """item -> the validated/not answers of its counted judgements (those that say either)."""
    out: dict[int, list[bool]] = {}
    for item, validated in (
        counted_judgements(study_id).filter(validated__isnull=False).values_list("assignment__item_id", "validated")
    ):
        out.setdefault(item, []).append(bool(validated))
    return {k: tuple(v) for k, v in out.items()}


def item_suspicion(
    signals: Signals, votes: tuple[bool, ...], run: int | None, computed_at: str = ""
) -> tuple[float, dict[str, Any]]:
    """(score, what is stored beside it) of one item: 0 when no part could be computed;
    ``votes`` and ``computed_at`` say what the score saw and when."""
    value, parts = score(replace(signals, votes=votes))
    return (value or 0.0), {
        "parts": parts,
        "run": run,
        "rivals": signals.rivals,
        "votes": len(votes),
        "scored": value is not None,
        "computed_at": computed_at,
    }


def refresh_suspicion(study_id: int, batch: int = 500) -> int:
    """Compute and store the score of every single-turn item of a study; returns how many were scored."""
    items = list(StudyItem.objects.filter(study_id=study_id, query__n_turns=1).only("pk", "query_id"))
    votes = item_votes(study_id)
    computed_at = timezone.now().isoformat(timespec="seconds")
    scored = 0
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        signals = audit_signals([i.query_id for i in chunk])
        for item in chunk:
            run, sig = signals.get(item.query_id, (None, Signals(ranks=(), n_gallery=0)))
            item.suspicion, item.suspicion_parts = item_suspicion(sig, votes.get(item.pk, ()), run, computed_at)
            scored += item.suspicion_parts["scored"]
        with transaction.atomic():
            StudyItem.objects.bulk_update(chunk, ["suspicion", "suspicion_parts"], batch_size=batch)
    return scored


#: What each part says, for the staff pages (the formulas: :mod:`audit.suspicion`).
PART_HELP: dict[str, str] = {
    "lead_rank": "the lead retriever (the audit's best) ranks the labelled target low (log scale)",
    "lead_gap": "under the lead retriever, another image fits the query better than the target",
    "margin": "unimodal margin: the multimodal rank no better than the text-only or image-only one",
    "retrievers": "the retrievers disagree with the labelled target (its multimodal rank, on a log scale)",
    "spread": "how far the retrievers' ranks differ (shown, not counted)",
    "gap": "another image fits the query better than the target (in standard deviations)",
    "breadth": "pool images that every retriever ranks above the target",
    "consistency": "the text does not point at the target rather than at the reference",
    "votes": "the annotators disagree (two votes or more)",
}


def staleness(stored: list[dict[str, Any]], votes_now: dict[int, tuple[bool, ...]]) -> dict[str, Any]:
    """How far stored scores are behind: ``stored`` holds ``item`` (pk) and ``meta`` (the stored
    parts) per item. Returns the oldest ``computed_at`` and the items whose counted votes changed
    since their score was computed (a submit does not recompute it: the page's button does)."""
    behind = [
        row["item"] for row in stored if len(votes_now.get(row["item"], ())) != (row["meta"] or {}).get("votes", 0)
    ]
    stamps = [(row["meta"] or {}).get("computed_at") or "" for row in stored]
    return {"computed_at": min(stamps) if stamps and all(stamps) else "", "behind": behind}


def part_rows(parts: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts of a stored item for a page: name, value (None: not computed) and weight."""
    values = (parts or {}).get("parts") or {}
    return [
        {"name": name, "value": values.get(name), "weight": WEIGHTS[name], "help": PART_HELP[name]} for name in PARTS
    ]
