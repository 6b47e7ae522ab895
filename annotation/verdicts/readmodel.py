"""THE read model of a study's item state: every count, vote and decision a page, report,
queue or export shows is read here, in one pass per study.

What it computes, once (nothing else in CIRVal counts judgements or decides quorum):

* **the counted judgements** of every item (``Judgement.objects.counted()``: the current
  revision of each, less late ones, which are kept and shown but never counted), read as
  :class:`ItemRow` / :class:`VoteRow` (:func:`study_rows`, :func:`iter_item_batches`);
* **votes** (:func:`counted_votes`: validity votes, session votes or turn votes);
* **the quorum** an item's votes are read by (:func:`quorum_rule_of`, ``Study.quorum_rule``;
  the settings it reads are :data:`QUORUM_FIELDS`, listed here and nowhere else);
* **decisions and item states** (:func:`decide_row`, :func:`item_state`), **study counts**
  and **per-annotator counted judgements** (:func:`study_pass`: one pass over the items);
* **the reliability fit** of the study's counted votes (:func:`study_reliability`);
* **the adjudication prefilter** (:func:`adjudication_candidates`, the one SQL statement of the
  consensus rule, a superset of what :func:`decide_row` sends to adjudication);
* **an annotator's assignment counts** (:func:`assignment_counts`: done, live reserved, skipped).

Reading it is cheap: :func:`study_rows` reads only the columns item state needs, with the
JSON columns as text decoded once per distinct value, and keeps the rows of each study in
this process keyed by a change counter of its judgements, adjudications and items
(:func:`change_stamp`). Every judgement, revision and adjudication is a new row, so a
counter that moved by exactly the new rows means only the items of those rows changed: they
are read again and the rest is kept; any other change reads the study again. A read never
returns rows older than the counter it read first: never stale.

Readers: the progress page and API, My studies and shares (:mod:`annotation.verdicts.state`),
the agreement report (:mod:`annotation.agreement.reports`), the export, the quality report
and gold, the adjudication queue (:mod:`annotation.verdicts.adjudication`), the reliability
fit, ``demo_check`` and the CIRCUS import (:mod:`annotation.studies.circus`).

Rows and the decoded JSON values they hold are shared between readers: treat them as read-only.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db.models import Count, F, Max, Q, QuerySet, TextField
from django.db.models.functions import Cast

from annotation.core.consensus import (
    ADJUDICATED,
    ADJUDICATION,
    PENDING,
    UNJUDGED,
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
from annotation.core.rubric import CIRCUS_FLAG_ORDER as FLAGS
from annotation.core.rubric import VALIDATED_LABEL as VALIDATED
from annotation.core.rubric import Rubric
from annotation.core.study_settings import QuorumSettings
from annotation.core.turns import turn_answers
from annotation.models import Adjudication, Assignment, Judgement, Study, StudyItem, counted_q
from annotation.verdicts.reliability import AnnotatorReliability, Reliability, annotator_reliability, fit_votes

#: THE study settings the quorum rule (and so every decision and slot) reads, the fields of
#: annotation.core.study_settings.QuorumSettings: a change of any of them re-reads slots (the
#: study settings page), re-keys the reliability fit and the counts.
QUORUM_FIELDS: tuple[str, ...] = QuorumSettings.field_names()

AWAITING_ADJUDICATION = "awaiting_adjudication"
DECIDED = "decided"
ITEM_STATES: tuple[str, ...] = (UNJUDGED, PENDING, AWAITING_ADJUDICATION, DECIDED, ADJUDICATED)

DEFAULT_CHUNK = 1000


@dataclass(frozen=True, slots=True)
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
    return (
        rubric.kind == "category"
        and rubric.flags is not None
        and tuple(rubric.flags.order) == FLAGS
        and rubric.valid_category is not None
    )


def validity_label(
    validated: bool | None, flags: dict[str, bool] | None, category: str, valid_key: str = VALIDATED
) -> str | list[str] | None:
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
    return [
        SessionVote(v.annotator, tuple(v.reject_flags), _score(v.scales.get(rule.scale)), v.flagged) for v in row.votes
    ]


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
        return cls(
            rule.base,
            policy,
            primary or None,
            session,
            rule,
            model if policy == "reliability" else None,
            turn_key_of(study),
        )

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
        return decide_turns(
            votes,
            verdicts.session,
            verdicts.policy,
            primary=verdicts.primary,
            adjudication=adjudication,
            quorum=verdicts.needed(votes),
        )
    if verdicts.session is not None:
        return decide_session(votes, verdicts.session, adjudication=adjudication, quorum=verdicts.needed(votes))
    return decide(
        votes,
        verdicts.policy,
        primary=verdicts.primary,
        adjudication=adjudication,
        quorum=verdicts.needed(votes),
        reliability=verdicts.reliability,
    )


def _batched(iterable, n: int) -> Iterator[list]:
    batch: list = []
    for x in iterable:
        batch.append(x)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


# --------------------------------------------------------------------------- reading rows


_ITEM_FIELDS = (
    "id",
    "query_id",
    "query__dataset_id",
    "query__dataset__name",
    "query__external_id",
    "query__ordinal",
    "hidden_category",
    "stratum",
    "agreement",
)
_JSON_VOTE_FIELDS = ("flags", "scales", "reject_flags", "per_turn")
_VOTE_COLUMNS = (
    "assignment__item_id",
    "assignment__annotator__username",
    "validated",
    "category",
    "sub_reason",
    "flags_text",
    "note",
    "flagged",
    "time_spent_ms",
    "revision",
    "created_at",
    "scales_text",
    "reject_flags_text",
    "per_turn_text",
)

_decoded: dict[str | None, Any] = {}
DECODED_MAX = 50_000  # distinct JSON texts kept decoded (a study's flags and scales repeat a few patterns)


def _decode(text: str | None, empty: Any) -> Any:
    """A JSON column's value from its text, decoded once per distinct text (shared: read-only)."""
    if not text:
        return empty
    found = _decoded.get(text)
    if found is None:
        if len(_decoded) >= DECODED_MAX:
            _decoded.clear()
        found = _decoded[text] = json.loads(text) or empty
    return found


