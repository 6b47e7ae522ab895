"""Unit tests for annotation.agreement.maths against published worked examples and hand computations."""

from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from annotation.agreement.maths import (
    FLAGS,
    LEVELS,
    Interval,
    Ratings,
    Undefined,
    agreement_report,
    all_identical_rate,
    binary_valid_ratings,
    bootstrap_ci,
    cohen_kappa,
    cohen_kappa_from_confusion,
    flag_ratings,
    fleiss_kappa,
    fleiss_kappa_from_counts,
    gwet_ac1,
    gwet_ac1_from_counts,
    krippendorff_alpha,
    krippendorff_alpha_from_counts,
    label_from_signature,
    label_prevalence,
    pairwise_cohen_kappa,
    percent_agreement,
    summarize,
    to_json_value,
    validity_rates,
    validity_ratings,
    validity_signature,
)
from tests.reference_impl import pairwise_cohen_kappa_sklearn


def expand_table(table: list[list[int]], categories: list[object]) -> tuple[list[object], list[object]]:
    """Two aligned label lists from a contingency table (rows: rater a, columns: rater b)."""
    a: list[object] = []
    b: list[object] = []
    for i, row in enumerate(table):
        for j, n in enumerate(row):
            a += [categories[i]] * n
            b += [categories[j]] * n
    return a, b


def sk_kappa(a, b, **kw) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(cohen_kappa_score(a, b, **kw))


# --------------------------------------------------------------------------- Cohen


def test_cohen_kappa_textbook_2x2() -> None:
    # Wikipedia "Cohen's kappa", worked example: 50 grant proposals read by A and B;
    # both yes 20, A yes / B no 5, A no / B yes 10, both no 15. p_o = 0.7, p_e = 0.5,
    # kappa = 0.4.
    table = [[20, 5], [10, 15]]
    assert cohen_kappa_from_confusion(np.array(table)) == pytest.approx(0.4, abs=1e-15)
    a, b = expand_table(table, ["yes", "no"])
    assert cohen_kappa(a, b) == pytest.approx(0.4, abs=1e-15)
    assert sk_kappa(a, b) == pytest.approx(0.4, abs=1e-15)


# Hand-computed 3x3 example (rows: rater a, columns: rater b), n = 40.
# Row sums 12, 13, 15; column sums 14, 12, 14; diagonal 30.
#   unweighted: p_o = 30/40, p_e = (12*14 + 13*12 + 15*14) / 1600 = 534/1600,
#               kappa = (0.75 - 0.33375) / (1 - 0.33375) = 333/533
#   linear |i-j|: observed sum 2+0+3+2+2*1+2 = 11; expected sum
#               (144 + 2*168 + 182 + 182 + 2*210 + 180)/40 = 1444/40; kappa = 1 - 440/1444 = 251/361
#   quadratic (i-j)^2: observed 2+0+3+2+4*1+2 = 13; expected (144 + 4*168 + 182 + 182
#               + 4*210 + 180)/40 = 2200/40 = 55; kappa = 1 - 13/55 = 42/55
WEIGHTED_TABLE = [[10, 2, 0], [3, 8, 2], [1, 2, 12]]


@pytest.mark.parametrize(
    ("weights", "expected"),
    [(None, Fraction(333, 533)), ("linear", Fraction(251, 361)), ("quadratic", Fraction(42, 55))],
)
def test_weighted_kappa_hand_computed(weights, expected) -> None:
    got = cohen_kappa_from_confusion(np.array(WEIGHTED_TABLE), weights)
    assert got == pytest.approx(float(expected), abs=1e-14)
    a, b = expand_table(WEIGHTED_TABLE, [1, 2, 3])
    assert cohen_kappa(a, b, weights=weights) == pytest.approx(float(expected), abs=1e-14)
    assert sk_kappa(a, b, weights=weights) == pytest.approx(float(expected), abs=1e-14)


