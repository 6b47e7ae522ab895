"""Consensus over the votes of an item's annotators (pure: no Django, no Celery).

A *vote* is one annotator's current judgement reduced to what consensus needs: did the
annotator choose VALIDATED, and did they flag the item for adjudication. :func:`decide`
turns an item's votes into a :class:`Decision` under one of three policies:

* ``"majority"`` (default): strictly more than half of the item's voters chose
  VALIDATED -> validated; strictly more than half chose an invalid category -> rejected;
  otherwise (an even split) the item is a *tie* and goes to adjudication.
* ``"unanimous"``: validated only when every voter chose VALIDATED, rejected only when
  every voter chose invalid; any disagreement goes to adjudication.
* ``"reliability"``: reliability-weighted: unanimous votes decide as under majority, split
  votes by the posterior of the annotators' reliability model (Dawid-Skene,
  :mod:`annotation.verdicts.reliability`), so a reliable annotator can outweigh two unreliable ones.
* ``"primary"``: one annotator decides alone, the rule of the CIRCUS release (FORMATS.md
  §6): the ``primary`` annotator when they voted on the item, otherwise the first voter
  in sorted annotator order (CIRCUS kept annotator_03 over annotator_08, and the first
  labelled row in sorted user order otherwise).

Quorum: an item is decided only once it has ``quorum`` current votes (a study's quorum,
by default its overlap) or an adjudication. Before that it is ``"pending"`` (reason
``quorum``) and is never exported as validated. Under every policy an item that any voter
flagged goes to adjudication. An adjudicator's decision, when one is given, always
decides the item (provenance ``"adjudicated"``).

Provenance of a decided item: ``"unanimous"`` (two or more voters, all agreeing with the
decision), ``"single"`` (a quorum of one: one vote decided), ``"majority"`` (a strict
majority, not all), ``"primary"`` (one annotator decided) or ``"adjudicated"``. Undecided
items have the statuses ``"adjudication"`` (waiting for an adjudicator; ``reason`` says
why: ``tie``, ``flagged`` or ``disagreement``), ``"pending"`` (fewer votes than the
quorum) or ``"unjudged"`` (no vote yet).

:func:`decide` is the one rule for single-turn items; :func:`decide_session` applies the
same quorum, flag and adjudication gate to session studies, whose votes are reject flags
and an overall score (:class:`SessionRule`, session rubric v1). Under a rubric with a turn
verdict (session v2) :func:`decide_turns` decides every turn with :func:`decide` and derives
the session's verdict and valid prefix from the turns (:mod:`annotation.core.turns`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from annotation.core.turns import session_valid, valid_prefix

POLICIES: tuple[str, ...] = ("majority", "unanimous", "primary", "reliability")

VALIDATED = "validated"
REJECTED = "rejected"
ADJUDICATION = "adjudication"
PENDING = "pending"
UNJUDGED = "unjudged"
STATUSES: tuple[str, ...] = (VALIDATED, REJECTED, ADJUDICATION, PENDING, UNJUDGED)

UNANIMOUS = "unanimous"
#: THE meaning of "unanimous", for verdicts and for alternatives alike: at least this many
#: voters, every one agreeing (:func:`unanimous`). One vote agrees with itself but is not
#: unanimous: the ``"unanimous"`` policy (no voter disagrees) decides an item of a quorum of one,
#: with provenance ``"single"``; an alternative needs two ticks of two annotators.
UNANIMOUS_MIN_VOTERS = 2
SINGLE = "single"
MAJORITY = "majority"
PRIMARY = "primary"
ADJUDICATED = "adjudicated"
RELIABILITY = "reliability"
PROVENANCES: tuple[str, ...] = (UNANIMOUS, SINGLE, MAJORITY, PRIMARY, ADJUDICATED, RELIABILITY)

TIE = "tie"
FLAGGED = "flagged"
DISAGREEMENT = "disagreement"
NO_VOTES = "no_votes"
QUORUM = "quorum"


@dataclass(frozen=True)
class QuorumRule:
    """How many annotators an item is served to and how many counted judgements decide it:
    THE quorum rule of a study (``Study.quorum_rule``), read by consensus, serving, the late
    rule and every count.

    ``overlap``: annotators an item is served to; ``quorum``: counted judgements an item
    needs before consensus decides it (``None``: the overlap). Agreement-subset items are
    served to every annotator. A rule that depends on the votes (an "adaptive overlap":
    two annotators, a third only when they disagree) is a subclass overriding
    :meth:`needed` and :meth:`slots`; nothing else defines a quorum. A rule may read the
    study's reliability model (:meth:`with_reliability`; only a weighted adaptive rule does).
    """

    overlap: int
    quorum: int | None = None

    @property
    def base(self) -> int:
        """The quorum before any vote is seen (what pages state as "the quorum")."""
        return max(1, self.quorum or self.overlap or 1)

    def needed(self, votes: Sequence[object] = ()) -> int:
        """Counted judgements the item needs, given its counted ``votes`` so far."""
        return self.base

    @property
    def most(self) -> int:
        """The most annotators an item that is not in the agreement subset is ever served to."""
        return max(1, self.overlap or 1)

    @property
    def adaptive(self) -> bool:
        """Whether an item's slots depend on its votes (see :class:`AdaptiveQuorumRule`)."""
        return False

    def slots(self, agreement: bool = False, n_annotators: int | None = None, votes: Sequence[object] = ()) -> int:
        """Annotators the item is served to: every annotator for an agreement item, else the
        overlap (for an adaptive rule: as many as its counted ``votes`` need)."""
        if agreement and n_annotators:
            return n_annotators
        return max(1, self.overlap or 1)

    def describe(self) -> str:
        return f"{self.most} annotator(s) per item, decided at {self.base} counted judgement(s)"

    @property
    def weighted(self) -> bool:
        """Whether split votes may settle by a reliability posterior (only an adaptive rule's may)."""
        return False

    def with_reliability(self, model: Any) -> QuorumRule:
        """The rule reading a reliability model (only an adaptive, weighted rule reads one)."""
        return self


