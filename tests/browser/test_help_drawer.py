"""Issue 39, item 7: the item page's guidelines drawer (?) is read from the keyboard. At
1366x768 the guidelines and the key list are taller than the screen: the drawer's card takes
the focus when it opens, the arrow and page keys scroll it, the page's shortcuts do not act
behind it, Esc gives the focus back, and axe-core finds nothing serious with it open (it found
scrollable-region-focusable before)."""

from __future__ import annotations

import pytest

from annotation.judging.panel_fill import fill_study_candidates
from annotation.studies.building import StudySpec, create_study
from audit.runs.encoding import clear_memos
from tests.browser.axe import axe_violations
from tests.browser.conftest import SHOTS, close_tab, login, open_tab, small_demo

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DRAWER = """() => { const card = document.querySelector('#help .card');
  return {open: !document.getElementById('help').hidden, focused: document.activeElement === card,
          scrollable: card.scrollHeight > card.clientHeight, scrollTop: card.scrollTop,
          cursor: Number(document.querySelector('#candgrid .cand.cursor').dataset.index),
          category: (document.querySelector('input[name=category]:checked') || {}).value || null}; }"""


@pytest.fixture
def panel_study(tmp_path_factory, settings):
    small_demo(tmp_path_factory, settings, "drawer-images", n_gallery=60, n_single=6, n_sessions=1)
    study, _ = create_study(StudySpec(name="drawer", datasets=["demo"], overlap=1, annotators=["ann"], candidates=30))
    fill_study_candidates(study.pk)
    yield study
    clear_memos()


def test_guidelines_drawer_is_read_from_the_keyboard(browser, live_server, panel_study):
    page = open_tab(browser, 1366, 768)
    try:
        login(page, live_server.url, "ann", "ann-pw")
        page.goto(f"{live_server.url}/annotate/{panel_study.pk}/")
        page.wait_for_selector("#candgrid .cand.cursor")
        page.wait_for_load_state("networkidle")
        item_url = page.url
        page.locator("#candgrid .cand[data-index='2'] [role=checkbox]").focus()
        page.keyboard.press("?")
        state = page.evaluate(DRAWER)
        assert state["open"] and state["focused"] and state["scrollable"], state
        assert axe_violations(page) == []
        for key in ("ArrowDown", "ArrowDown", "PageDown"):
            page.keyboard.press(key)
        page.wait_for_timeout(300)  # smooth scrolling
        state = page.evaluate(DRAWER)
        assert state["scrollTop"] > 0 and state["cursor"] == 2, state  # the drawer scrolled, not the panel
        page.keyboard.press("5")  # a category key behind the drawer: nothing
        page.keyboard.press("Enter")  # nor a submit
        page.wait_for_timeout(200)
        assert page.evaluate(DRAWER)["category"] is None and page.url == item_url
        page.screenshot(path=str(SHOTS / "help-drawer-scrolled-1366x768.png"))
        page.keyboard.press("Escape")
        assert not page.evaluate(DRAWER)["open"]
        page.keyboard.press(" ")  # the focus is back on the candidate: Space ticks it
        assert page.get_attribute("#candgrid .cand[data-index='2'] [role=checkbox]", "aria-checked") == "true"
    finally:
        close_tab(page)