_NO_FLAGS: dict[str, bool] = {}
_NO_LIST: list = []


def _votes(study: Study, where: Q) -> Iterator[tuple[int, VoteRow]]:
    """(item id, vote) of the study's counted judgements matching ``where``, in item then
    annotator order. The JSON columns are read as text (no per-row decoding by the ORM)."""
    texts = {f"{name}_text": Cast(name, output_field=TextField()) for name in _JSON_VOTE_FIELDS}
    rows = (
        Judgement.objects.counted()
        .filter(where, assignment__study=study)
        .annotate(**texts)
        .order_by("assignment__item_id", "assignment__annotator__username")
        .values_list(*_VOTE_COLUMNS)
    )
    for item_id, user, validated, cat, sub, flags, note, flagged, ms, rev, at, scales, rejects, turns in rows:
        yield (
            item_id,
            VoteRow(
                user,
                validated,
                cat,
                sub,
                _decode(flags, _NO_FLAGS),
                note,
                flagged,
                ms,
                rev,
                at,
                _decode(scales, _NO_FLAGS),
                _decode(rejects, _NO_LIST),
                _decode(turns, _NO_LIST),
            ),
        )


def _fill(study: Study, rows: list[ItemRow], exact: bool = False) -> None:
    """Attach the current judgements and adjudications of one batch: by id range for a run
    of consecutive items (the whole study), by id list for a hand-picked set (``exact``)."""
    if not rows:
        return
    by_id = {r.item_id: r for r in rows}
    lo, hi = rows[0].item_id, rows[-1].item_id
    if exact:
        mine, adjudicated = Q(assignment__item_id__in=list(by_id)), Q(item_id__in=list(by_id))
    else:
        mine = Q(assignment__item_id__gte=lo, assignment__item_id__lte=hi)
        adjudicated = Q(item_id__gte=lo, item_id__lte=hi)
    for item_id, vote in _votes(study, mine):
        row = by_id.get(item_id)
        if row is not None:
            row.votes.append(vote)
    adjudications = Adjudication.objects.filter(adjudicated, study=study, is_current=True).values_list(
        "item_id", "decision", "note", "decided_by__username", "decided_at"
    )
    for item_id, decision, note, by, at in adjudications:
        row = by_id.get(item_id)
        if row is not None:
            row.adjudication = AdjudicationRow(decision, note, by, at)


def _read_rows(study: Study, item_ids: Sequence[int] | None = None) -> list[ItemRow]:
    items = StudyItem.objects.filter(study=study)
    if item_ids is not None:
        items = items.filter(id__in=list(item_ids))
    rows = [ItemRow(*values) for values in items.order_by("id").values_list(*_ITEM_FIELDS)]
    _fill(study, rows, exact=item_ids is not None)
    return rows