def leaning(vote: object) -> bool | None:
    """Which way a vote leans, for disagreement: ``validated`` of a :class:`Vote`; a session
    vote leans valid when it raised no reject flag; ``None``: no verdict (a scales-only rubric)."""
    validated = getattr(vote, "validated", None)
    if validated is None and hasattr(vote, "reject_flags"):
        return not vote.reject_flags
    return None if validated is None else bool(validated)


#: The posterior an adaptive study under reliability-weighted consensus needs before it decides
#: a split without a further annotator (``Study.adaptive_confidence``'s default): 90% sure either way.
DEFAULT_CONFIDENCE = 0.9


def confident(posterior: float, confidence: float) -> bool:
    """Whether P(valid) ``posterior`` is at least ``confidence`` sure either way."""
    return max(posterior, 1.0 - posterior) >= confidence


@dataclass(frozen=True)
class AdaptiveQuorumRule(QuorumRule):
    """Adaptive overlap: each item goes to ``overlap`` annotators (the base, e.g. 2), and to one
    more, up to ``maximum``, while its counted votes are not *settled* (:meth:`settled`, THE
    rule of whether an item needs a further annotator).

    Votes are settled when any of them is flagged (an adjudicator decides, more votes would not),
    when no vote carries a verdict, when one side leads the other by at least the base quorum
    (two agreeing votes of two; 3 to 1 of four) or when ``maximum`` votes are in (the policy
    then decides, a tie goes to adjudication). So with base 2 and maximum 3: two agreeing votes
    decide; two disagreeing ones open the item to a third annotator, whose vote makes a majority.

    Under reliability-weighted consensus (``confidence`` set, :meth:`weighted`) split votes are
    also settled once the posterior of the annotators' reliability model (``reliability``, the
    study's Dawid-Skene fit on its judgements so far, bound by :meth:`with_reliability`) is at
    least ``confidence`` sure either way: a split between a reliable annotator and one known to be
    unreliable is decided by the weights, without a third. Without a model the lead rule alone.
    """

    maximum: int = 3
    confidence: float | None = None  # reliability-weighted consensus: the posterior that settles a split
    reliability: Any = field(default=None, compare=False, repr=False)  # anything with posterior(votes)

    def __post_init__(self) -> None:
        if self.maximum < max(1, self.overlap or 1):
            raise ValueError(f"adaptive overlap: the maximum ({self.maximum}) is below the overlap ({self.overlap})")
        if self.confidence is not None and not 0.5 <= self.confidence <= 1.0:
            raise ValueError(f"adaptive overlap: the confidence ({self.confidence}) is not between 0.5 and 1")

    @property
    def most(self) -> int:
        return self.maximum

    @property
    def adaptive(self) -> bool:
        return True

    @property
    def weighted(self) -> bool:
        """Whether split votes may settle by the reliability posterior (reliability-weighted consensus)."""
        return self.confidence is not None

    def with_reliability(self, model: Any) -> QuorumRule:
        """This rule reading ``model``'s posterior (a weighted rule only; else the rule unchanged)."""
        return replace(self, reliability=model) if self.weighted else self

    def settled(self, votes: Sequence[object]) -> bool:
        """Whether these counted votes need no further annotator (see the class docstring)."""
        if len(votes) >= self.maximum or any(getattr(v, "flagged", False) for v in votes):
            return True
        sides = [leaning(v) for v in votes]
        valid, invalid = sides.count(True), sides.count(False)
        if valid + invalid == 0 or abs(valid - invalid) >= self.base:
            return True
        return bool(
            len(votes) >= self.base
            and valid
            and invalid
            and self.weighted
            and self.reliability is not None
            and confident(float(self.reliability.posterior(votes)), float(self.confidence))
        )

    def needed(self, votes: Sequence[object] = ()) -> int:
        n = len(votes)
        if n < self.base:
            return self.base
        return n if self.settled(votes) else min(n + 1, self.maximum)

    def slots(self, agreement: bool = False, n_annotators: int | None = None, votes: Sequence[object] = ()) -> int:
        if agreement and n_annotators:
            return n_annotators
        return max(max(1, self.overlap or 1), self.needed(votes))

    def describe(self) -> str:
        weights = (
            f", or once the annotators' reliability (Dawid-Skene) makes a split at least "
            f"{self.confidence:.0%} sure either way"
            if self.weighted
            else ""
        )
        return (
            f"adaptive overlap: {self.overlap} annotator(s) per item, one more (up to {self.maximum}) "
            f"while they disagree; decided once one side leads by {self.base}{weights}"
        )


