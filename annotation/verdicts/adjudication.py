"""Votes, consensus and adjudication of a study's items, read from the database in batches.

:func:`iter_item_batches` streams a study's items in id order (``.iterator(chunk_size)``)
with every current judgement and the current adjudication of each item, one batch at a
time, so reports and exports never hold more than one batch of judgements. The consensus
itself is the pure :func:`annotation.core.consensus.decide`.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.db.models import Count, F, Max, Q

from annotation.core.rubric import CIRCUS_FLAG_ORDER as FLAGS
from annotation.core.rubric import VALIDATED_LABEL as VALIDATED
from annotation.core.consensus import (
    Decision,
    QuorumRule,
    SessionRule,
    SessionVote,
    TurnVote,
    Vote,
    decide,
    decide_session,
    decide_turns,
    describe_turns,
)
from annotation.verdicts.reliability import AnnotatorReliability, Reliability, annotator_reliability, fit_votes
from annotation.models import Adjudication, Judgement, Study, StudyItem, counted_q
from annotation.core.rubric import Rubric
from annotation.core.turns import turn_answers

DEFAULT_CHUNK = 1000


@dataclass(frozen=True)
class VoteRow:
    """One annotator's current judgement of an item (what reports, queues and traces show)."""

    annotator: str
    validated: bool | None
    category: str
    sub_reason: str
    flags: dict[str, bool]
    note: str
    flagged: bool
    time_spent_ms: int
    revision: int
    judged_at: datetime
    scales: dict[str, Any]
    reject_flags: list[str]
    per_turn: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class AdjudicationRow:
    decision: str
    note: str
    decided_by: str | None
    decided_at: datetime

    @property
    def validated(self) -> bool:
        return self.decision == Adjudication.Decision.VALIDATED


@dataclass
class ItemRow:
    """A study item with its query's coordinates, its votes and its adjudication."""

    item_id: int
    query_id: int
    dataset_id: int
    dataset: str
    external_id: str
    ordinal: int
    hidden_category: str
    stratum: str
    agreement: bool = False
    votes: list[VoteRow] = field(default_factory=list)
    adjudication: AdjudicationRow | None = None

    @property
    def key(self) -> str:
        """``"<dataset>::<external id>"``: how pages name the item."""
        return f"{self.dataset}::{self.external_id}"


def is_validity_rubric(rubric: Rubric) -> bool:
    """A category rubric whose flags are the four CIRCUS flags (labels: VALIDATED or flags)."""
    return (rubric.kind == "category" and rubric.flags is not None and tuple(rubric.flags.order) == FLAGS
            and rubric.valid_category is not None)


def validity_label(validated: bool | None, flags: dict[str, bool] | None, category: str,
                   valid_key: str = VALIDATED) -> str | list[str] | None:
    """The agreement label of a stored validity judgement.

    ``"VALIDATED"`` when validated; otherwise the list of its true flags in canonical
    order, so an invalid judgement with no flag (CIRCUS's "invalid unspecified") is
    ``[]``. Rows written without ``validated`` fall back on the category. ``None``: no label.
    """
    flags = flags or {}
    if validated is True:
        return VALIDATED
    if validated is False:
        return [f for f in FLAGS if flags.get(f)]
    if not category:
        return None
    if category == valid_key:
        return VALIDATED
    return [category] if category in FLAGS else None


def votes_of(row: ItemRow) -> list[Vote]:
    """The consensus votes of an item: judgements with a validated / invalid verdict."""
    return [Vote(v.annotator, bool(v.validated), v.flagged) for v in row.votes if v.validated is not None]


