"""Rank files and a CIRCUS study imported from the project room's page."""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from annotation.models import Study
from audit.models import AuditRun
from tests.conftest import FIXTURES
from tests.integration.test_audit_import import ALPHA, BETA, tiny  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db
@pytest.fixture
def staff_client(settings, tmp_path):
    settings.UPLOAD_DIR = tmp_path / "uploads"
    c = Client()
    c.force_login(get_user_model().objects.create_user("boss", password="pw", is_staff=True))
    return c
def test_rank_files_from_the_browser(staff_client, tiny, settings):  # noqa: F811
    with open(ALPHA, "rb") as a, open(BETA, "rb") as b:
        resp = staff_client.post("/room/imports/", {"which": "ranks", "ranks-dataset": "tiny", "ranks-files": [a, b],
                                                    "ranks-min_mm_retrievers": 1})
    page = resp.content.decode()
    run = AuditRun.objects.get()
    assert run.source == "imported" and run.retrievers == ["alpha", "beta"]
    assert 'class="status done"' in page and f"Audit {run.pk}:" in page
    assert f"<code>{ALPHA.name}</code>" in page and str(settings.UPLOAD_DIR) not in page
def test_circus_study_from_the_browser(staff_client):
    files = sorted((FIXTURES / "circus" / "agreement_users").glob("annotator_*.json"))
    handles = [open(p, "rb") for p in files]
    try:
        resp = staff_client.post("/room/imports/", {"which": "circus", "circus-study_name": "circus-web",
                                                    "circus-files": handles, "circus-dataset_prefix": "circus",
                                                    "circus-verify_checksum": "on"})
    finally:
        for h in handles:
            h.close()
    page = resp.content.decode()
    study = Study.objects.get(name="circus-web")
    assert 'class="status done"' in page and f"Study {study.pk}" in page
    assert study.items.count() > 0 and study.annotators.count() == len(files)

