"""Nothing lost, nothing doubled, nothing silent (issue 14, integrity): the lease heartbeat
and expiry warning, a late submit, two tabs on one item, the draft race, and the counts at
the end of an annotator's share, in the real browser."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlparse

import pytest
from django.utils import timezone

from annotation.assignment import queue as engine
from annotation.models import Assignment, Draft, Judgement, Study
from annotation.studies.building import StudySpec, create_study
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def assignment_of(page) -> int:
    return int(urlparse(page.url).path.rstrip("/").split("/")[-1])


def small_study(name: str, total: int = 3, overlap: int = 1, lease_minutes: int = 10) -> Study:
    study, _ = create_study(
        StudySpec(
            name=name,
            datasets=["demo"],
            overlap=overlap,
            total=total,
            seed=3,
            lease_minutes=lease_minutes,
            annotators=["annotator1", "annotator2"],
        )
    )
    return study


def open_item(page, base: str, study: Study) -> int:
    page.goto(f"{base}/annotate/{study.pk}/")  # a page that posts on load: the POST reserves
    page.wait_for_selector("#judgement-form")
    return assignment_of(page)


def lease_posts(page) -> list[str]:
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url) if r.method == "POST" and r.url.endswith("/lease/") else None)
    return seen


def test_lease_heartbeat_while_active_paused_when_idle(page, live_server, demo_world, settings):
    settings.CIRVAL_LEASE_HEARTBEAT_SECONDS = 1
    settings.CIRVAL_LEASE_IDLE_SECONDS = 2
    study = small_study("beat")
    login(page, live_server.url, "annotator1", "annotator1-demo")
    seen = lease_posts(page)
    a = open_item(page, live_server.url, study)
    Assignment.objects.filter(pk=a).update(lease_expires=timezone.now() + timedelta(minutes=3))
    with page.expect_request(lambda r: r.url.endswith(f"/api/assignments/{a}/lease/")):
        page.mouse.move(200, 200)
        page.keyboard.press("n")
        page.keyboard.type("still here")
    page.wait_for_timeout(300)  # let the response land
    renewed = Assignment.objects.get(pk=a).lease_expires
    assert renewed > timezone.now() + timedelta(minutes=9)  # back to the study's 10 minutes
    # idle: after the idle threshold, the heartbeat stops renewing
    page.wait_for_timeout(3000)
    idle_from = len(seen)
    page.wait_for_timeout(3000)
    assert len(seen) == idle_from
    assert page.is_hidden("#lease-warning")  # 10 minutes left: no warning


def test_expiry_warning_then_late_submit_is_kept_and_told(page, live_server, demo_world, settings, shot):
    settings.CIRVAL_LEASE_HEARTBEAT_SECONDS = 1
    settings.CIRVAL_LEASE_IDLE_SECONDS = 3
    study = small_study("late", total=2, lease_minutes=1)
    login(page, live_server.url, "annotator1", "annotator1-demo")
    a = open_item(page, live_server.url, study)
    # issue 39: a one-minute lease, and an annotator at work: the heartbeat keeps the lease,
    # which never lapses, and no countdown shows
    for i in range(8):
        page.mouse.move(100 + 10 * i, 200)
        page.wait_for_timeout(400)
        assert page.is_hidden("#lease-warning"), i
        assert Assignment.objects.get(pk=a).lease_expires > timezone.now() + timedelta(seconds=50)
    # idle: renewal pauses, and with under a minute left the page warns
    page.wait_for_selector("#lease-warning:not([hidden])", timeout=10000)
    assert "ends in 0:" in page.inner_text("#lease-warning") or "ends in 1:00" in page.inner_text("#lease-warning")
    page.set_viewport_size({"width": 1366, "height": 768})
    shot(page, "integrity-lease-warning-1366x768")
    # the lease runs out and the item goes to annotator2
    Assignment.objects.filter(pk=a).update(lease_expires=timezone.now() - timedelta(seconds=1))
    other = Study.objects.get(pk=study.pk).annotators.get(username="annotator2")
    served = engine.next_assignment(study, other).assignment
    while served.item_id != Assignment.objects.get(pk=a).item_id:
        engine.submit(served, {"category": "VALIDATED", "time_spent_ms": 5})
        served = engine.next_assignment(study, other).assignment
    page.mouse.move(100, 100)
    page.mouse.move(300, 300)
    page.wait_for_function("() => document.getElementById('lease-warning').textContent.includes('someone else')")
    # the notice stays until it is read (the page's one-second lease check used to replace
    # it by "Submit now to keep your answer")
    page.wait_for_timeout(2500)
    assert "someone else" in page.inner_text("#lease-warning") and "Submit now" not in page.inner_text("#lease-warning")
    shot(page, "integrity-late-notice-stays-1366x768")
    page.click("#lease-ack")
    page.wait_for_timeout(1500)
    assert page.is_hidden("#lease-warning")
    page.keyboard.press("5")
    page.keyboard.press("Enter")
    page.wait_for_selector("#late-notice:not([hidden])")
    assert "marked late" in page.inner_text("#late-notice")
    shot(page, "integrity-late-submit")
    mine = Judgement.objects.get(assignment_id=a)
    assert mine.late is True and mine.category == "VALIDATED"
    engine.submit(served, {"category": "VALIDATED", "time_spent_ms": 5})
    item = served.item
    item.refresh_from_db()
    assert item.completed == 1 and Judgement.objects.counted().filter(assignment__item=item).count() == 1
    page.keyboard.press("Enter")  # on to the next item
    page.wait_for_function(f"() => !location.pathname.endsWith('/item/{a}/')")


def test_two_tabs_on_one_item_conflict_offers_a_choice(page, live_server, demo_world, shot):
    study = small_study("tabs")
    login(page, live_server.url, "annotator1", "annotator1-demo")
    a = open_item(page, live_server.url, study)
    second = page.context.new_page()
    second.goto(page.url)
    second.wait_for_selector("#judgement-form")
    page.keyboard.press("5")
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => !location.pathname.endsWith('/item/{a}/')")
    second.keyboard.press("4")
    second.keyboard.press("n")
    second.keyboard.type("second tab's note")
    second.keyboard.press("Escape")
    second.keyboard.press("Enter")
    second.wait_for_selector("#conflict:not([hidden])")
    text = second.inner_text("#conflict")
    assert "VALIDATED" in text and "QUERY_TOO_BROAD" in text and "second tab's note" in text
    for w, h in ((1366, 768), (1920, 1080)):
        second.set_viewport_size({"width": w, "height": h})
        shot(second, f"integrity-two-tabs-conflict-{w}x{h}")
    assert list(Judgement.objects.filter(assignment_id=a).values_list("category", flat=True)) == ["VALIDATED"]
    # the focus is on "Keep mine": Enter presses it (the page's Enter-submits key leaves it alone;
    # it used to submit the same stale answer again and show the conflict once more)
    assert second.evaluate("() => document.activeElement.id") == "conflict-mine"
    second.keyboard.press("Enter")
    second.wait_for_function(f"() => !location.pathname.endsWith('/item/{a}/')")
    revisions = list(
        Judgement.objects.filter(assignment_id=a)
        .order_by("revision")
        .values_list("revision", "category", "note", "is_current")
    )
    assert revisions == [(1, "VALIDATED", "", False), (2, "QUERY_TOO_BROAD", "second tab's note", True)]
    second.close()


def test_draft_race_reload_right_after_a_keystroke_keeps_the_newest(page, live_server, demo_world):
    study = small_study("drafts")
    login(page, live_server.url, "annotator1", "annotator1-demo")
    a = open_item(page, live_server.url, study)
    # nothing typed: a reload restores nothing and says nothing
    page.reload()
    page.wait_for_selector("#judgement-form")
    assert page.inner_text("#draft-status") != "Draft restored."
    assert not Draft.objects.filter(assignment_id=a).exists()
    typed = ""
    for word in ("one ", "two ", "three ", "four ", "five"):
        page.focus("#note")
        page.keyboard.type(word)
        typed += word
        page.reload()  # at once: no wait for the debounced save
        page.wait_for_selector("#judgement-form")
        assert page.input_value("#note") == typed
        assert page.inner_text("#draft-status") == "Draft restored."
    assert assignment_of(page) == a


def test_end_of_share_counts_and_tab_title(page, live_server, demo_world, shot):
    """overlap 1, 3 items, 2 annotators: annotator1's share is 2, but they may judge all 3."""
    study = small_study("share", total=3)
    login(page, live_server.url, "annotator1", "annotator1-demo")
    a = open_item(page, live_server.url, study)
    for n in (1, 2):
        assert page.title().startswith(f"Item #{n} ")
        page.keyboard.press("5")
        page.keyboard.press("Enter")
        page.wait_for_function(f"() => !location.pathname.endsWith('/item/{a}/')")
        page.wait_for_selector("#judgement-form")
        a = assignment_of(page)
    # the third item is served: its count must not read "2 of 2"
    assert page.title().startswith("Item #3 ")
    assert "item #3" in page.inner_text(".itembar")
    assert page.inner_text("#progress-text").replace("\n", " ") == "2 of 3"
    shot(page, "integrity-end-of-share")
    page.keyboard.press("5")
    page.keyboard.press("Enter")
    page.wait_for_selector("text=All done")
    assert "3 of 3 judged" in page.inner_text("main")


