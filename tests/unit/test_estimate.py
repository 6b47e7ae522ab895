"""Issue 40, item 2: the maths of estimate studies (annotation/studies/estimate.py) against
hand-computed textbook cases (Cochran, Sampling Techniques, 3rd ed.)."""

from __future__ import annotations

import itertools
import math

import pytest

from annotation.quality.signals import wilson
from annotation.studies.estimate import (
    MIN_PER_STRATUM,
    StratumCount,
    cum_sqrt_f_bounds,
    interval_variance,
    next_stratum,
    neyman_sample_size,
    plan_items,
    planning_rate,
    planning_rates,
    serving_plan,
    srs_sample_size,
    stop_reached,
    stratified_estimate,
    stratified_variance,
    stratum_of,
    stratum_order,
    stratum_sizes,
)


def test_cochran_547_stratified_variance_with_the_finite_population_correction():
    # N = (100, 50), n = (10, 5), p = (0.2, 0.8):
    # v = (1/150^2) [100 * 90 * 0.16 / 9 + 50 * 45 * 0.16 / 4] = (160 + 90) / 22500
    strata = [StratumCount(100, 10, 2), StratumCount(50, 5, 4)]
    assert stratified_variance(strata) == pytest.approx(250 / 22500)
    e = stratified_estimate(strata)
    assert e.value == pytest.approx((100 * 0.2 + 50 * 0.8) / 150)  # p_st = sum W_h p_h = 0.4
    assert e.variance == pytest.approx(250 / 22500)
    assert e.judged == 15 and e.size == 150
    assert [s.weight for s in strata] == [10.0, 10.0]  # design weights N_h / n_h
    # the interval is Wilson's at n_eff = p q / v~, v~ with p~_h = (x_h + 1/2) / (n_h + 1) over n_h
    smoothed = (100 * 90 * (2.5 / 11) * (8.5 / 11) / 10 + 50 * 45 * (4.5 / 6) * (1.5 / 6) / 5) / 150**2
    assert interval_variance(strata) == pytest.approx(smoothed)
    assert (e.low, e.high) == pytest.approx(wilson(0.4, 0.4 * 0.6 / smoothed))
    assert e.low < 0.4 < e.high and e.half_width == pytest.approx((e.high - e.low) / 2)


def test_a_stratum_judged_in_full_adds_no_variance_and_a_census_is_a_point():
    assert stratified_variance([StratumCount(10, 10, 3), StratumCount(50, 5, 4)]) == pytest.approx(
        50 * 45 * 0.8 * 0.2 / 4 / 60**2
    )
    census = stratified_estimate([StratumCount(10, 10, 3), StratumCount(5, 5, 0)])
    assert census.value == pytest.approx(0.2) and census.low == census.high == census.value and census.n_eff is None


def test_no_estimate_until_every_stratum_has_two_decided_items():
    assert stratified_estimate([StratumCount(10, 1, 0), StratumCount(10, 5, 1)]) is None
    assert stratified_estimate([StratumCount(1, 1, 1), StratumCount(10, 2, 1)]) is not None  # a stratum of one, judged
    with pytest.raises(ValueError):
        stratified_variance([StratumCount(10, 1, 0)])
    with pytest.raises(ValueError):
        StratumCount(10, 3, 4)


def test_no_defect_seen_still_gives_an_interval():
    e = stratified_estimate([StratumCount(100, 10, 0), StratumCount(100, 10, 0)])
    assert e.value == 0 and e.variance == 0 and e.low == 0 and e.high > 0.02


def test_wilson_textbook_value():
    # 2 of 10: the Wilson 95% interval is 0.0567 to 0.5098 (Newcombe 1998, table I style)
    low, high = wilson(0.2, 10)
    assert (round(low, 4), round(high, 4)) == (0.0567, 0.5098)


def test_srs_sample_size_cochran_42():
    # n0 = 1.96^2 * 0.3 * 0.7 / 0.05^2 = 322.7; n = n0 / (1 + (n0 - 1) / 1000) = 244.1 -> 245
    assert srs_sample_size(1000, 0.3, 0.05) == 245
    assert srs_sample_size(50, 0.3, 0.05) <= 50


def test_neyman_sample_size_cochran_526():
    # W = (.5, .5), S = sqrt(1000/999 * PQ): (0.50025, 0.30015); V = (0.05/1.96)^2
    # n = (sum W S)^2 / (V + sum W S^2 / N) = 0.16016 / (0.00065077 + 0.00008509) = 217.7 -> 218
    assert neyman_sample_size([1000, 1000], [0.5, 0.1], 0.05) == 218
    # a stratum whose share would exceed it is taken in full (Cochran 5.9)
    assert neyman_sample_size([10, 10000], [0.5, 0.01], 0.002) >= 10
    assert neyman_sample_size([100, 100], [0.0, 0.0], 0.03) == 0