def quorum_rule(
    overlap: int, quorum: int | None = None, maximum: int | None = None, confidence: float | None = None
) -> QuorumRule:
    """THE quorum rule of these study settings: adaptive when ``maximum`` exceeds the overlap;
    ``confidence``: reliability-weighted consensus settles splits at this posterior
    (:class:`AdaptiveQuorumRule`; ``None``: majority's lead rule)."""
    if maximum and maximum > max(1, overlap or 1):
        return AdaptiveQuorumRule(overlap, quorum, maximum, confidence)
    return QuorumRule(overlap, quorum)


def study_quorum_rule(
    overlap: int, quorum: int | None, maximum: int | None, policy: str, confidence: float | None
) -> QuorumRule:
    """THE quorum rule of a study's settings with its consensus ``policy``: ``confidence`` (its
    ``adaptive_confidence``) settles splits only under the :data:`RELIABILITY` policy
    (``Study.quorum_rule``; the simulated crowd's strategies, ``annotation.verdicts.crowd``)."""
    return quorum_rule(overlap, quorum, maximum, confidence if policy == RELIABILITY else None)


@dataclass(frozen=True)
class Vote:
    """One annotator's current judgement of an item, as consensus sees it."""

    annotator: str
    validated: bool
    flagged: bool = False


@dataclass(frozen=True)
class Decision:
    """The outcome for one item.

    ``status``: validated / rejected / adjudication / pending / unjudged. ``provenance``:
    how a validated or rejected status was reached ('' otherwise). ``reason``: why an item
    waits for adjudication (tie / flagged / disagreement), ``quorum`` (pending) or
    ``no_votes``; '' when decided. ``quorum``: the votes the item needed.
    ``decided_by``: the deciding annotator under the primary policy, else ``None``.
    """

    status: str
    provenance: str
    reason: str
    n_votes: int
    valid_votes: int
    invalid_votes: int
    flagged_votes: int
    decided_by: str | None = None
    quorum: int = 1
    split: tuple[tuple[str, int], ...] = ()  # the vote split the outcome rests on, e.g. (("valid", 1), ("invalid", 1))
    turns: tuple[Decision, ...] = ()  # turn-by-turn sessions: the decision of every turn (:func:`decide_turns`)
    prefix: int | None = None  # turn-by-turn sessions, once decided: the valid prefix kept (turns)

    @property
    def split_text(self) -> str:
        """The vote split in words, e.g. ``1 valid / 1 invalid`` or ``1 reject flag / 1 none``."""
        return " / ".join(f"{n} {what}" for what, n in self.split)

    @property
    def validated(self) -> bool:
        return self.status == VALIDATED

    @property
    def decided(self) -> bool:
        return self.status in (VALIDATED, REJECTED)

    @property
    def needs_adjudication(self) -> bool:
        return self.status == ADJUDICATION

    def to_dict(self) -> dict[str, object]:
        return {
            "status": self.status,
            "provenance": self.provenance,
            "reason": self.reason,
            "n_votes": self.n_votes,
            "valid_votes": self.valid_votes,
            "invalid_votes": self.invalid_votes,
            "flagged_votes": self.flagged_votes,
            "decided_by": self.decided_by,
            "quorum": self.quorum,
            "split": self.split_text,
            **({"prefix": self.prefix, "turns": [t.to_dict() for t in self.turns]} if self.turns else {}),
        }