def test_weighted_kappa_uses_the_declared_scale() -> None:
    # Only 1, 2 and 5 are used on a 1..5 scale; positions 0, 1, 4 on the declared scale.
    # Pairs (a, b): |d| = 1,0,0,4,0,3,4,3 -> observed 15; marginals a (3,2,3), b (2,3,3)
    # at positions (0,1,4): expected (3*(3+12) + 2*(2+9) + 3*(8+9))/8 = 118/8;
    # kappa = 1 - 15/(118/8) = -1/59. On the observed labels only (positions 0,1,2):
    # observed 7, expected 58/8, kappa = 1/29 -- a different number.
    a = [1, 2, 5, 5, 1, 2, 1, 5]
    b = [2, 2, 5, 1, 1, 5, 5, 2]
    scale = [1, 2, 3, 4, 5]
    assert cohen_kappa(a, b, weights="linear", categories=scale) == pytest.approx(-1 / 59, abs=1e-15)
    assert sk_kappa(a, b, weights="linear", labels=scale) == pytest.approx(-1 / 59, abs=1e-15)
    assert cohen_kappa(a, b, weights="linear") == pytest.approx(1 / 29, abs=1e-15)
    assert sk_kappa(a, b, weights="linear") == pytest.approx(1 / 29, abs=1e-15)


def test_kappa_constant_raters_convention() -> None:
    # Both raters constant on the same label: p_e = 1, 0/0. sklearn says NaN; we say undefined,
    # or 1.0 under the CIRCUS convention (constant_pairs="one").
    assert math.isnan(sk_kappa(["x"] * 5, ["x"] * 5))
    assert isinstance(cohen_kappa(["x"] * 5, ["x"] * 5), Undefined)
    assert isinstance(cohen_kappa(["x"] * 5, ["x"] * 5, categories=["x", "y"], weights="linear"), Undefined)
    assert cohen_kappa(["x"] * 5, ["x"] * 5, constant_pairs="one") == 1.0
    assert cohen_kappa(["x"] * 5, ["x"] * 5, categories=["x", "y"], weights="linear", constant_pairs="one") == 1.0
    # Constant but different: p_o = 0, p_e = 0, kappa = 0 (well defined, sklearn agrees).
    assert cohen_kappa(["x"] * 5, ["y"] * 5) == 0.0
    assert sk_kappa(["x"] * 5, ["y"] * 5) == 0.0
    # One rater constant, the other not: p_o = p_e = 4/5, kappa = 0.
    assert cohen_kappa(["x"] * 5, ["x"] * 4 + ["y"]) == pytest.approx(0.0, abs=1e-15)
    # No shared item at all.
    assert isinstance(cohen_kappa(["x", None], [None, "x"]), Undefined)


@pytest.mark.parametrize("weights", [None, "linear", "quadratic"])
def test_pairwise_numpy_matches_sklearn_reference(weights) -> None:
    rng = np.random.default_rng(7)
    n_raters, n_items, k = 6, 80, 5
    truth = rng.integers(0, k, size=n_items)
    codes = np.where(rng.random((n_raters, n_items)) < 0.6, truth, rng.integers(0, k, size=(n_raters, n_items)))
    codes[rng.random((n_raters, n_items)) < 0.3] = -1  # missing ratings
    codes[4, :] = np.where(codes[4] >= 0, 2, -1)  # a constant rater
    codes[5, :] = np.where(codes[5] >= 0, 2, -1)  # another one on the same label -> 1.0
    codes[3, 40:] = -1
    codes[0, :40] = -1  # raters 0 and 3 share no item
    ratings = Ratings.from_dense(codes, raters=[f"r{i}" for i in range(n_raters)], categories=[1, 2, 3, 4, 5])
    fast = pairwise_cohen_kappa(ratings, weights)
    ref = pairwise_cohen_kappa_sklearn(ratings, weights)
    assert [(p.rater_a, p.rater_b) for p in fast] == [(p.rater_a, p.rater_b) for p in ref]
    assert ("r0", "r3") not in {(p.rater_a, p.rater_b) for p in fast}
    assert len(fast) == 14
    for f, r in zip(fast, ref):
        assert f.kappa == pytest.approx(r.kappa, abs=1e-12)
        assert f.n_shared == r.n_shared
        assert f.constant_identical == r.constant_identical
    const = [p for p in fast if (p.rater_a, p.rater_b) == ("r4", "r5")][0]
    assert const.constant_identical and const.kappa is None
    one = {(p.rater_a, p.rater_b): p.kappa for p in pairwise_cohen_kappa(ratings, weights, "one")}
    assert one == pytest.approx(
        {(p.rater_a, p.rater_b): p.kappa for p in pairwise_cohen_kappa_sklearn(ratings, weights, "one")}, abs=1e-12
    )
    assert one[("r4", "r5")] == 1.0


