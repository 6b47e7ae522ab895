"""The turn-by-turn verdict (issue 26, item 3): THE derivation of a session's verdict and valid
prefix from its turns (annotation.core.turns), the per-turn consensus (decide_turns, which
decides every turn with the study's one vote rule) and the session rubric v2. Expectations are
worked out by hand."""

from __future__ import annotations

import copy

import pytest

from annotation.core.consensus import (
    ADJUDICATED,
    ADJUDICATION,
    FLAGGED,
    MAJORITY,
    PENDING,
    PRIMARY,
    REJECTED,
    SINGLE,
    TIE,
    UNANIMOUS,
    VALIDATED,
    SessionRule,
    TurnVote,
    decide,
    decide_turns,
    tally,
    turn_decisions,
)
from annotation.core.rubric import (
    SESSION_RUBRIC_V1,
    SESSION_RUBRIC_V2,
    JudgementError,
    Rubric,
    builtin_rubric,
    builtin_rubrics,
    validate_judgement,
)
from annotation.core.turns import session_valid, turn_answers, valid_prefix
from retrieval.records import ParseError

T, F = True, False


# --------------------------------------------------------------------------- the derivation


@pytest.mark.parametrize(
    ("turns", "rejected", "prefix", "valid"),
    [
        ((T, T, T), F, 3, T),
        ((T, T, F), F, 2, F),
        ((T, F, T), F, 1, F),  # a later valid turn does not extend the prefix
        ((F, T, T), F, 0, F),
        ((T, T, T), T, 0, F),  # a session-level reject flag voids every prefix
        ((T,), F, 1, T),
        ((), F, 0, F),  # no turn: nothing valid
    ],
)
def test_valid_prefix_and_session_verdict(turns, rejected, prefix, valid) -> None:
    assert valid_prefix(turns, rejected) == prefix
    assert session_valid(turns, rejected) is valid
    assert session_valid(turns, rejected) == (len(turns) > 0 and valid_prefix(turns, rejected) == len(turns))


def test_turn_answers_reads_the_verdict_key_and_refuses_old_judgements() -> None:
    assert turn_answers([{"valid": True, "x": False}, {"valid": False}], "valid") == (True, False)
    assert turn_answers([{"valid": True}, {"x": True}], "valid") is None  # one turn unanswered
    assert turn_answers([{"real_difference_toward_target": True}], "valid") is None  # a v1 judgement
    assert turn_answers([], "valid") is None
    assert turn_answers([{"valid": 1}], "valid") is None  # only booleans


# --------------------------------------------------------------------------- per-turn consensus


def tv(name: str, turns: str, *rejects: str, flagged: bool = False) -> TurnVote:
    """``tv("a", "++-")``: a answered turns 1, 2 valid and turn 3 invalid."""
    return TurnVote(name, tuple(c == "+" for c in turns), tuple(rejects), flagged)


def test_turn_decisions_are_the_one_vote_rule_per_position() -> None:
    votes = [tv("a", "++-"), tv("b", "+--"), tv("c", "+-+")]
    turns = turn_decisions(votes, quorum=3)
    assert [d.status for d in turns] == [VALIDATED, REJECTED, REJECTED]
    for t, d in enumerate(turns):  # exactly decide() over that turn's answers
        from annotation.core.consensus import Vote

        assert d == decide([Vote(v.annotator, v.turns[t]) for v in votes], quorum=3)
    assert [d.provenance for d in turns] == [UNANIMOUS, MAJORITY, MAJORITY]


def test_session_validated_when_every_turn_is() -> None:
    d = decide_turns([tv("a", "+++"), tv("b", "+++")], quorum=2)
    assert (d.status, d.provenance, d.prefix) == (VALIDATED, UNANIMOUS, 3)
    assert (d.valid_votes, d.invalid_votes) == (2, 0)
    assert [t.status for t in d.turns] == [VALIDATED] * 3
    assert d.to_dict()["prefix"] == 3 and len(d.to_dict()["turns"]) == 3


def test_majority_per_turn_rejects_at_the_first_rejected_turn() -> None:
    # turn 3: a and b say invalid, c valid -> rejected by majority; prefix: turns 1-2
    d = decide_turns([tv("a", "++-"), tv("b", "++-"), tv("c", "+++")], quorum=3)
    assert (d.status, d.provenance, d.prefix) == (REJECTED, MAJORITY, 2)
    assert (d.valid_votes, d.invalid_votes) == (1, 2)


def test_unanimous_rejection_and_single_vote() -> None:
    assert decide_turns([tv("a", "+-+"), tv("b", "-+-")], quorum=2).status == ADJUDICATION  # turn 1 is a tie
    d = decide_turns([tv("a", "+-+"), tv("b", "+--")], quorum=2)
    assert (d.status, d.provenance, d.prefix) == (REJECTED, UNANIMOUS, 1)
    d = decide_turns([tv("a", "++-")], quorum=1)
    assert (d.status, d.provenance, d.prefix) == (REJECTED, SINGLE, 2)


