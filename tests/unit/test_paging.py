"""Which candidates an annotator was shown: the first two pages are open, and a page with a
tick opens the two after it (issues 25 and 39)."""

from __future__ import annotations

import pytest

from annotation.alternatives.agreement import candidate_units
from annotation.alternatives.paging import PAGE_SIZE, PAGES_AHEAD, pages_shown, reachable, shown_candidates

PANEL = list(range(100, 145))  # 45 candidates: pages of 10, 10, 10, 10, 5


def test_a_page_with_a_tick_opens_the_two_after_it_up_to_the_depth() -> None:
    assert PAGE_SIZE == 10 and PAGES_AHEAD == 2
    assert pages_shown(PANEL, []) == 2  # no tick: the first two pages
    assert pages_shown(PANEL, [103]) == 3  # a tick on page 1 opens pages 2 and 3
    assert pages_shown(PANEL, [103, 111]) == 4
    assert pages_shown(PANEL, [121]) == 5 == pages_shown(PANEL, [144])  # the depth: no sixth page
    assert pages_shown(PANEL, [999]) == 2  # not a candidate
    assert pages_shown(PANEL[:5], []) == 1  # a one-page panel
    assert pages_shown([], [1]) == 0
    assert pages_shown(PANEL, [103], ahead=1) == 2  # one page ahead: a tick opens the next page only
    assert shown_candidates(PANEL, [109]) == PANEL[:30]
    assert shown_candidates(PANEL, []) == PANEL[:20]
    assert shown_candidates(PANEL, [105], page_size=15) == PANEL
    with pytest.raises(ValueError):
        pages_shown(PANEL, [], page_size=0)
    with pytest.raises(ValueError):
        pages_shown(PANEL, [], ahead=0)


def test_agreement_rates_only_the_candidates_shown() -> None:
    ticks = {"i": {"a": [100], "b": [], "c": [122]}}
    every = candidate_units({"i": PANEL}, ticks)
    shown = candidate_units({"i": PANEL}, ticks, PAGE_SIZE)
    assert len(every) == 3 * 45
    by = {a: [u for u, who, _ in shown if who == a] for a in "abc"}
    assert [len(by[a]) for a in "abc"] == [30, 20, 45]
    assert sorted(u for u, who, v in shown if v) == ["i:100", "i:122"]


def test_reachable_follows_the_page_rules_ticking_every_fit_shown() -> None:
    """Issue 39, item 1: an annotator who ticks every fitting candidate shown and opens no page
    at will reaches pages 1 and 2, then each page while one of the two before it brought a tick."""
    assert reachable(PANEL, {101, 105, 112, 123}) == [101, 105, 112, 123]  # pages 1, 2, 3 each bring one
    assert reachable(PANEL, {101, 125}) == [101, 125]  # page 2 brings none: page 3 is open all the same
    assert reachable(PANEL, {112}) == [112]  # nothing on page 1: page 2 is open from the start
    assert reachable(PANEL, {123}) == []  # pages 1 and 2 bring none: page 3 is never opened
    assert reachable(PANEL, {101, 131}) == [101]  # pages 2 and 3 bring none: page 4 stays closed
    assert reachable(PANEL, {101, 121, 141}) == [101, 121, 141]  # down to the panel's depth
    assert reachable([], {1}) == []
    # what was reached is exactly what the page's own rule shows for those ticks
    ticks = reachable(PANEL, {101, 105, 112, 125, 143})
    assert set(shown_candidates(PANEL, ticks)) >= set(ticks) and pages_shown(PANEL, ticks) == 5  # all five