# --------------------------------------------------------------------------- Fleiss

# Fleiss (1971) example as reproduced in Wikipedia "Fleiss' kappa": 10 subjects,
# 14 raters, 5 categories; P-bar = 0.378, P_e = 0.213, kappa = 0.210.
FLEISS_TABLE = [
    [0, 0, 0, 0, 14],
    [0, 2, 6, 4, 2],
    [0, 0, 3, 5, 6],
    [0, 3, 9, 2, 0],
    [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0],
    [3, 2, 6, 3, 0],
    [2, 5, 3, 2, 2],
    [6, 5, 2, 1, 0],
    [0, 2, 2, 3, 7],
]


def fleiss_exact(table: list[list[int]]) -> Fraction:
    """Fleiss' kappa in exact rational arithmetic (independent of the module)."""
    n = sum(table[0])
    big_n = len(table)
    p_j = [Fraction(sum(row[j] for row in table), big_n * n) for j in range(len(table[0]))]
    p_i = [Fraction(sum(c * c for c in row) - n, n * (n - 1)) for row in table]
    p_bar = sum(p_i) / big_n
    p_e = sum(p * p for p in p_j)
    return (p_bar - p_e) / (1 - p_e)


def test_fleiss_wikipedia_example() -> None:
    exact = fleiss_exact(FLEISS_TABLE)
    assert round(float(exact), 3) == 0.210
    assert fleiss_kappa_from_counts(np.array(FLEISS_TABLE)) == pytest.approx(float(exact), abs=1e-14)
    # Same through Ratings: rater identities do not matter to Fleiss' kappa.
    triples = []
    for item, row in enumerate(FLEISS_TABLE):
        labels = [cat for cat, n in enumerate(row, start=1) for _ in range(n)]
        triples += [(item, slot, lab) for slot, lab in enumerate(labels)]
    ratings = Ratings.from_triples(triples)
    assert fleiss_kappa(ratings) == pytest.approx(float(exact), abs=1e-14)
    # percent agreement = Fleiss' P-bar = 0.378 (Wikipedia, rounded)
    assert percent_agreement(ratings) == pytest.approx(0.378, abs=5e-4)


def test_fleiss_not_applicable_with_unequal_ratings() -> None:
    triples = [(1, "a", "x"), (1, "b", "x"), (2, "a", "x"), (2, "b", "y"), (2, "c", "y")]
    value = fleiss_kappa(Ratings.from_triples(triples))
    assert isinstance(value, Undefined) and value.not_applicable
    report = agreement_report(triples, n_boot=0)
    assert report["fleiss_kappa"] is None
    assert "not applicable" in report["undefined"]["fleiss_kappa"]


# --------------------------------------------------------------------------- Krippendorff

# Krippendorff, K. (2011). "Computing Krippendorff's Alpha-Reliability", Annenberg School
# for Communication, University of Pennsylvania: the worked reliability-data example with
# 4 observers x 12 units and missing values. Published: nominal 0.743, ordinal 0.815,
# interval 0.849, ratio 0.797. Each is also recomputed exactly below (alpha_exact).
K_DATA = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
    [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
]
K_PUBLISHED = {"nominal": 0.743, "ordinal": 0.815, "interval": 0.849, "ratio": 0.797}