def test_an_undecided_earlier_turn_holds_the_session() -> None:
    # turn 1 is a tie (1 valid / 1 invalid): the session waits for an adjudicator even though
    # turn 3 is rejected, because the valid prefix depends on turn 1
    d = decide_turns([tv("a", "++-"), tv("b", "-+-")], quorum=2)
    assert (d.status, d.reason, d.prefix) == (ADJUDICATION, TIE, None)
    # the tie after a rejected turn does not matter: rejected, prefix 1
    d = decide_turns([tv("a", "+-+"), tv("b", "+--")], quorum=2)
    assert (d.status, d.prefix) == (REJECTED, 1)


def test_reject_flags_follow_the_session_rule() -> None:
    votes = [tv("a", "+++", "circle"), tv("b", "+++", "circle"), tv("c", "+++")]
    d = decide_turns(votes, quorum=3)
    assert (d.status, d.provenance, d.prefix) == (REJECTED, MAJORITY, 0)
    assert decide_turns([tv("a", "+++", "circle"), tv("b", "+++")], quorum=2).reason == TIE
    d = decide_turns([tv("a", "+++", "circle"), tv("b", "+++"), tv("c", "+++")], SessionRule(reject="any"), quorum=3)
    assert (d.status, d.prefix) == (REJECTED, 0)
    d = decide_turns([tv("a", "+++", "circle"), tv("b", "+++"), tv("c", "+++")], quorum=3)
    assert (d.status, d.provenance, d.prefix) == (VALIDATED, MAJORITY, 3)  # one flag of three: not rejected


def test_gate_quorum_flag_and_adjudication() -> None:
    assert decide_turns([tv("a", "+++")], quorum=2).status == PENDING
    assert decide_turns([], quorum=2).status == "unjudged"
    d = decide_turns([tv("a", "+++", flagged=True), tv("b", "+++")], quorum=2)
    assert (d.status, d.reason, d.prefix) == (ADJUDICATION, FLAGGED, None)
    # an adjudicator validates: every turn kept; rejects: the consensus prefix, never every turn
    votes = [tv("a", "++-"), tv("b", "-+-")]
    assert decide_turns(votes, quorum=2, adjudication=True).prefix == 3
    assert decide_turns(votes, quorum=2, adjudication=False).prefix == 0  # turn 1 undecided
    votes = [tv("a", "+++", flagged=True), tv("b", "+++")]
    d = decide_turns(votes, quorum=2, adjudication=False)
    assert (d.status, d.provenance, d.prefix) == (REJECTED, ADJUDICATED, 2)
    votes = [tv("a", "+++", "circle"), tv("b", "+++")]
    assert decide_turns(votes, quorum=2, adjudication=False).prefix == 0


def test_primary_policy_decides_every_turn_by_one_annotator() -> None:
    d = decide_turns([tv("a", "+++"), tv("b", "+--")], policy="primary", primary="b", quorum=2)
    assert (d.status, d.provenance, d.prefix) == (REJECTED, PRIMARY, 1)
    assert all(t.decided_by == "b" for t in d.turns)


def test_tally_counts_turn_decisions_like_any_other() -> None:
    ds = [
        decide_turns([tv("a", "++"), tv("b", "++")], quorum=2),
        decide_turns([tv("a", "+-"), tv("b", "-+")], quorum=2),
    ]
    t = tally(ds)
    assert t["status"][VALIDATED] == 1 and t["adjudication_reasons"][TIE] == 1


def test_two_votes_of_one_annotator_are_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        decide_turns([tv("a", "+"), tv("a", "-")])


# --------------------------------------------------------------------------- the rubric


SCALES = {"naturalness": 3, "coherence": 3, "goal_progress": 3, "low_redundancy": 3, "overall": 3}


def test_session_rubric_v2_is_the_default_and_v1_stays_readable() -> None:
    assert builtin_rubrics()["session"].version == 2
    v1, v2 = builtin_rubric("session", 1), builtin_rubric("session", 2)
    assert v1.turn_verdict is None and "turn_verdict" not in v1.to_dict()
    assert v1.to_dict() == SESSION_RUBRIC_V1  # old definitions round-trip unchanged
    assert v2.to_dict() == SESSION_RUBRIC_V2 and Rubric.from_dict(v2.to_dict()) == v2
    assert (v2.turn_verdict.key, v2.turn_verdict.valid_key, v2.turn_verdict.invalid_key) == ("valid", "a", "d")
    with pytest.raises(KeyError):
        builtin_rubric("session", 9)
    # a v1 judgement stays valid under v1 (no verdict asked)
    old = validate_judgement(
        v1,
        {
            "scales": SCALES,
            "per_turn_checks": [{"real_difference_toward_target": True, "consistent_with_history": True}],
            "time_spent_ms": 1,
        },
    )
    assert old.per_turn_checks == [{"real_difference_toward_target": True, "consistent_with_history": True}]


