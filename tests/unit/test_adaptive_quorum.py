"""Adaptive overlap (annotation.verdicts.consensus.AdaptiveQuorumRule): two annotators, a
third (up to the maximum) only where they disagree; consensus decides with the rule's quorum."""
from __future__ import annotations

import pytest

from annotation.verdicts.consensus import (
    AdaptiveQuorumRule,
    QuorumRule,
    SessionVote,
    Vote,
    decide,
    quorum_rule,
)

V, X = True, False


def votes(*sides, flagged=()):
    return [Vote(f"a{n}", side, n in flagged) for n, side in enumerate(sides)]


def test_quorum_rule_picks_adaptive_only_above_the_overlap():
    assert type(quorum_rule(3)) is QuorumRule
    assert type(quorum_rule(2, None, 2)) is QuorumRule
    rule = quorum_rule(2, None, 3)
    assert isinstance(rule, AdaptiveQuorumRule) and rule.adaptive and rule.most == 3 and rule.base == 2
    assert not QuorumRule(3).adaptive and QuorumRule(3).most == 3
    with pytest.raises(ValueError):
        AdaptiveQuorumRule(3, None, 2)


@pytest.mark.parametrize("sides,needed,slots", [
    ((), 2, 2), ((V,), 2, 2),                  # below the base: two annotators
    ((V, V), 2, 2), ((X, X), 2, 2),            # two agreeing votes decide
    ((V, X), 3, 3),                            # two disagreeing open a third
    ((V, X, V), 3, 3), ((V, X, X), 3, 3),      # the third makes a majority (the maximum)
])
def test_two_then_three(sides, needed, slots):
    rule = AdaptiveQuorumRule(2, None, 3)
    assert rule.needed(votes(*sides)) == needed
    assert rule.slots(False, 5, votes(*sides)) == slots
    assert rule.slots(True, 5, votes(*sides)) == 5  # agreement items: everyone


def test_up_to_five_needs_a_lead_of_two():
    rule = AdaptiveQuorumRule(2, None, 5)
    assert rule.needed(votes(V, X)) == 3
    assert rule.needed(votes(V, X, V)) == 4      # 2 to 1: not settled
    assert rule.needed(votes(V, X, V, V)) == 4   # 3 to 1: lead of two
    assert rule.needed(votes(V, X, V, X)) == 5
    assert rule.needed(votes(V, X, V, X, X)) == 5  # the maximum: the policy decides


def test_a_flag_or_no_verdict_opens_nothing():
    rule = AdaptiveQuorumRule(2, None, 3)
    assert rule.needed(votes(V, X, flagged=(1,))) == 2
    assert rule.needed([SessionVote("a", (), 4.0), SessionVote("b", ("broken",), 1.0)]) == 3
    assert rule.needed([SessionVote("a", (), 4.0), SessionVote("b", (), 1.0)]) == 2

    class Scales:  # a scales-only rubric's vote: no verdict, no disagreement
        annotator, validated, flagged = "s", None, False
    assert rule.needed([Scales(), Scales()]) == 2


def test_consensus_follows_the_rule():
    rule = AdaptiveQuorumRule(2, None, 3)
    for sides, status, provenance in [((V, V), "validated", "unanimous"), ((X, X), "rejected", "unanimous"),
                                      ((V, X), "pending", ""), ((V, X, V), "validated", "majority"),
                                      ((V, X, X), "rejected", "majority"), ((V,), "pending", "")]:
        vs = votes(*sides)
        d = decide(vs, quorum=rule.needed(vs))
        assert (d.status, d.provenance) == (status, provenance), sides


def test_the_simulated_crowd_runs_the_apps_rules():
    from annotation.verdicts.crowd import STRATEGIES, TEAM, collect, compare, decide_all, labour_table

    truth = {f"q{n}": n % 5 != 0 for n in range(120)}
    fixed, adaptive, ds = STRATEGIES
    votes = collect(truth, adaptive, TEAM, 1)
    for got in votes.values():
        assert len(got) in (2, 3) and len({v.annotator for v in got}) == len(got)
        assert (len(got) == 3) == (got[0].validated != got[1].validated)  # a third only after a split
    full = collect(truth, fixed, TEAM, 1)
    assert all(len(v) == 3 for v in full.values())
    assert all(full[i][:len(votes[i])] == votes[i] for i in truth)  # the same crowd for every strategy
    verdicts = decide_all(votes, adaptive)
    assert all(v is not None for v in verdicts.values())  # every item decided: 2-0 or 2-1
    assert verdicts == decide_all(full, fixed)  # a third vote never overturns two agreeing ones
    rows = labour_table(compare(truth, repeats=3))
    assert rows[0]["judgements"] == 3 * 120 * 3 and rows[1]["judgements"] == rows[2]["judgements"] < rows[0]["judgements"]
    assert 0.9 < rows[1]["validated_accuracy"] == rows[0]["validated_accuracy"] and rows[1]["judgements_share"] < 0.8
