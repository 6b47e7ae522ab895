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

from annotation.assignment.rules import Candidate, Choice, choose_next
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
        open_items = StudyItem.objects.filter(study=study).exclude(id__in=mine.values("item_id"))
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
            choice = _skipped_again(study, user, n_annotators) or _why_nothing(study, mine, choice)
            if not choice.served:
                return Served(None, choice.rule)
        return Served(_reserve(study, user, choice, now), choice.rule)


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


def _why_nothing(study: Study, mine, choice: Choice) -> Choice:
    """Tell 'everything left is reserved by others' from 'nothing left at all'."""
    waiting = (
        StudyItem.objects.filter(study=study, completed__lt=study.overlap).exclude(id__in=mine.values("item_id")).exists()
    )
    return Choice(None, "all_slots_reserved" if waiting else "queue_empty")


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
    def __init__(self, judgement: Judgement):
        self.judgement = judgement


def submit(assignment: Assignment, payload: dict, client_token: str = "") -> Judgement:
    """Store a judgement (a new revision when one exists). Same client token → same row.

    Raises :class:`annotation.judging.rubric.JudgementError` for an invalid payload and
    :class:`DuplicateSubmission` (carrying the stored row) for a repeated token.
    """
    study = assignment.study
    rubric_row = study.rubric
    clean = validate_judgement(rubric_row.rubric, payload, n_turns=assignment.item.query.n_turns)
    ticked = payload.get(ALTERNATIVES)
    alternatives = clean_alternatives(ticked, item_candidates(assignment.item) if ticked else [])
    with transaction.atomic():
        a = Assignment.objects.select_for_update().get(pk=assignment.pk)
        if client_token:
            existing = Judgement.objects.filter(assignment=a, client_token=client_token).first()
            if existing is not None:
                raise DuplicateSubmission(existing)
        previous = Judgement.objects.filter(assignment=a, is_current=True).first()
        if previous is not None:
            Judgement.objects.filter(pk=previous.pk).update(is_current=False)
        data = clean.to_dict()
        try:
            with transaction.atomic():
                judgement = Judgement.objects.create(
                    assignment=a, rubric=rubric_row, revision=(previous.revision + 1) if previous else 1,
                    is_current=True, category=data.get("category") or "", sub_reason=data.get("sub_reason") or "",
                    note=data.get("note") or "", flags=data.get("flags") or {}, validated=data.get("validated"),
                    flagged=bool(data.get("flagged")), time_spent_ms=data.get("time_spent_ms") or 0,
                    scales=data.get("scales") or {}, per_turn=data.get("per_turn_checks") or [],
                    reject_flags=list(data.get("reject_flags") or []), client_token=client_token,
                    alternatives=alternatives,
                )
        except IntegrityError:
            existing = Judgement.objects.filter(assignment=a, client_token=client_token).first()
            if client_token and existing is not None:
                raise DuplicateSubmission(existing) from None
            raise
        if a.status != Assignment.Status.DONE:
            # A late submit after the lease was released is kept too: never lose work.
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


def annotator_progress(study: Study, user) -> dict:
    """'17 of 120' for one annotator: done, reserved, and their share of the work."""
    mine = Assignment.objects.filter(study=study, annotator=user).aggregate(
        done=Count("id", filter=Q(status=Assignment.Status.DONE)),
        reserved=Count("id", filter=Q(status=Assignment.Status.RESERVED, lease_expires__gt=timezone.now())),
    )
    sizes = study_sizes(study)
    n_annotators = max(1, sizes["annotators"])
    share = sizes["agreement"] + -(-sizes["other"] * min(study.overlap, n_annotators) // n_annotators)
    done = mine["done"]
    total = max(done, min(share, sizes["agreement"] + sizes["other"]))
    return {"done": done, "reserved": mine["reserved"], "total": total, "remaining": max(0, total - done)}
