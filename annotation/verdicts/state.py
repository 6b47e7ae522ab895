"""A study's counts and an annotator's share, as pages show them, and the slots serving reads.

The item state itself (counted judgements, votes, decisions, item states, the one pass over
a study) is the read model's, :mod:`annotation.verdicts.readmodel`; this module words it for
the progress page and API, My studies, the end page and the item page's bar:

* **Judgements that count**: :func:`~annotation.verdicts.readmodel.counted_judgements`, i.e.
  ``Judgement.objects.counted()``: the current revision of each judgement, less late ones
  (stored after the lease went to someone else: kept and shown as *late*, never counted).
  :func:`submit_is_late` is the late rule.
* **The quorum rule**: ``Study.quorum_rule`` (:class:`annotation.core.consensus.QuorumRule`):
  how many annotators an item is served to (``slots``) and how many counted judgements decide
  it (``needed``). An adaptive rule (:class:`~annotation.core.consensus.AdaptiveQuorumRule`)
  plugs in there and nowhere else; what it opened for an item's votes is kept on the item
  (``StudyItem.extra_slots``, :func:`reopen_slots`) so serving reads it in SQL (:func:`free_slot_q`,
  :func:`item_slots`).
* **An item's decision state** (:func:`~annotation.verdicts.readmodel.item_state`): ``unjudged`` (no counted judgement),
  ``pending`` (below the quorum), ``awaiting_adjudication`` (a tie, a flag or a
  disagreement), ``decided`` (by the votes), ``adjudicated`` (by staff). An item is
  *exported* once a finished export wrote it; :func:`study_counts` gives the latest export's
  count beside the states.
* :func:`study_counts`: the states of every item, the counted and late judgements, and the
  counted judgements of each annotator (the read model's :func:`~annotation.verdicts.readmodel.study_pass`).
* :func:`annotator_share`: "N of M" for one annotator: ``done`` (items they submitted),
  ``remaining`` (items still open to them, at most their estimated share) and
  ``total = done + remaining``; ``remaining`` is 0 exactly when the queue has nothing left
  for them, so the bar, the end page and My studies agree. The open items are counted up to
  :data:`OPEN_COUNT_CAP` only, so "next item" reads a bounded number of rows at any study
  size: while at least that many are open, ``remaining`` is the share's estimate; within the
  last :data:`OPEN_COUNT_CAP` it is the exact count.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from django.core.cache import cache
from django.db.models import Count, F, Max, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from annotation.core.consensus import PENDING, UNJUDGED, QuorumRule, tally
from annotation.models import Adjudication, AlternativeDecision, Assignment, ExportJob, Judgement, Study, StudyItem
from annotation.sizes import recount, shift
from annotation.verdicts.readmodel import (
    AWAITING_ADJUDICATION,
    DECIDED,
    ITEM_STATES,
    QUORUM_FIELDS,
    ItemRow,
    Verdicts,
    assignment_counts,
    counted_judgements,
    counted_votes,
    item_state,
    item_states,
    iter_rows,
    late_judgements,
    late_per_annotator,
    locked_item_row,
    quorum_rule_of,
    session_rule_of,
    study_pass,
    turn_key_of,
)

__all__ = [
    "AWAITING_ADJUDICATION",
    "DECIDED",
    "ITEM_STATES",
    "counted_judgements",
    "item_state",
    "item_states",
    "late_judgements",
]  # the read model's, for the readers of this module


def study_sizes(study: Study) -> dict:
    """Item and annotator counts of a study: ``agreement`` and ``other`` items, ``annotators``
    and the items' ``extra`` slots together. Read off the study row (``Study.n_*``, kept by
    :mod:`annotation.sizes` with every change), so they cost no query: "next item"
    reads them with the study row it loads anyway."""
    return {
        "agreement": study.n_agreement,
        "other": study.n_items - study.n_agreement,
        "annotators": study.n_annotators,
        "extra": study.n_extra_slots,
    }


def item_slots(study: Study, agreement: bool, extra: int, n_annotators: int | None) -> int:
    """THE number of annotators one item is served to now: the quorum rule's slots
    (``Study.quorum_rule.slots``; every annotator for an agreement item) plus, for other items,
    what an adaptive rule opened for its votes (``StudyItem.extra_slots``, kept by :func:`reopen_slots`)."""
    rule = study.quorum_rule
    return rule.slots(True, n_annotators) if agreement and n_annotators else rule.slots() + extra


def free_slot_q(study: Study, n_annotators: int | None) -> Q:
    """Items with a slot free (:func:`item_slots` above ``taken``), as a filter on StudyItem;
    ``n_annotators`` None: every agreement item (the pure rules then judge their capacity)."""
    rule = study.quorum_rule
    agreement = (
        Q(agreement=True) if n_annotators is None else Q(agreement=True, taken__lt=rule.slots(True, n_annotators))
    )
    return agreement | Q(agreement=False, taken__lt=F("extra_slots") + rule.slots())


def opened_slots(rule: QuorumRule, row: ItemRow, session: Any = None, turn_key: str | None = None) -> int:
    """THE extra slots an item's counted votes open under the quorum rule (``rule.slots`` less the
    overlap; 0 for agreement items and fixed rules): what ``StudyItem.extra_slots`` keeps."""
    if row.agreement or not rule.adaptive:
        return 0
    return rule.slots(False, None, counted_votes(row, session, turn_key)) - rule.slots()


def reopen_slots(study: Study, item_id: int) -> int:
    """Under an adaptive quorum rule, after a judgement of the item is stored: open or close
    the item's extra slots (``StudyItem.extra_slots``) to what the rule's ``slots`` give for
    its counted votes (two disagreeing votes open a third). The item row is locked first, so
    two racing submits of its last votes both see each other's. A fixed rule: nothing (0).
    Under reliability-weighted adaptive overlap the rule reads the study's last stored
    reliability fit (:func:`~annotation.verdicts.readmodel.quorum_rule_of`; none yet: a split
    opens a further slot): the one item is decided here, in O(1); the refit on the new
    judgements and every other item's slots follow in a worker
    (:func:`annotation.verdicts.refit.request_refit`, sent by the submit once it commits)."""
    if not study.quorum_rule.adaptive:
        return 0
    found = locked_item_row(study, item_id)
    if found is None or found[0].agreement:
        return 0
    row, before = found
    rule = quorum_rule_of(study)
    extra = opened_slots(rule, row, session_rule_of(study), turn_key_of(study))
    if extra != before:
        StudyItem.objects.filter(pk=item_id).update(extra_slots=extra)
        shift(study, extra=extra - before)  # the item row is locked: ``before`` is the stored value
    return extra


def slot_changes(study: Study, rule: QuorumRule | None = None) -> Iterator[tuple[int, int, int]]:
    """(item id, kept extra slots, extra slots under ``rule``) of every item whose kept
    ``StudyItem.extra_slots`` differ from what ``rule`` (default: the study's current quorum
    rule, :func:`quorum_rule_of`) opens for its counted votes (:func:`opened_slots`): what
    :func:`refresh_slots` writes, and what a staff page counts as serving's lag behind the exact
    reliability fit."""
    rule = rule or quorum_rule_of(study)
    session, turn_key = session_rule_of(study), turn_key_of(study)
    extra_now = dict(StudyItem.objects.filter(study=study).values_list("id", "extra_slots"))
    for row in iter_rows(study):
        extra = opened_slots(rule, row, session, turn_key)
        if extra != extra_now.get(row.item_id):
            yield row.item_id, extra_now.get(row.item_id), extra


def refresh_slots(study: Study, rule: QuorumRule | None = None) -> int:
    """Every item's extra slots again, under the study's current quorum rule (after its overlap,
    adaptive maximum, consensus or confidence changed, or its stored reliability fit moved:
    :func:`annotation.verdicts.refit.refit_study`; ``rule``: the rule already bound to it): what
    :func:`reopen_slots` would give each (:func:`slot_changes`). Returns the items changed."""
    changed = 0
    for item_id, _, extra in slot_changes(study, rule):
        changed += StudyItem.objects.filter(pk=item_id).update(extra_slots=extra)
    recount(study, ("n_extra_slots",))  # after the items' rows: their locks are never taken under the study's
    return changed


def submit_is_late(status: str, taken: int, agreement: bool, study: Study, extra: int = 0) -> bool:
    """THE late rule: a submit on an assignment that no longer holds its slot (its lease was
    released, or the annotator skipped the item) is late when the item's slots
    (:func:`item_slots`; ``extra``: its ``extra_slots``) have since gone to others (``taken`` reached them)."""
    if status not in (Assignment.Status.RELEASED, Assignment.Status.SKIPPED):
        return False
    return taken >= item_slots(study, agreement, extra, study_sizes(study)["annotators"])


def latest_export(study: Study) -> ExportJob | None:
    return ExportJob.objects.filter(study=study, status=ExportJob.Status.DONE).order_by("-finished_at", "-id").first()


def study_counts(study: Study, verdicts: Verdicts | None = None) -> dict[str, Any]:
    """Every count of a study, from one pass over its items and counted judgements.

    ``items``; ``states`` (:data:`ITEM_STATES` -> items); ``pending`` (below the quorum,
    unjudged items NOT included) and ``unjudged``; ``status``, ``provenance`` and
    ``adjudication_reasons`` (the :func:`~annotation.core.consensus.tally` of the
    decisions); ``quorum``; ``judgements`` (counted), ``late``, ``flagged`` (counted and
    flagged); ``complete`` (items that reached their slots); ``annotators`` (username ->
    ``{"judged": counted, "late": late}``); ``exported`` (validated items of the latest
    finished export, ``None`` before any). With the study's own rule (``verdicts`` None) the
    counts are cached under :func:`study_version`."""
    if verdicts is None:  # the study's own rule: cached under the study's version (never stale)
        key = "cirval:counts:" + hashlib.sha256(study_version(study).encode()).hexdigest()
        counts = cache.get(key)
        if counts is None:
            counts = _study_counts(study, Verdicts.of(study))
            cache.set(key, counts, COUNTS_CACHE_SECONDS)
        return counts
    return _study_counts(study, verdicts)


COUNTS_CACHE_SECONDS = 24 * 3600  # keyed by study_version: a change makes a new key


def _study_counts(study: Study, verdicts: Verdicts) -> dict[str, Any]:
    walk = study_pass(study, verdicts)
    out: dict[str, Any] = tally(walk.decisions.values())
    out["items"] = sum(walk.states.values())
    late = late_per_annotator(study)
    export = latest_export(study)
    out.update(
        states=walk.states,
        pending=walk.states[PENDING],
        unjudged=walk.states[UNJUDGED],
        quorum=verdicts.quorum,
        judgements=walk.judgements,
        late=sum(late.values()),
        flagged=walk.flagged,
        complete=walk.complete,
        labour=labour_figures(study, walk.judgements, walk.saved),
        annotators={
            u: {"judged": walk.per_annotator.get(u, 0), "late": late.get(u, 0)}
            for u in sorted(set(walk.per_annotator) | set(late))
        },
        exported=(export.manifest.get("counts", {}).get("validated") if export is not None else None),
    )
    return out


def labour_figures(study: Study, spent: int, saved: int) -> dict[str, Any]:
    """Judgements spent (counted) and saved by adaptive overlap: on every item that settled
    below the rule's maximum, the judgements a fixed overlap at that maximum would have cost
    beyond it. ``adaptive``: whether the study's rule is adaptive (else nothing is saved)."""
    rule = study.quorum_rule
    return {
        "adaptive": rule.adaptive,
        "rule": rule.describe(),
        "spent": spent,
        "saved": saved,
        "maximum": rule.most,
        "base": rule.base,
    }


