"""An admin logs in, browses the demo dataset and imports a file in the browser."""

from __future__ import annotations

import pytest

from retrieval.models import Dataset
from tests.browser.conftest import login
from tests.conftest import FIXTURES

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_login_is_required_and_demo_is_browsable(page, live_server, demo_world, shot):
    page.goto(f"{live_server.url}/datasets/")
    assert "/login/" in page.url
    shot(page, "platform-login")
    login(page, live_server.url, "admin", "admin-demo")
    page.goto(f"{live_server.url}/datasets/")
    row = page.locator("table.data tbody tr", has_text="demo")
    assert row.count() == 1
    shot(page, "platform-datasets")
    page.click("text=demo")
    page.wait_for_selector(".queryrow")
    # the demo's images really load (natural width > 0), none is a placeholder
    page.wait_for_function(
        "() => [...document.querySelectorAll('.queryrow img')].slice(0, 6).every(i => i.complete && i.naturalWidth > 0)"
    )
    sources = page.eval_on_selector_all(".queryrow img", "imgs => imgs.slice(0, 6).map(i => i.currentSrc)")
    for src in sources:  # real PNG thumbnails, not the missing-image placeholder
        assert page.request.get(src).headers["content-type"] == "image/png"
    shot(page, "platform-dataset-detail")
    page.click("p.filters a[href='?kind=multi']")
    page.wait_for_url("**/?kind=multi")
    assert "turns" in page.inner_text(".queryrow >> nth=0")
    shot(page, "platform-sessions")


@pytest.mark.usefixtures("eager_celery")  # the upload is imported by its task, run here
def test_browser_upload_import(page, live_server, demo_world, shot):
    login(page, live_server.url, "admin", "admin-demo")
    page.goto(f"{live_server.url}/datasets/import/")
    page.select_option("select[name=format]", "circo")
    page.fill("input[name=name]", "circo-browser")
    page.set_input_files("input[name=files]", str(FIXTURES / "datasets" / "circo" / "val.json"))
    page.click("button[type=submit]")
    page.wait_for_url("**/datasets/imports/*/")
    page.wait_for_selector("#job-status.done")
    shot(page, "platform-import-done")
    assert '"queries": 220' in page.inner_text("#job-report")
    assert Dataset.objects.filter(name="circo-browser").exists()


@pytest.mark.usefixtures("eager_celery")  # the upload is imported by its task, run here
def test_bad_upload_is_refused_with_the_record_named(page, live_server, demo_world, tmp_path, shot):
    bad = tmp_path / "val.json"
    bad.write_text('[{"id": 0, "reference_img_id": "x"}]')
    login(page, live_server.url, "admin", "admin-demo")
    page.goto(f"{live_server.url}/datasets/import/")
    page.select_option("select[name=format]", "circo")
    page.fill("input[name=name]", "circo-bad")
    page.set_input_files("input[name=files]", str(bad))
    page.click("button[type=submit]")
    page.wait_for_selector("#job-status.failed")
    text = page.inner_text("#job-error")
    assert "record 1" in text and "reference_img_id" in text
    shot(page, "platform-import-failed")
    assert not Dataset.objects.filter(name="circo-bad").exists()