def iter_item_batches(
    study: Study, *, chunk_size: int = DEFAULT_CHUNK, item_ids: Sequence[int] | None = None
) -> Iterator[list[ItemRow]]:
    """The study's items in id order, ``chunk_size`` at a time, votes attached: the kept rows
    of :func:`study_rows` when the study is small enough to keep, else streamed from the
    database one batch at a time (``.iterator(chunk_size)``). A hand-picked set (``item_ids``)
    is read from the kept rows when this process keeps the study already, else from the
    database (a page that shows a few items never reads the whole study)."""
    snapshot = study_rows(study) if item_ids is None or _is_kept(study) else None
    if snapshot is not None:
        rows = snapshot.rows if item_ids is None else snapshot.pick(item_ids)
        for start in range(0, len(rows), chunk_size):
            yield rows[start : start + chunk_size]
        return
    if item_ids is not None:  # a hand-picked set: read ``chunk_size`` ids at a time
        ids = sorted(set(item_ids))
        for start in range(0, len(ids), chunk_size):
            yield _read_rows(study, ids[start : start + chunk_size])
        return
    stream = (
        StudyItem.objects.filter(study=study).order_by("id").values_list(*_ITEM_FIELDS).iterator(chunk_size=chunk_size)
    )
    for chunk in _batched(stream, chunk_size):
        rows = [ItemRow(*values) for values in chunk]
        _fill(study, rows)
        yield rows


def iter_rows(study: Study, item_ids: Sequence[int] | None = None) -> Iterator[ItemRow]:
    """Every item row of :func:`iter_item_batches`, one at a time."""
    for batch in iter_item_batches(study, item_ids=item_ids):
        yield from batch


def locked_item_row(study: Study, item_id: int) -> tuple[ItemRow, int] | None:
    """One item, its row locked (``select_for_update``) and read with its ``extra_slots``,
    then its votes attached: (row, extra slots), or None. Always read from the database."""
    found = (
        StudyItem.objects.select_for_update(of=("self",))
        .filter(pk=item_id, study=study)
        .values_list(*_ITEM_FIELDS, "extra_slots")
        .first()
    )
    if found is None:
        return None
    row = ItemRow(*found[:-1])
    _fill(study, [row], exact=True)
    return row, found[-1]


def item_row(study: Study, item_id: int) -> ItemRow | None:
    for batch in iter_item_batches(study, item_ids=[item_id]):
        return batch[0] if batch else None
    return None


# --------------------------------------------------------------------------- judgements


def counted_judgements(study: Study | int) -> QuerySet:
    """THE study's judgements that count: the current revision of each, less late ones."""
    return Judgement.objects.counted().filter(assignment__study=study)


def late_judgements(study: Study | int) -> QuerySet:
    """Current judgements stored late: kept, shown, never counted."""
    return Judgement.objects.filter(assignment__study=study, is_current=True, late=True)


def late_per_annotator(study: Study | int) -> dict[str, int]:
    """Username -> their late judgements (current ones) in the study."""
    return dict(
        late_judgements(study)
        .values_list("assignment__annotator__username")
        .annotate(n=Count("id"))
        .values_list("assignment__annotator__username", "n")
    )


def item_completions(study: Study | int) -> dict[int, int]:
    """THE completions of each item (``StudyItem.completed``; items without one left out): its
    done assignments, less those whose current judgement came late (stored after the slot went
    to someone else). The queue keeps the column by this rule one submit at a time
    (:func:`annotation.assignment.queue.mark_done`); an import sets it with this count."""
    late = set(late_judgements(study).values_list("assignment_id", flat=True))
    out: dict[int, int] = {}
    done = Assignment.objects.filter(study=study, status=Assignment.Status.DONE).values_list("id", "item_id")
    for assignment_id, item_id in done:
        if assignment_id not in late:
            out[item_id] = out.get(item_id, 0) + 1
    return out


# --------------------------------------------------------------------------- kept rows


def change_stamp(study: Study) -> tuple:
    """The change counter of a study's item state: its judgements (all rows, counted rows, the
    newest id), adjudications (all, current, newest id) and items (count, newest id, agreement
    items). Each judgement, revision or adjudication adds a row, so it moves with every change."""
    j = Judgement.objects.filter(assignment__study=study).aggregate(
        n=Count("id"), counted=Count("id", filter=counted_q()), last=Max("id")
    )
    a = Adjudication.objects.filter(study=study).aggregate(
        n=Count("id"), current=Count("id", filter=Q(is_current=True)), last=Max("id")
    )
    i = StudyItem.objects.filter(study=study).aggregate(
        n=Count("id"), last=Max("id"), agreement=Count("id", filter=Q(agreement=True))
    )
    return (
        (j["n"], j["counted"], j["last"] or 0),
        (a["n"], a["current"], a["last"] or 0),
        (i["n"], i["last"] or 0, i["agreement"]),
    )


