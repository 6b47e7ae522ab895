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
    for word in ("Hits@10 per turn", "latest", "average", "weighted", "Final Recall@10",
                 "success", "multi-turn", "epsilon-consistency", "tau-diversity", "Turn lengths"):
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
