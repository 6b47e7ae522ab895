"""The ETA every job page shows: a pure function of (done, total, elapsed)."""

from __future__ import annotations

import pytest

from retrieval.jobs.job_progress import eta_seconds


def test_eta_is_the_rate_so_far_times_what_is_left():
    assert eta_seconds(30, 120, 10.0) == pytest.approx(30.0)  # a quarter in 10 s: 30 s left
    assert eta_seconds(1, 3, 5.0) == pytest.approx(10.0)
    assert eta_seconds(120, 120, 10.0) == 0.0


def test_no_eta_without_a_rate():
    assert eta_seconds(0, 120, 10.0) is None
    assert eta_seconds(5, 0, 10.0) is None


def test_eta_is_never_negative():
    assert eta_seconds(130, 120, 10.0) == 0.0  # done past an underestimated total
