"""Adaptive overlap (annotation.core.consensus.AdaptiveQuorumRule): two annotators, a
third (up to the maximum) only where they disagree; consensus decides with the rule's quorum."""

from __future__ import annotations

import pytest

from annotation.core.consensus import (
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


@pytest.mark.parametrize(
    "sides,needed,slots",
    [
        ((), 2, 2),
        ((V,), 2, 2),  # below the base: two annotators
        ((V, V), 2, 2),
        ((X, X), 2, 2),  # two agreeing votes decide
        ((V, X), 3, 3),  # two disagreeing open a third
        ((V, X, V), 3, 3),
        ((V, X, X), 3, 3),  # the third makes a majority (the maximum)
    ],
)
def test_two_then_three(sides, needed, slots):
    rule = AdaptiveQuorumRule(2, None, 3)
    assert rule.needed(votes(*sides)) == needed
    assert rule.slots(False, 5, votes(*sides)) == slots
    assert rule.slots(True, 5, votes(*sides)) == 5  # agreement items: everyone


def test_up_to_five_needs_a_lead_of_two():
    rule = AdaptiveQuorumRule(2, None, 5)
    assert rule.needed(votes(V, X)) == 3
    assert rule.needed(votes(V, X, V)) == 4  # 2 to 1: not settled
    assert rule.needed(votes(V, X, V, V)) == 4  # 3 to 1: lead of two
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
    for sides, status, provenance in [
        ((V, V), "validated", "unanimous"),
        ((X, X), "rejected", "unanimous"),
        ((V, X), "pending", ""),
        ((V, X, V), "validated", "majority"),
        ((V, X, X), "rejected", "majority"),
        ((V,), "pending", ""),
    ]:
        vs = votes(*sides)
        d = decide(vs, quorum=rule.needed(vs))
        assert (d.status, d.provenance) == (status, provenance), sides


class Known:
    """A reliability model: ``posterior(votes)`` from fixed sensitivities and specificities."""

    def __init__(self, prior=0.8, **people):
        from annotation.verdicts.reliability import Reliability

        self.model = Reliability(prior, {n: s for n, (s, _) in people.items()}, {n: c for n, (_, c) in people.items()})
        self.calls = 0

    def posterior(self, votes):
        self.calls += 1
        return self.model.posterior(votes)


TEAM_OF_THREE = dict(good=(0.97, 0.9), fair=(0.9, 0.75), spam=(0.5, 0.5))


def said(**sides):
    return [Vote(name, side) for name, side in sides.items()]


def test_confident_is_sure_either_way():
    from annotation.core.consensus import confident

    assert confident(0.95, 0.9) and confident(0.05, 0.9) and confident(0.9, 0.9)
    assert not confident(0.6, 0.9) and not confident(0.11, 0.9) and confident(0.5, 0.5)


def test_a_weighted_rule_settles_only_the_splits_its_model_is_sure_of():
    rule = quorum_rule(2, None, 3, 0.9)
    assert rule.weighted and not quorum_rule(2, None, 3).weighted and not QuorumRule(3).weighted
    assert QuorumRule(3).with_reliability(object()) == QuorumRule(3)
    assert quorum_rule(2, None, 3).with_reliability(object()) is not None
    with pytest.raises(ValueError):
        quorum_rule(2, None, 3, 0.4)
    split_by_spammer = said(good=V, spam=X)  # P(valid) ~ 0.97: the weights decide it
    split_by_equals = said(good=V, fair=X)  # P(valid) ~ 0.84: uncertain
    assert rule.needed(split_by_spammer) == 3  # no model yet: the lead rule, a third
    model = Known(**TEAM_OF_THREE)
    bound = rule.with_reliability(model)
    assert bound == rule  # the model is not part of the rule's settings (repr, equality, cache keys)
    assert model.model.posterior(split_by_spammer) > 0.9 > model.model.posterior(split_by_equals) > 0.5
    assert bound.settled(split_by_spammer) and bound.needed(split_by_spammer) == 2
    assert bound.slots(False, 5, split_by_spammer) == 2
    assert not bound.settled(split_by_equals) and bound.slots(False, 5, split_by_equals) == 3
    model.calls = 0
    assert bound.settled(said(good=V, fair=V)) and bound.settled(said(good=X, spam=X))  # agreeing: the lead rule
    assert bound.settled(said(good=V, fair=X, spam=V))  # the maximum
    assert bound.needed(said(good=V)) == 2  # below the base: no posterior read
    assert model.calls == 0
    assert bound.settled([Vote("good", True), Vote("spam", False, True)])  # a flag: an adjudicator decides
    # a stricter confidence asks a third of the same split; the majority rule always does
    assert not quorum_rule(2, None, 3, 0.99).with_reliability(model).settled(split_by_spammer)
    assert not quorum_rule(2, None, 3).with_reliability(model).settled(split_by_spammer)
    # consensus decides the settled split by the same posterior, at the rule's quorum
    d = decide(split_by_spammer, "reliability", quorum=bound.needed(split_by_spammer), reliability=model)
    assert (d.status, d.provenance) == ("validated", "reliability")
    assert (
        decide(split_by_equals, "reliability", quorum=bound.needed(split_by_equals), reliability=model).status
        == "pending"
    )
    assert "90% sure" in rule.describe() and "sure" not in quorum_rule(2, None, 3).describe()


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
    assert all(full[i][: len(votes[i])] == votes[i] for i in truth)  # the same crowd for every strategy
    verdicts = decide_all(votes, adaptive)
    assert all(v is not None for v in verdicts.values())  # every item decided: 2-0 or 2-1
    assert verdicts == decide_all(full, fixed)  # a third vote never overturns two agreeing ones
    weighted = collect(truth, ds, TEAM, 1)
    assert all(full[i][: len(weighted[i])] == weighted[i] for i in truth)  # the same crowd again
    thirds = {i for i, got in weighted.items() if len(got) == 3}
    splits = {i for i, got in weighted.items() if got[0].validated != got[1].validated}
    assert thirds <= splits and len(thirds) < len(splits)  # a third only on a split, not on every split
    assert all(v is not None for v in decide_all(weighted, ds).values())  # every item settled, decided
    rows = labour_table(compare(truth, repeats=3))
    assert (
        rows[0]["judgements"] == 3 * 120 * 3 and rows[2]["judgements"] < rows[1]["judgements"] < rows[0]["judgements"]
    )
    assert 0.9 < rows[1]["validated_accuracy"] == rows[0]["validated_accuracy"] and rows[1]["judgements_share"] < 0.8


def test_the_simulated_weighted_study_reads_no_truth(monkeypatch):
    """The reliability-weighted study's collection reads the answers and the fits made on them,
    never the truth: with the same answers, a flipped truth gives the same votes."""
    from annotation.verdicts import crowd

    truth = {f"q{n}": n % 5 != 0 for n in range(60)}
    ds = crowd.STRATEGIES[2]
    streams = {i: crowd.answers(i, v, crowd.TEAM, 3) for i, v in truth.items()}
    expected = crowd.collect(truth, ds, crowd.TEAM, 3)
    monkeypatch.setattr(crowd, "answers", lambda item, valid, team, seed: streams[item])
    assert crowd.collect({i: not v for i, v in truth.items()}, ds, crowd.TEAM, 3) == expected