def alpha_exact(data: list[list[int | None]], level: str) -> Fraction:
    """Krippendorff's alpha from its definition, in exact rationals (test-local).

    o_ck = sum over units u of (pairs of values c, k in u) / (m_u - 1); n_c = sum_k o_ck;
    alpha = 1 - (n - 1) * sum o_ck d_ck / sum_c sum_k n_c n_k d_ck.
    """
    values = sorted({v for row in data for v in row if v is not None})
    o = {(c, k): Fraction(0) for c in values for k in values}
    for u in range(len(data[0])):
        vals = [row[u] for row in data if row[u] is not None]
        m = len(vals)
        if m < 2:
            continue
        for i in range(m):
            for j in range(m):
                if i != j:
                    o[(vals[i], vals[j])] += Fraction(1, m - 1)
    n_c = {c: sum(o[(c, k)] for k in values) for c in values}
    n = sum(n_c.values())

    def d(c: int, k: int) -> Fraction:
        if level == "nominal":
            return Fraction(int(c != k))
        if level == "ordinal":
            lo, hi = min(c, k), max(c, k)
            between = sum(n_c[g] for g in values if lo <= g <= hi)
            return (between - (n_c[c] + n_c[k]) / 2) ** 2
        if level == "interval":
            return Fraction(c - k) ** 2
        return (Fraction(c - k) / (c + k)) ** 2

    observed = sum(o[(c, k)] * d(c, k) for c in values for k in values)
    expected = sum(n_c[c] * n_c[k] * d(c, k) for c in values for k in values)
    return 1 - (n - 1) * observed / expected


@pytest.mark.parametrize("level", LEVELS)
def test_krippendorff_published_example(level) -> None:
    triples = [(u, coder, K_DATA[coder][u]) for coder in range(4) for u in range(12)]
    ratings = Ratings.from_triples(triples)
    assert ratings.n_items == 12 and ratings.n_ratings == 41  # 40 pairable: unit 12 has one value
    exact = alpha_exact(K_DATA, level)
    assert round(float(exact), 3) == K_PUBLISHED[level]
    got = krippendorff_alpha(ratings, level)
    assert got == pytest.approx(float(exact), abs=1e-12)
    internal = krippendorff_alpha_from_counts(ratings.counts(), level, [1, 2, 3, 4, 5], method="internal")
    assert internal == pytest.approx(float(exact), abs=1e-12)


def test_krippendorff_nominal_exact_fraction() -> None:
    # Krippendorff (2011), nominal: alpha = 1 - (n - 1) D_o / D_e = 0.743 (= 113/152 exactly).
    assert alpha_exact(K_DATA, "nominal") == Fraction(113, 152)


@pytest.mark.parametrize("level", LEVELS)
def test_krippendorff_internal_matches_package_on_random_data(level) -> None:
    rng = np.random.default_rng(3)
    counts = rng.multinomial(4, [0.1, 0.2, 0.4, 0.2, 0.1], size=60)
    counts[::7] = 0
    counts[::7, 2] = 1  # some units with a single rating
    domain = [1.0, 2.0, 4.0, 7.0, 11.0]
    pkg = krippendorff_alpha_from_counts(counts, level, domain, method="package")
    own = krippendorff_alpha_from_counts(counts, level, domain, method="internal")
    assert isinstance(pkg, float)
    assert own == pytest.approx(pkg, abs=1e-12)


# --------------------------------------------------------------------------- Gwet, percent


