"""The suspicion score's maths (audit/suspicion.py), on hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from annotation.core.serving import Candidate, choose_next, queue_fields
from audit.democheck import check_suspicion
from audit.suspicion import (
    PARTS,
    WEIGHTS,
    Signals,
    breadth_part,
    combine,
    consensus_rivals,
    consistency_part,
    gap_part,
    item_parts,
    lead_index,
    lead_rank_part,
    margin_part,
    queue_order,
    queue_precision,
    retrievers_part,
    score,
    spread_part,
    top_count,
    votes_part,
)


def test_margin_is_how_close_the_better_unimodal_rank_comes_to_the_multimodal_one():
    assert margin_part([(1, 50, 80)], 99) == 0.0  # the composition puts the target first
    assert margin_part([(4, 16, 300)], 99) == pytest.approx(0.5)  # log 4 / log 16
    assert margin_part([(40, 30, 300)], 99) == 1.0  # no better than the text alone: clipped
    # the retriever that needs the composition most decides
    assert margin_part([(40, 30, 300), (4, 900, 16)], 99) == pytest.approx(0.5)
    # not retrieved counts as N + 1
    assert margin_part([(None, None, None)], 99) == 1.0
    assert margin_part([], 99) is None
    with pytest.raises(ValueError):
        margin_part([(0, 1, 1)], 99)


def test_retrievers_and_spread_read_the_multimodal_ranks_on_a_log_scale():
    assert retrievers_part([(10, 1, 1), (10, 1, 1)], 99) == pytest.approx(0.5)  # log 10 / log 100
    assert retrievers_part([(1, 5, 5), (None, 5, 5)], 99) == pytest.approx(0.5)  # (0 + 1) / 2
    assert retrievers_part([], 99) is None
    assert spread_part([(1, 5, 5), (100, 5, 5)], 99) == pytest.approx(1.0)
    assert spread_part([(10, 5, 5), (10, 5, 5)], 99) == 0.0
    assert spread_part([(10, 5, 5)], 99) is None


def test_gap_breadth_consistency_and_votes():
    assert gap_part([1.0, 3.0]) == pytest.approx(0.5)  # the smallest gap, over 2 standard deviations
    assert gap_part([-0.7]) == 0.0 and gap_part([5.0]) == 1.0 and gap_part([]) is None
    assert breadth_part(0) == 0.0 and breadth_part(10) == pytest.approx(1 - math.exp(-1)) and breadth_part(None) is None
    assert consistency_part([0.1, -0.2]) == pytest.approx(0.4)  # 0.5 - the best retriever's delta
    assert consistency_part([0.8]) == 0.0 and consistency_part([-0.9]) == 1.0 and consistency_part([]) is None
    assert votes_part([True]) is None  # one vote disagrees with nobody
    assert votes_part([True, False]) == 1.0 and votes_part([True, True]) == 0.0 and votes_part([False, False]) == 0.0
    assert votes_part([True, True, False]) == pytest.approx(2 / 3)


def test_the_score_is_the_weighted_mean_of_the_parts_present():
    equal = {
        "margin": 1.0,
        "retrievers": 1.0,
        "spread": 0.0,
        "gap": 1.0,
        "breadth": 1.0,
        "consistency": 1.0,
        "votes": 1.0,
    }
    parts = {
        "margin": 1.0,
        "retrievers": 0.5,
        "spread": 0.9,
        "gap": None,
        "breadth": 0.0,
        "consistency": 0.5,
        "votes": None,
    }
    # spread weighs 0, gap and votes are missing: (1 + 0.5 + 0 + 0.5) / 4
    assert combine(parts, equal) == pytest.approx(0.5)
    assert combine(parts, {**equal, "margin": 3.0}) == pytest.approx((3 + 0.5 + 0 + 0.5) / 6)
    assert combine({name: None for name in PARTS}) is None
    # the shipped weights count the lead retriever's parts and the votes only
    assert {name for name, w in WEIGHTS.items() if w > 0} == {"lead_rank", "lead_gap", "votes"}
    s = Signals(
        ranks=((4, 16, 300), (10, 20, 30)),
        n_gallery=99,
        rivals=10,
        consistency=(0.1,),
        gaps=(1.0,),
        votes=(True, False),
        lead=1,
        lead_gap=3.0,
    )
    value, got = score(s)
    assert list(got) == list(PARTS) and got == item_parts(s)
    expected = {
        "lead_rank": math.log(10) / math.log(100),
        "lead_gap": 1.0,
        "margin": min(math.log(4) / math.log(16), math.log(10) / math.log(20)),
        "retrievers": (math.log(4) + math.log(10)) / 2 / math.log(100),
        "gap": 0.5,
        "breadth": 1 - math.exp(-1),
        "consistency": 0.4,
        "votes": 1.0,
    }
    for name, v in expected.items():
        assert got[name] == pytest.approx(v), name
    counted = ("lead_rank", "lead_gap", "votes")
    assert value == pytest.approx(sum(expected[k] for k in counted) / 3)
    assert 0.0 <= value <= 1.0
    assert combine(got, equal) == pytest.approx(
        sum(expected[k] for k in ("margin", "retrievers", "gap", "breadth", "consistency", "votes")) / 6
    )


def test_the_lead_retriever_is_the_one_with_the_best_mean_reciprocal_rank():
    # retriever 0: 1/1 + 1/10 + 0 = 1.1; retriever 1: 1/2 + 1/2 + 1/2 = 1.5
    assert lead_index([(1, 2), (10, 2), (None, 2)]) == 1
    assert lead_index([(1, 1), (2, 2)]) == 0  # ties: the first
    assert lead_index([]) is None and lead_index([(), ()]) is None
    # without a lead the lead parts are not computed, and the score rests on what is there
    s = Signals(ranks=((4, 16, 300), (None, 20, 30)), n_gallery=99, gaps=(1.0,))
    assert lead_rank_part(s) is None and item_parts(s)["lead_gap"] is None and score(s)[0] is None
    assert lead_rank_part(Signals(ranks=s.ranks, n_gallery=99, lead=1)) == 1.0  # not retrieved: N + 1
    assert lead_rank_part(Signals(ranks=s.ranks, n_gallery=99, lead=5)) is None  # no such retriever


def test_consensus_rivals_are_the_images_every_retriever_ranks_above_the_target():
    lists = [[5, 6, 7, 1, 9], [7, 8, 5, 6, 1]]
    # target 1 at ranks 4 and 5; above it: {5, 6, 7} and {7, 8, 5, 6}; the reference 6 left out
    assert consensus_rivals(lists, [4, 5], exclude={1, 6}) == 2
    # a retriever that did not retrieve the target: its whole list is above it
    assert consensus_rivals([[5, 6, 7], [7, 8, 9]], [None, 1], exclude=set()) == 0
    assert consensus_rivals([[5, 6, 7], [7, 8, 9]], [None, None], exclude=set()) == 1
    # a retriever without a stored list takes no part; none at all: unknown
    assert consensus_rivals([[5, 6, 7], []], [3, None], exclude=set()) == 2
    assert consensus_rivals([[], []], [None, None], exclude=set()) is None


def test_queue_order_and_its_precision_at_the_top():
    scores = {"a": 0.9, "b": 0.1, "c": None, "d": 0.7, "e": 0.3}
    assert queue_order(scores) == ["a", "d", "e", "b", "c"]
    assert top_count(5) == 1 and top_count(68) == 14 and top_count(80) == 16 and top_count(0) == 0
    with pytest.raises(ValueError):
        top_count(10, 0)
    got = queue_precision(scores, {"a", "b"}, share=0.4)  # the top 2: a, d
    assert (got["found"], got["hits"], got["planted"]) == (2, 1, 2)
    assert got["precision"] == 0.5 and got["recall"] == 0.5 and got["queue"] == 5
    # a defect outside the queue takes no part
    assert queue_precision(scores, {"a", "zz"}, share=0.2)["planted"] == 1


def test_check_suspicion_measures_every_planted_kind_and_the_human_ones():
    kinds = {"q1": "vague", "q2": "composition", "q3": "text_only", "q4": "composition", "q5": "too_broad"}
    scores = {"q1": 0.9, "q2": 0.8, "q3": 0.7, "q4": 0.1, "q5": 0.2}
    got = check_suspicion(kinds, scores, share=0.6)  # the top 3: q1, q2, q3
    assert got["planted"]["planted"] == 3 and got["planted"]["hits"] == 2
    assert got["planted"]["precision"] == pytest.approx(2 / 3) and got["planted"]["recall"] == pytest.approx(2 / 3)
    assert got["human"]["planted"] == 2 and got["human"]["hits"] == 1  # text_only is no human flag


def test_serving_by_suspicion_prefers_the_higher_score_after_the_overlap_rule():
    fresh = [Candidate(item_id=i, overlap=3, order_key=i, priority=p) for i, p in ((1, 0.2), (2, 0.9), (3, 0.5))]
    assert choose_next(fresh).item == 2
    # an item closer to its overlap still comes first
    started = [*fresh, Candidate(item_id=4, overlap=3, completed=1, order_key=4, priority=0.0)]
    assert choose_next(started).item == 4
    # equal scores: the seeded order
    assert choose_next([Candidate(item_id=i, overlap=3, order_key=10 - i, priority=0.5) for i in (1, 2)]).item == 2
    assert queue_fields("suspicion") == ("-agreement", "-taken", "-suspicion", "order_key")
    assert queue_fields("random") == ("-agreement", "-taken", "order_key")
