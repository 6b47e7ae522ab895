"""Issue 39, item 6: every rubric option, target and scale in view at 1366x768 (and
1920x1080), with nothing clipped by a scrolling column; candidates open at full size and
nothing drawn over them hides any of the image. Item 7 on the same pages: axe-core finds
nothing serious, with a category chosen and with the zoom open too, and every candidate is
reached with Tab and ticked with Space. Screenshots (viewport only: what the annotator sees
without scrolling) in var/screenshots."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from annotation.assignment import queue as engine
from annotation.judging.panel_fill import fill_study_candidates
from annotation.models import Study, StudyItem
from annotation.studies.building import StudySpec, create_study
from audit.runs.encoding import clear_memos
from tests.browser.axe import axe_violations
from tests.browser.conftest import SHOTS, close_tab, login, open_tab, small_demo

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SIZES = [(1366, 768), (1920, 1080)]

# Each element matched by the selector: its box is entirely inside the viewport and inside
# every ancestor that clips its content (a scrolling column clips without a page scroll).
NOT_IN_VIEW = """(sel) => {
  const bad = [];
  for (const el of document.querySelectorAll(sel)) {
    if (!el.getClientRects().length) continue;  // not rendered (a folded part)
    const r = el.getBoundingClientRect();
    const name = (el.id || el.className || el.tagName) + ' ' + (el.textContent || el.alt || '').trim().slice(0, 40);
    if (r.top < 0 || r.left < 0 || r.bottom > innerHeight + 0.5 || r.right > innerWidth + 0.5) {
      bad.push('outside the viewport: ' + name); continue;
    }
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const s = getComputedStyle(p);
      if (s.overflowX === 'visible' && s.overflowY === 'visible') continue;
      const c = p.getBoundingClientRect();
      if (r.top < c.top - 0.5 || r.bottom > c.top + p.clientHeight + 0.5 || r.left < c.left - 0.5 || r.right > c.left + p.clientWidth + 0.5) {
        bad.push('clipped by ' + (p.id || p.className) + ': ' + name); break;
      }
    }
  }
  return bad;
}"""

# Anything drawn over a candidate's image (a button, a number, a tick) hides part of it.
OVER_IMAGES = """() => {
  const bad = [];
  for (const c of document.querySelectorAll('#candgrid .cand:not([hidden])')) {
    const img = c.querySelector('img').getBoundingClientRect();
    for (const el of c.querySelectorAll('*:not(img)')) {
      if (!el.getClientRects().length) continue;
      const r = el.getBoundingClientRect();
      const overlap = Math.min(r.right, img.right) - Math.max(r.left, img.left) > 0.5 &&
                      Math.min(r.bottom, img.bottom) - Math.max(r.top, img.top) > 0.5;
      if (overlap && getComputedStyle(el).position === 'absolute') bad.push(c.dataset.index + ': ' + el.className);
    }
  }
  return bad;
}"""


def not_in_view(page, selector: str) -> list[str]:
    return page.evaluate(NOT_IN_VIEW, selector)


def open_study(browser, base: str, study: Study, user: str, password: str, size: tuple[int, int], ready: str):
    """A tab of the given size, logged in, on the item the study serves the user."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = open_tab(browser, *size)
    login(page, base, user, password)
    page.goto(f"{base}/annotate/{study.pk}/")
    page.wait_for_selector(ready)
    page.wait_for_load_state("networkidle")
    return page


@pytest.fixture
def three_target_study(tmp_path_factory, settings):
    """A small demo world and a validity study with a panel on every item; the annotator holds
    an item whose query has three labelled targets."""
    small_demo(tmp_path_factory, settings, "inview-images", n_gallery=60, n_single=16, n_sessions=2)
    study, _ = create_study(StudySpec(name="inview", datasets=["demo"], overlap=1, annotators=["ann"], candidates=30))
    fill_study_candidates(study.pk)
    item = max(StudyItem.objects.filter(study=study).select_related("query"), key=lambda i: i.query.targets.count())
    assert item.query.targets.count() >= 3
    hold_item(study, "ann", item)
    yield study
    clear_memos()


