"""bench/audit.py explains each rank where the naive way and the audit differ by the score gap
of the near-tie that reorders (its naive ranking uses the tests' reference rule, pessimistic ties)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np

_spec = importlib.util.spec_from_file_location(
    "bench_audit", Path(__file__).resolve().parents[2] / "bench" / "audit.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

# item 0 excluded (the reference); the positive is item 3; item 1 scores 1e-7 above it, item 2 8e-7 below
SCORES = np.array([0.99, 0.5000001, 0.4999992, 0.5, 0.9, 0.1], dtype=np.float64)


def test_the_naive_rank_itself_needs_no_gap():
    assert bench.tie_gap(SCORES, [3], 0, 3) == 0.0


def test_a_better_or_worse_rank_is_explained_by_the_nearest_items_gap():
    assert math.isclose(bench.tie_gap(SCORES, [3], 0, 2), 1e-7, rel_tol=1e-6)  # passes item 1
    assert math.isclose(bench.tie_gap(SCORES, [3], 0, 4), 8e-7, rel_tol=1e-6)  # falls behind item 2
    assert math.isclose(bench.tie_gap(SCORES, [3], 0, 1), 0.4, rel_tol=1e-6)  # passes item 4 too: no near-tie
    assert bench.tie_gap(SCORES, [3], 0, 6) == math.inf  # there is no sixth place without the reference
    assert bench.tie_gap(SCORES, [3], 0, None) == math.inf


def test_an_exact_tie_ranked_optimistically_shows_as_gap_zero():
    scores = np.array([0.2, 0.7, 0.7, 0.1])
    assert bench.naive_rank_one_scores(scores, [2], None) == 2  # pessimistic: after the item it ties with
    assert bench.tie_gap(scores, [2], None, 1) == 0.0


def test_with_several_positives_a_worse_rank_moves_every_better_one():
    scores = np.array([0.9, 0.8, 0.79999, 0.7, 0.69999])
    # positives 1 (rank 2) and 3 (rank 4): best rank 2; best rank 3 needs item 1 behind item 2 only
    assert math.isclose(bench.tie_gap(scores, [1, 3], None, 3), 1e-5, rel_tol=1e-4)
