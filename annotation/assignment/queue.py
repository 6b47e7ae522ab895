"""The assignment engine's persistence layer around the pure rules of ``assignment``.

Serving an item: expired leases are released, the annotator's own live lease is resumed,
else a few candidate items are read in queue order and locked with
``select_for_update(skip_locked=True)`` (on PostgreSQL; SQLite serialises writers), the
pure :func:`annotation.core.serving.choose_next` picks one and says which rule served it,
and the item's ``taken`` counter grows inside the same transaction. Two annotators racing
for an item's last slot therefore cannot both get it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Exists, F, FilteredRelation, Max, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.dispatch import Signal
from django.utils import timezone

from annotation.agreement.intervals import request_after_submit
from annotation.alternatives.payload import FIELD as ALTERNATIVES
from annotation.alternatives.payload import NONE_FIT, clean_alternatives, clean_none_fit
from annotation.assignment import hot_rows
from annotation.assignment.hot_rows import CANDIDATES, TURN1_COLUMNS
from annotation.core.rubric import validate_judgement
from annotation.core.serving import (
    PANELS_PENDING,
    QUEUE_EMPTY,
    REFIT_PENDING,
    SERVE_SUSPICION,
    Candidate,
    Choice,
    choose_gold,
    choose_next,
    gold_due,
    nothing_to_serve,
    queue_fields,
)
from annotation.judging.candidates import item_candidates, request_panels
from annotation.models import Assignment, Draft, Judgement, Study, StudyItem
from annotation.verdicts.readmodel import assignment_counts
from annotation.verdicts.refit import refit_pending, request_refit
from annotation.verdicts.state import (  # noqa: F401
    free_slot_q,
    item_slots,
    open_left,
    open_left_limit,
    reopen_slots,
    share_wanted,
    study_sizes,
    submit_is_late,
)

#: Sent (``study_id=``) once a counted judgement of a study that samples an estimate has committed;
#: ``annotation.apps`` connects the estimate's re-plan (annotation.studies.estimating sits above
#: serving, so serving never imports it).
estimate_judged = Signal()


@dataclass
class Served:
    """``fresh``: the assignment row was just created (no judgement or draft yet);
    ``mine``: the annotator's done and live-reserved counts after serving and the items
    still open to them (``open``, :func:`annotation.verdicts.state.open_left`, read with the
    row that served the item; None when not read), for progress."""

    assignment: Assignment | None
    rule: str
    fresh: bool = False
    mine: dict | None = None


def _lease(study: Study, now):
    return now + timedelta(minutes=study.lease_minutes)


def release_expired(study: Study, now=None) -> int:
    """Give the slots of expired leases back to the pool; returns how many."""
    now = now or timezone.now()
    return _release(Assignment.objects.filter(study=study, lease_expires__lte=now))


def release_held(study_id: int, user_id: int) -> int:
    """Give back every slot an annotator holds in a study, expired or not (they were removed
    from it and can no longer submit: their items go to others now, not when the lease ends)."""
    return _release(Assignment.objects.filter(study_id=study_id, annotator_id=user_id))


def _release(assignments) -> int:
    """THE release of leases: each reserved assignment of ``assignments`` (not locked by a
    racing request) becomes released and its item's slot is free again; returns how many."""
    released = 0
    with transaction.atomic():
        held = list(
            assignments.select_for_update(skip_locked=True)
            .filter(status=Assignment.Status.RESERVED)
            .values_list("id", "item_id")
        )
        for assignment_id, item_id in held:
            Assignment.objects.filter(pk=assignment_id).update(status=Assignment.Status.RELEASED)
            StudyItem.objects.filter(pk=item_id, taken__gt=0).update(taken=F("taken") - 1)
            released += 1
    return released


MINE = ("position", "served", "gold", "done", "reserved")


def _mine_aggregates(now) -> dict:
    kept = ~Q(status=Assignment.Status.RELEASED)
    return {
        "position": Max("position"),
        "served": Count("id", filter=kept),
        "gold": Count("id", filter=kept & Q(item__gold=True)),
        **assignment_counts(now, "done", "reserved"),  # the read model's, as progress and shares count them
    }


