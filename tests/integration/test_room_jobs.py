"""Every job in one list; a failed audit retried from it."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from annotation.models import ExportJob
from annotation.studies.building import StudySpec, create_study
from audit.models import AuditRun
from audit.runs.planning import create_run
from retrieval.models import ImportJob
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db


def test_jobs_list_and_audit_retry(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False  # the retry is handed to workers after commit (none here)
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    run = create_run("circo", ["openclip:cirval-tiny-vit"])
    AuditRun.objects.filter(pk=run.pk).update(status=AuditRun.Status.FAILED, error="chunk 3 failed 3 times\ntrace")
    ImportJob.objects.create(dataset_name="x", format="circo", status="running", done=5, total=10)
    study, _ = create_study(StudySpec(name="s", datasets=["circo"], overlap=1, total=2))
    ExportJob.objects.create(study=study, status="queued")
    c = Client()
    c.force_login(get_user_model().objects.create_user("boss", password="pw", is_staff=True))
    page = c.get("/room/jobs/").content.decode()
    assert page.count('<tr class="job ') == 3
    assert "import x (circo)" in page and "50 %" in page and "export of s" in page
    assert "chunk 3 failed 3 times" in page and "trace" not in page and f"/room/audits/{run.pk}/retry/" in page
    kinds = [j["kind"] for j in c.get("/room/jobs.json").json()["jobs"]]
    assert sorted(kinds) == ["audit", "export", "import"]

    resp = c.post(f"/room/audits/{run.pk}/retry/")
    assert resp.status_code == 302
    run.refresh_from_db()
    assert run.status in (AuditRun.Status.QUEUED, AuditRun.Status.RUNNING) and run.error == ""
    assert f"/room/audits/{run.pk}/retry/" not in c.get("/room/jobs/").content.decode()
