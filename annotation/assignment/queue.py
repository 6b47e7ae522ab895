"""The assignment engine's persistence layer around the pure rules of ``assignment``.

Serving an item: expired leases are released, the annotator's own live lease is resumed,
else a few candidate items are read in queue order and locked with
``select_for_update(skip_locked=True)`` (on PostgreSQL; SQLite serialises writers), the
pure :func:`annotation.assignment.rules.choose_next` picks one and says which rule served it,
and the item's ``taken`` counter grows inside the same transaction. Two annotators racing
for an item's last slot therefore cannot both get it.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.core.cache import cache
from django.db.models import Count, F, Max, Q
from django.utils import timezone

from annotation.assignment.rules import Candidate, Choice, choose_gold, choose_next, gold_due, nothing_to_serve
from annotation.models import Assignment, Draft, Judgement, Study, StudyItem
from annotation.judging.alternatives import FIELD as ALTERNATIVES
from annotation.judging.alternatives import clean_alternatives
from annotation.judging.candidates import item_candidates
from annotation.judging.rubric import validate_judgement

CANDIDATES = 8  # rows locked per request: enough to step around a few racing annotators


@dataclass
class Served:
    assignment: Assignment | None
    rule: str


def _lease(study: Study, now):
    return now + timedelta(minutes=study.lease_minutes)


def release_expired(study: Study, now=None) -> int:
    """Give the slots of expired leases back to the pool; returns how many."""
    now = now or timezone.now()
    released = 0
    with transaction.atomic():
        expired = list(
            Assignment.objects.select_for_update(skip_locked=True)
            .filter(study=study, status=Assignment.Status.RESERVED, lease_expires__lte=now)
            .values_list("id", "item_id")
        )
        for assignment_id, item_id in expired:
            Assignment.objects.filter(pk=assignment_id).update(status=Assignment.Status.RELEASED)
            StudyItem.objects.filter(pk=item_id, taken__gt=0).update(taken=F("taken") - 1)
            released += 1
    return released


def next_assignment(study: Study, user, now=None) -> Served:
    """The annotator's next item, reserved under a lease, and the rule that served it."""
    now = now or timezone.now()
    if study.status != Study.Status.OPEN:
        return Served(None, "study_closed")
    if Assignment.objects.filter(study=study, status=Assignment.Status.RESERVED, lease_expires__lte=now).exists():
        release_expired(study, now)
    n_annotators = study_sizes(study)["annotators"]
    with transaction.atomic():
        own = (
            Assignment.objects.select_for_update()
            .filter(study=study, annotator=user, status=Assignment.Status.RESERVED, lease_expires__gt=now)
            .order_by("leased_at")
            .first()
        )
        if own is not None:
            choice = choose_next([], annotator_holds=own.item_id)
            own.lease_expires = _lease(study, now)
            own.save(update_fields=["lease_expires"])
            return Served(own, choice.rule)

        mine = Assignment.objects.filter(study=study, annotator=user).exclude(status=Assignment.Status.RELEASED)
        gold = _gold_choice(study, mine)
        if gold is not None:
            return Served(_reserve(study, user, gold, now), gold.rule)
        open_items = StudyItem.objects.filter(study=study, gold=False).exclude(id__in=mine.values("item_id"))
        rows = list(
            (open_items.filter(agreement=True) | open_items.filter(taken__lt=study.overlap))
            .order_by("-agreement", "-taken", "order_key")
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("id", "taken", "completed", "agreement", "order_key")[:CANDIDATES]
        )
        candidates = [
            Candidate(item_id=i, overlap=study.overlap, completed=c, reserved=t - c, in_agreement_subset=a, order_key=o)
            for i, t, c, a, o in rows
        ]
        choice = choose_next(candidates, n_annotators=n_annotators)
        if not choice.served:
            choice = _skipped_again(study, user, n_annotators) or _why_nothing(study, mine, n_annotators)
            if not choice.served:
                return Served(None, choice.rule)
        return Served(_reserve(study, user, choice, now), choice.rule)