def lease_state(user, now=None) -> dict:
    """Annotations for the study row a "next item" request reads anyway (``member_study``;
    :mod:`annotation.assignment.hot_rows` reads the same row as SQL), so that the engine
    needs no query of its own for them: whether any lease of the study has expired (a
    request with none skips the release), the user's counts of :func:`_mine_counts`
    (``mine_*``) and the study's number of gold items (``n_gold``, counted on the partial
    index ``studyitem_gold``: a study without gold costs nothing)."""
    now = now or timezone.now()
    expired = Assignment.objects.filter(study=OuterRef("pk"), status=Assignment.Status.RESERVED, lease_expires__lte=now)
    mine = Assignment.objects.filter(study=OuterRef("pk"), annotator=user.pk).order_by().values("study")
    gold = StudyItem.objects.filter(study=OuterRef("pk"), gold=True).order_by().values("study")
    state = {
        "has_expired": Exists(expired),
        "mine_user": Value(user.pk),
        "n_gold": Coalesce(Subquery(gold.annotate(n=Count("id")).values("n")[:1]), 0),
    }
    for name, agg in _mine_aggregates(now).items():
        state[f"mine_{name}"] = Subquery(mine.annotate(v=agg).values("v")[:1])
    return state


def study_for_next(user, study_id: int, now=None) -> Study:
    """The study row a "next item" request reads (404 unless the user annotates in it, or is
    staff), with :func:`lease_state` for this user: one query, written as SQL once
    (:mod:`annotation.assignment.hot_rows`: compiling this queryset cost 5 ms of CPU per
    request; its test holds the SQL to this rule)."""
    return hot_rows.study_for_next(user, study_id, now)


def _mine_counts(study: Study, user, now) -> dict:
    """One aggregate over the annotator's rows: last position, served and gold counts (for
    the gold rule; released rows left out) and done/live-reserved counts (for progress).
    Read from the study row when :func:`lease_state` annotated it for this user."""
    if getattr(study, "mine_user", None) == user.pk:
        return {name: getattr(study, f"mine_{name}") or 0 for name in MINE}
    return Assignment.objects.filter(study=study, annotator=user).aggregate(**_mine_aggregates(now))


def _resume(study: Study, user, now, counts: dict, left_limit: int) -> Served | None:
    """The annotator's own live lease, renewed, or None, with :func:`open_left` (up to ``left_limit``)."""
    own = (
        Assignment.objects.select_for_update(of=("self",))
        .select_related("item__query__dataset")
        .annotate(open_left=open_left(study, user.pk, left_limit, now))
        .filter(study=study, annotator=user, status=Assignment.Status.RESERVED, lease_expires__gt=now)
        .order_by("leased_at")
        .first()
    )
    if own is None:
        return None
    choice = choose_next([], annotator_holds=own.item_id)
    own.lease_expires = _lease(study, now)
    own.save(update_fields=["lease_expires"])
    own.study = study
    return Served(
        own, choice.rule, mine={"done": counts["done"], "reserved": counts["reserved"], "open": own.open_left}
    )