def test_gwet_ac1_two_raters_hand_computed() -> None:
    # 10 items, 2 raters: both yes 6, both no 2, one disagreement each way.
    # p_a = 8/10; pi_yes = (7 + 7)/20 = 0.7, pi_no = 0.3; p_e = (0.7*0.3 + 0.3*0.7)/(2-1) = 0.42
    # AC1 = (0.8 - 0.42) / (1 - 0.42) = 19/29.   (Cohen's kappa here: 11/21.)
    a, b = expand_table([[6, 1], [1, 2]], ["yes", "no"])
    triples = [(i, "A", x) for i, x in enumerate(a)] + [(i, "B", x) for i, x in enumerate(b)]
    ratings = Ratings.from_triples(triples)
    assert gwet_ac1(ratings) == pytest.approx(19 / 29, abs=1e-15)
    assert cohen_kappa(a, b) == pytest.approx(11 / 21, abs=1e-15)


def test_gwet_ac1_multi_rater_with_missing_hand_computed() -> None:
    # i1: x x x      -> agreement 1
    # i2: x y -      -> agreement 0
    # i3: y y x      -> c_y = 2: 2*1/(3*2) = 1/3
    # i4: y - -      -> one rating: not in p_a, but in pi (Gwet)
    # p_a = (1 + 0 + 1/3)/3 = 4/9; pi_x = (1 + 1/2 + 1/3 + 0)/4 = 11/24, pi_y = 13/24
    # p_e = 2 * 11/24 * 13/24 = 143/288; AC1 = (4/9 - 143/288)/(1 - 143/288) = -15/145 = -3/29
    triples = [
        ("i1", "A", "x"),
        ("i1", "B", "x"),
        ("i1", "C", "x"),
        ("i2", "A", "x"),
        ("i2", "B", "y"),
        ("i2", "C", None),
        ("i3", "A", "y"),
        ("i3", "B", "y"),
        ("i3", "C", "x"),
        ("i4", "A", "y"),
    ]
    ratings = Ratings.from_triples(triples)
    assert ratings.n_ratings == 9
    assert gwet_ac1(ratings) == pytest.approx(-3 / 29, abs=1e-15)
    # percent agreement over items with >= 2 ratings: (1 + 0 + 1/3)/3; all identical: 1 of 3.
    assert percent_agreement(ratings) == pytest.approx(4 / 9, abs=1e-15)
    assert all_identical_rate(ratings) == pytest.approx(1 / 3, abs=1e-15)
    # prevalence over all 9 ratings: x in i1 (3), i2 (1), i3 (1) = 5; y = 4
    assert label_prevalence(ratings) == pytest.approx({"x": 5 / 9, "y": 4 / 9})


def test_gwet_uses_declared_scale() -> None:
    counts = np.array([[2, 0], [2, 0], [2, 0]])
    assert gwet_ac1_from_counts(counts) == 1.0  # Q = 2, no disagreement: p_e = 0
    assert isinstance(gwet_ac1_from_counts(counts[:, :1]), Undefined)  # Q = 1


# --------------------------------------------------------------------------- undefined cases


def test_all_ratings_identical_is_undefined_not_zero() -> None:
    triples = [(i, r, "same") for i in range(5) for r in ("a", "b", "c")]
    ratings = Ratings.from_triples(triples)
    for value in (fleiss_kappa(ratings), gwet_ac1(ratings)):
        assert isinstance(value, Undefined)
    for level in ("nominal", "ordinal"):
        assert isinstance(krippendorff_alpha(ratings, level), Undefined)
    assert percent_agreement(ratings) == 1.0
    assert all(p.kappa is None and p.constant_identical for p in pairwise_cohen_kappa(ratings))
    assert all(p.kappa == 1.0 for p in pairwise_cohen_kappa(ratings, None, "one"))

    report = agreement_report(triples, n_boot=20)
    json.dumps(report, allow_nan=False)  # raises on any NaN or infinity
    for key in ("krippendorff_alpha", "fleiss_kappa", "gwet_ac1"):
        assert report[key] is None
        assert "no variation" in report["undefined"][key] or "fewer than two" in report["undefined"][key]
    assert report["percent_agreement"] == 1.0
    pc = report["pairwise_cohen"]
    assert (pc["count"], pc["n_undefined"], pc["n_pairs"], pc["mean"]) == (0, 3, 3, None)
    assert set(pc["by_pair"].values()) == {None} and "pairwise_cohen" in report["undefined"]
    assert report["confidence_intervals"]["intervals"]["krippendorff_alpha"] is None
    assert any("undefined" in c and "constant" in c for c in report["conventions"])


