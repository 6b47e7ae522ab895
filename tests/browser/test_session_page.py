"""A demo annotator judges two generated sessions on the filmstrip page, keyboard only."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from annotation.models import Judgement, Study
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def assignment_id(page) -> int:
    return int(urlparse(page.url).path.rstrip("/").split("/")[-1])


def test_two_sessions_on_the_filmstrip(page, live_server, demo_world, shot):
    study = Study.objects.get(name="demo-sessions")
    login(page, live_server.url, "annotator3", "annotator3-demo")
    page.goto(f"{live_server.url}/annotate/{study.pk}/")
    page.wait_for_selector(".filmstrip")
    first = assignment_id(page)
    n_frames = page.locator(".filmstrip .frame:not(.goal)").count()
    assert n_frames >= 2
    shot(page, "session-filmstrip")

    # Enter before rating everything is refused
    page.keyboard.press("Enter")
    page.wait_for_selector("#form-error:not([hidden])")
    assert "Rate" in page.inner_text("#form-error")

    for key, value in zip("qwert", "45344"):
        page.keyboard.press(key)
        page.keyboard.press(value)
    page.keyboard.press("j")  # turn 1: real difference toward the target
    page.keyboard.press("ArrowRight")  # turn 2
    page.keyboard.press("j")
    page.keyboard.press("k")  # turn 2: consistent with the history
    # session rubric v2: Enter without every turn's verdict is refused and names the turns
    page.keyboard.press("Enter")
    page.wait_for_selector("#form-error:not([hidden])")
    assert "Give every turn a verdict" in page.inner_text("#form-error")
    for t in range(n_frames):  # a (valid) on every turn, from the first
        page.locator(f".filmstrip .frame[data-turn='{t}'] .turnno").click()
        page.keyboard.press("a")
    shot(page, "session-rated")
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => !location.pathname.endsWith('/item/{first}/')")
    page.wait_for_selector(".filmstrip")
    second = assignment_id(page)

    for key in "qwert":
        page.keyboard.press(key)
        page.keyboard.press("2")
    page.keyboard.press("z")  # reject: duplicate
    page.keyboard.press("v")  # reject: circle
    page.keyboard.press("f")  # flag for adjudication
    for _ in range(8):
        page.keyboard.press("ArrowLeft")
    for _ in range(page.locator(".filmstrip .frame:not(.goal)").count()):
        page.keyboard.press("d")  # every turn invalid
        page.keyboard.press("ArrowRight")
    shot(page, "session-rejected")
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => !location.pathname.endsWith('/item/{second}/')")

    j1 = Judgement.objects.get(assignment_id=first, is_current=True)
    assert j1.scales == {"naturalness": 4, "coherence": 5, "goal_progress": 3, "low_redundancy": 4, "overall": 4}
    assert len(j1.per_turn) == n_frames
    assert j1.per_turn[0]["real_difference_toward_target"] is True
    assert j1.per_turn[1] == {"real_difference_toward_target": True, "consistent_with_history": True, "valid": True}
    assert all(t["valid"] is True for t in j1.per_turn)
    assert j1.reject_flags == [] and j1.category == ""
    j2 = Judgement.objects.get(assignment_id=second, is_current=True)
    assert set(j2.scales.values()) == {2} and sorted(j2.reject_flags) == ["circle", "duplicate"] and j2.flagged
    assert j2.per_turn and all(t["valid"] is False for t in j2.per_turn)