def next_assignment(study: Study, user, now=None) -> Served:
    """The annotator's next item, reserved under a lease, and the rule that served it."""
    now = now or timezone.now()
    if study.status != Study.Status.OPEN:
        return Served(None, "study_closed")
    if (
        getattr(study, "has_expired", True)
        and Assignment.objects.filter(study=study, status=Assignment.Status.RESERVED, lease_expires__lte=now).exists()
    ):
        release_expired(study, now)
    n_annotators = study_sizes(study)["annotators"]
    with transaction.atomic():
        counts = _mine_counts(study, user, now)
        # The items still open to the user, counted as far as their share can use (after
        # this request: one more held), read with the row that serves the item: serving
        # keeps it open to them (now held), so the count stands after serving.
        left_limit = share_wanted(study, counts["done"] or 0, (counts["reserved"] or 0) + 1)
        if counts["reserved"]:
            resumed = _resume(study, user, now, counts, left_limit)
            if resumed is not None:
                return resumed

        mine = Assignment.objects.filter(study=study, annotator=user).exclude(status=Assignment.Status.RELEASED)
        gold = _gold_choice(study, user, mine, counts, (left_limit, now))
        if gold is not None:
            return _reserve(study, user, gold[0], now, counts, gold[1])
        items = candidate_items(study, user.pk, now, left_limit)
        by_suspicion = serves_by_suspicion(study)
        candidates = [
            Candidate(
                item_id=i.pk,
                overlap=item_slots(study, False, i.extra_slots, None),
                completed=i.completed,
                reserved=i.taken - i.completed,
                in_agreement_subset=i.agreement,
                order_key=i.order_key,
                priority=i.suspicion if by_suspicion else 0.0,
            )
            for i in items
        ]
        choice = choose_next(candidates, n_annotators=n_annotators)
        if not choice.served:
            choice = _skipped_again(study, user, n_annotators) or _why_nothing(study, mine, n_annotators)
            if not choice.served:
                return Served(None, choice.rule)
        return _reserve(study, user, choice, now, counts, {i.pk: i for i in items}.get(choice.item))


def candidate_query(study: Study, user_id: int, now, left_limit: int):
    """THE rows "next item" chooses from: up to :data:`CANDIDATES` items of the served pool
    (:func:`served_pool`) the user holds no assignment of, with a slot free (the quorum rule's
    slots plus what an adaptive rule opened for the item's votes; agreement items: everyone,
    in the rules), in the study's queue order, locked (skipping rows racing requests hold),
    each with the items still open to the user (``open_left``: :func:`open_left` counted up
    to ``left_limit``) and :func:`_with_earlier`'s columns."""
    mine = Assignment.objects.filter(study=study, annotator=user_id).exclude(status=Assignment.Status.RELEASED)
    open_items = served_pool(study).exclude(id__in=mine.values("item_id"))
    return (
        _with_earlier(open_items.filter(free_slot_q(study, None)), user_id)
        .annotate(open_left=open_left(study, user_id, left_limit, now))
        .order_by(*queue_order(study))
        .select_for_update(skip_locked=True, of=("self",))[:CANDIDATES]
    )


def candidate_items(study: Study, user_id: int, now, left_limit: int) -> list[StudyItem]:
    """:func:`candidate_query`'s rows, read by its explicit SQL (:func:`hot_rows.candidate_rows`:
    building and compiling the queryset took about a quarter of the web tier's CPU under
    ``bench/load.py``) with the study's rules as this module and the read model state them."""
    rule = study.quorum_rule
    rules = {
        "order": queue_order(study),
        "panels": needs_panels(study),
        "stopped": study.estimate_stopped,
        "slots": rule.slots(),
        "agreement_slots": rule.slots(True, study_sizes(study)["annotators"]),
        "left_limit": open_left_limit(left_limit),
    }
    return hot_rows.candidate_rows(study.pk, user_id, now, rules)


def served_pool(study: Study):
    """The study's items the queue may serve: its non-gold items whose candidate panel is
    stored (:func:`with_panels`); once an estimate study's stop rule is met
    (``Study.estimate_stopped``), only those already served, to be finished."""
    items = with_panels(study, StudyItem.objects.filter(study=study, gold=False))
    return items.filter(taken__gt=0) if study.estimate_stopped else items


def needs_panels(study: Study) -> bool:
    """Whether the study's single-turn items wait for their candidate panel before they are
    served (``CIRVAL_SERVE_AFTER_PANEL``): not in an interactive study (its annotators write
    sessions and see no panel), nor in one that asks for no candidates."""
    return settings.CIRVAL_SERVE_AFTER_PANEL and study.candidates > 0 and not study.interactive


