"""Ticked alternatives: validation, consensus and per-candidate agreement, by hand."""

from __future__ import annotations

import pytest

from annotation.alternatives.agreement import candidate_units, distribution, unit_agreement
from annotation.alternatives.decisions import accepted, decide_alternatives
from annotation.alternatives.payload import clean_alternatives, too_broad
from annotation.core.rubric import JudgementError


def test_clean_alternatives_takes_only_the_items_own_candidates():
    assert clean_alternatives([30, 10], [10, 20, 30]) == [10, 30]  # panel order
    assert clean_alternatives(None, [10]) == [] and clean_alternatives([], [10]) == []
    for bad in ([40], [10, 10], ["10"], [True], 10, {"a": 1}):
        with pytest.raises(JudgementError) as e:
            clean_alternatives(bad, [10, 20, 30])
        assert e.value.field == "alternatives"
    assert too_broad(10, 10) and not too_broad(9, 10) and not too_broad(50, 0)


def test_majority_unanimous_and_adjudication():
    ticks = {"a": [1, 2], "b": [2, 3], "c": [2, 1]}
    out = decide_alternatives([1, 2, 3, 4], ticks)
    assert [(x.image, x.votes, x.accepted, x.rule) for x in out] == [
        (1, 2, True, "majority"),
        (2, 3, True, "majority"),
        (3, 1, False, ""),
    ]
    assert out[0].provenance() == {"votes": 2, "of": 3, "ticked_by": ["a", "c"], "rule": "majority"}
    assert [x.image for x in accepted(decide_alternatives([1, 2, 3], ticks, "unanimous"))] == [2]
    # 2 of 4 is not a strict majority
    assert not accepted(decide_alternatives([1], {"a": [1], "b": [1], "c": [], "d": []}))
    # an adjudicator overrides the votes both ways, and may accept an untouched candidate
    adj = decide_alternatives([1, 2, 3, 4], ticks, adjudicated={2: False, 4: True})
    assert [(x.image, x.accepted, x.rule) for x in accepted(adj)] == [(1, True, "majority"), (4, True, "adjudicated")]
    # one vote alone is never unanimous
    assert not accepted(decide_alternatives([1], {"a": [1]}, "unanimous"))
    with pytest.raises(ValueError):
        decide_alternatives([1], ticks, "plurality")


def test_unit_agreement_by_hand():
    # one item, candidates 1..4, three annotators. Units (ratings): c1 (1,1,0), c2 (1,1,1),
    # c3 (0,1,0), c4 (0,0,0). Coincidences: c1: o11=2, o10=o01=2 -> /2 each pair weight 1/(m-1)=1/2
    #   o(1,1)=1, o(0,1)=o(1,0)=1 ; c2: o(1,1)=3 ; c3: o(0,0)=1, o(0,1)=o(1,0)=1 ; c4: o(0,0)=3.
    # Totals: o00=4, o11=4, o01=o10=2; n=12, n0=n1=6. D_o = (2+2)/12, D_e = 2*6*6/(12*11)
    # alpha = 1 - D_o/D_e = 1 - (4/12)/(72/132) = 1 - 11/18 = 7/18.
    triples = candidate_units({"i": [1, 2, 3, 4]}, {"i": {"a": [1, 2], "b": [1, 2, 3], "c": [2]}})
    assert len(triples) == 12
    out = unit_agreement(triples, n_boot=200)
    assert out["alpha_nominal"] == pytest.approx(7 / 18)
    # raw agreement per unit: c1 1/3, c2 1, c3 1/3, c4 1 -> 2/3
    assert out["raw_agreement"] == pytest.approx(2 / 3)
    assert out["prevalence"] == pytest.approx(6 / 12)
    assert out["n_units"] == 4 and out["intervals"]["alpha_nominal"]["n_boot"] == 200
    assert unit_agreement([])["alpha_nominal"] is None


def test_distribution():
    assert distribution([0, 2, 2, 5]) == {
        "histogram": {"0": 1, "2": 2, "5": 1},
        "n_items": 4,
        "mean": 2.25,
        "items_with_alternatives": 3,
    }
