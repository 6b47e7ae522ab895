"""What an annotator's browser receives about an item: never the hidden category,
other annotators' answers or study statistics."""
from __future__ import annotations

from django.urls import reverse
from django.utils import timezone

from retrieval.models import Image, Query

from annotation.access import grant_images, payload_image_ids
from annotation.assignment.queue import annotator_progress
from annotation.assignment.rules import FRESH_ITEM, GOLD_ITEM
from annotation.models import Assignment, Draft, Judgement


def image_ref(image: Image | None, size: int = 384) -> dict | None:
    if image is None:
        return None
    url = reverse("retrieval:image", args=[image.pk])
    return {"id": image.pk, "external_id": image.external_id, "url": url, "thumb": f"{url}?size={size}",
            "missing": image.missing, "width": image.width, "height": image.height}


def shown_rule(rule: str) -> str:
    """The serving rule as the annotator sees it: gold items are mixed in silently, so they
    read like any fresh item (staff see the stored ``served_by``)."""
    return FRESH_ITEM if rule == GOLD_ITEM else rule


def aggregate_panel(query: Query) -> list[dict]:
    """The de-duplicated union of every retriever's top-10 from the latest finished audit."""
    try:
        from audit.runs.panels import latest_panel
    except ImportError:  # the audit app has no panel yet
        return []
    return [image_ref(img, 160) for img in latest_panel(query)]


def session_ranks(query: Query) -> list:
    try:
        from audit.runs.panels import latest_session_ranks
    except ImportError:
        return []
    return latest_session_ranks(query)


def judgement_dict(j: Judgement | None) -> dict | None:
    if j is None:
        return None
    return {
        "revision": j.revision, "category": j.category or None, "sub_reason": j.sub_reason or None, "note": j.note,
        "flagged": j.flagged, "scales": j.scales, "per_turn": j.per_turn, "reject_flags": j.reject_flags,
        "time_spent_ms": j.time_spent_ms, "created_at": j.created_at.isoformat(), "late": j.late,
    }


def lease_seconds(assignment: Assignment) -> int | None:
    """Seconds left on a held lease (the page counts down from it; no clock skew)."""
    if assignment.status != Assignment.Status.RESERVED or assignment.lease_expires is None:
        return None
    return max(0, int((assignment.lease_expires - timezone.now()).total_seconds()))


def item_payload(assignment: Assignment, rule: str | None = None) -> dict:
    study = assignment.study
    query = (
        Query.objects.select_related("dataset")
        .prefetch_related("turns__reference_image", "turns__turn_target", "targets__image")
        .get(pk=assignment.item.query_id)
    )
    turns = list(query.turns.all())
    targets = [t for t in query.targets.all() if t.is_positive]
    current = assignment.revisions.filter(is_current=True).first()
    draft = Draft.objects.filter(assignment=assignment).first()
    # Not blind: the target's rank after each turn, from the newest audit of the session.
    ranks = session_ranks(query) if (query.n_turns > 1 and not study.blind) else []
    payload = {
        "assignment": assignment.pk,
        "study": study.pk,
        "status": assignment.status,
        "served_by": shown_rule(rule or assignment.served_by),
        "position": assignment.position,
        "lease_expires": assignment.lease_expires.isoformat() if assignment.lease_expires else None,
        "lease_seconds": lease_seconds(assignment),
        "query": {
            "dataset": query.dataset.name,
            "external_id": query.external_id,
            "n_turns": query.n_turns,
            "context": query.context_text,
            "turns": [
                {"index": t.index, "reference": image_ref(t.reference_image), "text": t.text,
                 "texts": t.captions,
                 "next": image_ref(t.turn_target, 160),
                 "rank": ranks[n] if n < len(ranks) and ranks[n] is not None else None}
                for n, t in enumerate(turns)
            ],
            "targets": [image_ref(t.image) for t in sorted(targets, key=lambda t: (not t.is_primary, t.pk))],
        },
        "panel": aggregate_panel(query) if query.n_turns == 1 else [],
        "judgement": judgement_dict(current),
        "draft": draft.payload if draft is not None else None,
        "progress": annotator_progress(study, assignment.annotator),
    }
    grant_images(assignment.annotator_id, payload_image_ids(payload))
    return payload