def _in_rubric_view(page, selector: str) -> bool:
    """The element lies inside the visible part of the rubric's scrolling column."""
    return page.evaluate(
        """(sel) => { const el = document.querySelector(sel).closest('label');
        const body = document.querySelector('.rubric-body').getBoundingClientRect();
        const r = el.getBoundingClientRect();
        return r.height > 0 && r.top >= body.top - 1 && r.bottom <= body.bottom + 1 && r.bottom <= innerHeight; }""",
        selector,
    )


@pytest.mark.parametrize("width,height", [(1366, 768), (1920, 1080)])
def test_the_chosen_reason_stays_in_view_of_the_rubric_column(page, live_server, demo_world, shot, width, height):
    """With the decision order open, a category chosen by key and its reason chosen by key are
    scrolled into the rubric's column, and a refused submit ("Other" needs a note) shows the
    reason it names; found clipped at 1366x768 in a browser pass."""
    page.set_viewport_size({"width": width, "height": height})
    study = small_study(f"reveal{width}")
    login(page, live_server.url, "annotator1", "annotator1-demo")
    open_item(page, live_server.url, study)
    page.click(".decision summary")
    page.keyboard.press("3")  # Invalid target image: six reasons open under it
    page.keyboard.press("o")  # Other (note required): the last of them
    page.keyboard.press("Escape")  # out of the note the reason focused
    assert _in_rubric_view(page, 'input[name="sub_reason"][value="other"]:checked')
    page.evaluate("() => { document.querySelector('.rubric-body').scrollTop = 0; }")  # the annotator scrolls up
    page.keyboard.press("Enter")
    page.wait_for_selector("#form-error:not([hidden])")
    assert "needs a note" in page.inner_text("#form-error")
    assert _in_rubric_view(page, 'input[name="sub_reason"][value="other"]:checked')
    shot(page, f"integrity-reason-in-view-{width}x{height}")
    page.keyboard.press("Escape")
    page.keyboard.press("5")  # Validated, the last category
    assert _in_rubric_view(page, 'input[name="category"][value="VALIDATED"]:checked')