def with_panels(study: Study, items):
    """``items`` less the single-turn ones whose panel no worker (or ``create_study``) has
    stored yet: an item is never served without its panel, whose ticks would be lost."""
    return items.exclude(query__n_turns=1, candidates_source="") if needs_panels(study) else items


def panels_pending(study: Study) -> bool:
    """Some single-turn item still waits for its panel (then a worker is asked to fill them)."""
    if not needs_panels(study):
        return False
    pending = StudyItem.objects.filter(study=study, query__n_turns=1, candidates_source="").exists()
    if pending:
        request_panels(study.pk)
    return pending


def serves_by_suspicion(study: Study) -> bool:
    """Whether the study serves its fresh items by suspicion, highest first (``Study.serve_order``)."""
    return study.serve_order == SERVE_SUSPICION


def queue_order(study: Study) -> tuple[str, ...]:
    """The study's serving order (:func:`annotation.core.serving.queue_fields`)."""
    return queue_fields(study.serve_order)


def _with_earlier(items, user):
    """Items read for serving: with query and dataset (for the payload), the id of the
    user's earlier assignment of each (``earlier_id``: None when there is none) and the
    query's first turn (``turn1_*``, a join on the unique (query, index = 1))."""
    earlier = Assignment.objects.filter(item=OuterRef("pk"), annotator=user).values("pk")[:1]
    turn1 = {f"turn1_{c}": F(f"first_turn__{c}") for c in TURN1_COLUMNS}
    return (
        items.select_related("query__dataset")
        .annotate(first_turn=FilteredRelation("query__turns", condition=Q(query__turns__index=1)))
        .annotate(earlier_id=Subquery(earlier), **turn1)
    )


def _gold_choice(study: Study, user, mine, counts: dict, left: tuple) -> tuple[Choice, StudyItem | None] | None:
    """A gold item when one is due (training phase, or the study's gold rate), else None.
    ``counts``: the annotator's served and gold counts (:func:`_mine_counts`); ``left``:
    the limit and clock of :func:`open_left`, read with the gold rows.

    The gold query runs only when an unseen gold item exists: the study row's ``n_gold``
    (:func:`lease_state`) minus the gold items the annotator holds (``counts["gold"]``; one
    assignment per item and annotator, released ones left out of both). A study without gold
    items therefore never runs it, and when it runs it finds an item, so "next item" never
    pays for both the gold query and the queue's. It reads the partial index
    ``studyitem_gold`` (gold rows only, in serving order), never scanning the study."""
    if study.gold_rate <= 0 and not study.training_items:
        return None
    n_gold = getattr(study, "n_gold", None)
    if n_gold is not None and n_gold <= counts["gold"]:
        return None
    rule = gold_due(counts["served"], counts["gold"], study.gold_rate, study.training_items)
    if rule is None:
        return None
    items = list(
        _with_earlier(
            with_panels(study, StudyItem.objects.filter(study=study, gold=True)).exclude(id__in=mine.values("item_id")),
            user,
        )
        .annotate(open_left=open_left(study, user.pk, *left))
        .order_by("order_key", "id")[:CANDIDATES]
    )
    choice = choose_gold([Candidate(item_id=i.pk, overlap=1, order_key=i.order_key) for i in items], rule)
    return None if choice is None else (choice, {i.pk: i for i in items}.get(choice.item))


def _skipped_again(study: Study, user, n_annotators: int) -> Choice | None:
    """Items this annotator skipped come back once nothing else is left."""
    rows = list(
        StudyItem.objects.filter(
            study=study, assignments__annotator=user, assignments__status=Assignment.Status.SKIPPED
        )
        .select_for_update(skip_locked=True, of=("self",))
        .values_list("id", "taken", "completed", "agreement", "order_key", "extra_slots")[:CANDIDATES]
    )
    if not rows:
        return None
    candidates = [
        Candidate(
            item_id=i,
            overlap=item_slots(study, False, x, None),
            completed=c,
            reserved=t - c,
            in_agreement_subset=a,
            order_key=o,
            skipped_by_me=True,
        )
        for i, t, c, a, o, x in rows
    ]
    choice = choose_next(candidates, n_annotators=n_annotators)
    return choice if choice.served else None