def _gold_choice(study: Study, mine) -> Choice | None:
    """A gold item when one is due (training phase, or the study's gold rate), else None."""
    if study.gold_rate <= 0 and not study.training_items:
        return None
    counts = mine.aggregate(served=Count("id"), gold=Count("id", filter=Q(item__gold=True)))
    rule = gold_due(counts["served"], counts["gold"], study.gold_rate, study.training_items)
    if rule is None:
        return None
    rows = (StudyItem.objects.filter(study=study, gold=True).exclude(id__in=mine.values("item_id"))
            .order_by("order_key", "id").values_list("id", "order_key")[:CANDIDATES])
    return choose_gold([Candidate(item_id=i, overlap=1, order_key=o) for i, o in rows], rule)


def _skipped_again(study: Study, user, n_annotators: int) -> Choice | None:
    """Items this annotator skipped come back once nothing else is left."""
    rows = list(
        StudyItem.objects.filter(
            study=study, assignments__annotator=user, assignments__status=Assignment.Status.SKIPPED
        )
        .select_for_update(skip_locked=True, of=("self",))
        .values_list("id", "taken", "completed", "agreement", "order_key")[:CANDIDATES]
    )
    if not rows:
        return None
    candidates = [
        Candidate(item_id=i, overlap=study.overlap, completed=c, reserved=t - c, in_agreement_subset=a,
                  order_key=o, skipped_by_me=True)
        for i, t, c, a, o in rows
    ]
    choice = choose_next(candidates, n_annotators=n_annotators)
    return choice if choice.served else None


def _why_nothing(study: Study, mine, n_annotators: int) -> Choice:
    """Tell 'everything left is reserved by others' from 'nothing left at all' (the rule:
    :func:`annotation.assignment.rules.nothing_to_serve`)."""
    rows = (StudyItem.objects.filter(study=study, gold=False, completed__lt=max(study.overlap, n_annotators))
            .exclude(id__in=mine.values("item_id")).values_list("id", "completed", "agreement").iterator())
    return nothing_to_serve((Candidate(item_id=i, overlap=study.overlap, completed=c, in_agreement_subset=a)
                             for i, c, a in rows), n_annotators)


def _reserve(study: Study, user, choice: Choice, now) -> Assignment:
    position = (Assignment.objects.filter(study=study, annotator=user).aggregate(m=Max("position"))["m"] or 0) + 1
    assignment = Assignment.objects.filter(item_id=choice.item, annotator=user).first()
    if assignment is None:
        assignment = Assignment(study=study, item_id=choice.item, annotator=user, position=position)
    elif assignment.status == Assignment.Status.SKIPPED:
        pass  # keeps its position
    else:
        assignment.position = position
    assignment.status = Assignment.Status.RESERVED
    assignment.served_by = choice.rule
    assignment.leased_at = now
    assignment.lease_expires = _lease(study, now)
    assignment.save()
    StudyItem.objects.filter(pk=choice.item).update(taken=F("taken") + 1)
    return assignment


def renew_lease(assignment: Assignment, now=None) -> dict:  # {"assignment": row, "body": answer}
    """The page's heartbeat: extend a lease still held (even one past its expiry that no one
    has released yet); otherwise say the item is no longer reserved and whether a submit
    would now be late."""
    now = now or timezone.now()
    with transaction.atomic():
        a = Assignment.objects.select_for_update().get(pk=assignment.pk)
        if a.status == Assignment.Status.RESERVED:
            a.lease_expires = _lease(a.study, now)
            a.save(update_fields=["lease_expires"])
            body = {"held": True, "status": a.status, "lease_expires": a.lease_expires.isoformat(), "late": False}
        else:
            body = {"held": False, "status": a.status, "lease_expires": None, "late": _lost_slot(a, a.study)}
    return {"assignment": a, "body": body}


