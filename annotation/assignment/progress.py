"""The admin's view of a study's progress: every count comes from :mod:`annotation.verdicts.state`."""

from __future__ import annotations

from statistics import median

from django.utils import timezone

from annotation.models import Assignment, Study
from annotation.verdicts.readmodel import assignment_counts, iter_rows
from annotation.verdicts.state import annotator_share, study_counts


def study_progress(study: Study, counts: dict | None = None) -> dict:
    """Items, item states and judgements (:func:`~annotation.verdicts.state.study_counts`)
    with, per annotator, their counted and late judgements, live leases, skips and share."""
    counts = counts if counts is not None else study_counts(study)
    now = timezone.now()
    per_user = {
        row["annotator__username"]: row
        for row in Assignment.objects.filter(study=study)
        .values("annotator__username")
        .annotate(**assignment_counts(now))
    }
    times: dict[str, list[int]] = {}
    for row in iter_rows(study):  # the read model's counted judgements
        for v in row.votes:
            times.setdefault(v.annotator, []).append(v.time_spent_ms)
    annotators = [
        _annotator_row(study, user, per_user.get(user.username, {}), counts, times.get(user.username, []))
        for user in study.annotators.order_by("username")
    ]
    # annotators removed from the study whose judgements still count: listed (``removed``), so
    # that the rows add up to the study's totals
    members = {a["annotator"] for a in annotators}
    for name in sorted(set(counts["annotators"]) - members):
        judged = counts["annotators"][name]
        done = per_user.get(name, {}).get("done", 0)  # items submitted, as annotator_share counts them
        annotators.append(
            {
                "annotator": name,
                "removed": True,
                "done": done,
                "judged": judged["judged"],
                "late": judged["late"],
                "reserved": per_user.get(name, {}).get("reserved", 0),
                "skipped": per_user.get(name, {}).get("skipped", 0),
                "remaining": 0,
                "total": done,
                "median_seconds": _median_seconds(times.get(name, [])),
            }
        )
    all_times = [ms for v in times.values() for ms in v]
    return {
        "study": study.pk,
        "items": counts["items"],
        "items_complete": counts["complete"],
        "states": counts["states"],
        "pending": counts["pending"],
        "unjudged": counts["unjudged"],
        "judgements": counts["judgements"],
        "late": counts["late"],
        "flagged": counts["flagged"],
        "quorum": counts["quorum"],
        "exported": counts["exported"],
        "median_seconds": _median_seconds(all_times),
        "annotators": annotators,
    }


def _median_seconds(spent: list[int]) -> float | None:
    return round(median(spent) / 1000, 1) if spent else None


def _annotator_row(study: Study, user, row: dict, counts: dict, spent: list[int]) -> dict:
    """One member's row: their share ("N of M"), counted and late judgements, leases, skips."""
    judged = counts["annotators"].get(user.username, {"judged": 0, "late": 0})
    share = annotator_share(study, user)
    return {
        "annotator": user.username,
        "removed": False,
        "done": share["done"],
        "judged": judged["judged"],
        "late": judged["late"],
        "reserved": row.get("reserved", 0),
        "skipped": row.get("skipped", 0),
        "remaining": share["remaining"],
        "total": share["total"],
        "median_seconds": _median_seconds(spent),
    }