def test_constant_pairs_one_and_ac1_with_the_rubric_categories() -> None:
    triples = [(i, r, "same") for i in range(5) for r in ("a", "b", "c")]
    # The CIRCUS convention: such pairs count as 1.0.
    one = agreement_report(triples, n_boot=0, constant_pairs="one")
    assert one["pairwise_cohen"]["count"] == 3 and one["pairwise_cohen"]["mean"] == 1.0
    assert any("1.0" in c for c in one["conventions"])
    # Gwet's AC1 with the rubric's two categories is defined when every rating agrees:
    # p_a = 1, pi = (1, 0), p_e = 0, AC1 = 1. This is the case AC1 exists for.
    declared = agreement_report(triples, n_boot=0, categories=["same", "other"])
    assert declared["gwet_ac1"] == 1.0 and declared["n_categories"] == 2


def test_no_item_with_two_ratings() -> None:
    triples = [(1, "a", "x"), (2, "b", "y"), (3, "a", "y")]
    report = agreement_report(triples, n_boot=0)
    assert report["n_items"] == 0 and report["n_items_excluded"] == 3
    assert report["krippendorff_alpha"] is None and report["percent_agreement"] is None
    assert report["pairwise_cohen"] == {
        "count": 0,
        "n_undefined": 0,
        "n_pairs": 0,
        "mean": None,
        "median": None,
        "min": None,
        "max": None,
        "weights": "none",
        "constant_pairs": "undefined",
        "by_pair": {},
        "shared_items_by_pair": {},
    }
    assert to_json_value(Undefined("x")) is None and to_json_value(0.5) == 0.5


# --------------------------------------------------------------------------- Ratings


def test_ratings_construction_rules() -> None:
    with pytest.raises(ValueError, match="more than once"):
        Ratings.from_triples([(1, "a", "x"), (1, "a", "y")])
    with pytest.raises(ValueError, match="not among the given categories"):
        Ratings.from_triples([(1, "a", "z")], categories=["x", "y"])
    with pytest.raises(ValueError, match="not in the given raters"):
        Ratings.from_triples([(1, "a", "x")], raters=["b"])
    with pytest.raises(ValueError, match="triple"):
        Ratings.from_triples([(1, "a")])
    r = Ratings.from_triples([(1, "b", "y"), (1, "a", None), (2, "a", float("nan")), (2, "b", "x"), (1, "c", "x")])
    assert r.n_ratings == 3 and r.raters == ("b", "c") and r.categories == ("x", "y")
    r2 = Ratings.from_triples([(1, "b", "y"), (1, "a", "x")], raters=["b", "a"])
    assert r2.raters == ("b", "a")
    assert r2.dense().tolist() == [[1], [0]]


def test_take_items_resamples_whole_items() -> None:
    r = Ratings.from_triples([(1, "a", "x"), (1, "b", "y"), (2, "a", "x"), (3, "b", "y"), (3, "a", "y")])
    s = r.take_items(np.array([2, 2, 0]))
    assert s.n_items == 3 and s.n_ratings == 6
    assert s.counts().tolist() == [[0, 2], [0, 2], [1, 1]]
    assert r.min_ratings(2).n_items == 2


# --------------------------------------------------------------------------- bootstrap


