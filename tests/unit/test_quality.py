"""Quality signals and gold scoring: hand-computed and published numbers."""

from __future__ import annotations

import pytest

from annotation.core.serving import GOLD_ITEM, TRAINING_ITEM, Candidate, choose_gold, gold_due
from annotation.quality.signals import disagreement, gold_correct, straight_runs, too_fast, wilson_interval


@pytest.mark.parametrize(
    "k,n,low,high",
    [
        # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (Wilson score)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        # by hand: p = .8, z^2 = 3.8415; (0.99208 -+ 0.31362) / 1.38415
        (8, 10, 0.4902, 0.9433),
    ],
)
def test_wilson_interval_matches_published_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(5, 5)
    assert hi == 1.0 and lo == pytest.approx(0.5655, abs=1e-4)  # 5 / (5 + z^2)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_too_fast_counts_strictly_below_the_threshold():
    assert too_fast([4999, 5000, 100, 12000], 5) == 2
    assert too_fast([], 5) == 0


def test_straight_runs():
    answers = ["valid"] * 5 + ["invalid"] + ["valid"] * 3 + ["x"] * 8
    r = straight_runs(answers, 5)
    assert (r.runs, r.longest, r.items) == (2, 8, 13)
    assert straight_runs(["a", "b", "a"], 2) == (0, 1, 0) and straight_runs([], 2) == (0, 0, 0)
    with pytest.raises(ValueError):
        straight_runs(["a"], 1)


def test_disagreement_only_counts_decided_items():
    votes = {1: True, 2: False, 3: True, 4: True}
    consensus = {1: True, 2: True, 3: False}
    assert disagreement(votes, consensus) == (2, 3)


def test_gold_correct():
    assert gold_correct({"validated": True, "category": "valid"}, {"validated": True}) is True
    assert (
        gold_correct({"validated": False, "category": "ambiguous"}, {"validated": False, "category": "wrong_target"})
        is False
    )
    assert gold_correct({"validated": True}, {}) is None


def test_gold_due_at_the_rate():
    due = [n for n in range(60) if gold_due(n, n // 20, 0.05) is not None]
    # 20th, 40th, 60th item (0-based served counts 19, 39, 59) with one gold per 20 served so far
    assert due == [19, 39, 59]
    assert gold_due(19, 1, 0.05) is None  # already had its gold
    assert gold_due(0, 0, 0.0) is None
    assert gold_due(0, 0, 1.0) == GOLD_ITEM


def test_training_phase_comes_first():
    assert [gold_due(n, n, 0.05, training=3) for n in range(4)] == [TRAINING_ITEM] * 3 + [None]
    with pytest.raises(ValueError):
        gold_due(1, 2, 0.05)
    with pytest.raises(ValueError):
        gold_due(1, 0, 1.5)


def test_choose_gold_skips_judged_and_takes_the_first():
    cands = [
        Candidate(item_id=3, overlap=1, order_key=2),
        Candidate(item_id=1, overlap=1, order_key=5),
        Candidate(item_id=2, overlap=1, order_key=1, judged_by_me=True),
    ]
    assert choose_gold(cands, GOLD_ITEM).item == 3
    assert choose_gold(cands[2:], GOLD_ITEM) is None