def _why_nothing(study: Study, mine, n_annotators: int) -> Choice:
    """Tell 'everything left is reserved by others' from 'nothing left at all' (the rule:
    :func:`annotation.core.serving.nothing_to_serve`), and 'nothing now, but the study's
    pending refit may reopen items' (:func:`annotation.verdicts.refit.refit_pending`)."""
    rows = (
        served_pool(study)
        .filter(completed__lt=max(study.quorum_rule.most, n_annotators))
        .exclude(id__in=mine.values("item_id"))
        .values_list("id", "completed", "agreement", "extra_slots")
        .iterator()
    )
    choice = nothing_to_serve(
        (
            Candidate(item_id=i, overlap=item_slots(study, False, x, None), completed=c, in_agreement_subset=a)
            for i, c, a, x in rows
        ),
        n_annotators,
    )
    if choice.rule == QUEUE_EMPTY and refit_pending(study):  # the refit may reopen a split: not done yet
        return Choice(None, REFIT_PENDING)
    if choice.rule == QUEUE_EMPTY and panels_pending(study):  # items wait for their candidates: not done yet
        return Choice(None, PANELS_PENDING)
    return choice


def _reserve(study: Study, user, choice: Choice, now, counts: dict, item: StudyItem | None = None) -> Served:
    """Reserve ``choice`` for the user. ``item``: the locked candidate row when read with the
    id of the user's earlier assignment of it (``earlier_id``), which saves a look-up."""
    position = (counts["position"] or 0) + 1
    if item is not None and getattr(item, "earlier_id", None) is None:
        assignment = None
    else:
        assignment = Assignment.objects.filter(item_id=choice.item, annotator=user).first()
    fresh = assignment is None
    if fresh:
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
    assignment.study = study
    if item is not None:
        item.taken += 1
        item.study = study
        assignment.item = item
    return Served(
        assignment,
        choice.rule,
        fresh=fresh,
        mine={"done": counts["done"], "reserved": counts["reserved"] + 1, "open": getattr(item, "open_left", None)},
    )


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


def _edited_at(payload: dict) -> float:
    """When the page made a draft (its clock, ms); 0 for none or nonsense."""
    stamp = payload.get("edited_at")
    return float(stamp) if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) else 0.0


def save_draft(assignment: Assignment, payload: dict) -> Draft:
    """Autosave; ticked ``alternatives`` and ``none_fit`` are checked like a judgement's
    (JudgementError). A save older (by the page's ``edited_at``) than the stored draft, one
    that arrives after a newer one from the same page, changes nothing: the stored draft is
    returned, and its ``edited_at`` tells the page which of its edits the server holds."""
    ticked = (
        clean_alternatives(payload.get(ALTERNATIVES), item_candidates(assignment.item))
        if payload.get(ALTERNATIVES)
        else []
    )
    payload = {**payload, ALTERNATIVES: ticked, NONE_FIT: clean_none_fit(payload.get(NONE_FIT), ticked)}
    with transaction.atomic():
        stored = Draft.objects.select_for_update().filter(assignment=assignment).first()
        if stored is not None and _edited_at(stored.payload) > _edited_at(payload):
            return stored
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


ANSWER_FIELDS = (
    "category",
    "sub_reason",
    "note",
    "flagged",
    "scales",
    "per_turn",
    "reject_flags",
    "alternatives",
    "none_fit",
)


def answer_of(j: Judgement) -> dict:
    return {f: getattr(j, f) for f in ANSWER_FIELDS}


def _row_fields(data: dict) -> dict:
    """The Judgement columns of a cleaned judgement (one mapping for create and compare)."""
    return {
        "category": data.get("category") or "",
        "sub_reason": data.get("sub_reason") or "",
        "note": data.get("note") or "",
        "flags": data.get("flags") or {},
        "validated": data.get("validated"),
        "flagged": bool(data.get("flagged")),
        "time_spent_ms": data.get("time_spent_ms") or 0,
        "scales": data.get("scales") or {},
        "per_turn": data.get("per_turn_checks") or [],
        "reject_flags": list(data.get("reject_flags") or []),
    }