def _check_votes(votes: Sequence[Vote]) -> None:
    seen: set[str] = set()
    for v in votes:
        if not isinstance(v.validated, bool):
            raise ValueError(f"vote of {v.annotator!r}: validated must be true or false, got {v.validated!r}")
        if v.annotator in seen:
            raise ValueError(f"annotator {v.annotator!r} voted twice on the same item")
        seen.add(v.annotator)


def primary_voter(votes: Sequence[Vote], primary: str | None = None) -> Vote | None:
    """The vote that decides under the primary policy (see the module docstring)."""
    if not votes:
        return None
    if primary is not None:
        for v in votes:
            if v.annotator == primary:
                return v
    return min(votes, key=lambda v: v.annotator)


def _check_quorum(quorum: int) -> None:
    if isinstance(quorum, bool) or not isinstance(quorum, int) or quorum < 1:
        raise ValueError(f"quorum must be an integer >= 1, got {quorum!r}")


def _gate(n: int, flagged: int, quorum: int, adjudication: bool | None) -> tuple[str, str, str] | None:
    """What decides an item before any policy: an adjudication, no vote, fewer votes than the
    quorum, or a flag. ``(status, provenance, reason)``, or ``None`` when the policy decides."""
    _check_quorum(quorum)
    if adjudication is not None:
        if not isinstance(adjudication, bool):
            raise ValueError(f"adjudication must be true, false or None, got {adjudication!r}")
        return (VALIDATED if adjudication else REJECTED, ADJUDICATED, "")
    if n == 0:
        return (UNJUDGED, "", NO_VOTES)
    if flagged:
        return (ADJUDICATION, "", FLAGGED)
    if n < quorum:
        return (PENDING, "", QUORUM)
    return None


