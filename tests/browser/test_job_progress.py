"""The one progress script (static/cirval/jobs.js) on an import page: a job waiting for an
unavailable queue says so, then follows the job to its end and reloads once to show the
readable result."""

from __future__ import annotations

import pytest

from retrieval.jobs.sending import QUEUE_DOWN
from retrieval.models import ImportJob
from retrieval.services import run_import_job
from tests.browser.conftest import SHOTS, login
from tests.conftest import FIXTURES

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_job_page_says_the_queue_is_down_then_follows_the_job(page, live_server, demo_accounts):
    SHOTS.mkdir(parents=True, exist_ok=True)
    job = ImportJob.objects.create(
        dataset_name="circo-later", format="circo", files=[str(FIXTURES / "datasets" / "circo" / "val.json")]
    )
    login(page, live_server.url, "admin", "admin-demo")
    page.goto(f"{live_server.url}/datasets/imports/{job.pk}/")
    assert page.inner_text("#job-status") == "queued"
    assert QUEUE_DOWN in page.inner_text("#job-wait")
    for w, h in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": w, "height": h})
        page.screenshot(path=str(SHOTS / f"job-queue-down-{w}.png"), full_page=True)
    page.evaluate("() => (window.__samePage = 1)")  # gone once the page reloads
    run_import_job(job)  # the broker is back: a worker runs it
    page.wait_for_selector("#import-result")  # the server-rendered result, after one reload
    assert page.inner_text("#job-status") == "done"
    assert page.evaluate("() => window.__samePage") is None
    assert page.eval_on_selector("#job-progress", "p => p.value") == 100
    assert page.is_hidden("#job-wait")
    assert '"queries": 220' in page.inner_text("#job-report")
    for w, h in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": w, "height": h})
        page.screenshot(path=str(SHOTS / f"job-import-done-{w}.png"), full_page=True)
