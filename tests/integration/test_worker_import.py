"""A browser import too large to run inline goes through a real Celery worker process.

In CI the broker is Redis and the database PostgreSQL; locally the same test runs on the
filesystem broker and the SQLite file.
"""

from __future__ import annotations

import json

import pytest

from retrieval.models import ImportJob, Query
from tests.conftest import FIXTURES, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_upload_runs_on_a_real_worker_and_reports_progress(client, demo_accounts, worker_factory):
    worker = worker_factory().start("import")
    assert client.login(username="admin", password=demo_accounts["admin"])
    val = FIXTURES / "datasets" / "circo" / "val.json"
    with open(val, "rb") as fh:
        resp = client.post("/datasets/import/", {"format": "circo", "name": "circo-upload", "files": [fh]})
    assert resp.status_code == 302, resp.content[:500]
    job = ImportJob.objects.get()
    assert resp["Location"] == f"/datasets/imports/{job.pk}/"

    def finished():
        job.refresh_from_db()
        return job.status in ("done", "failed")

    wait_for(finished, timeout=90, what=f"the worker to run the import\n{worker.log()}")
    assert job.status == "done", job.error
    assert job.report["queries"] == 220 == Query.objects.filter(dataset__name="circo-upload").count()
    status = client.get(f"/datasets/imports/{job.pk}/status/").json()
    assert status["status"] == "done" and status["percent"] == 100
    assert "retrieval.run_import" in worker.log()


def test_a_redelivered_import_task_is_idempotent(demo_accounts):
    """acks_late: a task seen twice (worker killed before ack) must not import twice."""
    from retrieval.tasks import run_import

    val = FIXTURES / "datasets" / "circo" / "val.json"
    job = ImportJob.objects.create(dataset_name="twice", format="circo", files=[str(val)])
    assert run_import.apply(args=[job.pk]).get() == "done"
    assert run_import.apply(args=[job.pk]).get() == "done"
    assert Query.objects.filter(dataset__name="twice").count() == len(json.loads(val.read_text()))