def unanimous(agreeing: int, voters: int) -> bool:
    """Whether ``agreeing`` of ``voters`` is unanimous (:data:`UNANIMOUS_MIN_VOTERS`)."""
    return voters >= UNANIMOUS_MIN_VOTERS and agreeing == voters


def _agreeing(n: int) -> str:
    """Provenance of a decision every one of ``n`` voters agreed with (:func:`unanimous`)."""
    return UNANIMOUS if unanimous(n, n) else SINGLE


def _split(valid: int, n: int, policy: str) -> tuple[str, str, str]:
    """(status, provenance, reason) of a majority / unanimous vote of ``valid`` out of ``n``."""
    if valid == n or valid == 0:
        return (VALIDATED if valid == n else REJECTED, _agreeing(n), "")
    if policy == "unanimous":
        return (ADJUDICATION, "", DISAGREEMENT)
    if 2 * valid > n:
        return (VALIDATED, MAJORITY, "")
    if 2 * (n - valid) > n:
        return (REJECTED, MAJORITY, "")
    return (ADJUDICATION, "", TIE)


def _weighted(votes: Sequence[Vote], valid: int, reliability: Any) -> tuple[str, str, str]:
    """(status, provenance, reason) under the ``reliability`` policy: unanimous votes decide
    as under majority; split votes by the posterior ``reliability.posterior(votes)`` (the
    probability that the item is valid given who voted what, e.g. a Dawid-Skene model):
    above one half validated, below rejected, exactly one half a tie."""
    n = len(votes)
    if valid in (0, n):
        return _split(valid, n, "majority")
    p = float(reliability.posterior(votes))
    if p > 0.5:
        return (VALIDATED, RELIABILITY, "")
    if p < 0.5:
        return (REJECTED, RELIABILITY, "")
    return (ADJUDICATION, "", TIE)


