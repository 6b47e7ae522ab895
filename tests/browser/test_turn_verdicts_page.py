"""Per-turn verdicts on the workbench (issue 26, item 3), keyboard first, at 1366x768 and
1920x1080: a / d set the current turn valid / invalid in the filmstrip, each frame shows its
verdict, a submit without every turn's verdict is refused and names the turns, and the answers
are kept as the candidate ticks are: in the browser at once, on the server's draft, through a
reload while the server is unreachable, then in the judgement."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from annotation.models import Draft, Judgement, Study
from tests.browser.conftest import SHOTS, close_tab, login, open_tab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def assignment_of(page) -> int:
    return int(urlparse(page.url).path.rstrip("/").split("/")[-1])


def local_draft(page, assignment: int):
    return page.evaluate(f"() => JSON.parse(localStorage.getItem('cirval-draft-{assignment}') || 'null')")


def frame_states(page) -> list[str]:
    return page.eval_on_selector_all(
        ".filmstrip .frame[data-turn]",
        """els => els.map(e =>
        e.classList.contains('tv-valid') ? 'valid' : e.classList.contains('tv-invalid') ? 'invalid' : '-')""",
    )


def in_view(page, selector: str, width: int, height: int) -> bool:
    box = page.locator(selector).first.bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= height and box["x"] + box["width"] <= width


@pytest.mark.parametrize("width,height", [(1366, 768), (1920, 1080)])
def test_turn_verdicts_by_keyboard_kept_through_a_reload(browser, live_server, demo_world, width, height):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = open_tab(browser, width, height)
    try:
        study = Study.objects.get(name="demo-sessions")
        assert study.rubric.version == 2
        login(page, live_server.url, "annotator2", "annotator2-demo")
        page.goto(f"{live_server.url}/annotate/{study.pk}/")
        page.wait_for_selector(".filmstrip .turnverdict")
        a = assignment_of(page)
        n = page.locator(".filmstrip .frame[data-turn]").count()
        assert n >= 2 and page.locator(".turnverdict").count() == n
        assert frame_states(page) == ["-"] * n
        # the toggles of the first turns and the submit button are on screen without scrolling
        assert in_view(page, ".frame[data-turn='0'] .turnverdict", width, height)
        assert in_view(page, ".frame[data-turn='1'] .turnverdict", width, height)
        assert in_view(page, "#submit-btn", width, height)

        for key, value in zip("qwert", "44444"):
            page.keyboard.press(key)
            page.keyboard.press(value)
        page.keyboard.press("a")  # turn 1 valid
        page.keyboard.press("ArrowRight")
        page.keyboard.press("d")  # turn 2 invalid
        assert frame_states(page)[:2] == ["valid", "invalid"]
        page.keyboard.press("a")  # changed their mind: turn 2 valid
        assert frame_states(page)[:2] == ["valid", "valid"]
        page.keyboard.press("d")
        if n > 2:  # the rest is left open: Enter is refused, naming them
            page.keyboard.press("Enter")
            page.wait_for_selector("#form-error:not([hidden])")
            assert "Give every turn a verdict" in page.inner_text("#form-error")
            assert f"turn {', '.join(str(t) for t in range(3, n + 1))}" in page.inner_text("#form-error")
        page.screenshot(path=str(SHOTS / f"turn-verdicts-{width}x{height}.png"))

        # saved as the ticks are: in the browser at once, then on the server's draft
        kept = local_draft(page, a)
        assert kept is None or [t.get("valid") for t in kept["per_turn_checks"][:2]] == [True, False]
        page.wait_for_function("() => document.getElementById('draft-status').textContent === 'Draft saved.'")
        assert [t.get("valid") for t in Draft.objects.get(assignment_id=a).payload["per_turn_checks"][:2]] == [
            True,
            False,
        ]

        # the server is unreachable: the next verdict stays in the browser and survives a reload
        page.route("**/draft/", lambda route: route.abort())
        page.locator(".filmstrip .frame[data-turn='0'] .turnno").click()  # a click makes turn 1 current
        page.keyboard.press("d")
        page.wait_for_function(
            "() => document.getElementById('draft-status').textContent.includes('not saved on the server')"
        )
        assert local_draft(page, a)["per_turn_checks"][0]["valid"] is False
        assert (
            Draft.objects.get(assignment_id=a).payload["per_turn_checks"][0]["valid"] is True
        )  # the server's is older
        page.reload()
        page.wait_for_selector(".filmstrip .turnverdict")
        assert frame_states(page)[:2] == ["invalid", "invalid"]
        page.unroute("**/draft/")

        for t in range(2, n):  # the remaining turns, then submit
            page.locator(f".filmstrip .frame[data-turn='{t}'] .turnno").click()
            page.keyboard.press("a")
        assert frame_states(page) == ["invalid", "invalid"] + ["valid"] * (n - 2)
        page.screenshot(path=str(SHOTS / f"turn-verdicts-done-{width}x{height}.png"))
        page.keyboard.press("Enter")
        page.wait_for_function(f"() => !location.pathname.endsWith('/item/{a}/')")
        j = Judgement.objects.get(assignment_id=a, is_current=True)
        assert [t["valid"] for t in j.per_turn] == [False, False] + [True] * (n - 2)
        assert local_draft(page, a) is None
    finally:
        close_tab(page)
