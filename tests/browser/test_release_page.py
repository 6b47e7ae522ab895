"""A new staff user makes a release of the demo from the browser: the study list, the
study's progress page, "Make a release", the job page following the worker, the zip and the
fields to fill in; at 1366x768 (and full HD)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from annotation.models import ReleaseJob, Study, StudyItem
from annotation.release.bundle import run_release_job
from tests.browser.conftest import SHOTS, login
from tests.integration.test_report_export import judge

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_new_user_makes_a_release_of_the_demo(page, live_server, demo_world, settings, tmp_path):
    settings.EXPORT_DIR = tmp_path / "exports"
    study = Study.objects.get(name="demo-validity")
    users = list(study.annotators.order_by("username"))
    for n, item in enumerate(StudyItem.objects.filter(study=study).order_by("id")[:8]):
        for user in users:
            judge(study, item, user, "V" if n % 4 else "TEXT")
    page.set_viewport_size({"width": 1366, "height": 768})
    login(page, live_server.url, "admin", "admin-demo")
    page.goto(f"{live_server.url}/studies/")
    page.click("text=demo-validity")
    page.wait_for_selector("#release-form")
    page.locator("#release-form").scroll_into_view_if_needed()
    assert page.locator("#release-button").is_visible()
    page.screenshot(path=str(SHOTS / "release-form-1366.png"))
    page.click("#release-button")
    page.wait_for_url(f"{live_server.url}/releases/*/")
    job = ReleaseJob.objects.get()
    assert job.status == "queued"  # nothing was built in the request: a worker does it
    run_release_job(job)  # what the worker does
    page.wait_for_selector("#release-zip")  # the page follows the job and reloads once
    assert page.inner_text("#job-status") == "done"
    assert "rai:personalSensitiveInformation" in page.inner_text("#release-placeholders")
    for w, h in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": w, "height": h})
        page.screenshot(path=str(SHOTS / f"release-done-{w}.png"), full_page=True)
    with page.expect_download() as dl:
        page.click("#release-zip")
    data = Path(dl.value.path()).read_bytes()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    job.refresh_from_db()
    folder = Path(job.path).name
    for name in ("croissant.json", "README.md", "SHA256SUMS", f"study-{study.pk}/mbeir/manifest.json"):
        assert f"{folder}/{name}" in names, name