@dataclass
class Snapshot:
    """A study's item rows (id order) at one :func:`change_stamp`."""

    stamp: tuple
    rows: list[ItemRow]
    index: dict[int, int] = field(default_factory=dict)  # item id -> position in rows
    #: per rule (:func:`study_pass`'s key): item id -> what one pass derived from the item's row;
    #: carried to the next stamp less the items whose rows changed
    derived: OrderedDict[Any, dict[int, Any]] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if not self.index:
            self.index = {r.item_id: k for k, r in enumerate(self.rows)}

    def derived_for(self, key: Any) -> dict[int, Any] | None:
        """The per-item results kept under ``key`` (made empty on first use), or None when
        ``key`` cannot be kept (unhashable). At most :data:`DERIVED_KEYS` keys are kept."""
        try:
            hash(key)
        except TypeError:
            return None
        with _keep_lock:
            found = self.derived.get(key)
            if found is None:
                found = self.derived[key] = {}
                while len(self.derived) > DERIVED_KEYS:
                    self.derived.popitem(last=False)
            self.derived.move_to_end(key)
        return found

    def carried(self, stamp: tuple, rows: list[ItemRow], changed: set[int]) -> Snapshot:
        """The next snapshot: ``rows`` at ``stamp``, with what was derived from the rows that
        did not change."""
        with _keep_lock:
            derived = OrderedDict(
                (key, {i: v for i, v in values.items() if i not in changed}) for key, values in self.derived.items()
            )
        return Snapshot(stamp, rows, self.index, derived)

    def pick(self, item_ids: Iterable[int]) -> list[ItemRow]:
        """The rows of these items (those of the study), in id order."""
        return [self.rows[k] for k in sorted(self.index[i] for i in set(item_ids) if i in self.index)]

    @property
    def n_votes(self) -> int:
        return sum(len(r.votes) for r in self.rows)


#: Studies with more counted judgements than this are streamed, never kept in memory (kept rows
#: cost about 0.6 KB per judgement: 17 MB for the 10k-item bench study's 30k).
KEEP_MAX_JUDGEMENTS = 100_000
KEEP_TOTAL_JUDGEMENTS = 150_000  # kept per process, all studies together (the most recently read first)
KEEP_STUDIES = 4  # studies kept per process
DERIVED_KEYS = 4  # rules whose per-item results a kept study carries
_kept: OrderedDict[tuple, Snapshot] = OrderedDict()
_keep_lock = threading.Lock()


def _changed_items(study: Study, old: tuple, new: tuple) -> set[int] | None:
    """The items whose rows changed between two stamps when only new rows were added since
    (each new judgement or adjudication names its item), else None (read the study again)."""
    (jn0, _, jlast0), (an0, _, alast0), items0 = old
    (jn1, _, _), (an1, _, _), items1 = new
    if items0 != items1:
        return None
    new_j = list(
        Judgement.objects.filter(assignment__study=study, id__gt=jlast0).values_list("assignment__item_id", flat=True)
    )
    new_a = list(Adjudication.objects.filter(study=study, id__gt=alast0).values_list("item_id", flat=True))
    if jn1 != jn0 + len(new_j) or an1 != an0 + len(new_a):
        return None  # a row appeared below the newest id seen, or one was deleted
    return set(new_j) | set(new_a)


def study_rows(study: Study) -> Snapshot | None:
    """The rows of every item of the study, current as of this call (see the module
    docstring), or None for a study too large to keep (:data:`KEEP_MAX_JUDGEMENTS`: read it
    with :func:`iter_item_batches`, which then streams)."""
    stamp = change_stamp(study)
    if stamp[0][1] > KEEP_MAX_JUDGEMENTS:
        return None
    key = _key(study)
    with _keep_lock:
        kept = _kept.get(key)
    if kept is not None and kept.stamp == stamp:
        snapshot = kept
    else:
        changed = _changed_items(study, kept.stamp, stamp) if kept is not None else None
        if changed is None:
            snapshot = Snapshot(stamp, _read_rows(study))
        else:
            rows = list(kept.rows)
            for row in _read_rows(study, sorted(changed)):
                if row.item_id in kept.index:
                    rows[kept.index[row.item_id]] = row
            snapshot = kept.carried(stamp, rows, changed)
    with _keep_lock:
        _kept[key] = snapshot
        _kept.move_to_end(key)
        while len(_kept) > KEEP_STUDIES or (
            len(_kept) > 1 and sum(k.stamp[0][1] for k in _kept.values()) > KEEP_TOTAL_JUDGEMENTS
        ):
            _kept.popitem(last=False)
    return snapshot


