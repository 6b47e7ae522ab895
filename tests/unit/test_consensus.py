"""Consensus policies (annotation.core.consensus): majority, unanimous, primary; ties, flags,
adjudication overrides, provenance. Every expectation is worked out by hand in the test."""

from __future__ import annotations

import pytest

from annotation.core.consensus import (
    ADJUDICATED,
    ADJUDICATION,
    DISAGREEMENT,
    FLAGGED,
    MAJORITY,
    NO_VOTES,
    PENDING,
    PRIMARY,
    QUORUM,
    REJECTED,
    SINGLE,
    TIE,
    UNANIMOUS,
    UNJUDGED,
    VALIDATED,
    SessionRule,
    SessionVote,
    Vote,
    decide,
    decide_session,
    primary_voter,
    tally,
)


def votes(*spec: str, flagged: str = "") -> list[Vote]:
    """``votes("a+", "b-")``: a chose VALIDATED, b an invalid category; ``flagged="b"`` flags b."""
    return [Vote(s[:-1], s[-1] == "+", s[:-1] in flagged.split(",")) for s in spec]


@pytest.mark.parametrize(
    ("spec", "status", "provenance", "reason"),
    [
        (("a+", "b+", "c+"), VALIDATED, UNANIMOUS, ""),
        (("a-", "b-", "c-"), REJECTED, UNANIMOUS, ""),
        (("a+", "b+", "c-"), VALIDATED, MAJORITY, ""),  # 2 of 3 > 1.5
        (("a+", "b-", "c-"), REJECTED, MAJORITY, ""),
        (("a+", "b-"), ADJUDICATION, "", TIE),  # 1 of 2 is not strictly more than half
        (("a+", "b+", "c-", "d-"), ADJUDICATION, "", TIE),
        (("a+", "b+", "c+", "d-"), VALIDATED, MAJORITY, ""),  # 3 of 4
        (("a+", "b+", "c-", "d-", "e+"), VALIDATED, MAJORITY, ""),
        (("a+",), VALIDATED, SINGLE, ""),  # quorum 1: one vote decides, not "unanimous"
        (("a-",), REJECTED, SINGLE, ""),
    ],
)
def test_majority(spec, status, provenance, reason) -> None:
    d = decide(votes(*spec))
    assert (d.status, d.provenance, d.reason) == (status, provenance, reason)
    assert d.n_votes == len(spec)
    assert d.valid_votes == sum(s.endswith("+") for s in spec)
    assert d.invalid_votes == sum(s.endswith("-") for s in spec)
    assert d.validated is (status == VALIDATED)
    assert d.decided is (status in (VALIDATED, REJECTED))


def test_majority_is_the_default_and_order_does_not_matter() -> None:
    a = decide(votes("a+", "b-", "c+"))
    b = decide(list(reversed(votes("a+", "b-", "c+"))), "majority")
    assert a == b and a.status == VALIDATED and a.provenance == MAJORITY


def test_flagged_items_go_to_adjudication_under_every_policy() -> None:
    flagged = votes("a+", "b+", "c+", flagged="c")
    for policy in ("majority", "unanimous", "primary"):
        d = decide(flagged, policy, primary="a")
        assert (d.status, d.reason, d.flagged_votes) == (ADJUDICATION, FLAGGED, 1)
        assert d.needs_adjudication and not d.decided and d.provenance == ""


@pytest.mark.parametrize(
    ("spec", "status", "provenance", "reason"),
    [
        (("a+", "b+", "c+"), VALIDATED, UNANIMOUS, ""),
        (("a-", "b-"), REJECTED, UNANIMOUS, ""),
        (("a+", "b+", "c-"), ADJUDICATION, "", DISAGREEMENT),  # a majority is not enough
        (("a+", "b-"), ADJUDICATION, "", DISAGREEMENT),
    ],
)
def test_unanimous(spec, status, provenance, reason) -> None:
    d = decide(votes(*spec), "unanimous")
    assert (d.status, d.provenance, d.reason) == (status, provenance, reason)


def test_primary_annotator_decides_alone() -> None:
    # b is the primary annotator: their invalid vote wins over two valid votes
    d = decide(votes("a+", "b-", "c+"), "primary", primary="b")
    assert (d.status, d.provenance, d.decided_by) == (REJECTED, PRIMARY, "b")
    d = decide(votes("a-", "b+", "c-"), "primary", primary="b")
    assert (d.status, d.provenance, d.decided_by) == (VALIDATED, PRIMARY, "b")
    # no tie exists under this policy
    d = decide(votes("a+", "b-"), "primary", primary="a")
    assert (d.status, d.decided_by) == (VALIDATED, "a")


