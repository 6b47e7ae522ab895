"""Which candidates an annotator was shown: a page with a tick opens the next one (issue 25)."""

from __future__ import annotations

import pytest

from annotation.alternatives.agreement import candidate_units
from annotation.alternatives.paging import PAGE_SIZE, pages_shown, reachable, shown_candidates

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


def test_reachable_follows_the_page_rules_ticking_every_fit_shown() -> None:
    """Issue 39, item 1: an annotator who ticks every fitting candidate shown and opens no page
    at will reaches page 1, then each next page while the page before brought a tick."""
    assert reachable(PANEL, {101, 105, 112, 123}) == [101, 105, 112, 123]  # pages 1, 2, 3 each bring one
    assert reachable(PANEL, {101, 125}) == [101]  # page 2 brings none: page 3 is never opened
    assert reachable(PANEL, {112}) == []  # nothing on page 1: the annotator stops there
    assert reachable(PANEL, {101, 111, 121, 131}) == [101, 111, 121, 131]  # down to the panel's depth
    assert reachable([], {1}) == []
    # what was reached is exactly what the page's own rule shows for those ticks
    ticks = reachable(PANEL, {101, 105, 112, 125})
    assert set(shown_candidates(PANEL, ticks)) >= set(ticks) and pages_shown(PANEL, ticks) == 4  # all four