def _key(study: Study) -> tuple:
    return (study.pk, study.created_at.timestamp() if study.created_at else None)


def _is_kept(study: Study) -> bool:
    with _keep_lock:
        return _key(study) in _kept


def forget_rows() -> None:
    """Drop every kept study (tests that rewrite rows around the ORM)."""
    with _keep_lock:
        _kept.clear()


# --------------------------------------------------------------------------- one pass


def item_state(decision: Decision) -> str:
    """The decision state of one item from its :func:`decide_row`."""
    if decision.provenance == ADJUDICATED:
        return ADJUDICATED
    if decision.decided:
        return DECIDED
    if decision.status == ADJUDICATION:
        return AWAITING_ADJUDICATION
    return PENDING if decision.status == PENDING else UNJUDGED


def item_states(decisions: Iterable[Decision]) -> dict[str, int]:
    """Items per :data:`ITEM_STATES` of these decisions."""
    states = {s: 0 for s in ITEM_STATES}
    for d in decisions:
        states[item_state(d)] += 1
    return states


def plain_state(n_votes: int, needed: int) -> str:
    """The state of an item of a rubric without verdicts (scales only): by its counted judgements."""
    if n_votes == 0:
        return UNJUDGED
    return PENDING if n_votes < needed else DECIDED


@dataclass
class StudyPass:
    """One pass over a study's items under one rule (:func:`study_pass`).

    ``rows`` (id order) and ``decisions`` (item id -> :class:`Decision`; empty for rubrics
    without verdicts); ``states`` (:data:`ITEM_STATES` -> items); ``judgements`` (counted),
    ``flagged`` (counted and flagged), ``complete`` (items that reached their slots),
    ``saved`` (judgements adaptive overlap saved), ``per_annotator`` (username -> counted)."""

    verdicts: Verdicts
    rows: list[ItemRow] = field(default_factory=list)
    decisions: dict[int, Decision] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=lambda: {s: 0 for s in ITEM_STATES})
    per_annotator: dict[str, int] = field(default_factory=dict)
    judgements: int = 0
    flagged: int = 0
    complete: int = 0
    saved: int = 0
    snapshot: Snapshot | None = None  # the kept rows read (None: a study too large to keep)

    def derived_for(self, key: Any) -> dict[int, Any] | None:
        """Per-item results a reader keeps with the study's rows (:meth:`Snapshot.derived_for`)."""
        return self.snapshot.derived_for(key) if self.snapshot is not None else None

    def add(self, row: ItemRow, found: tuple) -> None:
        """Count one item from what :func:`_measure` found for it."""
        n, flagged, complete, saved, state, decision = found
        self.rows.append(row)
        self.judgements += n
        self.flagged += flagged
        self.complete += complete
        self.saved += saved
        self.states[state] += 1
        if decision is not None:
            self.decisions[row.item_id] = decision
        for v in row.votes:
            self.per_annotator[v.annotator] = self.per_annotator.get(v.annotator, 0) + 1


def _measure(
    row: ItemRow, verdicts: Verdicts, rule: QuorumRule, n_annotators: int, decides: bool, decide_all: bool
) -> tuple:
    """What one item adds to a pass: (counted judgements, flagged ones, whether it reached its
    slots, judgements adaptive overlap saved on it, its state, its decision or None)."""
    n = len(row.votes)
    slots = rule.slots(row.agreement, n_annotators, counted_votes(row, verdicts.session, verdicts.turn_key))
    saved = rule.most - slots if rule.adaptive and not row.agreement and n >= slots else 0  # settled below the maximum
    decision = decide_row(row, verdicts) if decides or decide_all else None
    state = item_state(decision) if decides else plain_state(n, rule.needed(row.votes))
    return n, sum(1 for v in row.votes if v.flagged), int(n >= slots), saved, state, decision


