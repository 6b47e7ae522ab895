"""The annotator's workbench: zoom (full images only on demand, one scale for both sides,
pan) and the layout at 1366x768 and 1920x1080 for both rubrics."""

from __future__ import annotations

import pytest

from annotation.models import Study
from tests.browser.conftest import SHOTS, close_tab, login, open_tab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def open_item(page, base, study_name, user):
    study = Study.objects.get(name=study_name)
    login(page, base, user, f"{user}-demo")
    page.goto(f"{base}/annotate/{study.pk}/")
    page.wait_for_selector("#judgement-form")


def full_image_requests(requests):
    return [u for u in requests if "/images/" in u and "size=" not in u]


def test_zoom_opens_full_images_side_by_side_at_one_scale(page, live_server, demo_world, shot):
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    open_item(page, live_server.url, "demo-validity", "annotator1")
    page.wait_for_load_state("networkidle")
    assert full_image_requests(requests) == []  # thumbnails only until the zoom is asked for
    sizes = page.locator(".pxsize").all_inner_texts()
    assert sizes and all(s.endswith(" px") for s in sizes)

    page.keyboard.press("z")
    page.wait_for_selector("#zoom:not([hidden]) .zoompane img")
    assert page.locator("#zoom .zoompane").count() == 2
    page.wait_for_function(
        "() => [...document.querySelectorAll('#zoom img')].every(i => i.complete && i.naturalWidth > 0)"
    )
    page.wait_for_function("() => document.querySelector('#zoom').dataset.scale")
    assert len(full_image_requests(requests)) == 2
    ratios = page.evaluate(
        "() => [...document.querySelectorAll('#zoom img')].map(i => i.getBoundingClientRect().width / i.naturalWidth)"
    )
    assert ratios[0] == pytest.approx(ratios[1], rel=0.02)
    heads = page.locator("#zoom .zoomhead").all_inner_texts()
    assert heads[0].startswith("Reference") and heads[1].startswith("Target") and all("px" in h for h in heads)
    shot(page, "workbench-zoom-fit")

    # the page's own keys do nothing while zooming: Enter submits nothing
    page.keyboard.press("5")
    assert page.locator("input[name=category]:checked").count() == 0
    for _ in range(3):
        page.keyboard.press("+")
    scale = float(page.get_attribute("#zoom", "data-scale"))
    assert scale > ratios[0] * 3
    port = page.locator("#zoom .zoomport").first
    box = port.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2 - 120, box["y"] + box["height"] / 2 - 90, steps=5)
    page.mouse.up()
    pan = page.evaluate(
        "() => { const p = document.querySelector('#zoom .zoomport'); return [p.scrollLeft, p.scrollTop]; }"
    )
    assert pan[0] > 0 and pan[1] > 0
    shot(page, "workbench-zoom-in")
    page.keyboard.press("Escape")
    page.wait_for_selector("#zoom", state="hidden")
    assert page.locator("#zoom img").count() == 0

    # a click on a target thumbnail opens the same view
    page.click(".targets figure.target img")
    page.wait_for_selector("#zoom:not([hidden]) .zoompane img")
    page.keyboard.press("Escape")

    # ? opens the study's guidelines beside the item (the evidence stays in view)
    page.keyboard.press("?")
    page.wait_for_selector("#guidelines", state="visible")
    assert "Judge each query" in page.inner_text("#guidelines")
    drawer = page.locator("#help .card").bounding_box()
    evidence = page.locator("#reference-img").bounding_box()
    assert drawer["x"] > evidence["x"] + evidence["width"]
    shot(page, "workbench-guidelines")
    page.keyboard.press("?")
    page.wait_for_selector("#help", state="hidden")


def in_view(page, selector, height):
    box = page.locator(selector).first.bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= height


def visible_inside(page, selector, container):
    """The element is inside the visible part of its scrolling container."""
    return page.evaluate(
        """([s, c]) => { const e = document.querySelector(s); if (!e) return false;
        const a = e.getBoundingClientRect(), b = document.querySelector(c).getBoundingClientRect();
        return a.top >= b.top - 1 && a.bottom <= b.bottom + 1; }""",
        [selector, container],
    )


@pytest.mark.parametrize("width,height", [(1366, 768), (1920, 1080)])
def test_layout_keeps_submit_and_note_in_view(browser, live_server, demo_world, width, height):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = open_tab(browser, width, height)
    try:
        open_item(page, live_server.url, "demo-validity", "annotator1")
        page.keyboard.press("1")  # a category with sub-reasons: the longest form
        page.keyboard.press("5")  # the last category: scrolled into view when chosen
        assert visible_inside(page, "label.choice.on", ".rubric-body")
        page.keyboard.press("1")
        for sel in ("#submit-btn", "#note", "#skip-btn"):
            assert in_view(page, sel, height), (sel, width, height)
        page.screenshot(path=str(SHOTS / f"workbench-validity-{width}x{height}.png"))
        # the category with the most sub-reasons, submitted without one: every category, every
        # sub-reason and the error are in view at once, with no scrolling inside the rubric
        page.keyboard.press("3")
        page.keyboard.press("Enter")
        page.wait_for_selector("#form-error:not([hidden])")
        page.screenshot(path=str(SHOTS / f"workbench-validity-subreasons-{width}x{height}.png"))
        for selector, least in (("label.choice.cat", 5), (".subs:not([hidden]) label.choice.sub", 4)):
            inside = page.evaluate(
                """(s) => { const b = document.querySelector('.rubric-body').getBoundingClientRect();
                return [...document.querySelectorAll(s)].map(e => e.getBoundingClientRect())
                    .map(r => r.top >= b.top - 1 && r.bottom <= b.bottom + 1); }""",
                selector,
            )
            assert len(inside) >= least and all(inside), (selector, inside, width, height)
        assert in_view(page, "#form-error", height) and in_view(page, "#submit-btn", height)
        page.goto("about:blank")
        page.context.clear_cookies()
        open_item(page, live_server.url, "demo-sessions", "annotator3")
        for key, value in zip("qwert", "45344"):
            page.keyboard.press(key)
            page.keyboard.press(value)
            # the filmstrip stays visible while the scales are filled in
            assert in_view(page, ".filmstrip .frame", height), (key, width, height)
            assert visible_inside(page, ".scale.active", ".rubric-body"), key
        page.keyboard.press("j")
        for sel in ("#submit-btn", "#note", ".filmstrip .frame"):
            assert in_view(page, sel, height), (sel, width, height)
        page.screenshot(path=str(SHOTS / f"workbench-session-{width}x{height}.png"))
    finally:
        close_tab(page)
