"""The leaderboard's pure maths: Kendall's tau-b, ranks, the query bootstrap, the table."""

from __future__ import annotations

import pytest
from scipy.stats import kendalltau

from audit.leaderboard.scoring import (
    FULL,
    GENERIC,
    SHORTCUT_FREE_SET,
    VALIDATED,
    VALIDATED_ALTERNATIVES,
    EntryRanks,
    build_table,
    with_alternatives,
)
from audit.leaderboard.stats import bootstrap, kendall_tau_b, rank_changes, ranks
from retrieval.protocols import PROTOCOLS, QueryRanks, figures


@pytest.mark.parametrize(
    "x,y",
    [
        ([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]),
        ([0.31, 0.2, 0.2, 0.5, 0.4, 0.1], [0.3, 0.25, 0.1, 0.1, 0.45, 0.2]),
        ([3, 1, 2], [1, 2, 3]),
        ([1, 1, 2, 2], [2, 1, 1, 2]),
    ],
)
def test_tau_b_equals_scipy(x, y):
    assert kendall_tau_b(x, y) == pytest.approx(kendalltau(x, y).statistic)


def test_tau_b_undefined_for_a_constant_sequence():
    assert kendall_tau_b([1, 1, 1], [1, 2, 3]) is None


def test_ranks_share_ties_and_changes_count_climbs():
    assert ranks({"a": 0.5, "b": 0.7, "c": 0.5, "d": None}) == {"a": 2, "b": 1, "c": 2, "d": None}
    changes = rank_changes({"a": 0.5, "b": 0.7, "c": 0.1}, {"a": 0.9, "b": 0.2, "c": 0.3})
    assert changes["a"] == {"before": 2, "after": 1, "change": 1}
    assert changes["b"] == {"before": 1, "after": 3, "change": -2}


def _entries(n=40):
    good = EntryRanks({q: QueryRanks([1 if q % 3 else 20]) for q in range(n)})
    bad = EntryRanks({q: QueryRanks([5 if q % 2 else 60]) for q in range(n)}, alternatives={q: [2] for q in range(n)})
    return {"good": good, "bad": bad}


def _sets(n=40):
    return {
        FULL: list(range(n)),
        SHORTCUT_FREE_SET: list(range(0, n, 2)),
        VALIDATED: list(range(1, n, 2)),
        VALIDATED_ALTERNATIVES: list(range(1, n, 2)),
    }


def test_table_cells_are_the_protocol_figures_and_alternatives_add_positives():
    t = build_table(GENERIC, "R@10", _sets(), _entries(), n_boot=50, seed=1)
    full = [QueryRanks([1 if q % 3 else 20]) for q in range(40)]
    assert t.values[("good", FULL)] == figures(GENERIC, full, True)["R@10"]
    assert t.values[("bad", VALIDATED)] == 1.0 and t.values[("bad", SHORTCUT_FREE_SET)] == 0.0
    assert t.values[("bad", VALIDATED_ALTERNATIVES)] == 1.0
    assert t.gaps[("good", FULL)] is None  # no text-only / image-only ranks
    assert t.changes["bad"]["change"] == 1 and t.changes["good"]["change"] == -1
    assert t.tau == pytest.approx(-1.0)


def test_bootstrap_is_reproducible_with_a_seed_and_brackets_the_value():
    a = build_table(GENERIC, "R@10", _sets(), _entries(), n_boot=200, seed=7)
    b = build_table(GENERIC, "R@10", _sets(), _entries(), n_boot=200, seed=7)
    c = build_table(GENERIC, "R@10", _sets(), _entries(), n_boot=200, seed=8)
    assert a.uncertainty.cells == b.uncertainty.cells and a.uncertainty.differences == b.uncertainty.differences
    assert a.uncertainty.cells != c.uncertainty.cells
    low, high = a.uncertainty.cells[("good", FULL)]
    assert low <= a.values[("good", FULL)] <= high and low < high
    d_low, d_high = a.uncertainty.differences[("bad", VALIDATED)]
    assert d_low <= a.values[("bad", VALIDATED)] - a.values[("bad", FULL)] <= d_high


def test_paired_difference_uses_the_same_queries():
    # the validated set is every query: the paired difference is exactly 0 in every replicate
    sets = {FULL: list(range(30)), VALIDATED: list(range(30))}
    entries = {"e": EntryRanks({q: QueryRanks([q % 12 + 1]) for q in range(30)})}
    t = build_table(GENERIC, "R@10", sets, entries, n_boot=100, seed=3)
    assert t.uncertainty.differences[("e", VALIDATED)] == (0.0, 0.0)


def test_bootstrap_statistic_sees_resampled_positions():
    seen = []
    bootstrap(5, ["e"], [FULL], lambda e, s, drawn: seen.append(list(drawn)) or 0.0, n_boot=3, seed=0)
    assert len(seen) == 3 and all(len(d) == 5 and all(0 <= i < 5 for i in d) for d in seen)


def test_alternatives_keep_the_reference_order_length():
    q = QueryRanks([4], ahead=[True])
    assert with_alternatives(q, [2]).ahead == [True, None]
    assert figures(PROTOCOLS["circo"], [with_alternatives(q, [2])], True)["mAP@5"] is not None


@pytest.mark.parametrize("key,metric", [("cirr", "Avg"), ("circo", "mAP@10"), ("fashioniq", "R@10"), ("cirr", "R@5")])
def test_a_resample_scores_as_figures_over_the_drawn_queries(key, metric):
    """The bootstrap's shortcut (per-query figures, then their mean) equals figures() itself."""
    import numpy as np

    from audit.leaderboard.scoring import per_query, resampled

    protocol = PROTOCOLS[key]
    rng = np.random.default_rng(5)
    queries = {
        q: QueryRanks(
            [int(rng.integers(1, 30)), None, int(rng.integers(1, 80))],
            (),
            0,
            int(rng.integers(1, 4)),
            ("dress", "shirt", "toptee")[q % 3],
        )
        for q in range(60)
    }
    entry = EntryRanks(queries, audited_removed=True)
    order = list(queries)
    values = np.array(per_query(protocol, entry, FULL, order, metric), dtype=float)
    categories = np.array([queries[q].category for q in order], dtype=object)
    for _ in range(5):
        drawn = rng.integers(0, 60, size=60)
        counts = np.bincount(drawn, minlength=60)
        expected = figures(protocol, [queries[order[i]] for i in drawn], True)[metric]
        assert resampled(values, categories, counts, protocol.per_category) == pytest.approx(expected, abs=1e-12)
