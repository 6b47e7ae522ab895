"""Rank files of another dataset on the staff room's imports page (issue 28): refused with
the reason and an example until "Force (--force)" is ticked. The upload is queued as a job
(run here by the eager worker) and its page shows the outcome. At 1366x768."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from audit.models import AuditRun
from tests.browser.conftest import close_tab, login, open_tab
from tests.integration.test_audit_import import ALPHA, other, tiny  # noqa: F401 - the fixtures

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_rank_files_of_another_dataset_are_refused_until_forced(
    browser,
    live_server,
    other,
    settings,
    tmp_path,
    shot,  # noqa: F811
    eager_celery,
):
    settings.UPLOAD_DIR = tmp_path / "uploads"
    get_user_model().objects.create_superuser("boss", password="boss-pw")
    page = open_tab(browser, 1366, 768)
    try:
        login(page, live_server.url, "boss", "boss-pw")

        def upload(force: bool) -> None:
            page.goto(f"{live_server.url}/room/imports/")
            page.select_option("#ranks-form select[name=ranks-dataset]", "other")
            page.set_input_files("#ranks-form input[name=ranks-files]", str(ALPHA))
            page.set_checked("#ranks-form input[name=ranks-force]", force)
            page.click("#ranks-form button[type=submit]")
            page.wait_for_url("**/room/imports/*/")
            page.wait_for_function("['done', 'failed'].includes(document.getElementById('job-status').textContent)")

        upload(force=False)
        error = page.inner_text("#job-error")
        assert (
            "do not match dataset 'other'" in error and "the file says 'is red', the dataset 'another query 0'" in error
        )
        assert "force the import (--force)" in error and "failed" in page.inner_text("#job-status")
        assert not AuditRun.objects.exists()
        shot(page, "room-ranks-refused-1366x768")
        upload(force=True)
        assert "done" in page.inner_text("#job-status")
        assert "imported with --force although 4 query text(s) differ" in page.inner_text("#import-result .warnings")
        assert AuditRun.objects.get().summary["import"]["forced"] is True
        shot(page, "room-ranks-forced-1366x768")
    finally:
        close_tab(page)