def test_primary_falls_back_on_the_first_annotator_by_name() -> None:
    # The CIRCUS rule: annotator_03 kept over annotator_08 (both judged the same block).
    block = [Vote("annotator_08", False), Vote("annotator_03", True)]
    d = decide(block, "primary")
    assert (d.status, d.decided_by) == (VALIDATED, "annotator_03")
    # a primary annotator who did not judge this item: the first voter by name decides
    d = decide(block, "primary", primary="annotator_05")
    assert d.decided_by == "annotator_03"
    assert primary_voter([]) is None
    assert primary_voter(block, "annotator_08").annotator == "annotator_08"


def test_adjudication_overrides_every_policy() -> None:
    tie = votes("a+", "b-")
    assert decide(tie, adjudication=True).status == VALIDATED
    d = decide(tie, adjudication=False)
    assert (d.status, d.provenance, d.reason, d.n_votes) == (REJECTED, ADJUDICATED, "", 2)
    # it also decides flagged items, and overrides a clear majority or a primary vote
    assert decide(votes("a+", "b+", flagged="a"), adjudication=False).status == REJECTED
    assert decide(votes("a+", "b+", "c+"), "unanimous", adjudication=False).provenance == ADJUDICATED
    assert decide(votes("a-"), "primary", primary="a", adjudication=True).status == VALIDATED
    # an adjudicated item without votes is decided too
    assert decide([], adjudication=True).status == VALIDATED


def test_no_votes() -> None:
    d = decide([])
    assert (d.status, d.reason, d.n_votes) == (UNJUDGED, NO_VOTES, 0)
    assert not d.decided and not d.needs_adjudication