def test_bootstrap_is_seeded_and_brackets_the_estimate() -> None:
    rng = np.random.default_rng(11)
    truth = rng.integers(0, 3, size=120)
    triples = [
        (i, r, int(truth[i]) if rng.random() < 0.8 else int(rng.integers(0, 3)))
        for i in range(120)
        for r in ("a", "b", "c")
    ]
    ratings = Ratings.from_triples(triples)
    point = krippendorff_alpha(ratings)
    ci1 = bootstrap_ci(ratings, krippendorff_alpha, n_boot=300, seed=5)
    ci2 = bootstrap_ci(ratings, krippendorff_alpha, n_boot=300, seed=5)
    ci3 = bootstrap_ci(ratings, krippendorff_alpha, n_boot=300, seed=6)
    assert isinstance(ci1, Interval) and ci1 == ci2 and ci1 != ci3
    assert ci1.low < point < ci1.high and ci1.n_valid == 300
    # The percentile rule by hand: same resamples, quantiles 2.5% / 97.5%.
    gen = np.random.default_rng(5)
    values = [krippendorff_alpha(ratings.take_items(gen.integers(0, 120, size=120))) for _ in range(300)]
    assert ci1.low == pytest.approx(np.quantile(values, 0.025), abs=1e-15)
    assert ci1.high == pytest.approx(np.quantile(values, 0.975), abs=1e-15)


def test_bootstrap_undefined_everywhere() -> None:
    ratings = Ratings.from_triples([(i, r, "x") for i in range(4) for r in "ab"])
    assert isinstance(bootstrap_ci(ratings, krippendorff_alpha, n_boot=10), Undefined)


# --------------------------------------------------------------------------- validity


def test_validity_signatures() -> None:
    assert validity_signature("VALIDATED") == "VALID"
    assert validity_signature(["QUERY_TOO_BROAD", "INVALID_TEXT_QUERY"]) == "INVALID_TEXT_QUERY+QUERY_TOO_BROAD"
    assert validity_signature(list(reversed(FLAGS))) == "+".join(FLAGS)
    assert validity_signature([]) == "INVALID_UNSPECIFIED"
    assert validity_signature(None) is None
    for bad in ("INVALID_TEXT_QUERY", ["NOPE"], 3):
        with pytest.raises(ValueError):
            validity_signature(bad)
    assert label_from_signature("VALID") == "VALIDATED"
    assert label_from_signature("INVALID_UNSPECIFIED") == []
    assert label_from_signature("INVALID_IMAGE_QUERY+QUERY_TOO_BROAD") == ["INVALID_IMAGE_QUERY", "QUERY_TOO_BROAD"]
    with pytest.raises(ValueError):
        label_from_signature("INVALID_FOO")


def test_validity_blocks_hand_computed() -> None:
    t, b, g = "INVALID_TEXT_QUERY", "QUERY_TOO_BROAD", "INVALID_TARGET_IMAGE"
    triples = [
        # item 1: all VALID -> unanimous valid, exact
        ("i1", "A", "VALIDATED"),
        ("i1", "B", "VALIDATED"),
        ("i1", "C", "VALIDATED"),
        # item 2: all invalid, same signature -> exact invalid
        ("i2", "A", [b]),
        ("i2", "B", [b]),
        ("i2", "C", [b]),
        # item 3: all invalid, different signatures
        ("i3", "A", [t, b]),
        ("i3", "B", [b]),
        ("i3", "C", []),
        # item 4: mixed valid / invalid
        ("i4", "A", "VALIDATED"),
        ("i4", "B", [g]),
        ("i4", "C", "VALIDATED"),
    ]
    sig = validity_ratings(triples)
    rates = validity_rates(sig)
    assert rates == {
        "exact_agreement_rate": 0.5,
        "unanimous_valid_invalid_rate": 0.75,
        "exact_invalid_signature_rate": 0.5,
    }
    binary = binary_valid_ratings(sig)
    assert binary.counts().tolist() == [[0, 3], [3, 0], [3, 0], [1, 2]]
    broad = flag_ratings(sig, b)
    assert broad.counts()[:, 1].tolist() == [0, 3, 2, 0]
    report = agreement_report(triples, rubric="validity", n_boot=0)
    assert report["per_flag_agreement"][b]["positive_rate"] == pytest.approx(5 / 12)
    assert report["per_flag_agreement"][t]["positive_rate"] == pytest.approx(1 / 12)
    assert report["binary_valid_invalid"]["valid_rate"] == pytest.approx(5 / 12)
    assert report["binary_valid_invalid"]["n_items"] == 4 and report["binary_valid_invalid"]["n_raters"] == 3
    assert report["signature_alpha_nominal"] == report["krippendorff_alpha"]
    # Fleiss on the binary table by hand: counts [0,3],[3,0],[3,0],[1,2] (invalid, valid);
    # p = (7/12, 5/12); P_i = 1, 1, 1, 1/3; P-bar = 5/6; P_e = 74/144; kappa = (5/6 - 74/144)/(70/144) = 23/35
    assert report["binary_valid_invalid"]["fleiss_kappa"] == pytest.approx(23 / 35, abs=1e-14)
    json.dumps(report, allow_nan=False)