def test_cum_sqrt_f_bounds_by_hand():
    # bins of width 0.2 over [0.1, 0.9] at 4 bins: counts (16, 4, 4, 1) -> sqrt (4, 2, 2, 1), total 9;
    # thirds of 9 are reached after bins 1 and 2: cuts at 0.3 and 0.5
    scores = [0.1] * 16 + [0.35] * 4 + [0.6] * 4 + [0.9]
    bounds = cum_sqrt_f_bounds(scores, n_strata=3, bins=4)
    assert bounds == pytest.approx([0.3, 0.5, 0.9])
    assert stratum_sizes(scores, bounds) == [16, 4, 5]
    assert stratum_of(0.3, bounds) == 0 and stratum_of(0.31, bounds) == 1 and stratum_of(2.0, bounds) == 2
    assert cum_sqrt_f_bounds([0.4] * 7, 4) == [0.4]  # one value: one stratum


def test_small_strata_are_merged():
    scores = [0.0] * 50 + [1.0]  # one lone high score cannot be a stratum of its own
    bounds = cum_sqrt_f_bounds(scores, 4)
    assert all(n >= MIN_PER_STRATUM for n in stratum_sizes(scores, bounds))
    with pytest.raises(ValueError):
        cum_sqrt_f_bounds([], 4)


def _variance(sizes, sds, n):
    return sum((N * s) ** 2 * (1 / k - 1 / N) for N, s, k in zip(sizes, sds, n))


def test_the_plan_is_the_integer_neyman_allocation_at_every_prefix():
    sizes, sds = [40, 30, 20], [0.1, 0.3, 0.5]
    plan = serving_plan([range(n) for n in sizes], [0, 0, 0], sds)
    assert len(plan) == sum(sizes) and plan[:6] == [0, 0, 1, 1, 2, 2]  # two in every stratum first
    for m in (10, 25, 40, 70):
        n = [plan[:m].count(h) for h in range(3)]
        best = min(
            _variance(sizes, sds, k) for k in itertools.product(*(range(2, N + 1) for N in sizes)) if sum(k) == m
        )
        assert _variance(sizes, sds, n) == pytest.approx(best)
    # large strata: the shares approach N_h S_h (Neyman)
    plan = serving_plan([range(10000)] * 2, [0, 0], [0.5, 0.1])[:600]
    assert plan.count(0) / plan.count(1) == pytest.approx(5, rel=0.02)
    assert next_stratum([5, 5], [5, 5], [0.5, 0.5]) is None


def test_plan_items_continues_each_stratum_where_serving_left_it():
    strata = [["a1", "a2", "a3", "a4"], ["b1", "b2", "b3"]]
    order = plan_items(strata, [2, 1], [0.5, 0.5])
    assert sorted(order) == ["a3", "a4", "b2", "b3"]
    assert [x for x in order if x.startswith("a")] == ["a3", "a4"] and order[0] == "b2"  # b is below two


def test_planning_rate_starts_at_the_prior_and_follows_the_data():
    assert planning_rate(0.3) == pytest.approx(0.3)
    assert planning_rate(0.3, 2, 6) == pytest.approx((4 * 0.3 + 2) / 10)
    assert planning_rate(0.0, 0, 50) == pytest.approx(0.02)  # never a zero SD
    with pytest.raises(ValueError):
        planning_rate(0.3, 3, 2)
    assert planning_rates([0.3, 0.6], [2, 0], [6, 10], reallocate=False) == pytest.approx([0.3, 0.6])
    assert planning_rates([0.3, 0.6], [2, 0], [6, 10], reallocate=True) == pytest.approx([0.32, 2.4 / 14])


def test_stratum_order_is_a_seeded_permutation():
    a = stratum_order([5, 3, 9, 1], seed=4, stratum=1)
    assert sorted(a) == [1, 3, 5, 9] and a == stratum_order([9, 1, 3, 5], seed=4, stratum=1)
    assert any(stratum_order(range(20), 4, 1) != stratum_order(range(20), 4, h) for h in (0, 2))


def test_stop_rule():
    e = stratified_estimate([StratumCount(1000, 400, 80), StratumCount(1000, 400, 8)])
    assert stop_reached(e, e.half_width) and not stop_reached(e, e.half_width / 2)
    assert not stop_reached(None, 0.5)
    assert math.isfinite(e.n_eff)