def skip(assignment: Assignment) -> None:
    """Hand an item back; it returns to this annotator only when nothing else is left."""
    with transaction.atomic():
        a = Assignment.objects.select_for_update().get(pk=assignment.pk)
        if a.status != Assignment.Status.RESERVED:
            return
        a.status = Assignment.Status.SKIPPED
        a.save(update_fields=["status"])
        StudyItem.objects.filter(pk=a.item_id, taken__gt=0).update(taken=F("taken") - 1)


def save_draft(assignment: Assignment, payload: dict) -> Draft:
    """Autosave; ticked ``alternatives`` are checked like a judgement's (JudgementError)."""
    if payload.get(ALTERNATIVES):
        payload = {**payload, ALTERNATIVES: clean_alternatives(payload[ALTERNATIVES], item_candidates(assignment.item))}
    draft, _ = Draft.objects.update_or_create(assignment=assignment, defaults={"payload": payload})
    return draft


class DuplicateSubmission(Exception):
    """The same answer sent again with the same client token: the stored row stands."""

    def __init__(self, judgement: Judgement):
        self.judgement = judgement


class Conflict(Exception):
    """A submit that would silently overwrite or lose an answer (answered 409 with both versions).

    ``reason``: ``stale`` (the submit was based on an older revision than the stored one) or
    ``token_reused`` (a client token already stored with a different answer)."""

    def __init__(self, reason: str, judgement: Judgement | None):
        self.reason = reason
        self.judgement = judgement


ANSWER_FIELDS = ("category", "sub_reason", "note", "flagged", "scales", "per_turn", "reject_flags", "alternatives")


def answer_of(j: Judgement) -> dict:
    return {f: getattr(j, f) for f in ANSWER_FIELDS}


def _row_fields(data: dict) -> dict:
    """The Judgement columns of a cleaned judgement (one mapping for create and compare)."""
    return {
        "category": data.get("category") or "", "sub_reason": data.get("sub_reason") or "",
        "note": data.get("note") or "", "flags": data.get("flags") or {}, "validated": data.get("validated"),
        "flagged": bool(data.get("flagged")), "time_spent_ms": data.get("time_spent_ms") or 0,
        "scales": data.get("scales") or {}, "per_turn": data.get("per_turn_checks") or [],
        "reject_flags": list(data.get("reject_flags") or []),
    }


def _check_token(a: Assignment, client_token: str, fields: dict) -> None:
    if not client_token:
        return
    existing = Judgement.objects.filter(assignment=a, client_token=client_token).first()
    if existing is None:
        return
    if answer_of(existing) == {f: fields[f] for f in ANSWER_FIELDS}:
        raise DuplicateSubmission(existing)
    raise Conflict("token_reused", existing)


def _lost_slot(a: Assignment, study: Study) -> bool:
    """A released lease whose slot has since gone to someone else: the submit is late."""
    if a.status != Assignment.Status.RELEASED:
        return False
    return StudyItem.objects.filter(pk=a.item_id, taken__gte=study.overlap).exists()


