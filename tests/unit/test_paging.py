"""Which candidates an annotator was shown: a page with a tick opens the next one (issue 25)."""
from __future__ import annotations

import pytest

from annotation.alternatives.agreement import candidate_units
from annotation.alternatives.paging import PAGE_SIZE, pages_shown, shown_candidates

PANEL = list(range(100, 135))  # 35 candidates: pages of 10, 10, 10, 5


def test_a_page_with_a_tick_opens_the_next_up_to_the_depth() -> None:
    assert PAGE_SIZE == 10
    assert pages_shown(PANEL, []) == 1  # no tick: the first page only
    assert pages_shown(PANEL, [103]) == 2
    assert pages_shown(PANEL, [103, 111]) == 3
    assert pages_shown(PANEL, [103, 111, 125]) == 4 == pages_shown(PANEL, [134])  # the depth: no fifth page
    assert pages_shown(PANEL, [999]) == 1  # not a candidate
    assert pages_shown([], [1]) == 0
    assert shown_candidates(PANEL, [109]) == PANEL[:20]
    assert shown_candidates(PANEL, [105], page_size=15) == PANEL[:30]
    assert shown_candidates(PANEL, [120], page_size=15) == PANEL
    with pytest.raises(ValueError):
        pages_shown(PANEL, [], page_size=0)


def test_agreement_rates_only_the_candidates_shown() -> None:
    ticks = {"i": {"a": [100], "b": [], "c": [112]}}
    every = candidate_units({"i": PANEL}, ticks)
    shown = candidate_units({"i": PANEL}, ticks, PAGE_SIZE)
    assert len(every) == 3 * 35
    by = {a: [u for u, who, _ in shown if who == a] for a in "abc"}
    assert [len(by[a]) for a in "abc"] == [20, 10, 30]
    assert sorted(u for u, who, v in shown if v) == ["i:100", "i:112"]