def study_pass(study: Study, verdicts: Verdicts | None = None, *, decide_all: bool = False) -> StudyPass:
    """THE one pass over a study's items: every item's decision and state, and the study's
    counts, under ``verdicts`` (default: the study's own rule, :meth:`Verdicts.of`). Items of
    a rubric without verdicts get a state by their counted judgements and no decision, unless
    ``decide_all`` (then every item is decided too; the states are unchanged). A kept study
    (:func:`study_rows`) keeps each item's result under the rule, so after a judgement only
    the items whose rows changed are decided again."""
    verdicts = verdicts or Verdicts.of(study)
    out = StudyPass(verdicts)
    rule = verdicts.rule or study.quorum_rule
    decides, n_annotators = has_verdicts(study.rubric.rubric), study.n_annotators
    snapshot = study_rows(study)
    if snapshot is None:
        for row in iter_rows(study):
            out.add(row, _measure(row, verdicts, rule, n_annotators, decides, decide_all))
        return out
    out.snapshot = snapshot
    kept = snapshot.derived_for(("pass", verdicts, rule, n_annotators, decides, decide_all))
    for row in snapshot.rows:
        found = kept.get(row.item_id) if kept is not None else None
        if found is None:
            found = _measure(row, verdicts, rule, n_annotators, decides, decide_all)
            if kept is not None:
                kept[row.item_id] = found
        out.add(row, found)
    return out


# --------------------------------------------------------------------------- assignments


def assignment_counts(now: datetime, *names: str) -> dict[str, Any]:
    """THE aggregates of an annotator's assignments (for ``.aggregate`` / ``.annotate`` over
    their rows): ``done`` (submitted), ``reserved`` (a live lease at ``now``), ``skipped``.
    ``names``: the ones wanted (default all)."""
    every = {
        "done": Count("id", filter=Q(status=Assignment.Status.DONE)),
        "reserved": Count("id", filter=Q(status=Assignment.Status.RESERVED, lease_expires__gt=now)),
        "skipped": Count("id", filter=Q(status=Assignment.Status.SKIPPED)),
    }
    return {k: every[k] for k in (names or every)}


# --------------------------------------------------------------------------- adjudication prefilter


def adjudication_candidates(study: Study, verdicts: Verdicts) -> list[int]:
    """THE prefilter of the adjudication queue: ids of the items that may need an adjudicator,
    found with one aggregate query: an item with a flag, a split vote (majority and
    reliability: an even split; unanimous: any split) or an adjudication. Sessions: every item
    with its base quorum of judgements (their rule reads scores, decided in Python). Late
    judgements never count. The filter uses the study's base quorum: a superset, for any quorum
    rule whose ``needed`` is at least its base, of the items :func:`decide_row` sends to
    adjudication (``tests/unit/test_adjudication_prefilter.py`` checks it on generated studies)."""
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
            out.append(
                {
                    "item": item,
                    "key": keys[item],
                    "majority": majority.status,
                    "reliability": weighted.status,
                    "split": majority.split_text,
                    "posterior": model.posterior(votes),
                }
            )
    return tuple(out)


RELIABILITY_CACHE_SECONDS = 3600  # keyed by the study's judgements: a new one makes a new key


def study_reliability(study: Study) -> StudyReliability:
    """The reliability fit of a study, its report (annotators, differences) with the model
    :func:`reliability_of` reads: Dawid-Skene on every item's counted votes (the
    votes consensus decides on), fitted once per state of the study's judgements (cached)."""
    seen = judgement_state(study)
    settings = ":".join(str(getattr(study, name)) for name in QUORUM_FIELDS)  # the quorum rule decides what differs
    key = f"cirval:reliability:{study.pk}:{study.created_at.timestamp()}:{seen['n']}:{seen['last']}:{settings}"
    found = cache.get(key)
    if found is None:
        by_item: dict[int, list[Vote]] = {}
        keys: dict[int, str] = {}
        for row in iter_rows(study):
            votes = votes_of(row)
            if votes:
                by_item[row.item_id], keys[row.item_id] = votes, row.key
        fit, model = fit_votes(by_item)
        rows = [(item, v.annotator, v.validated) for item, votes in by_item.items() for v in votes]
        found = StudyReliability(
            model,
            tuple(annotator_reliability(fit, rows)),
            len(by_item),
            len(rows),
            fit.iterations,
            _differences(study, by_item, keys, model),
        )
        cache.set(key, found, RELIABILITY_CACHE_SECONDS)
    return found
