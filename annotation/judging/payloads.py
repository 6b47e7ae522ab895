"""What an annotator's browser receives about an item: never the hidden category,
other annotators' answers or study statistics."""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings
from django.urls import get_script_prefix, reverse
from django.utils import timezone

from annotation.access import grant_images, payload_image_ids
from annotation.alternatives.paging import PAGES_AHEAD
from annotation.core.rounds import hides_target
from annotation.judging.candidates import PAGE_SIZE, item_candidates
from annotation.models import Assignment, Draft, Judgement, StudyItem
from annotation.verdicts.state import annotator_share
from retrieval.models import Image, Query, Turn
from retrieval.sessions import describe_reference

_SENTINEL = 987654321


@lru_cache(maxsize=8)
def _image_url_parts(script_prefix: str) -> tuple[str, str]:
    """The image URL around its id, reversed once per script prefix (an item payload
    holds twenty-odd images; reversing each cost about a tenth of the request)."""
    head, _, tail = reverse("retrieval:image", args=[_SENTINEL]).partition(str(_SENTINEL))
    return head, tail


def image_url(pk: int) -> str:
    head, tail = _image_url_parts(get_script_prefix())
    return f"{head}{pk}{tail}"


def image_ref(image: Image | None, size: int = 384) -> dict | None:
    if image is None:
        return None
    url = image_url(image.pk)
    return {
        "id": image.pk,
        "external_id": image.external_id,
        "url": url,
        "thumb": f"{url}?size={size}",
        "missing": image.missing,
        "width": image.width,
        "height": image.height,
    }


def first_turn(item: StudyItem, query: Query) -> Turn | None:
    """A single-turn item's turn from the columns read with the item for serving
    (``turn1_*``: :func:`annotation.assignment.queue._with_earlier`), its images not yet
    attached; None when they were not read (the turns are then read on their own)."""
    if query.n_turns != 1 or getattr(item, "turn1_id", None) is None:
        return None
    return Turn(
        pk=item.turn1_id,
        query=query,
        index=1,
        texts=item.turn1_texts,
        reference_image_id=item.turn1_reference_image_id,
        turn_target_id=item.turn1_turn_target_id,
        provenance=item.turn1_provenance,
    )


def turns_and_panel(item: StudyItem, query: Query) -> tuple[list[Turn], list[dict]]:
    """The query's turns (with their images) and the item's blind candidate panel as image
    references in panel order. A single-turn item read for serving needs one query for
    both: the panel's images and its turn's images together."""
    ids = item_candidates(item) if query.n_turns == 1 else []
    turn = first_turn(item, query)
    wanted = [*ids, *((turn.reference_image_id, turn.turn_target_id) if turn else ())]
    images = Image.objects.in_bulk([i for i in wanted if i is not None]) if any(wanted) else {}
    if turn is not None:
        turn.reference_image = images.get(turn.reference_image_id)
        turn.turn_target = images.get(turn.turn_target_id)
        turns = [turn]
    else:
        turns = list(query.turns.select_related("reference_image", "turn_target"))
    return turns, [image_ref(images[i], 160) for i in ids if i in images]


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
        "revision": j.revision,
        "category": j.category or None,
        "sub_reason": j.sub_reason or None,
        "note": j.note,
        "flagged": j.flagged,
        "scales": j.scales,
        "per_turn": j.per_turn,
        "reject_flags": j.reject_flags,
        "time_spent_ms": j.time_spent_ms,
        "created_at": j.created_at.isoformat(),
        "late": j.late,
        "alternatives": j.alternatives,
        "none_fit": j.none_fit,
    }


