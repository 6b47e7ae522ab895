"""Issue 25, item 2: staff see a study's suspicion queue (score and parts) and that the study
is served in suspicion order, at 1366x768 and 1920x1080; the item page shows the score; annotators see none."""

from __future__ import annotations

import random

import pytest

from annotation.models import Study, StudyItem
from annotation.studies.suspicion_scores import item_suspicion
from audit.suspicion import PARTS, Signals
from tests.browser.conftest import close_tab, login, open_tab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def scored_demo(demo_world):
    """The demo validity study (made without an audit) with scores stored as refresh_suspicion
    stores them, from seeded signals, and served by suspicion."""
    study = Study.objects.get(name="demo-validity")
    rng = random.Random(5)
    items = list(StudyItem.objects.filter(study=study, query__n_turns=1).order_by("id")[:40])
    for item in items:
        ranks = tuple((rng.randint(1, 900), rng.randint(1, 900), rng.randint(1, 900)) for _ in range(2))
        sig = Signals(
            ranks=ranks,
            n_gallery=900,
            rivals=rng.randint(0, 30),
            consistency=(rng.uniform(-0.5, 0.8),),
            gaps=(rng.uniform(-1, 3),),
            lead=rng.randint(0, 1),
            lead_gap=rng.uniform(-1, 3),
        )
        item.suspicion, item.suspicion_parts = item_suspicion(
            sig, (True, False) if rng.random() < 0.2 else (), run=None
        )
    StudyItem.objects.bulk_update(items, ["suspicion", "suspicion_parts"])
    study.serve_order = Study.ServeOrder.SUSPICION
    study.save(update_fields=["serve_order"])
    return study


@pytest.mark.parametrize("width,height", [(1366, 768), (1920, 1080)])
def test_staff_see_the_queue_with_its_parts(browser, live_server, scored_demo, shot, width, height):
    study = scored_demo
    page = open_tab(browser, width, height)
    try:
        login(page, live_server.url, "admin", "admin-demo")
        page.goto(f"{live_server.url}/studies/{study.pk}/progress/")
        assert "Served in suspicion order" in page.inner_text("#serve-order")
        page.click("#serve-order a")
        page.wait_for_selector("#suspicion")
        assert "served in suspicion order" in page.inner_text("#serve-order")
        headers = page.eval_on_selector_all("#suspicion thead th", "ts => ts.map(t => t.textContent.trim())")
        assert [h for h in headers if h in PARTS] == list(PARTS)
        scores = [
            float(s) for s in page.eval_on_selector_all("#suspicion td.score", "ts => ts.map(t => t.textContent)")
        ]
        assert len(scores) == page.locator("#suspicion tbody tr").count() and scores == sorted(scores, reverse=True)
        best = study.items.order_by("-suspicion", "order_key").first()
        assert scores[0] == round(best.suspicion, 2)
        row = page.locator(f"#suspicion tr[data-item='{best.pk}']")
        assert row.locator("td.part").count() == len(PARTS)
        # the table fits the 1366 px screen: no sideways scrolling
        scroll = page.evaluate("document.documentElement.scrollWidth")
        assert scroll <= width, scroll
        shot(page, f"suspicion-queue-{width}")
        # the item's staff page shows the score and its parts
        row.locator("a").click()
        page.wait_for_selector("#suspicion")
        text = page.inner_text("#suspicion")
        assert f"{best.suspicion:.2f}" in text and all(name in text for name in PARTS)
        shot(page, f"suspicion-item-{width}")
    finally:
        close_tab(page)
    # an annotator is refused the queue
    page = open_tab(browser, 1366, 768)
    try:
        login(page, live_server.url, "annotator1", "annotator1-demo")
        response = page.goto(f"{live_server.url}/studies/{study.pk}/suspicion/")
        assert response.status == 403 or "/login" in page.url or "suspicion" not in page.content().lower()
    finally:
        close_tab(page)