def test_v2_judgement_needs_every_turn_verdict() -> None:
    v2 = builtin_rubric("session", 2)
    row = {"real_difference_toward_target": True, "consistent_with_history": True}
    ok = validate_judgement(
        v2,
        {"scales": SCALES, "per_turn_checks": [{**row, "valid": True}, {**row, "valid": False}], "time_spent_ms": 1},
        n_turns=2,
    )
    assert [t["valid"] for t in ok.per_turn_checks] == [True, False]
    with pytest.raises(JudgementError, match=r"per_turn_checks\[1\]\.valid"):
        validate_judgement(
            v2, {"scales": SCALES, "per_turn_checks": [{**row, "valid": True}, row], "time_spent_ms": 1}, n_turns=2
        )


def test_turn_verdict_definition_is_checked() -> None:
    data = copy.deepcopy(SESSION_RUBRIC_V2)
    data["turn_verdict"]["valid_key"] = "q"  # a scale's focus key
    with pytest.raises(ParseError, match="collides"):
        Rubric.from_dict(data)
    data = copy.deepcopy(SESSION_RUBRIC_V2)
    data["turn_verdict"]["key"] = "consistent_with_history"
    with pytest.raises(ParseError, match="per-turn check key"):
        Rubric.from_dict(data)
    data = copy.deepcopy(SESSION_RUBRIC_V2)
    data["turn_verdict"]["invalid_key"] = "s"
    with pytest.raises(ParseError, match="reserved"):
        Rubric.from_dict(data)


# --------------------------------------------------------------------------- agreement per position


def test_agreement_per_turn_position_equals_sklearn_and_krippendorff() -> None:
    """Random answers of 4 annotators on 30 sessions of 2-5 turns (each session judged by 2-4 of
    them): the labels of every turn dimension (annotation.agreement.reports.turn_label) through the
    one engine (compute_agreement, TURN_SPEC) give krippendorff's nominal alpha and, per pair,
    sklearn's Cohen's kappa."""
    import random

    import krippendorff
    import numpy as np
    from sklearn.metrics import cohen_kappa_score

    from annotation.agreement.maths import pair_key
    from annotation.agreement.reports import TURN_SPEC, compute_agreement, turn_label

    rng = random.Random(7)
    users = ["u1", "u2", "u3", "u4"]
    compared = 0
    judgements = []  # (session, user, per_turn objects, reject flags)
    for s in range(30):
        n = rng.randint(2, 5)
        truth = [rng.random() < 0.75 for _ in range(n)]
        for u in rng.sample(users, rng.randint(2, 4)):
            turns = [t if rng.random() < 0.8 else not t for t in truth]
            judgements.append(
                (s, u, [{"valid": v, "x": True} for v in turns], ["circle"] if rng.random() < 0.1 else [])
            )
    for dim in ("verdict", "turn:1", "turn:2", "turn:3", "turn:4"):
        triples = [
            (s, u, lab)
            for s, u, per_turn, rej in judgements
            if (lab := turn_label("valid", per_turn, rej, dim)) is not None
        ]
        report = compute_agreement(triples, TURN_SPEC, raters=users)
        items = sorted({s for s, _, _ in triples})
        grid = {(s, u): v for s, u, v in triples}
        data = np.array([[grid.get((s, u), np.nan) for s in items] for u in users], dtype=float)
        assert report["krippendorff_alpha"] == pytest.approx(
            krippendorff.alpha(reliability_data=data, level_of_measurement="nominal", value_domain=[0, 1]), abs=1e-9
        )
        for a, b in ((0, 1), (0, 2), (1, 3), (2, 3)):
            both = [
                (grid[(s, users[a])], grid[(s, users[b])])
                for s in items
                if (s, users[a]) in grid and (s, users[b]) in grid
            ]
            if len({x for pair in both for x in pair}) < 2:
                continue
            key = pair_key(users[a], users[b])
            mine = report["pairwise_cohen"]["by_pair"].get(
                key, report["pairwise_cohen"]["by_pair"].get(pair_key(users[b], users[a]))
            )
            ref = cohen_kappa_score([x for x, _ in both], [y for _, y in both], labels=[0, 1])
            assert mine == pytest.approx(ref, abs=1e-9), (dim, key)
            compared += 1
    assert compared >= 15  # most pairs of most dimensions were checked