def test_refusals() -> None:
    with pytest.raises(ValueError, match="unknown consensus policy"):
        decide(votes("a+"), "plurality")
    with pytest.raises(ValueError, match="voted twice"):
        decide([Vote("a", True), Vote("a", False)])
    with pytest.raises(ValueError, match="validated must be true or false"):
        decide([Vote("a", None)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="adjudication must be"):
        decide(votes("a+"), adjudication="yes")  # type: ignore[arg-type]


def test_tally() -> None:
    decisions = [
        decide(votes("a+", "b+")),  # validated, unanimous
        decide(votes("a+", "b+", "c-")),  # validated, majority
        decide(votes("a+", "b-")),  # tie
        decide(votes("a+", "b+", flagged="b")),  # flagged
        decide(votes("a+", "b-"), adjudication=False),
        decide([]),
    ]
    t = tally(decisions)
    assert t["items"] == 6
    assert t["status"] == {VALIDATED: 2, REJECTED: 1, ADJUDICATION: 2, PENDING: 0, UNJUDGED: 1}
    assert t["provenance"] == {UNANIMOUS: 1, SINGLE: 0, MAJORITY: 1, PRIMARY: 0, ADJUDICATED: 1, "reliability": 0}
    assert t["adjudication_reasons"] == {TIE: 1, FLAGGED: 1, DISAGREEMENT: 0}


# --------------------------------------------------------------------------- quorum


@pytest.mark.parametrize("policy", ["majority", "unanimous", "primary"])
def test_below_quorum_is_pending_under_every_policy(policy) -> None:
    # An overlap-3 study: one VALIDATED vote is not a decision, whatever the policy.
    d = decide(votes("a+"), policy, quorum=3)
    assert (d.status, d.provenance, d.reason, d.quorum) == (PENDING, "", QUORUM, 3)
    assert not d.validated and not d.decided
    d = decide(votes("a+", "b+"), policy, quorum=3)
    assert d.status == PENDING and not d.validated
    d = decide(votes("a+", "b+", "c+"), policy, quorum=3)
    assert d.validated and d.provenance == (PRIMARY if policy == "primary" else UNANIMOUS)


def test_quorum_gate_order() -> None:
    # an adjudication decides before the quorum; a flag sends to adjudication before it
    d = decide(votes("a+"), quorum=3, adjudication=True)
    assert (d.status, d.provenance) == (VALIDATED, ADJUDICATED)
    d = decide(votes("a+", flagged="a"), quorum=3)
    assert (d.status, d.reason) == (ADJUDICATION, FLAGGED)
    assert decide([], quorum=3).status == UNJUDGED
    # more votes than the quorum: the policy decides over all of them
    assert decide(votes("a+", "b-", "c+"), quorum=2).provenance == MAJORITY
    t = tally([decide(votes("a+"), quorum=2), decide(votes("a+", "b+"), quorum=2)])
    assert t["status"][PENDING] == 1 and t["provenance"][UNANIMOUS] == 1
    with pytest.raises(ValueError):
        decide(votes("a+"), quorum=0)


def test_unanimous_needs_two_votes() -> None:
    assert decide(votes("a+")).provenance == SINGLE
    assert decide(votes("a+", "b+")).provenance == UNANIMOUS
    assert decide(votes("a-", "b-")).provenance == UNANIMOUS


# --------------------------------------------------------------------------- sessions


def sv(name: str, overall: float | None, *flags: str, flagged: bool = False) -> SessionVote:
    return SessionVote(name, tuple(flags), overall, flagged)


def test_session_majority_rule() -> None:
    rule = SessionRule()  # majority of reject flags, median overall >= 3
    assert rule.to_dict() == {"reject": "majority", "threshold": 3.0, "scale": "overall"}
    # medians: (4, 5) -> 4.5 validated, everyone passes -> unanimous
    d = decide_session([sv("a", 4), sv("b", 5)], rule, quorum=2)
    assert (d.status, d.provenance, d.valid_votes) == (VALIDATED, UNANIMOUS, 2)
    # 3 voters, median of (2, 3, 5) = 3 >= 3: validated, a disagrees -> majority
    d = decide_session([sv("a", 2), sv("b", 3), sv("c", 5)], rule, quorum=3)
    assert (d.status, d.provenance, d.valid_votes, d.invalid_votes) == (VALIDATED, MAJORITY, 2, 1)
    # median of (1, 2, 4) = 2 < 3: rejected
    assert decide_session([sv("a", 1), sv("b", 2), sv("c", 4)], rule, quorum=3).status == REJECTED
    # 2 of 3 raise a reject flag: rejected whatever the scores
    d = decide_session([sv("a", 5, "circle"), sv("b", 5, "duplicate"), sv("c", 5)], rule, quorum=3)
    assert (d.status, d.provenance) == (REJECTED, MAJORITY)
    # 1 of 2: a tie
    d = decide_session([sv("a", 5, "circle"), sv("b", 5)], rule, quorum=2)
    assert (d.status, d.reason) == (ADJUDICATION, TIE)
    # 1 of 3 does not reject under majority; the median decides: (4, 5, 5) -> validated
    assert decide_session([sv("a", 4, "circle"), sv("b", 5), sv("c", 5)], rule, quorum=3).status == VALIDATED
    # even count: median of (2, 4) = 3 >= 3
    assert decide_session([sv("a", 2), sv("b", 4)], rule, quorum=2).status == VALIDATED


def test_session_any_rule_threshold_quorum_and_adjudication() -> None:
    rule = SessionRule.from_dict({"reject": "any", "threshold": 4})
    assert decide_session([sv("a", 4, "circle"), sv("b", 5), sv("c", 5)], rule, quorum=3).status == REJECTED
    assert decide_session([sv("a", 3), sv("b", 4), sv("c", 4)], rule, quorum=3).status == VALIDATED
    assert decide_session([sv("a", 3), sv("b", 3), sv("c", 5)], rule, quorum=3).status == REJECTED
    d = decide_session([sv("a", 5)], rule, quorum=2)
    assert (d.status, d.reason) == (PENDING, QUORUM)
    assert decide_session([sv("a", 5)], rule, quorum=1).provenance == SINGLE
    assert decide_session([sv("a", 1)], rule, quorum=2, adjudication=True).provenance == ADJUDICATED
    assert decide_session([sv("a", 5, flagged=True), sv("b", 5)], rule, quorum=2).reason == FLAGGED
    assert decide_session([sv("a", None), sv("b", None)], rule, quorum=2).status == ADJUDICATION
    with pytest.raises(ValueError):
        SessionRule(reject="some")


# --------------------------------------------------------------------------- issue 28: the quorum rule, the split


def test_quorum_rule_is_the_quorum_else_the_overlap_and_serves_agreement_items_to_everyone():
    from annotation.core.consensus import QuorumRule

    assert QuorumRule(3).base == QuorumRule(3).needed() == 3
    assert QuorumRule(3, 2).needed([Vote("a", True), Vote("b", True)]) == 2
    assert QuorumRule(0).base == 1  # never below one
    assert QuorumRule(2).slots() == 2 and QuorumRule(2).slots(True, 5) == 5 and QuorumRule(2).slots(True, None) == 2


def test_an_adaptive_rule_plugs_in_by_overriding_needed():
    """The later issue's "adaptive overlap": two annotators, a third only on disagreement."""
    from annotation.core.consensus import QuorumRule

    class Adaptive(QuorumRule):
        def needed(self, votes=()):
            return 3 if len({v.validated for v in votes}) > 1 else 2

    rule = Adaptive(2)
    agree, split = [Vote("a", True), Vote("b", True)], [Vote("a", True), Vote("b", False)]
    assert decide(agree, quorum=rule.needed(agree)).status == "validated"
    assert decide(split, quorum=rule.needed(split)).status == "pending"


def test_a_session_tie_shows_the_reject_flag_split_not_valid_invalid():
    """1 reject flag / 1 none is the tie; its votes are 0 "valid" / 2 "invalid" (neither passes)."""
    from annotation.core.consensus import SessionVote, decide_session

    d = decide_session([SessionVote("a", ("incoherent",), 4.0), SessionVote("b", (), 2.0)])
    assert d.reason == "tie" and (d.valid_votes, d.invalid_votes) == (0, 2)
    assert d.split_text == "1 reject flag / 1 no reject flag / 0 overall \u2265 3"
    assert decide([Vote("a", True), Vote("b", False)]).split_text == "1 valid / 1 invalid"