def _check_token(a: Assignment, client_token: str, fields: dict) -> None:
    """``a.token_id``: the row already stored with this token (read with the lock)."""
    if not client_token or a.token_id is None:
        return
    existing = Judgement.objects.get(pk=a.token_id)
    if answer_of(existing) == {f: fields[f] for f in ANSWER_FIELDS}:
        raise DuplicateSubmission(existing)
    raise Conflict("token_reused", existing)


def _lost_slot(a: Assignment, study: Study) -> bool:
    """The late rule (:func:`annotation.verdicts.state.submit_is_late`) on a locked assignment."""
    return submit_is_late(a.status, a.item.taken, a.item.agreement, study, a.item.extra_slots)


def submit_rows(client_token: str = ""):
    """The assignments read by a submit: locked (``select_for_update``) with what the submit
    needs in the same query: study, rubric and query, the current revision (``current_id``,
    ``current_revision``, ``current_late``), the row stored with ``client_token``
    (``token_id``) and whether a draft exists (``has_draft``)."""
    current = Judgement.objects.filter(assignment=OuterRef("pk"), is_current=True)
    token = Judgement.objects.filter(assignment=OuterRef("pk"), client_token=client_token or None)
    return (
        Assignment.objects.select_related("study__rubric", "item__query")
        .select_for_update(of=("self",))
        .annotate(
            current_id=Subquery(current.values("pk")[:1]),
            current_revision=Subquery(current.values("revision")[:1]),
            current_late=Subquery(current.values("late")[:1]),
            token_id=Subquery(token.values("pk")[:1]),
            has_draft=Exists(Draft.objects.filter(assignment=OuterRef("pk"))),
        )
    )


def submit_row(user, assignment_id: int, client_token: str = "") -> Assignment:
    """The user's writable assignment (:func:`annotation.permissions.writable_assignment`: 404,
    or 403 once access has ended) read and locked as :func:`submit_rows` reads it, in one query;
    inside the submit's transaction. The query is :mod:`annotation.assignment.hot_rows`'s SQL
    (compiling this queryset cost 4 ms of CPU per submit; its test holds the SQL to this rule)."""
    return hot_rows.submit_row(user, assignment_id, client_token)  # that query, written as SQL once


def submit(
    assignment: Assignment, payload: dict, client_token: str = "", base_revision: int | None = None, fetch=None
) -> Judgement:
    """Store a judgement (a new revision when one exists). Same client token and answer → same row.

    Raises :class:`annotation.core.rubric.JudgementError` for an invalid payload,
    :class:`DuplicateSubmission` (carrying the stored row) for a repeated token and answer,
    and :class:`Conflict` for a stale ``base_revision`` or a token reused with another answer.
    A submit after the lease expired and the item went to someone else is stored with
    ``late=True`` and does not count towards the item's quorum.

    The assignment is read again under lock by ``fetch()`` (default: :func:`submit_rows`'s
    ``get(pk=...)``; the API passes :func:`submit_row`, so one query checks access, locks and
    reads the state).
    A racing submit that commits between that read's snapshot and its lock makes the insert
    break a unique constraint: the whole submit is then tried once more on fresh rows.
    """
    return _locked(assignment, client_token, fetch, lambda a: _store(a, payload, client_token, base_revision))


def store_judgement(assignment: Assignment, answer: dict, client_token: str = "") -> Judgement:
    """Store a judgement that was checked elsewhere (an import's records, e.g. a CIRCUS
    file read by :mod:`annotation.agreement.circus_files`) through the same store as an
    annotator's :func:`submit`: the lock, the revision and current row, the client token,
    the late rule and the item's counters. ``answer`` holds the cleaned fields
    (``category``, ``flags``, ``validated``, ``note``, ...; see :func:`_row_fields`)."""
    fields = {
        **_row_fields(answer),
        "alternatives": list(answer.get("alternatives") or []),
        "none_fit": bool(answer.get(NONE_FIT)),
    }
    return _locked(assignment, client_token, None, lambda a: _store_fields(a, fields, client_token, None))


