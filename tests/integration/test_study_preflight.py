"""Study creation warns before it builds over missing images or an unaudited dataset."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from annotation.models import Study
from retrieval.models import Image
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db


def test_warns_then_builds_when_confirmed():
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    missing = Image.objects.filter(dataset__name="circo", missing=True).count()
    assert missing > 0  # the fixture ships no image files
    staff = get_user_model().objects.create_user("boss", password="pw", is_staff=True)
    c = Client()
    c.force_login(staff)
    form = {
        "name": "over-missing",
        "datasets": ["circo"],
        "rubric": "validity",
        "overlap": 1,
        "seed": 0,
        "agreement_size": 0,
        "lease_minutes": 10,
        "hidden_categories": ["composition_required"],
    }
    resp = c.post("/studies/new/", form)
    body = resp.content.decode()
    assert resp.status_code == 200 and 'id="study-warnings"' in body
    assert f"({missing} image files were not found at import)" in body
    assert "no finished audit" in body
    assert not Study.objects.filter(name="over-missing").exists()
    form["hidden_categories"] = []
    resp = c.post("/studies/new/", {**form, "confirmed": "1"})
    assert resp.status_code == 302 and Study.objects.filter(name="over-missing").exists()


@pytest.mark.usefixtures("eager_celery")  # the upload is imported by its task, run here
def test_import_result_page_is_readable(settings, tmp_path):
    settings.UPLOAD_DIR = tmp_path / "uploads"
    staff = get_user_model().objects.create_user("boss2", password="pw", is_staff=True)
    c = Client()
    c.force_login(staff)
    with open(FIXTURES / "datasets/circo/val.json", "rb") as fh:
        resp = c.post(
            "/datasets/import/", {"name": "circo-up", "format": "circo", "split": "", "images_root": "", "files": fh}
        )
    assert resp.status_code == 302
    page = c.get(resp["Location"]).content.decode()
    assert 'id="import-result"' in page and "<code>val.json</code>" in page
    assert str(settings.UPLOAD_DIR) not in page  # the server path is never shown
    assert 'id="missing-images"' in page and 'class="missing"' in page
    assert page.count('class="status done"') == 1 and "{&#x27;" not in page and "{'queries'" not in page