def lease_config(study) -> dict:
    """How an item page keeps its lease (the item and the interactive page): a heartbeat every
    ``heartbeat_seconds`` while its annotator is active, at most a third of the study's lease
    so that a beat or two may be lost without the lease lapsing; renewal pauses after
    ``idle_seconds`` without activity; the countdown shows, ``warn_seconds`` before the end,
    only once no heartbeat keeps the lease."""
    lease = study.lease_minutes * 60
    return {
        "lease_seconds": lease,
        "heartbeat_seconds": max(1, min(settings.CIRVAL_LEASE_HEARTBEAT_SECONDS, lease // 3)),
        "idle_seconds": settings.CIRVAL_LEASE_IDLE_SECONDS,
        "warn_seconds": settings.CIRVAL_LEASE_WARN_SECONDS,
    }


def lease_seconds(assignment: Assignment) -> int | None:
    """Seconds left on a held lease (the page counts down from it; no clock skew)."""
    if assignment.status != Assignment.Status.RESERVED or assignment.lease_expires is None:
        return None
    return max(0, int((assignment.lease_expires - timezone.now()).total_seconds()))


def item_payload(
    assignment: Assignment, rule: str | None = None, staff: bool = False, fresh: bool = False, mine: dict | None = None
) -> dict:
    """The item as its annotator sees it: never the rule that served it (gold items are mixed
    in silently). ``staff`` adds what only staff may see: that rule and where the item's
    candidate panel came from. ``fresh`` (a row just created: no judgement, no draft) and
    ``mine`` (the annotator's counts) come from :class:`annotation.assignment.queue.Served`
    and save queries."""
    study = assignment.study
    query = assignment.item.query
    turns, panel = turns_and_panel(assignment.item, query)
    targets = query.positive_targets(query.targets.select_related("image"))  # the format's target rule
    hidden = hides_target(study.interactive)  # the target is only described: no target, panel or turn target
    if hidden:
        targets, panel = [], []
    current = None if fresh else assignment.revisions.filter(is_current=True).first()
    draft = None if fresh else Draft.objects.filter(assignment=assignment).first()
    # Not blind: the target's rank after each turn, from the newest audit of the session.
    ranks = session_ranks(query) if (query.n_turns > 1 and not study.blind) else []
    payload = {
        "assignment": assignment.pk,
        "study": study.pk,
        "status": assignment.status,
        "position": assignment.position,
        "lease_expires": assignment.lease_expires.isoformat() if assignment.lease_expires else None,
        "lease_seconds": lease_seconds(assignment),
        "query": {
            "dataset": query.dataset.name,
            "external_id": query.external_id,
            "n_turns": query.n_turns,
            "context": query.context_text,
            "turns": [
                {
                    "index": t.index,
                    "reference": image_ref(t.reference_image),
                    "text": t.text,
                    "texts": t.captions,
                    # the turn's effective reference (read from its text at import: part of the data)
                    "reference_turns": list(t.reference_turns or []),
                    "refers_to": describe_reference(t.index, t.reference_turns or []),
                    "next": None if hidden else image_ref(t.turn_target, 160),
                    "rank": ranks[n] if n < len(ranks) and ranks[n] is not None else None,
                }
                for n, t in enumerate(turns)
            ],
            "targets": [image_ref(t.image) for t in sorted(targets, key=lambda t: (not t.is_primary, t.pk))],
        },
        "panel": panel,
        "panel_page_size": PAGE_SIZE,
        "panel_pages_ahead": PAGES_AHEAD,
        "too_broad": study.rubric.rubric.too_broad_rule(len(panel), study.candidates) if panel else None,
        "judgement": judgement_dict(current),
        "draft": draft.payload if draft is not None else None,
        "progress": annotator_share(study, assignment.annotator_id, mine=mine),
    }
    if staff:
        payload["staff"] = {
            "served_by": rule or assignment.served_by,
            "panel_source": assignment.item.candidates_source,
            # the automatic reference checks each turn fails (staff only)
            "turn_checks": [list(t.reference_checks or []) for t in turns],
        }
    grant_images(assignment.annotator_id, payload_image_ids(payload), assignment.study_id)
    return payload