def decide(
    votes: Iterable[Vote],
    policy: str = "majority",
    *,
    primary: str | None = None,
    adjudication: bool | None = None,
    quorum: int = 1,
    reliability: Any = None,
) -> Decision:
    """The consensus decision of one item.

    ``votes``: at most one per annotator. ``primary``: the deciding annotator for the
    primary policy (ignored by the others). ``adjudication``: an adjudicator's decision
    (True = validated, False = rejected) that overrides the policy, or ``None``.
    ``quorum``: current votes needed before the policy decides (a study's quorum).
    ``reliability``: for the ``"reliability"`` policy, the annotators' reliability model
    (anything with ``posterior(votes) -> P(valid)``, e.g.
    :class:`annotation.verdicts.reliability.Reliability`); without one it decides as majority.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown consensus policy {policy!r}; expected one of {POLICIES}")
    votes = list(votes)
    _check_votes(votes)
    n = len(votes)
    valid = sum(1 for v in votes if v.validated)
    flagged = sum(1 for v in votes if v.flagged)
    by = None
    outcome = _gate(n, flagged, quorum, adjudication)
    if outcome is None and policy == "primary":
        vote = primary_voter(votes, primary)
        assert vote is not None
        outcome, by = (VALIDATED if vote.validated else REJECTED, PRIMARY, ""), vote.annotator
    elif outcome is None and policy == "reliability" and reliability is not None:
        outcome = _weighted(votes, valid, reliability)
    elif outcome is None:
        outcome = _split(valid, n, "majority" if policy == "reliability" else policy)
    status, provenance, reason = outcome
    return Decision(
        status, provenance, reason, n, valid, n - valid, flagged, by, quorum, (("valid", valid), ("invalid", n - valid))
    )


# --------------------------------------------------------------------------- sessions

SESSION_REJECT_RULES: tuple[str, ...] = ("majority", "any")
DEFAULT_SESSION_THRESHOLD = 3.0


@dataclass(frozen=True)
class SessionVote:
    """One annotator's current judgement of a session: the reject flags raised, the overall
    score (``None`` when not given) and the flag for adjudication."""

    annotator: str
    reject_flags: tuple[str, ...]
    overall: float | None
    flagged: bool = False


@dataclass(frozen=True)
class SessionRule:
    """How a session study decides a session (a study setting).

    ``reject``: ``"majority"`` rejects when strictly more than half of the votes raise a
    reject flag (an exact half is a tie, sent to adjudication); ``"any"`` rejects on one
    reject flag. Otherwise the session is validated when the median overall score of the
    votes that gave one is at least ``threshold``, else rejected (no score: adjudication).
    """

    reject: str = "majority"
    threshold: float = DEFAULT_SESSION_THRESHOLD
    scale: str = "overall"

    def __post_init__(self) -> None:
        if self.reject not in SESSION_REJECT_RULES:
            raise ValueError(f"reject rule must be one of {SESSION_REJECT_RULES}, got {self.reject!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SessionRule:
        data = data or {}
        return cls(
            reject=str(data.get("reject", "majority")),
            threshold=float(data.get("threshold", DEFAULT_SESSION_THRESHOLD)),
            scale=str(data.get("scale", "overall")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"reject": self.reject, "threshold": self.threshold, "scale": self.scale}

    def describe(self) -> str:
        reject = (
            "strictly more than half of the votes raise a reject flag (an exact half goes to adjudication)"
            if self.reject == "majority"
            else "any vote raises a reject flag"
        )
        return (
            f"rejected when {reject}; otherwise validated when the median {self.scale} score is at least "
            f"{self.threshold:g}, else rejected"
        )


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def _session_rejection(votes: Sequence[SessionVote], rule: SessionRule) -> tuple[str, str, str] | None:
    """The outcome decided by the reject flags alone, or ``None`` when the scores decide."""
    n = len(votes)
    rejecting = sum(1 for v in votes if v.reject_flags)
    provenance = _agreeing(n) if rejecting == n else MAJORITY
    if rejecting and (rule.reject == "any" or 2 * rejecting > n):
        return (REJECTED, provenance, "")
    if rejecting and 2 * rejecting == n:
        return (ADJUDICATION, "", TIE)
    return None


def _vote_passes(vote: SessionVote, rule: SessionRule) -> bool:
    return not vote.reject_flags and vote.overall is not None and float(vote.overall) >= rule.threshold


def _session_outcome(votes: Sequence[SessionVote], rule: SessionRule) -> tuple[str, str, str]:
    rejection = _session_rejection(votes, rule)
    if rejection is not None:
        return rejection
    scores = [float(v.overall) for v in votes if v.overall is not None]
    if not scores:
        return (ADJUDICATION, "", DISAGREEMENT)
    validated = _median(scores) >= rule.threshold
    agree = sum(1 for v in votes if _vote_passes(v, rule) == validated)
    return (VALIDATED if validated else REJECTED, _agreeing(len(votes)) if agree == len(votes) else MAJORITY, "")


def decide_session(
    votes: Iterable[SessionVote],
    rule: SessionRule | None = None,
    *,
    adjudication: bool | None = None,
    quorum: int = 1,
) -> Decision:
    """The decision of one session under ``rule`` (default :class:`SessionRule`), with the
    quorum, flag and adjudication gate of :func:`decide`. ``valid_votes`` counts the votes
    that raised no reject flag and scored at least the threshold."""
    rule = rule or SessionRule()
    votes = list(votes)
    seen = [v.annotator for v in votes]
    if len(set(seen)) != len(seen):
        raise ValueError("an annotator voted twice on the same session")
    n = len(votes)
    valid = sum(1 for v in votes if _vote_passes(v, rule))
    flagged = sum(1 for v in votes if v.flagged)
    outcome = _gate(n, flagged, quorum, adjudication) or _session_outcome(votes, rule)
    status, provenance, reason = outcome
    return Decision(status, provenance, reason, n, valid, n - valid, flagged, None, quorum, session_split(votes, rule))


# --------------------------------------------------------------------------- turn by turn


@dataclass(frozen=True)
class TurnVote:
    """One annotator's current judgement of a session under a turn-verdict rubric: a
    valid / invalid answer per turn, the reject flags raised and the flag for adjudication."""

    annotator: str
    turns: tuple[bool, ...]
    reject_flags: tuple[str, ...] = ()
    flagged: bool = False

    @property
    def validated(self) -> bool:
        """This annotator's own session verdict (:func:`annotation.core.turns.session_valid`);
        what an adaptive quorum reads as the vote's leaning."""
        return session_valid(self.turns, bool(self.reject_flags))


