"""A researcher reads the Sessions section of the demo audit: Hits@10 curves, filter table."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from audit.models import AuditRun
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def audited_demo(db, demo_images, demo_embeddings, settings):
    """make_demo's database part for this test; the world drawn and its embeddings cached once
    per test session (tests/conftest.py demo_images, demo_embeddings)."""
    settings.IMAGE_ROOTS = [demo_images.resolve()]
    settings.EMBEDDING_CACHE_DIR = demo_embeddings
    call_command("make_demo", "--images-dir", str(demo_images), verbosity=0)
    return AuditRun.objects.get(dataset__name="demo")


def test_researcher_reads_the_session_curves_and_filters(page, live_server, audited_demo, shot):
    run = audited_demo
    login(page, live_server.url, "researcher", "researcher-demo")
    page.goto(f"{live_server.url}/audits/{run.pk}/#sessions")
    section = page.locator("#sessions")
    section.wait_for()
    # one curve chart per retriever and the turn-length histogram, all drawn
    charts = section.locator("svg")
    assert charts.count() == len(run.retrievers) + 1
    for i in range(charts.count()):
        box = charts.nth(i).bounding_box()
        assert box and box["width"] > 600 and box["height"] > 150
    first = charts.nth(0)
    assert first.locator("polyline").count() == 9
    text = section.inner_text()
    for word in (
        "Hits@10 per turn",
        "latest",
        "average",
        "weighted",
        "Final Recall@10",
        "success",
        "multi-turn",
        "epsilon-consistency",
        "tau-diversity",
        "Turn lengths",
    ):
        assert word in text, word
    assert section.locator("#session-filters tbody tr").count() == 5  # all sessions + 4 filters
    # hovering a point shows its value (SVG <title>)
    tips = first.locator("circle > title").all_text_contents()
    hits = run.summary["sessions"]["metrics"][run.retrievers[0]]["latest"]["multimodal"]["hits_at_k"]
    assert f"multimodal · latest · turn l 1: {hits[0]:.3f}" in tips
    # the screenshot shows the Sessions section alone (the rest of the report is hidden for it)
    page.evaluate("""() => {
        for (const el of document.querySelectorAll('main > *')) {
            if (el.id !== 'sessions') el.style.display = 'none';
        }
    }""")
    shot(page, "audit-sessions")


def test_sessions_side_by_side_fits_at_1366(browser, live_server, audited_demo):
    """The side-by-side table at 1366x768: retriever specs shortened (whole in the tooltip), the
    chart legends' labels clear of the next entry."""
    from tests.browser.conftest import SHOTS, close_tab, open_tab

    page = open_tab(browser, 1366, 768)
    try:
        login(page, live_server.url, "researcher", "researcher-demo")
        page.goto(f"{live_server.url}/audits/{audited_demo.pk}/")
        page.wait_for_selector("#compare-table")
        sizes = page.evaluate("""() => { const s = document.querySelector('#compare-table').closest('.scroll');
            return [s.scrollWidth, s.clientWidth]; }""")
        assert sizes[0] <= sizes[1] + 1, sizes
        codes = page.locator("#compare-table code")
        assert all(len(t) <= 34 for t in codes.all_inner_texts())
        assert codes.first.get_attribute("title") in audited_demo.retrievers
        # legend entries: each label ends before the next entry's sample begins
        gaps = page.evaluate("""() => [...document.querySelectorAll('#sessions-compare svg')].map(svg => {
            const texts = [...svg.querySelectorAll('text')].filter(t => t.getAttribute('y') === '40');
            const lines = [...svg.querySelectorAll('line')].filter(l => l.getAttribute('y1') === '36');
            return texts.slice(0, -1).map((t, i) => lines[i + 1].getBBox().x - (t.getBBox().x + t.getBBox().width));
        })""")
        assert gaps and all(g > 0 for chart in gaps for g in chart), gaps
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("#sessions-compare").screenshot(path=str(SHOTS / "audit-sessions-compare-1366.png"))
    finally:
        close_tab(page)