@pytest.mark.parametrize("width,height", SIZES)
def test_validity_rubric_targets_and_candidates_in_view(browser, live_server, three_target_study, width, height):
    page = open_study(
        browser, live_server.url, three_target_study, "ann", "ann-pw", (width, height), "#candgrid .cand.cursor"
    )
    try:
        assert axe_violations(page) == []
        page.screenshot(path=str(SHOTS / f"inview-validity-{width}x{height}.png"))
        assert page.locator(".targets figure.target").count() >= 3
        always = (
            "label.choice.cat",
            ".targets figure.target img",
            "figure.big img",
            ".caption",
            "#candgrid .cand:not([hidden])",
            "#cand-prev",
            "#cand-next",
            "#none-fit",
            "#note",
            "#flagged",
            "#submit-btn",
            "#skip-btn",
        )
        for sel in always:
            assert not_in_view(page, sel) == [], (sel, width, height)
        assert page.evaluate(OVER_IMAGES) == []  # nothing drawn over any candidate's image
        keys = page.eval_on_selector_all("label.choice.cat", "ls => ls.map(l => l.dataset.key)")
        for key in keys:  # each category chosen in turn: it, its sub-reasons and the rest in view
            page.keyboard.press(key)
            page.wait_for_timeout(150)
            page.screenshot(path=str(SHOTS / f"inview-validity-cat{key}-{width}x{height}.png"))
            subs = page.locator(".subs:not([hidden]) label.choice").count()
            for sel in (
                "label.choice.cat",
                ".subs:not([hidden]) label.choice",
                "#note",
                "#submit-btn",
                ".targets figure.target img",
            ):
                assert not_in_view(page, sel) == [], (key, sel, subs, width, height)
        assert axe_violations(page) == []
        # a candidate opens at full size, whole, beside the labelled target
        page.click("#candgrid .cand[data-index='2'] .cand-zoom")
        page.wait_for_selector("#zoom:not([hidden]) .zoompane img")
        page.wait_for_function("""() => Array.from(document.querySelectorAll('#zoom .zoompane img'))
            .every((i) => i.complete && i.naturalWidth > 0) && document.getElementById('zoom').dataset.scale""")
        page.wait_for_timeout(100)
        assert not_in_view(page, "#zoom .zoompane img") == []
        page.screenshot(path=str(SHOTS / f"inview-candidate-fullsize-{width}x{height}.png"))
        assert axe_violations(page) == []
    finally:
        close_tab(page)


def hold_item(study: Study, username: str, item: StudyItem) -> None:
    """Serve the user the study's items, handing back every other one, until they hold ``item``."""
    user = get_user_model().objects.get(username=username)
    while True:
        served = engine.next_assignment(study, user).assignment
        if served.item_id == item.pk:
            return
        engine.skip(served)


@pytest.mark.parametrize("longest", [False, True], ids=["first", "longest"])
@pytest.mark.parametrize("width,height", SIZES)
def test_session_scales_checks_and_turns_in_view(browser, live_server, demo_world, width, height, longest):
    study = Study.objects.get(name="demo-sessions")
    if longest:  # the demo's longest session (five turns): every frame, check and scale still in view
        items = StudyItem.objects.filter(study=study).select_related("query")
        hold_item(study, "annotator1", max(items, key=lambda i: (i.query.turns.count(), -i.pk)))
    page = open_study(
        browser, live_server.url, study, "annotator1", "annotator1-demo", (width, height), "#judgement-form .scale"
    )
    try:
        assert axe_violations(page) == []
        turns = page.locator(".filmstrip .frame[data-turn]").count()
        page.screenshot(path=str(SHOTS / f"inview-session-{turns}turns-{width}x{height}.png"))
        for sel in (
            ".scale",
            ".scalevals label.choice",
            ".rejects label.choice",
            ".frame",
            ".frame img",
            ".turnchecks label.choice",
            ".turnverdict label.choice",
            "#note",
            "#submit-btn",
        ):
            assert not_in_view(page, sel) == [], (sel, width, height)
        assert "Overall" in page.inner_text(".scales")
        page.keyboard.press("t")  # the Overall scale, then a value: still in view
        page.keyboard.press("4")
        assert page.locator("input[name=scale-overall]:checked").count() == 1
        assert not_in_view(page, ".scale[data-scale=overall]") == []
    finally:
        close_tab(page)


def test_every_candidate_reached_with_tab_and_ticked_with_space(browser, live_server, three_target_study):
    """The keyboard walk: Tab from the page's start reaches every candidate shown (role
    checkbox), Space ticks the focused one, and the next page (open from the start, and kept
    open by a tick) has candidates Tab reaches too."""
    page = open_study(
        browser, live_server.url, three_target_study, "ann", "ann-pw", (1366, 768), "#candgrid .cand.cursor"
    )
    try:
        page.keyboard.press("Tab")
        assert page.evaluate("() => document.activeElement.matches('a.skip')")  # the skip link comes first
        reached = []
        for _ in range(60):
            page.keyboard.press("Tab")
            focused = page.evaluate("""() => { const a = document.activeElement;
                return a.getAttribute('role') === 'checkbox' ? Number(a.closest('.cand').dataset.index) : null; }""")
            if focused is not None and focused not in reached:
                reached.append(focused)
            if len(reached) == 10:
                break
        assert reached == list(range(10))
        page.keyboard.press(" ")  # the tenth, focused: ticked
        assert page.get_attribute("#candgrid .cand[data-index='9'] [role=checkbox]", "aria-checked") == "true"
        page.keyboard.press("Shift+Tab")
        page.keyboard.press(" ")
        assert page.get_attribute("#candgrid .cand[data-index='8'] [role=checkbox]", "aria-checked") == "true"
        page.keyboard.press(" ")  # Space again: untick
        assert page.get_attribute("#candgrid .cand[data-index='8'] [role=checkbox]", "aria-checked") == "false"
        page.click("#cand-next")  # page 2 is open: Tab reaches its candidates from the pager
        page.locator("#candgrid .cand[data-index='10'] [role=checkbox]").focus()
        for i in range(10, 20):
            assert page.evaluate("() => Number(document.activeElement.closest('.cand').dataset.index)") == i
            page.keyboard.press("Tab")
    finally:
        close_tab(page)