def turn_decisions(
    votes: Sequence[TurnVote], policy: str = "majority", *, primary: str | None = None, quorum: int = 1
) -> tuple[Decision, ...]:
    """The consensus of every turn position: :func:`decide` over the annotators' answers on
    that turn, under the study's policy and quorum (the one vote rule; the flag for
    adjudication belongs to the session, so it is not passed down to its turns)."""
    n_turns = max((len(v.turns) for v in votes), default=0)
    return tuple(
        decide(
            [Vote(v.annotator, v.turns[t]) for v in votes if t < len(v.turns)], policy, primary=primary, quorum=quorum
        )
        for t in range(n_turns)
    )


def _turns_outcome(turns: Sequence[Decision]) -> tuple[str, str, str, int | None]:
    """(status, provenance, reason, prefix) from the turn decisions, read in turn order: the
    first turn not validated decides (rejected: the session is rejected and keeps the turns
    before it; undecided: the session waits with it); every turn validated: validated."""
    for i, d in enumerate(turns):
        if d.status == VALIDATED:
            continue
        if d.status == REJECTED:
            return (REJECTED, d.provenance, "", valid_prefix([True] * i + [False]))
        return (d.status, "", d.reason, None)
    return (VALIDATED, "", "", valid_prefix([True] * len(turns)))


def _adjudicated_prefix(adjudication: bool | None, turns: Sequence[Decision], rejected: bool) -> int | None:
    """The prefix kept by an adjudicator's decision (``None``: no adjudication, undecided):
    validated keeps every turn; rejected keeps the turns the consensus validated before the
    first it did not (none when the reject flags rejected or tied), never every turn."""
    if adjudication is None:
        return None
    if adjudication:
        return len(turns)
    kept = 0 if rejected else valid_prefix([d.status == VALIDATED for d in turns])
    return min(kept, max(len(turns) - 1, 0))


def _turns_provenance(status: str, votes: Sequence[TurnVote], policy: str, fallback: str) -> str:
    """Unanimous / single when every vote's own session verdict agrees with the outcome,
    primary under the primary policy, else the deciding turn's provenance (``fallback``)
    or majority."""
    if all(v.validated == (status == VALIDATED) for v in votes):
        return _agreeing(len(votes))
    if policy == PRIMARY:
        return PRIMARY
    return fallback if fallback not in ("", UNANIMOUS, SINGLE) else MAJORITY


def describe_turns(rule: SessionRule, policy: str = "majority") -> str:
    """The turn-by-turn rule in words (pages, export manifests)."""
    reject = (
        "strictly more than half of the votes raise a reject flag (an exact half goes to adjudication)"
        if rule.reject == "majority"
        else "any vote raises a reject flag"
    )
    return (
        f"every turn is decided by the {policy} rule on its valid / invalid answers; a session is rejected "
        f"when {reject}; otherwise it is valid when every turn is valid, and rejected at its first rejected "
        "turn, keeping the turns before it as its valid prefix (a turn still undecided before that holds "
        "the session)"
    )