def study_version(study: Study) -> str:
    """A fingerprint of everything a study's counts and reports read: it changes with every
    judgement (a revision is a new row), adjudication, candidate decision, assignment (the
    pseudonyms), item and setting. Caches of derived figures are keyed by it."""
    parts = [
        Judgement.objects.filter(assignment__study=study).aggregate(n=Count("id"), last=Max("id")),
        Adjudication.objects.filter(study=study).aggregate(n=Count("id"), last=Max("id")),
        AlternativeDecision.objects.filter(study=study).aggregate(n=Count("id"), last=Max("id")),
        Assignment.objects.filter(study=study).aggregate(n=Count("id"), last=Max("id")),
        StudyItem.objects.filter(study=study).aggregate(n=Count("id"), gold=Count("id", filter=Q(gold=True))),
        ExportJob.objects.filter(study=study, status=ExportJob.Status.DONE).aggregate(n=Count("id"), last=Max("id")),
    ]
    fresh = (
        Study.objects.filter(pk=study.pk)
        .values_list("rubric_id", "session_rule", "alternatives_rule", "candidates", *QUORUM_FIELDS)
        .first()
    )
    team = sorted(Study.annotators.through.objects.filter(study_id=study.pk).values_list("user_id", flat=True))
    return json.dumps([study.pk, study.created_at.timestamp(), parts, fresh, team], sort_keys=True, default=str)


