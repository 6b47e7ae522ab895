"""Issue 25, item 1: the candidate panel at 1366x768 and 1920x1080. Every candidate of the
page shown is on screen with the pager; the first two pages are open and a page with a tick
opens the two after it, up to the panel's depth, and the annotator may open the next one at
will (issue 39, item 1); any candidate opens at full size beside the target.
Screenshots (viewport only: what the annotator sees without scrolling) in var/screenshots."""

from __future__ import annotations

import pytest

from annotation.judging.candidates import PAGE_SIZE
from annotation.judging.panel_fill import fill_study_candidates
from annotation.models import StudyItem
from annotation.studies.building import StudySpec, create_study
from audit.runs.encoding import clear_memos
from tests.browser.conftest import SHOTS, close_tab, login, open_tab, small_demo

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DEPTH = 40  # four pages of ten


@pytest.fixture
def deep_panel_study(tmp_path_factory, settings):
    small_demo(tmp_path_factory, settings, "pages-images", n_gallery=60, n_single=4, n_sessions=1)
    study, _ = create_study(
        StudySpec(name="pages", datasets=["demo"], overlap=1, total=1, annotators=["ann"], candidates=DEPTH)
    )
    fill_study_candidates(study.pk)  # no audit: one retriever run on demand
    yield study
    clear_memos()


def _on_screen(page, selector: str) -> bool:
    """The element is entirely inside the viewport (no scrolling needed to see it)."""
    return page.evaluate(
        """(sel) => { const r = document.querySelector(sel).getBoundingClientRect();
        return r.width > 0 && r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight && r.right <= innerWidth; }""",
        selector,
    )


def _shown(page) -> list[int]:
    """Panel positions of the candidates shown, each checked to be entirely on screen."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('#candgrid .cand:not([hidden])')).map((c) => {
        const r = c.getBoundingClientRect();
        return (r.top >= 0 && r.bottom <= innerHeight && r.right <= innerWidth && r.width > 60) ? Number(c.dataset.index) : -1; })""")


def _pager_in_view(page) -> None:
    for sel in ("#cand-prev", "#cand-next", "#cand-page", "#none-fit", "#cand-count"):
        assert _on_screen(page, sel), sel