def decide_turns(
    votes: Iterable[TurnVote],
    rule: SessionRule | None = None,
    policy: str = "majority",
    *,
    primary: str | None = None,
    adjudication: bool | None = None,
    quorum: int = 1,
) -> Decision:
    """The decision of one session judged turn by turn.

    The quorum, flag and adjudication gate of :func:`decide` comes first; then the reject
    flags, under the study's session rule (``rule.reject``: majority or any; an exact half is
    a tie); then every turn is decided by :func:`decide` (:func:`turn_decisions`) and the
    session's verdict and valid prefix follow from the turns by THE derivation,
    :func:`annotation.core.turns.valid_prefix` (valid when every turn is). The scales do
    not decide. An adjudicator's decision overrides: validated keeps every turn; rejected keeps
    the turns the annotators' consensus validated before the first it did not (none when the
    reject flags rejected the session), never the whole session. ``Decision.turns`` holds every
    turn's decision; ``valid_votes`` counts the votes whose own verdict is valid.
    """
    rule = rule or SessionRule()
    if policy not in POLICIES:
        raise ValueError(f"unknown consensus policy {policy!r}; expected one of {POLICIES}")
    votes = list(votes)
    seen = [v.annotator for v in votes]
    if len(set(seen)) != len(seen):
        raise ValueError("an annotator voted twice on the same session")
    n = len(votes)
    valid = sum(1 for v in votes if v.validated)
    flagged = sum(1 for v in votes if v.flagged)
    turns = turn_decisions(votes, policy, primary=primary, quorum=quorum)
    rejection = (
        _session_rejection(  # the reject flags, under the study's session rule
            [SessionVote(v.annotator, v.reject_flags, None, v.flagged) for v in votes], rule
        )
        if n
        else None
    )
    gate = _gate(n, flagged, quorum, adjudication)
    if gate is not None:
        status, provenance, reason = gate
        prefix = _adjudicated_prefix(adjudication, turns, rejection is not None)
    elif rejection is not None:
        (status, provenance, reason), prefix = rejection, (0 if rejection[0] == REJECTED else None)
    else:
        status, provenance, reason, prefix = _turns_outcome(turns)
        if status in (VALIDATED, REJECTED):
            provenance = _turns_provenance(status, votes, policy, provenance)
    rejecting = sum(1 for v in votes if v.reject_flags)
    split = (("valid", valid), ("invalid", n - valid), ("reject flag", rejecting))
    return Decision(status, provenance, reason, n, valid, n - valid, flagged, None, quorum, split, turns, prefix)


def session_split(votes: Sequence[SessionVote], rule: SessionRule) -> tuple[tuple[str, int], ...]:
    """The split a session decision rests on: reject flags first (a tie is an exact half of
    them), then, among the votes without one, the scores against the threshold."""
    rejecting = sum(1 for v in votes if v.reject_flags)
    passing = sum(1 for v in votes if _vote_passes(v, rule))
    unscored = sum(1 for v in votes if not v.reject_flags and v.overall is None)
    split = [
        ("reject flag", rejecting),
        ("no reject flag", len(votes) - rejecting),
        (f"{rule.scale} \u2265 {rule.threshold:g}", passing),
    ]
    if unscored:
        split.append(("unscored", unscored))
    return tuple(split)


def tally(decisions: Iterable[Decision]) -> dict[str, object]:
    """Counts of statuses, provenances (decided items) and adjudication reasons."""
    status = {s: 0 for s in STATUSES}
    provenance = {p: 0 for p in PROVENANCES}
    reasons = {r: 0 for r in (TIE, FLAGGED, DISAGREEMENT)}
    total = 0
    for d in decisions:
        total += 1
        status[d.status] += 1
        if d.decided:
            provenance[d.provenance] += 1
        elif d.status == ADJUDICATION:
            reasons[d.reason] += 1
    return {"items": total, "status": status, "provenance": provenance, "adjudication_reasons": reasons}