def _mine(study: Study, user_id: int) -> dict:
    return Assignment.objects.filter(study=study, annotator_id=user_id).aggregate(
        **assignment_counts(timezone.now(), "done", "reserved")
    )


def open_to(study: Study, user_id: int, n_annotators: int, now=None) -> QuerySet:
    """Items still open to one annotator: not gold, not submitted by them, and with a slot
    free under the quorum rule (or held by them ``now``). Skipped items stay open."""
    mine = Assignment.objects.filter(study=study, annotator_id=user_id)
    held = mine.filter(status=Assignment.Status.RESERVED, lease_expires__gt=now or timezone.now()).values("item_id")
    free = free_slot_q(study, n_annotators)
    return (
        StudyItem.objects.filter(study=study, gold=False)
        .filter(free | Q(id__in=held))
        .exclude(id__in=mine.filter(status=Assignment.Status.DONE).values("item_id"))
    )


#: The most open items counted for an annotator's share (a bounded read at any study size):
#: while at least this many are open the share's estimate stands.
OPEN_COUNT_CAP = 40


def share_wanted(study: Study, done: int, reserved: int) -> int:
    """How many open items an annotator's share can still use: their estimated share (the
    agreement items plus an even part of the others' slots) less what they did, at least
    what they hold (and 1). Counting further than this changes no figure."""
    sizes = study_sizes(study)
    n = max(1, sizes["annotators"])
    others = sizes["other"] * min(study.quorum_rule.slots(), n) + sizes.get("extra", 0)  # slots opened so far
    estimate = sizes["agreement"] + -(-others // n)
    return max(estimate - done, reserved, 1)


def open_left_limit(limit: int) -> int:
    """How far :func:`open_left` counts for a share that can use ``limit`` items: at least 1,
    at most :data:`OPEN_COUNT_CAP`."""
    return max(1, min(limit, OPEN_COUNT_CAP))


def open_left(study: Study, user_id: int, limit: int, now=None) -> RawSQL:
    """An expression for the items still open to the annotator (:func:`open_to`), counted up
    to ``limit`` (:func:`share_wanted`): the "next item" engine reads it with a row it reads
    anyway, so the share costs no query of its own (issue 30: next item in <= 10 queries).
    It is an uncorrelated subquery, evaluated once per statement."""
    inner = (
        open_to(study, user_id, study_sizes(study)["annotators"], now).order_by().values("id")[: open_left_limit(limit)]
    )
    sql, params = inner.query.sql_with_params()
    return RawSQL(f"SELECT COUNT(*) FROM ({sql}) open_left", params)


def annotator_share(study: Study, user, mine: dict | None = None) -> dict[str, int]:
    """'17 of 120' for one annotator (see the module docstring): ``done``, ``reserved``,
    ``remaining``, ``total``. ``remaining`` is the items still open to the annotator
    (:func:`open_to`), at most :func:`share_wanted`, at least what they hold, so it
    reaches 0 exactly when nothing is left for them. ``mine``: their done and live-reserved
    counts when already known (``Served.mine``), which saves a query, and ``open``: the
    items open to them counted up to at least :func:`share_wanted` (:func:`open_left`,
    read by the engine with a row it reads anyway), which saves another."""
    user_id = getattr(user, "pk", user)
    mine = mine if mine is not None else _mine(study, user_id)
    done, reserved = mine["done"], mine["reserved"]
    wanted = share_wanted(study, done, reserved)
    found = mine.get("open")
    if found is None:
        found = open_to(study, user_id, study_sizes(study)["annotators"])[: min(wanted, OPEN_COUNT_CAP)].count()
    if found >= OPEN_COUNT_CAP:  # at least the cap open: the share's estimate stands
        found = wanted
    remaining = max(min(found, wanted), reserved)
    return {"done": done, "reserved": reserved, "total": done + remaining, "remaining": remaining}
