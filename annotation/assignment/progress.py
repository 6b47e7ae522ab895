"""The admin's view of a study's progress."""
from __future__ import annotations

from statistics import median

from django.db.models import Count, Q
from django.utils import timezone

from annotation.assignment.queue import annotator_progress
from annotation.models import Assignment, Judgement, Study, StudyItem


def study_progress(study: Study) -> dict:
    now = timezone.now()
    per_user = {
        row["annotator__username"]: row
        for row in Assignment.objects.filter(study=study)
        .values("annotator__username")
        .annotate(
            done=Count("id", filter=Q(status=Assignment.Status.DONE)),
            reserved=Count("id", filter=Q(status=Assignment.Status.RESERVED, lease_expires__gt=now)),
            skipped=Count("id", filter=Q(status=Assignment.Status.SKIPPED)),
        )
    }
    times: dict[str, list[int]] = {}
    for username, ms in Judgement.objects.filter(assignment__study=study, is_current=True).values_list(
        "assignment__annotator__username", "time_spent_ms"
    ):
        times.setdefault(username, []).append(ms)
    annotators = []
    for user in study.annotators.order_by("username"):
        row = per_user.get(user.username, {})
        share = annotator_progress(study, user)
        spent = times.get(user.username, [])
        annotators.append({
            "annotator": user.username, "done": row.get("done", 0), "reserved": row.get("reserved", 0),
            "skipped": row.get("skipped", 0), "remaining": share["remaining"], "total": share["total"],
            "median_seconds": round(median(spent) / 1000, 1) if spent else None,
        })
    items = StudyItem.objects.filter(study=study)
    n_items = items.count()
    complete = items.filter(Q(agreement=False, completed__gte=study.overlap) | Q(agreement=True, completed__gte=max(1, study.annotators.count()))).count()
    all_times = [ms for v in times.values() for ms in v]
    return {
        "study": study.pk, "items": n_items, "items_complete": complete,
        "judgements": Judgement.objects.filter(assignment__study=study, is_current=True).count(),
        "flagged": Judgement.objects.filter(assignment__study=study, is_current=True, flagged=True).count(),
        "median_seconds": round(median(all_times) / 1000, 1) if all_times else None,
        "annotators": annotators,
    }