def submit(assignment: Assignment, payload: dict, client_token: str = "", base_revision: int | None = None) -> Judgement:
    """Store a judgement (a new revision when one exists). Same client token and answer → same row.

    Raises :class:`annotation.judging.rubric.JudgementError` for an invalid payload,
    :class:`DuplicateSubmission` (carrying the stored row) for a repeated token and answer,
    and :class:`Conflict` for a stale ``base_revision`` or a token reused with another answer.
    A submit after the lease expired and the item went to someone else is stored with
    ``late=True`` and does not count towards the item's quorum.
    """
    study = assignment.study
    rubric_row = study.rubric
    clean = validate_judgement(rubric_row.rubric, payload, n_turns=assignment.item.query.n_turns)
    ticked = payload.get(ALTERNATIVES)
    alternatives = clean_alternatives(ticked, item_candidates(assignment.item) if ticked else [])
    fields = {**_row_fields(clean.to_dict()), "alternatives": alternatives}
    with transaction.atomic():
        a = Assignment.objects.select_for_update().get(pk=assignment.pk)
        _check_token(a, client_token, fields)
        previous = Judgement.objects.filter(assignment=a, is_current=True).first()
        if base_revision is not None and (previous.revision if previous else 0) != base_revision:
            raise Conflict("stale", previous)
        late = _lost_slot(a, study)
        if previous is not None:
            Judgement.objects.filter(pk=previous.pk).update(is_current=False)
        try:
            with transaction.atomic():
                judgement = Judgement.objects.create(
                    assignment=a, rubric=rubric_row, revision=(previous.revision + 1) if previous else 1,
                    is_current=True, client_token=client_token, late=late or (previous is not None and previous.late),
                    **fields,
                )
        except IntegrityError:
            existing = Judgement.objects.filter(assignment=a, client_token=client_token).first()
            if client_token and existing is not None:
                raise DuplicateSubmission(existing) from None
            raise
        if a.status != Assignment.Status.DONE:
            if not late:
                # A released lease whose slot is still free takes it back: counted once.
                grow_taken = a.status != Assignment.Status.RESERVED
                StudyItem.objects.filter(pk=a.item_id).update(
                    completed=F("completed") + 1, taken=F("taken") + (1 if grow_taken else 0)
                )
            a.status = Assignment.Status.DONE
            a.completed_at = timezone.now()
            a.save(update_fields=["status", "completed_at"])
        Draft.objects.filter(assignment=a).delete()
    return judgement


def study_sizes_key(study: Study) -> str:
    return f"cirval:study-sizes:{study.pk}:{study.created_at.timestamp()}"


def forget_study_sizes(study: Study) -> None:
    cache.delete(study_sizes_key(study))


def study_sizes(study: Study) -> dict:
    """Item and annotator counts of a study, cached briefly: counting 100k items per
    request would cost more than the rest of a "next item" call."""
    key = study_sizes_key(study)
    sizes = cache.get(key)
    if sizes is None:
        counts = StudyItem.objects.filter(study=study).aggregate(
            agreement=Count("id", filter=Q(agreement=True)), total=Count("id")
        )
        sizes = {"agreement": counts["agreement"], "other": counts["total"] - counts["agreement"],
                 "annotators": study.annotators.count()}
        cache.set(key, sizes, 30)
    return sizes


def held_assignment(study: Study, user, now=None) -> Assignment | None:
    """The annotator's live lease in this study, read only (nothing is reserved or renewed)."""
    now = now or timezone.now()
    return (
        Assignment.objects.filter(study=study, annotator=user, status=Assignment.Status.RESERVED, lease_expires__gt=now)
        .order_by("leased_at").first()
    )


def annotator_progress(study: Study, user, finished: bool = False) -> dict:
    """'17 of 120' for one annotator: done, reserved, and their share of the work.

    The share is an estimate (items are shared out as annotators ask): the total never
    falls below what is done plus the item held now, and once the queue has nothing left
    for this annotator (``finished``) it is exactly what they did."""
    mine = Assignment.objects.filter(study=study, annotator=user).aggregate(
        done=Count("id", filter=Q(status=Assignment.Status.DONE)),
        reserved=Count("id", filter=Q(status=Assignment.Status.RESERVED, lease_expires__gt=timezone.now())),
    )
    sizes = study_sizes(study)
    n_annotators = max(1, sizes["annotators"])
    share = sizes["agreement"] + -(-sizes["other"] * min(study.overlap, n_annotators) // n_annotators)
    done = mine["done"]
    total = done if finished else max(done + mine["reserved"], min(share, sizes["agreement"] + sizes["other"]))
    return {"done": done, "reserved": mine["reserved"], "total": total, "remaining": max(0, total - done)}