def test_validity_rate_undefined_without_unanimous_invalid() -> None:
    triples = [("i1", "A", "VALIDATED"), ("i1", "B", ["QUERY_TOO_BROAD"])]
    report = agreement_report(triples, rubric="validity", n_boot=0)
    assert report["binary_valid_invalid"]["exact_invalid_signature_rate"] is None
    assert "binary_valid_invalid.exact_invalid_signature_rate" in report["undefined"]


# --------------------------------------------------------------------------- report


def test_generic_ordinal_report_shape() -> None:
    rng = np.random.default_rng(1)
    triples = [
        (i, r, int(rng.integers(1, 6))) for i in range(30) for r in ("ann1", "ann2", "ann3") if rng.random() < 0.9
    ]
    report = agreement_report(triples, level="ordinal", categories=[1, 2, 3, 4, 5], n_boot=50, seed=3)
    for key in (
        "n_items",
        "n_annotators",
        "percent_agreement",
        "krippendorff_alpha",
        "fleiss_kappa",
        "gwet_ac1",
        "pairwise_cohen",
        "label_prevalence",
        "conventions",
        "undefined",
        "confidence_intervals",
    ):
        assert key in report
    pc = report["pairwise_cohen"]
    assert set(pc) >= {"count", "mean", "median", "min", "max", "by_pair"}
    assert pc["weights"] == "quadratic"  # default_kappa_weights("ordinal")
    assert list(pc["by_pair"]) == ["ann1__ann2", "ann1__ann3", "ann2__ann3"]
    ratings = Ratings.from_triples(triples, categories=[1, 2, 3, 4, 5]).min_ratings(2)
    ref = pairwise_cohen_kappa_sklearn(ratings, "quadratic")
    assert [pc["by_pair"][f"{p.rater_a}__{p.rater_b}"] for p in ref] == pytest.approx([p.kappa for p in ref], abs=1e-12)
    expected = summarize([p.kappa for p in ref])
    assert {k: pc[k] for k in expected} == pytest.approx(expected, abs=1e-12)
    assert report["krippendorff_alpha"] == pytest.approx(krippendorff_alpha(ratings, "ordinal"))
    assert set(report["label_prevalence"]) == {"1", "2", "3", "4", "5"}
    intervals = report["confidence_intervals"]["intervals"]
    assert intervals["krippendorff_alpha"]["n_boot"] == 50
    json.dumps(report, allow_nan=False)


def test_pair_keys_follow_given_rater_order() -> None:
    triples = [(i, r, (i + (r == "z")) % 2) for i in range(6) for r in ("z", "a", "m")]
    report = agreement_report(triples, raters=["z", "a", "m"], n_boot=0)
    assert list(report["pairwise_cohen"]["by_pair"]) == ["z__a", "z__m", "a__m"]
    assert report["annotators"] == ["z", "a", "m"]
    by_pair = report["pairwise_cohen"]["by_pair"]
    assert by_pair["a__m"] == 1.0 and by_pair["z__a"] == pytest.approx(-1.0)
    assert [f"{a}__{b}" for a, b in combinations(["z", "a", "m"], 2)] == list(by_pair)
