"""The workbench keeps every tick (issue 28): ticked candidates and "None fit" reach the
server's draft at once, stay in the browser until the server acknowledges them, survive a
reload while the server is unreachable, and the status line says only what is true. A
paused study still takes the answer to the item an annotator holds. At 1366x768."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from annotation.models import Assignment, Draft, Judgement, Study
from tests.browser.conftest import close_tab, login, open_tab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def assignment_of(page) -> int:
    return int(urlparse(page.url).path.rstrip("/").split("/")[-1])


def local_draft(page, assignment: int):
    return page.evaluate(f"() => JSON.parse(localStorage.getItem('cirval-draft-{assignment}') || 'null')")


def panel_ids(page) -> list[int]:
    return [int(x) for x in page.eval_on_selector_all("#candgrid .cand", "els => els.map(e => e.dataset.id)")]


def status(page) -> str:
    return page.inner_text("#draft-status")


def open_item(page, base: str, user: str) -> tuple[Study, int, list[int]]:
    """``user`` opens their next demo-validity item: (study, assignment id, panel image ids)."""
    study = Study.objects.get(name="demo-validity")
    login(page, base, user, f"{user}-demo")
    page.goto(f"{base}/annotate/{study.pk}/")
    page.wait_for_selector("#candgrid .cand.cursor")
    return study, assignment_of(page), panel_ids(page)


@pytest.fixture
def tab(browser, transactional_db):
    p = open_tab(browser, 1366, 768)
    yield p
    close_tab(p)


def test_ticks_and_none_fit_are_saved_at_once_and_kept_until_acknowledged(tab, live_server, demo_world, shot):
    page = tab
    study, a, panel = open_item(page, live_server.url, "annotator1")
    assert len(panel) >= 3
    assert status(page) == "No changes to save yet."  # nothing claimed before anything is saved

    # two ticks and nothing else: the draft on the server holds them at once
    page.keyboard.press(" ")
    page.keyboard.press("ArrowRight")
    page.keyboard.press(" ")
    page.wait_for_function("() => document.getElementById('draft-status').textContent === 'Draft saved.'")
    assert Draft.objects.get(assignment_id=a).payload["alternatives"] == panel[:2]
    assert local_draft(page, a) is None  # acknowledged: the browser's copy is let go
    page.reload()
    page.wait_for_selector("#candgrid .cand.cursor")
    assert (
        page.eval_on_selector_all("#candgrid .cand:has([aria-checked=true])", "els => els.map(e => +e.dataset.id)")
        == panel[:2]
    )
    assert status(page) == "Draft restored."

    # the server is unreachable: "None fit" is kept in the browser, and the page says so
    page.route("**/draft/", lambda route: route.abort())
    page.keyboard.press("0")  # with ticks on the panel, the first press only says what it would clear
    assert "press it again to confirm" in page.inner_text("#cand-count")
    assert page.eval_on_selector_all("#candgrid .cand:has([aria-checked=true])", "els => els.length") == 2
    shot(page, "workbench-none-fit-confirm-1366x768")
    page.keyboard.press("0")
    page.wait_for_function(
        "() => document.getElementById('draft-status').textContent.includes('not saved on the server')"
    )
    assert "kept in this browser" in status(page) and "Draft saved" not in status(page)
    kept = local_draft(page, a)
    assert kept["none_fit"] is True and kept["alternatives"] == []
    assert Draft.objects.get(assignment_id=a).payload["alternatives"] == panel[:2]  # the server has the old one
    shot(page, "workbench-none-fit-offline-1366x768")
    page.set_viewport_size({"width": 1920, "height": 1080})  # the longer status line still leaves Submit in view
    box = page.locator("#submit-btn").bounding_box()
    assert box["y"] + box["height"] <= 1080
    shot(page, "workbench-none-fit-offline-1920x1080")
    page.set_viewport_size({"width": 1366, "height": 768})

    # a reload while still offline restores "None fit" from the browser's copy
    page.reload()
    page.wait_for_selector("#candgrid .cand.cursor")
    assert page.inner_text("#cand-count").startswith("none of these fit") and "on" in page.get_attribute(
        "#none-fit", "class"
    )
    assert page.locator("#candgrid .cand:has([aria-checked=true])").count() == 0
    assert local_draft(page, a)["none_fit"] is True

    # back online: the kept edit is sent (retried every 5 s) and then let go
    page.unroute("**/draft/")
    page.wait_for_function(f"() => localStorage.getItem('cirval-draft-{a}') === null", timeout=15000)
    payload = Draft.objects.get(assignment_id=a).payload
    assert payload["none_fit"] is True and payload["alternatives"] == []
    shot(page, "workbench-none-fit-restored-1366x768")

    # submitted: "None fit" is part of the stored judgement
    page.keyboard.press("5")
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => !location.pathname.endsWith('/item/{a}/')")
    j = Judgement.objects.get(assignment_id=a)
    assert (j.category, j.alternatives, j.none_fit) == ("VALIDATED", [], True)
    assert not Draft.objects.filter(assignment_id=a).exists()
    page.goto(f"{live_server.url}/annotate/{study.pk}/history/")
    assert "Validated · none fit" in page.inner_text("table.data")


def test_a_paused_study_takes_the_answer_to_the_item_held(tab, live_server, demo_world, shot):
    page = tab
    study, a, panel = open_item(page, live_server.url, "annotator2")
    Study.objects.filter(pk=study.pk).update(status=Study.Status.PAUSED)  # staff pause while the item is open
    page.keyboard.press(" ")
    page.wait_for_function("() => document.getElementById('draft-status').textContent === 'Draft saved.'")
    page.reload()
    page.wait_for_selector("#paused-notice")
    assert "still saved" in page.inner_text("#paused-notice")
    shot(page, "workbench-paused-1366x768")
    # closed: the server refuses the draft, and the page says so (and keeps it in the browser)
    Study.objects.filter(pk=study.pk).update(status=Study.Status.CLOSED)
    page.keyboard.press("f")
    page.wait_for_function("() => document.getElementById('draft-status').textContent.includes('not saved')")
    assert status(page) == (
        "Draft not saved on the server: This study is closed; nothing was saved. It is kept in this browser."
    )
    assert local_draft(page, a)["flagged"] is True
    page.keyboard.press("f")
    Study.objects.filter(pk=study.pk).update(status=Study.Status.PAUSED)
    page.keyboard.press("1")
    page.keyboard.press("q")
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => !location.pathname.endsWith('/item/{a}/')")
    assert "This study is paused: no items are being served." in page.inner_text("main")
    j = Judgement.objects.get(assignment_id=a)
    assert (j.category, j.alternatives) == ("INVALID_TEXT_QUERY", panel[:1])
    assert Assignment.objects.get(pk=a).status == "done"
    page.goto(f"{live_server.url}/annotate/{study.pk}/history/")
    assert "Invalid text / Ungrammatical / nonsensical · 1 also correct" in page.inner_text("table.data")
    assert Assignment.objects.filter(study=study, annotator__username="annotator2").count() == 1  # nothing new
