"""Consensus over the votes of an item's annotators (pure: no Django, no Celery).

A *vote* is one annotator's current judgement reduced to what consensus needs: did the
annotator choose VALIDATED, and did they flag the item for adjudication. :func:`decide`
turns an item's votes into a :class:`Decision` under one of three policies:

* ``"majority"`` (default): strictly more than half of the item's voters chose
  VALIDATED -> validated; strictly more than half chose an invalid category -> rejected;
  otherwise (an even split) the item is a *tie* and goes to adjudication.
* ``"unanimous"``: validated only when every voter chose VALIDATED, rejected only when
  every voter chose invalid; any disagreement goes to adjudication.
* ``"primary"``: one annotator decides alone, the rule of the CIRCUS release (FORMATS.md
  §6): the ``primary`` annotator when they voted on the item, otherwise the first voter
  in sorted annotator order (CIRCUS kept annotator_03 over annotator_08, and the first
  labelled row in sorted user order otherwise).

Under every policy an item that any voter flagged goes to adjudication. An adjudicator's
decision, when one is given, always decides the item (provenance ``"adjudicated"``).

Provenance of a decided item: ``"unanimous"`` (every voter agreed with the decision, a
single voter included), ``"majority"`` (a strict majority, not all), ``"primary"`` (one
annotator decided) or ``"adjudicated"``. Undecided items have the statuses
``"adjudication"`` (waiting for an adjudicator; ``reason`` says why: ``tie``,
``flagged`` or ``disagreement``) or ``"unjudged"`` (no vote yet).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

POLICIES: tuple[str, ...] = ("majority", "unanimous", "primary")

VALIDATED = "validated"
REJECTED = "rejected"
ADJUDICATION = "adjudication"
UNJUDGED = "unjudged"
STATUSES: tuple[str, ...] = (VALIDATED, REJECTED, ADJUDICATION, UNJUDGED)

UNANIMOUS = "unanimous"
MAJORITY = "majority"
PRIMARY = "primary"
ADJUDICATED = "adjudicated"
PROVENANCES: tuple[str, ...] = (UNANIMOUS, MAJORITY, PRIMARY, ADJUDICATED)

TIE = "tie"
FLAGGED = "flagged"
DISAGREEMENT = "disagreement"
NO_VOTES = "no_votes"


@dataclass(frozen=True)
class Vote:
    """One annotator's current judgement of an item, as consensus sees it."""

    annotator: str
    validated: bool
    flagged: bool = False


@dataclass(frozen=True)
class Decision:
    """The outcome for one item.

    ``status``: validated / rejected / adjudication / unjudged. ``provenance``: how a
    validated or rejected status was reached ('' otherwise). ``reason``: why an item waits
    for adjudication (tie / flagged / disagreement) or ``no_votes``; '' when decided.
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
            "status": self.status, "provenance": self.provenance, "reason": self.reason,
            "n_votes": self.n_votes, "valid_votes": self.valid_votes, "invalid_votes": self.invalid_votes,
            "flagged_votes": self.flagged_votes, "decided_by": self.decided_by,
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


def decide(
    votes: Iterable[Vote],
    policy: str = "majority",
    *,
    primary: str | None = None,
    adjudication: bool | None = None,
) -> Decision:
    """The consensus decision of one item.

    ``votes``: at most one per annotator. ``primary``: the deciding annotator for the
    primary policy (ignored by the others). ``adjudication``: an adjudicator's decision
    (True = validated, False = rejected) that overrides the policy, or ``None``.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown consensus policy {policy!r}; expected one of {POLICIES}")
    votes = list(votes)
    _check_votes(votes)
    n = len(votes)
    valid = sum(1 for v in votes if v.validated)
    invalid = n - valid
    flagged = sum(1 for v in votes if v.flagged)

    def make(status: str, provenance: str = "", reason: str = "", by: str | None = None) -> Decision:
        return Decision(status, provenance, reason, n, valid, invalid, flagged, by)

    if adjudication is not None:
        if not isinstance(adjudication, bool):
            raise ValueError(f"adjudication must be true, false or None, got {adjudication!r}")
        return make(VALIDATED if adjudication else REJECTED, ADJUDICATED)
    if n == 0:
        return make(UNJUDGED, reason=NO_VOTES)
    if flagged:
        return make(ADJUDICATION, reason=FLAGGED)

    if policy == "primary":
        vote = primary_voter(votes, primary)
        assert vote is not None
        return make(VALIDATED if vote.validated else REJECTED, PRIMARY, by=vote.annotator)
    if valid == n or invalid == n:
        return make(VALIDATED if valid == n else REJECTED, UNANIMOUS)
    if policy == "unanimous":
        return make(ADJUDICATION, reason=DISAGREEMENT)
    if 2 * valid > n:
        return make(VALIDATED, MAJORITY)
    if 2 * invalid > n:
        return make(REJECTED, MAJORITY)
    return make(ADJUDICATION, reason=TIE)


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