@pytest.mark.parametrize("width,height", [(1366, 768), (1920, 1080)])
def test_every_candidate_on_screen_pages_open_with_ticks_and_open_full_size(
    browser, live_server, deep_panel_study, width, height
):
    study = deep_panel_study
    item = StudyItem.objects.get(study=study)
    panel = list(item.candidates)
    assert len(panel) == DEPTH and PAGE_SIZE == 10
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = open_tab(browser, width, height)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    try:
        login(page, live_server.url, "ann", "ann-pw")
        page.goto(f"{live_server.url}/annotate/{study.pk}/")
        page.wait_for_selector("#candgrid .cand.cursor")
        page.wait_for_load_state("networkidle")
        # page 1: ten candidates, every one on screen with the pager; no tick: pages 1 and 2 open
        assert _shown(page) == list(range(10)), (width, height)
        _pager_in_view(page)
        assert page.inner_text("#cand-page") == "page 1 of 2" and not page.is_disabled("#cand-next")
        assert f"a tick opens the next 2 pages; › opens more (up to {DEPTH})" in page.inner_text("#cand-more")
        assert page.inner_text("#cand-count") == f"0 ticked · 20 of {DEPTH} shown"
        page.screenshot(path=str(SHOTS / f"candidates-page1-{width}x{height}.png"))

        # a tick on page 1 opens pages 2 and 3
        page.keyboard.press(" ")
        assert page.inner_text("#cand-page") == "page 1 of 3" and not page.is_disabled("#cand-next")
        page.click("#cand-next")
        assert _shown(page) == list(range(10, 20))
        _pager_in_view(page)
        # "›" keeps the focus (Space would press it again: it may open a page at will): back to the panel
        page.locator("#candgrid .cand[data-index='10'] .candpick").focus()
        page.keyboard.press("ArrowRight")  # candidate 12, not ticked
        page.keyboard.press("PageDown")
        assert _shown(page) == list(range(20, 30)) and page.inner_text("#cand-page") == "page 3 of 3"
        _pager_in_view(page)
        page.screenshot(path=str(SHOTS / f"candidates-page3-{width}x{height}.png"))
        # pages 2 and 3 bring no tick: the rule opens no page 4 (the annotator still may)
        assert page.inner_text("#cand-page") == "page 3 of 3" and not page.is_disabled("#cand-next")
        page.keyboard.press(" ")  # now a tick does (candidate 22): page 4, the depth's last
        page.keyboard.press("PageDown")
        assert _shown(page) == list(range(30, 40)) and page.inner_text("#cand-page") == "page 4 of 4"
        assert page.inner_text("#cand-more") == f"all {DEPTH} candidates shown" and page.is_disabled("#cand-next")
        _pager_in_view(page)
        assert page.inner_text("#cand-count") == "2 ticked"  # every candidate shown

        # any candidate opens at full size beside the labelled target: the ⤢ button, or "v" on the cursor
        assert not [u for u in requests if f"/images/{panel[33]}/" in u and "size=" not in u]
        page.hover("#candgrid .cand[data-index='33']")
        page.click("#candgrid .cand[data-index='33'] .cand-zoom")
        page.wait_for_selector("#zoom:not([hidden]) .zoompane img")
        page.wait_for_function("""() => Array.from(document.querySelectorAll('#zoom .zoompane img'))
            .every((i) => i.complete && i.naturalWidth > 0) && document.getElementById('zoom').dataset.scale""")
        page.wait_for_timeout(100)  # the load handler has set the fitting scale
        heads = page.locator("#zoom .zoomhead").all_inner_texts()
        assert heads[0].startswith("Target") and heads[1].startswith("Candidate 34 · 128×128 px"), heads
        page.keyboard.press("1")  # 100 %: the candidate's own pixels
        img = page.locator("#zoom .zoompane img").nth(1)
        assert img.evaluate("i => [i.naturalWidth, i.style.width]") == [128, "128px"]
        assert [u for u in requests if f"/images/{panel[33]}/" in u and "size=" not in u]  # the full image
        assert page.locator("#candgrid .cand.on").count() == 2  # opening it ticked nothing
        page.screenshot(path=str(SHOTS / f"candidates-fullsize-{width}x{height}.png"))
        page.keyboard.press("Escape")
        assert page.is_hidden("#zoom")
        # closing gives the keyboard focus back to the candidate opened (Space would tick it)
        assert page.evaluate("() => document.activeElement.closest('.cand').dataset.index") == "33"
        for _ in range(4):
            page.keyboard.press("ArrowLeft")  # cursor on candidate 30, back on page 3
        page.keyboard.press("v")
        page.wait_for_selector("#zoom:not([hidden])")
        assert page.locator("#zoom .zoomhead").nth(1).inner_text().startswith("Candidate 30")
        page.keyboard.press("Escape")

        # unticking page 3's only tick leaves page 4 open: the annotator has seen it
        assert _shown(page) == list(range(20, 30))
        page.click("#candgrid .cand[data-index='21'] img")
        assert page.inner_text("#cand-page") == "page 3 of 4" and not page.is_disabled("#cand-next")
    finally:
        close_tab(page)


def test_pages_opened_by_hand_stay_open_after_a_reload(browser, live_server, deep_panel_study):
    """A page the annotator opened at will ("›" beyond the rule's pages) is kept in the draft:
    a reload shows it again, where the ticks alone would open only pages 1 and 2."""
    study = deep_panel_study
    page = open_tab(browser, 1366, 768)
    try:
        login(page, live_server.url, "ann", "ann-pw")
        page.goto(f"{live_server.url}/annotate/{study.pk}/")
        page.wait_for_selector("#candgrid .cand.cursor")
        assert page.inner_text("#cand-page") == "page 1 of 2"
        page.click("#cand-next")
        page.click("#cand-next")  # page 3: opened at will, no tick anywhere
        assert page.inner_text("#cand-page") == "page 3 of 3"
        page.wait_for_function("() => document.getElementById('draft-status').textContent === 'Draft saved.'")
        page.reload()
        page.wait_for_selector("#candgrid .cand.cursor")
        assert page.inner_text("#cand-page") == "page 1 of 3"
        assert page.inner_text("#cand-count") == f"0 ticked · 30 of {DEPTH} shown"
        page.click("#cand-next")
        page.click("#cand-next")
        assert _shown(page) == list(range(20, 30))
    finally:
        close_tab(page)
