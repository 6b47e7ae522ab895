"""A demo annotator judges five items with the keyboard only (acceptance of the annotation issue)."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from annotation.models import Assignment, Draft, Judgement, Study
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def current_assignment(page) -> int:
    path = urlparse(page.url).path  # /annotate/<study>/item/<assignment>/
    return int(path.rstrip("/").split("/")[-1])


def wait_next(page, previous: int) -> int:
    page.wait_for_function(f"() => !location.pathname.endsWith('/item/{previous}/')")
    page.wait_for_selector("#judgement-form")
    return current_assignment(page)


def test_keyboard_only_judging_with_draft_and_progress(page, live_server, demo_world, shot):
    study = Study.objects.get(name="demo-validity")
    login(page, live_server.url, "annotator1", "annotator1-demo")
    page.goto(f"{live_server.url}/annotate/")
    shot(page, "annotate-my-studies")
    page.goto(f"{live_server.url}/annotate/{study.pk}/")
    page.wait_for_selector("#judgement-form")
    a1 = current_assignment(page)
    assert "0</b> of" in page.inner_html("#progress-text")
    shot(page, "annotate-item-1")

    # 1: VALIDATED
    page.keyboard.press("5")
    page.keyboard.press("Enter")
    a2 = wait_next(page, a1)

    # 2: INVALID_TEXT_QUERY / ungrammatical (sub-reason key q)
    page.keyboard.press("1")
    page.keyboard.press("q")
    page.keyboard.press("Enter")
    a3 = wait_next(page, a2)

    # 3: INVALID_TARGET_IMAGE / other: refused until a note is typed
    page.keyboard.press("3")
    page.keyboard.press("o")
    page.keyboard.press("Escape")  # o focuses the note; leave it empty
    page.keyboard.press("Enter")
    page.wait_for_selector("#form-error:not([hidden])")
    assert "needs a note" in page.inner_text("#form-error")
    shot(page, "annotate-other-refused")
    assert current_assignment(page) == a3
    assert not Judgement.objects.filter(assignment_id=a3).exists()
    assert page.evaluate("document.activeElement.id") == "note"  # the refusal puts the cursor in the note
    page.keyboard.type("the target shows a different object")
    page.keyboard.press("Escape")
    page.keyboard.press("Enter")
    a4 = wait_next(page, a3)

    # 4: QUERY_TOO_BROAD, with a note; reload mid-item: the draft survives
    page.keyboard.press("4")
    page.keyboard.press("n")
    page.keyboard.type("dozens of grey scenes fit")
    page.keyboard.press("Escape")
    page.wait_for_function("() => document.getElementById('draft-status').textContent === 'Draft saved.'")
    assert Draft.objects.get(assignment_id=a4).payload["category"] == "QUERY_TOO_BROAD"
    page.reload()
    page.wait_for_selector("#judgement-form")
    assert current_assignment(page) == a4
    assert page.is_checked("input[name=category][value=QUERY_TOO_BROAD]")
    assert page.input_value("#note") == "dozens of grey scenes fit"
    assert page.inner_text("#draft-status") == "Draft restored."
    shot(page, "annotate-draft-restored")
    page.keyboard.press("Enter")
    a5 = wait_next(page, a4)

    # 5: INVALID_IMAGE_QUERY / low resolution (w), flagged for adjudication (f)
    page.keyboard.press("2")
    page.keyboard.press("w")
    page.keyboard.press("f")
    shot(page, "annotate-item-5")
    page.keyboard.press("Enter")
    wait_next(page, a5)
    assert "5</b> of" in page.inner_html("#progress-text")
    shot(page, "annotate-after-five")

    mine = Judgement.objects.filter(assignment__annotator__username="annotator1", is_current=True)
    got = {j.assignment_id: (j.category, j.sub_reason, j.note, j.flagged) for j in mine}
    assert got == {
        a1: ("VALIDATED", "", "", False),
        a2: ("INVALID_TEXT_QUERY", "ungrammatical_nonsensical", "", False),
        a3: ("INVALID_TARGET_IMAGE", "other", "the target shows a different object", False),
        a4: ("QUERY_TOO_BROAD", "", "dozens of grey scenes fit", False),
        a5: ("INVALID_IMAGE_QUERY", "low_resolution", "", True),
    }
    assert all(j.time_spent_ms > 0 for j in mine)
    assert Assignment.objects.filter(annotator__username="annotator1", status="done").count() == 5


def start_validity(page, base: str, user: str) -> int:
    """Log ``user`` in and open their first item of the demo's validity study; its assignment."""
    study = Study.objects.get(name="demo-validity")
    login(page, base, user, f"{user}-demo")
    page.goto(f"{base}/annotate/{study.pk}/")
    page.wait_for_selector("#judgement-form")
    return current_assignment(page)


def test_back_reopens_and_revises_keeping_history(page, live_server, demo_world, shot):
    first = start_validity(page, live_server.url, "annotator2")
    page.keyboard.press("5")
    page.keyboard.press("Enter")
    second = wait_next(page, first)
    page.keyboard.press("b")
    page.wait_for_url(f"**/item/{first}/")
    assert page.is_checked("input[name=category][value=VALIDATED]")
    page.keyboard.press("4")
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/item/{second}/**")
    revisions = list(
        Judgement.objects.filter(assignment_id=first).order_by("revision").values_list("category", "is_current")
    )
    assert revisions == [("VALIDATED", False), ("QUERY_TOO_BROAD", True)]
    shot(page, "annotate-after-revision")


def test_browser_back_after_a_submit_shows_the_stored_answer(page, live_server, demo_world, shot):
    """The browser's own Back (not the page's b) after a submit: the item page is fetched
    again (no-store), so it shows the stored answer as a revision, not the page as it was
    before the submit (which then reported a conflict with itself)."""
    first = start_validity(page, live_server.url, "annotator3")
    page.keyboard.press("2")
    page.keyboard.press("w")
    page.keyboard.press("Enter")
    wait_next(page, first)
    response = page.go_back()
    page.wait_for_url(f"**/item/{first}/")
    page.wait_for_selector("#judgement-form")
    assert response is not None and "no-store" in response.headers.get("cache-control", "")
    assert page.is_checked("input[name=category][value=INVALID_IMAGE_QUERY]")
    assert "revising" in page.inner_text(".itembar")
    page.keyboard.press("5")
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => !location.pathname.endsWith('/item/{first}/')")
    assert page.locator("#conflict:not([hidden])").count() == 0
    categories = list(
        Judgement.objects.filter(assignment_id=first).order_by("revision").values_list("category", flat=True)
    )
    assert categories == ["INVALID_IMAGE_QUERY", "VALIDATED"]
    shot(page, "annotate-after-browser-back")
