"""A researcher reads the demo audit's report; an annotator is refused."""

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


def test_researcher_reads_the_audit_report(page, live_server, audited_demo, shot):
    login(page, live_server.url, "researcher", "researcher-demo")
    page.goto(f"{live_server.url}/audits/")
    shot(page, "audit-list")
    page.goto(f"{live_server.url}/audits/{audited_demo.pk}/")
    page.wait_for_selector("svg")
    assert page.locator("svg").count() >= 2
    text = page.inner_text("main")
    for word in ("composition_required", "unresolved", "shortcut_solvable", "openclip:cirval-demo"):
        assert word in text
    shot(page, "audit-report")
    # mAP@K beside Recall@K, and the tie and target rules, at both screen sizes
    assert page.locator("#multi-full").is_visible()
    assert "mAP@10" in page.inner_text("#multi-full")
    assert "Ties are pessimistic" in page.inner_text("#rank-rules")
    for width, height in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": width, "height": height})
        page.locator("#multi-full").scroll_into_view_if_needed()
        box = page.locator("#multi-full").bounding_box()
        assert box is not None and box["width"] > 0
        page.screenshot(path=str(shot(page, f"audit-report-{width}").with_name(f"audit-multi-{width}.png")))


def test_annotator_cannot_see_audits(page, live_server, audited_demo):
    login(page, live_server.url, "annotator1", "annotator1-demo")
    resp = page.goto(f"{live_server.url}/audits/{audited_demo.pk}/")
    assert resp.status == 403
    assert "composition_required" not in page.content()