def _locked(assignment: Assignment, client_token: str, fetch, store) -> Judgement:
    read = fetch or (lambda: submit_rows(client_token).get(pk=assignment.pk))
    for attempt in (1, 2):
        try:
            with transaction.atomic():
                return store(read())
        except IntegrityError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _store(a: Assignment, payload: dict, client_token: str, base_revision: int | None) -> Judgement:
    clean = validate_judgement(a.study.rubric.rubric, payload, n_turns=a.item.query.n_turns)
    ticked = payload.get(ALTERNATIVES)
    alternatives = clean_alternatives(ticked, item_candidates(a.item) if ticked else [])
    fields = {
        **_row_fields(clean.to_dict()),
        "alternatives": alternatives,
        "none_fit": clean_none_fit(payload.get(NONE_FIT), alternatives),
    }
    return _store_fields(a, fields, client_token, base_revision)


def _store_fields(a: Assignment, fields: dict, client_token: str, base_revision: int | None) -> Judgement:
    """The one place a Judgement row is written (submits and imports)."""
    study = a.study
    _check_token(a, client_token, fields)
    revision = a.current_revision or 0
    if base_revision is not None and revision != base_revision:
        raise Conflict("stale", Judgement.objects.get(pk=a.current_id) if a.current_id else None)
    late = _lost_slot(a, study)
    if a.current_id is not None:
        Judgement.objects.filter(pk=a.current_id).update(is_current=False)
    judgement = Judgement.objects.create(
        assignment=a,
        rubric=study.rubric,
        revision=revision + 1,
        is_current=True,
        client_token=client_token,
        late=late or bool(a.current_late),
        **fields,
    )
    mark_done(a, late)
    if a.has_draft:
        Draft.objects.filter(assignment=a).delete()
    if not judgement.late:
        reopen_slots(study, a.item_id)  # an adaptive rule: two disagreeing votes open a third slot
        if study.estimate:  # an estimate study re-plans its sample from the decided items
            transaction.on_commit(lambda: estimate_judged.send(sender=Judgement, study_id=study.pk), robust=True)
        # reliability-weighted adaptive overlap: the stored fit is refitted in a worker once this commits
        transaction.on_commit(lambda: request_refit(study), robust=True)
        # the agreement report's bootstrap intervals, on a worker (debounced: one task per burst)
        transaction.on_commit(lambda: request_after_submit(study), robust=True)
    return judgement


def mark_done(a: Assignment, late: bool | None = None) -> None:
    """The assignment is done (a judgement was stored, or an interactive session ended): its
    item counts one more completion unless the answer came late (``None``: the lease rule): the
    read model's rule, :func:`annotation.verdicts.readmodel.item_completions`."""
    if a.status == Assignment.Status.DONE:
        return
    if late is None:
        late = _lost_slot(a, a.study)
    if not late:
        # A released lease whose slot is still free takes it back: counted once.
        grow_taken = a.status != Assignment.Status.RESERVED
        StudyItem.objects.filter(pk=a.item_id).update(
            completed=F("completed") + 1, taken=F("taken") + (1 if grow_taken else 0)
        )
    a.status = Assignment.Status.DONE
    a.completed_at = timezone.now()
    a.save(update_fields=["status", "completed_at"])


def held_assignment(study: Study, user, now=None) -> Assignment | None:
    """The annotator's live lease in this study, read only (nothing is reserved or renewed)."""
    now = now or timezone.now()
    return (
        Assignment.objects.filter(study=study, annotator=user, status=Assignment.Status.RESERVED, lease_expires__gt=now)
        .order_by("leased_at")
        .first()
    )