def _score(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def session_votes_of(row: ItemRow, rule: SessionRule) -> list[SessionVote]:
    """The session votes of an item: reject flags and the rule's scale of every judgement."""
    return [SessionVote(v.annotator, tuple(v.reject_flags), _score(v.scales.get(rule.scale)), v.flagged)
            for v in row.votes]


def turn_votes_of(row: ItemRow, key: str) -> list[TurnVote]:
    """The turn-by-turn votes of a session: each judgement's turn verdicts (under ``key``),
    reject flags and flag; a judgement without turn verdicts (an older rubric) is left out."""
    out = []
    for v in row.votes:
        answers = turn_answers(v.per_turn, key)
        if answers is not None:
            out.append(TurnVote(v.annotator, answers, tuple(v.reject_flags), v.flagged))
    return out


@dataclass(frozen=True)
class Verdicts:
    """How a study decides its items: what :func:`decide_row` needs besides the votes."""

    quorum: int = 1
    policy: str = "majority"
    primary: str | None = None
    session: SessionRule | None = None  # set for session studies
    rule: QuorumRule | None = None  # the study's quorum rule; None: ``quorum`` as a fixed number
    reliability: Any = None  # the "reliability" policy's model (annotation.verdicts.reliability.Reliability)
    turn_key: str | None = None  # session rubrics with a turn verdict: its key (sessions decided turn by turn)

    @classmethod
    def of(cls, study: Study, policy: str | None = None, primary: str | None = None) -> Verdicts:
        """The study's rule: its quorum rule and, for a session rubric, its session rule (and
        its turn verdict's key when the rubric judges turn by turn, :func:`turn_key_of`).
        ``policy`` None: the study's own consensus policy (``Study.consensus``). Under the
        ``"reliability"`` policy (and the weighted adaptive rule) read the annotators' Dawid-Skene
        model fitted on all the study's counted votes (:func:`reliability_of` exact: pages and
        exports decide by the exact fit; serving reads the stored one)."""
        session = session_rule_of(study)
        policy = policy or study.consensus
        model = None
        if (policy == "reliability" or study.quorum_rule.weighted) and session is None:
            model = reliability_of(study, exact=True)
        rule = quorum_rule_of(study, model)
        return cls(rule.base, policy, primary or None, session, rule, model if policy == "reliability" else None,
                   turn_key_of(study))

    def describe_session(self) -> str:
        """The session rule in words ('' for single-turn studies)."""
        if self.session is None:
            return ""
        return describe_turns(self.session, self.policy) if self.turn_key is not None else self.session.describe()

    def needed(self, votes) -> int:
        """Counted judgements an item with these ``votes`` needs (the study's :class:`QuorumRule`)."""
        return self.rule.needed(votes) if self.rule is not None else self.quorum


def quorum_rule_of(study: Study, model: Reliability | None = None) -> QuorumRule:
    """THE quorum rule an item's votes are read by (its slots, its quorum, whether it is settled):
    ``Study.quorum_rule``, bound under reliability-weighted adaptive overlap to the study's
    reliability model (``model``, else the stored fit, :func:`reliability_of`) so that a split is
    settled once the model is sure of it. Without a fit yet, or for session studies: the rule
    unbound (the lead rule alone: a split opens a further slot, the conservative side)."""
    rule = study.quorum_rule
    if not fits_reliability(study):
        return rule
    model = model if model is not None else reliability_of(study)
    return rule.with_reliability(model) if model is not None else rule


def fits_reliability(study: Study) -> bool:
    """Whether the study's quorum rule reads a reliability fit: reliability-weighted adaptive
    overlap of a single-turn study (what ``Study.reliability_fit`` is kept for)."""
    return study.quorum_rule.weighted and session_rule_of(study) is None


def reliability_of(study: Study, exact: bool = False) -> Reliability | None:
    """THE reliability model of a study, the one function every reader of it goes through.

    ``exact``: Dawid-Skene on all its counted votes now (:func:`study_reliability`, cached per
    state of its judgements): staff pages and exports, and the refit that stores it
    (:func:`annotation.verdicts.refit.refit_study`, in a worker). Otherwise the last stored fit
    (``Study.reliability_fit``), read from the study row with no query: what serving reads on a
    submit (:func:`annotation.verdicts.state.reopen_slots`); ``None`` before the first fit."""
    if exact:
        return study_reliability(study).model
    stored = (study.reliability_fit or {}).get("model")
    return Reliability.from_dict(stored) if stored else None


def judgement_state(study: Study) -> dict[str, int | None]:
    """How many judgements the study has (``n``, revisions included) and its newest's id
    (``last``): what a reliability fit is keyed by and stored with."""
    return Judgement.objects.filter(assignment__study=study).aggregate(n=Count("id"), last=Max("id"))


def session_rule_of(study: Study) -> SessionRule | None:
    """The study's session rule (session rubrics), else None."""
    return SessionRule.from_dict(study.session_rule) if is_session_rubric(study.rubric.rubric) else None


def turn_key_of(study: Study) -> str | None:
    """The key of the study's turn verdict (session rubrics that judge turn by turn), else None."""
    rubric = study.rubric.rubric
    return rubric.turn_verdict.key if is_session_rubric(rubric) and rubric.turn_verdict is not None else None


def is_session_rubric(rubric: Rubric) -> bool:
    return rubric.kind == "session"


def has_verdicts(rubric: Rubric) -> bool:
    """Items of this rubric get a validated / rejected verdict (adjudication, export):
    category rubrics with a validated category, and session rubrics."""
    return is_session_rubric(rubric) or (rubric.kind == "category" and rubric.valid_category is not None)


def counted_votes(row: ItemRow, session: SessionRule | None = None, turn_key: str | None = None) -> list:
    """The votes an item is decided on (and its quorum rule reads): turn-by-turn votes under a
    turn verdict (``turn_key``), session votes under a session rule, else the judgements with
    a validated / invalid verdict."""
    if turn_key is not None:
        return turn_votes_of(row, turn_key)
    return session_votes_of(row, session) if session is not None else votes_of(row)


def decide_row(row: ItemRow, verdicts: Verdicts, *, with_adjudication: bool = True) -> Decision:
    """THE decision of one study item (every page, report, queue and export calls it):
    :func:`~annotation.core.consensus.decide` for single-turn items,
    :func:`~annotation.core.consensus.decide_session` for sessions,
    :func:`~annotation.core.consensus.decide_turns` for sessions judged turn by turn (the
    study's policy on every turn), with the study's quorum."""
    adjudication = row.adjudication.validated if (with_adjudication and row.adjudication) else None
    votes = counted_votes(row, verdicts.session, verdicts.turn_key)
    if verdicts.turn_key is not None:
        return decide_turns(votes, verdicts.session, verdicts.policy, primary=verdicts.primary,
                            adjudication=adjudication, quorum=verdicts.needed(votes))
    if verdicts.session is not None:
        return decide_session(votes, verdicts.session, adjudication=adjudication, quorum=verdicts.needed(votes))
    return decide(votes, verdicts.policy, primary=verdicts.primary, adjudication=adjudication,
                  quorum=verdicts.needed(votes), reliability=verdicts.reliability)


def _batched(iterable, n: int) -> Iterator[list]:
    batch: list = []
    for x in iterable:
        batch.append(x)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


_ITEM_FIELDS = ("id", "query_id", "query__dataset_id", "query__dataset__name", "query__external_id",
                "query__ordinal", "hidden_category", "stratum", "agreement")
_VOTE_FIELDS = ("assignment__item_id", "assignment__annotator__username", "validated", "category", "sub_reason",
                "flags", "note", "flagged", "time_spent_ms", "revision", "created_at", "scales", "reject_flags",
                "per_turn")


def _fill(study: Study, rows: list[ItemRow], exact: bool = False) -> None:
    """Attach the current judgements and adjudications of one batch: by id range for a run
    of consecutive items (the whole study), by id list for a hand-picked set (``exact``)."""
    by_id = {r.item_id: r for r in rows}
    lo, hi = rows[0].item_id, rows[-1].item_id
    if exact:
        mine, adjudicated = Q(assignment__item_id__in=list(by_id)), Q(item_id__in=list(by_id))
    else:
        mine = Q(assignment__item_id__gte=lo, assignment__item_id__lte=hi)
        adjudicated = Q(item_id__gte=lo, item_id__lte=hi)
    judgements = (
        Judgement.objects.counted().filter(mine, assignment__study=study)
        .order_by("assignment__item_id", "assignment__annotator__username")
        .values_list(*_VOTE_FIELDS)
    )
    for item_id, user, validated, cat, sub, flags, note, flagged, ms, rev, at, scales, rejects, turns in judgements:
        row = by_id.get(item_id)
        if row is not None:
            row.votes.append(VoteRow(user, validated, cat, sub, flags or {}, note, flagged, ms, rev, at,
                                     scales or {}, list(rejects or []), list(turns or [])))
    adjudications = (
        Adjudication.objects.filter(adjudicated, study=study, is_current=True)
        .values_list("item_id", "decision", "note", "decided_by__username", "decided_at")
    )
    for item_id, decision, note, by, at in adjudications:
        row = by_id.get(item_id)
        if row is not None:
            row.adjudication = AdjudicationRow(decision, note, by, at)


def iter_item_batches(study: Study, *, chunk_size: int = DEFAULT_CHUNK,
                      item_ids: Sequence[int] | None = None) -> Iterator[list[ItemRow]]:
    """The study's items in id order, ``chunk_size`` at a time, votes attached."""
    items = StudyItem.objects.filter(study=study)
    if item_ids is not None:
        items = items.filter(id__in=list(item_ids))
    stream = items.order_by("id").values_list(*_ITEM_FIELDS).iterator(chunk_size=chunk_size)
    for chunk in _batched(stream, chunk_size):
        rows = [ItemRow(*values) for values in chunk]
        _fill(study, rows, exact=item_ids is not None)
        yield rows


def locked_item_row(study: Study, item_id: int) -> tuple[ItemRow, int] | None:
    """One item, its row locked (``select_for_update``) and read with its ``extra_slots``,
    then its votes attached: (row, extra slots), or None."""
    found = (StudyItem.objects.select_for_update(of=("self",)).filter(pk=item_id, study=study)
             .values_list(*_ITEM_FIELDS, "extra_slots").first())
    if found is None:
        return None
    row = ItemRow(*found[:-1])
    _fill(study, [row], exact=True)
    return row, found[-1]


def item_row(study: Study, item_id: int) -> ItemRow | None:
    for batch in iter_item_batches(study, item_ids=[item_id]):
        return batch[0]
    return None


@dataclass(frozen=True)
class QueueEntry:
    row: ItemRow
    decision: Decision  # under the policy, before any adjudication

    @property
    def adjudicated(self) -> bool:
        return self.row.adjudication is not None


def _queue_candidates(study: Study, verdicts: Verdicts) -> list[int]:
    """Ids of the items that may need an adjudicator, found with one aggregate query: an item
    with a flag, a split vote (majority: an even split; unanimous: any split) or a decision.
    Sessions: every item with a judgement (their rule reads scores, decided in Python).
    Late judgements (stored after their lease went to someone else) never count. The filter
    uses the study's base quorum: a superset for any quorum rule whose ``needed`` is at least
    its base; :func:`decide_row` then decides each candidate under the rule."""
    current = counted_q("assignments__revisions__")
    if verdicts.session is None:
        current &= Q(assignments__revisions__validated__isnull=False)
    items = StudyItem.objects.filter(study=study).annotate(
        n=Count("assignments__revisions", filter=current),
        valid=Count("assignments__revisions", filter=current & Q(assignments__revisions__validated=True)),
        flags=Count("assignments__revisions", filter=current & Q(assignments__revisions__flagged=True)),
    )
    wanted = Q(flags__gt=0) | Q(id__in=Adjudication.objects.filter(study=study).values("item_id"))
    if verdicts.session is not None:
        wanted |= Q(n__gte=verdicts.quorum)
    elif verdicts.policy in ("majority", "reliability"):  # reliability: a tie needs an even split too
        wanted |= Q(n__gte=verdicts.quorum, n=F("valid") * 2)
    elif verdicts.policy == "unanimous":
        wanted |= Q(n__gte=verdicts.quorum, valid__gt=0) & ~Q(valid=F("n"))
    return list(items.filter(wanted).order_by("id").values_list("id", flat=True))


def adjudication_queue(study: Study, verdicts: Verdicts | None = None) -> list[QueueEntry]:
    """Items that need (or got) an adjudicator: ties, flagged items, and any item already
    adjudicated. Waiting items first, each group in item id order. ``verdicts``: default
    the study's own rule (:meth:`Verdicts.of`: its consensus policy)."""
    verdicts = verdicts or Verdicts.of(study)
    entries: list[QueueEntry] = []
    candidates = _queue_candidates(study, verdicts)
    for start in range(0, len(candidates), DEFAULT_CHUNK):
        for batch in iter_item_batches(study, item_ids=candidates[start:start + DEFAULT_CHUNK]):
            for row in batch:
                decision = decide_row(row, verdicts, with_adjudication=False)
                if decision.needs_adjudication or row.adjudication is not None:
                    entries.append(QueueEntry(row, decision))
    return sorted(entries, key=lambda e: (e.adjudicated, e.row.item_id))


def adjudicate(study: Study, item: StudyItem, validated: bool, note: str, user) -> Adjudication:
    """Record a staff decision on an item; the previous one (if any) stays, not current."""
    if item.study_id != study.pk:
        raise ValueError("the item belongs to another study")
    decision = Adjudication.Decision.VALIDATED if validated else Adjudication.Decision.REJECTED
    with transaction.atomic():
        StudyItem.objects.select_for_update().filter(pk=item.pk).first()  # serialises racing adjudicators
        Adjudication.objects.filter(item=item, is_current=True).update(is_current=False)
        return Adjudication.objects.create(study=study, item=item, decision=decision, note=(note or "").strip(),
                                           decided_by=user, is_current=True)


# --------------------------------------------------------------------------- reliability


@dataclass(frozen=True)
class StudyReliability:
    """A study's Dawid-Skene fit on its counted validity votes (:mod:`annotation.verdicts.reliability`):
    ``model`` (what the ``"reliability"`` policy decides by), ``annotators`` (each one's
    reliability with its interval), ``items`` (items with a vote) and ``answers``."""

    model: Reliability
    annotators: tuple[AnnotatorReliability, ...]
    items: int
    answers: int
    iterations: int
    differs: tuple[dict, ...] = ()  # items whose reliability-weighted verdict differs from the majority's

    @property
    def by_annotator(self) -> dict[str, AnnotatorReliability]:
        return {a.annotator: a for a in self.annotators}


def _differences(study: Study, by_item: dict[int, list[Vote]], keys: dict[int, str], model: Reliability) -> tuple:
    """The items whose verdict under the reliability policy differs from the majority's (by
    their votes, before any adjudication), with both verdicts and the vote split."""
    rule, out = quorum_rule_of(study, model), []
    for item, votes in by_item.items():
        majority = decide(votes, "majority", quorum=rule.needed(votes))
        weighted = decide(votes, "reliability", quorum=rule.needed(votes), reliability=model)
        if majority.status != weighted.status:
            out.append({"item": item, "key": keys[item], "majority": majority.status, "reliability": weighted.status,
                        "split": majority.split_text, "posterior": model.posterior(votes)})
    return tuple(out)


RELIABILITY_CACHE_SECONDS = 3600  # keyed by the study's judgements: a new one makes a new key


def study_reliability(study: Study) -> StudyReliability:
    """The reliability fit of a study, its report (annotators, differences) with the model
    :func:`reliability_of` reads: Dawid-Skene on every item's counted votes (the
    votes consensus decides on), fitted once per state of the study's judgements (cached)."""
    seen = judgement_state(study)
    key = (f"cirval:reliability:{study.pk}:{study.created_at.timestamp()}:{seen['n']}:{seen['last']}:"
           f"{study.overlap}:{study.quorum}:{study.adaptive_max}:{study.consensus}:{study.adaptive_confidence}")  # the quorum rule decides what differs
    found = cache.get(key)
    if found is None:
        by_item: dict[int, list[Vote]] = {}
        keys: dict[int, str] = {}
        for batch in iter_item_batches(study):
            for row in batch:
                votes = votes_of(row)
                if votes:
                    by_item[row.item_id], keys[row.item_id] = votes, row.key
        fit, model = fit_votes(by_item)
        rows = [(item, v.annotator, v.validated) for item, votes in by_item.items() for v in votes]
        found = StudyReliability(model, tuple(annotator_reliability(fit, rows)), len(by_item), len(rows),
                                 fit.iterations, _differences(study, by_item, keys, model))
        cache.set(key, found, RELIABILITY_CACHE_SECONDS)
    return found
