"""The one job framework (retrieval/jobs): claim, heartbeat, sweep rules, failures, the
progress JSON shape, and the broker-down answer of the pages that start jobs."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from retrieval.jobs import leases, sending
from retrieval.jobs.models import Job, Leased, Progress
from retrieval.models import Dataset, ImportJob, Query
from retrieval.services import run_import_job
from tests.brokers import celery_broker, free_port
from tests.conftest import FIXTURES, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

VAL = FIXTURES / "datasets" / "circo" / "val.json"


def test_every_job_kind_shares_the_abstract_models():
    from annotation.models import ExportJob
    from audit.models import AuditChunk, AuditRun

    assert issubclass(ImportJob, Job) and issubclass(ExportJob, Job)
    assert issubclass(AuditChunk, Leased) and issubclass(AuditRun, Progress)
    assert AuditChunk.WAITING == "pending" and ImportJob.WAITING == "queued"


def test_default_settings_resend_a_dead_workers_job_within_30_seconds():
    # a beat every 5 s, silent for 25 s = dead, swept every 5 s: resent within 30 s,
    # and a live worker misses several beats before it would be taken for dead
    assert leases.stale_seconds() + leases.sweep_seconds() <= 30  # the last beat goes stale, then the next sweep
    assert leases.stale_seconds() >= 3 * leases.heartbeat_seconds()
    from django.conf import settings

    assert leases.stale_seconds() < settings.AUDIT_LEASE_SECONDS  # independent of the long lease


def test_claim_is_taken_once_until_the_heartbeat_goes_stale(settings):
    settings.JOB_STALE_SECONDS = 20
    job = ImportJob.objects.create(dataset_name="x", format="circo", files=[str(VAL)])
    assert leases.claim(ImportJob, job.pk, "w1")
    assert not leases.claim(ImportJob, job.pk, "w2")  # alive in w1
    ImportJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=21))
    assert leases.claim(ImportJob, job.pk, "w2")  # w1 stopped beating
    job.refresh_from_db()
    assert (job.owner, job.attempts, job.status) == ("w2", 2, "running")
    assert not leases.finish(ImportJob, job.pk, "w1")  # w1 lost its lease: it cannot finish
    assert leases.finish(ImportJob, job.pk, "w2", report={"ok": 1})
    assert not leases.claim(ImportJob, job.pk, "w3")  # done stays done


def test_heartbeat_writes_progress_and_notices_a_takeover(settings):
    job = ImportJob.objects.create(dataset_name="x", format="circo")
    assert leases.claim(ImportJob, job.pk, "w1")
    with leases.Heartbeat(ImportJob, job.pk, "w1", interval=0.1, progress=True) as beat:
        beat.report("writing queries", 3, 10)
        wait_for(lambda: ImportJob.objects.get(pk=job.pk).done == 3, timeout=10, what="the progress")
        ImportJob.objects.filter(pk=job.pk).update(owner="w2")
        wait_for(lambda: beat.lost, timeout=10, what="the takeover to be noticed")
        with pytest.raises(leases.LeaseLost):
            beat.check()
    assert ImportJob.objects.get(pk=job.pk).stage == "writing queries"


def test_sweep_rules_resend_stale_and_lost_jobs_and_give_up_after_the_attempts(settings):
    settings.JOB_STALE_SECONDS = 20
    settings.JOB_RESEND_SECONDS = 60
    old = timezone.now() - timedelta(seconds=61)
    dead = ImportJob.objects.create(dataset_name="a", format="circo", status="running", attempts=1, heartbeat_at=old)
    spent = ImportJob.objects.create(dataset_name="b", format="circo", status="running", attempts=3, heartbeat_at=old)
    alive = ImportJob.objects.create(
        dataset_name="c", format="circo", status="running", attempts=1, heartbeat_at=timezone.now()
    )
    never_sent = ImportJob.objects.create(dataset_name="d", format="circo")
    lost = ImportJob.objects.create(dataset_name="e", format="circo", enqueued_at=old)
    waiting = ImportJob.objects.create(dataset_name="f", format="circo", enqueued_at=timezone.now())
    sent: list[int] = []
    given_up: list[int] = []
    out = leases.resend_stale(
        ImportJob.objects.all(), lambda pk: sent.append(pk) or True, give_up=lambda row: given_up.append(row.pk)
    )
    assert out == {"resent_stale": 1, "failed": 1} and sent == [dead.pk] and given_up == [spent.pk]
    assert ImportJob.objects.get(pk=dead.pk).status == "queued"
    assert ImportJob.objects.get(pk=alive.pk).status == "running"
    sent.clear()
    assert leases.resend_lost(ImportJob.objects.exclude(pk=dead.pk), lambda pk: sent.append(pk) or True) == 2
    assert sorted(sent) == [never_sent.pk, lost.pk] and waiting.pk not in sent
    # the broker is down: the job is marked never sent, so the next sweep tries again
    again = ImportJob.objects.create(dataset_name="g", format="circo", enqueued_at=old)
    assert leases.resend_lost(ImportJob.objects.filter(pk=again.pk), lambda pk: False) == 0
    assert ImportJob.objects.get(pk=again.pk).enqueued_at is None
    assert leases.resend_lost(ImportJob.objects.filter(pk=again.pk), lambda pk: sent.append(pk) or True) == 1


@pytest.mark.parametrize(
    "exc, message",
    [
        (RuntimeError("disk on fire"), "RuntimeError: disk on fire"),
        (KeyError("reference"), "KeyError: 'reference'"),
        (ValueError("val.json: record 3: field 'id' is missing"), "val.json: record 3: field 'id' is missing"),
    ],
)
def test_any_exception_fails_an_import_readably_with_nothing_written(exc, message):
    """The failure comes while targets are written, after the dataset, images and queries."""
    job = ImportJob.objects.create(dataset_name="boom", format="circo", files=[str(VAL)])
    hits = []

    def boom(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("INSERT") and '"retrieval_target"' in sql:
            hits.append(sql)
            raise exc
        return execute(sql, params, many, context)

    with connection.execute_wrapper(boom):
        job = run_import_job(job)
    assert hits  # it really failed half way through the writes
    assert job.status == "failed" and job.error.startswith(message) and job.finished_at is not None
    if not isinstance(exc, ValueError):  # unexpected: a reference number to find the traceback in the log
        assert re.search(r"\(reference [0-9a-f]{8}: the details are in the server log\)$", job.error), job.error
    assert not Dataset.objects.filter(name="boom").exists() and not Query.objects.exists()
    assert run_import_job(job).status == "failed"  # a redelivered message does not run it again


def test_progress_endpoints_share_one_shape(client, demo_accounts):
    job = run_import_job(ImportJob.objects.create(dataset_name="shape", format="circo", files=[str(VAL)]))
    assert job.status == "done"
    assert client.login(username="admin", password=demo_accounts["admin"])
    body = client.get(f"/datasets/imports/{job.pk}/status/").json()
    assert set(body) >= {"id", "status", "stage", "done", "total", "percent", "eta_seconds", "error", "report"}
    assert body["percent"] == 100 and body["report"]["queries"] == 220 and body["id"] == job.pk


def test_send_task_answers_false_when_the_broker_is_down():
    with celery_broker(f"redis://127.0.0.1:{free_port()}/0"):  # nothing listens there
        from celery import current_app

        from retrieval.tasks import RUN_IMPORT

        assert RUN_IMPORT in current_app.tasks  # a refused connection, not an unknown task
        assert sending.send_task(RUN_IMPORT, 1) is False


def _planned_run(tmp_path):
    from audit.runs import planning
    from retrieval.demo import build_demo
    from retrieval.loader import load_parsed

    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=20, n_single=6, n_sessions=0), "demo", images_root=root)
    run = planning.create_run("demo", ["openclip:cirval-tiny-vit"], chunk_queries=3, chunk_gallery=10)
    planning.plan_run(run)
    return run


def test_audit_chunks_finish_and_fail_only_for_the_worker_that_holds_them(tmp_path, settings):
    """Issue 28: a chunk taken over by another worker can be neither finished nor failed by
    the worker that lost it (the job framework's owner checks)."""
    from audit.models import AuditChunk, AuditRank, AuditRun
    from audit.runs import execution

    settings.JOB_STALE_SECONDS = 20
    run = _planned_run(tmp_path)
    chunk = AuditChunk.objects.filter(run=run, kind="queries").first()
    assert leases.claim(AuditChunk, chunk.pk, "w1")
    AuditChunk.objects.filter(pk=chunk.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=21))
    assert leases.claim(AuditChunk, chunk.pk, "w2")  # w1 went silent: w2 took it over
    row = AuditRank(run=run, query_id=chunk.items[0], retriever=chunk.retriever)
    assert execution._write_chunk(run, chunk, {}, [row], "w1") is False  # the loser writes nothing
    assert not AuditRank.objects.filter(run=run).exists()
    execution.fail_chunk(chunk, "w1 failed", owner="w1")  # nor can it fail w2's chunk or the run
    chunk.refresh_from_db()
    assert chunk.status == "running" and chunk.owner == "w2"
    assert AuditRun.objects.get(pk=run.pk).status != "failed"
    assert execution._write_chunk(run, chunk, {}, [row], "w2") is True
    chunk.refresh_from_db()
    assert chunk.status == "done" and AuditRank.objects.filter(run=run).count() == 1


def test_a_broker_reconnect_resends_waiting_work_at_once(tmp_path, settings, monkeypatch):
    """Messages sent before a broker reconnect may be lost: they are sent again at the next
    sweep, not after JOB_RESEND_SECONDS; a chunk of a busy run too (the audit resumed ~290 s
    after a Redis restart before)."""
    from audit.models import AuditChunk
    from audit.runs import dispatch

    settings.JOB_RESEND_SECONDS = 600
    run = _planned_run(tmp_path)
    job = ImportJob.objects.create(dataset_name="x", format="circo", files=[str(VAL)], enqueued_at=timezone.now())
    AuditChunk.objects.filter(run=run).update(enqueued_at=timezone.now())
    waiting, busy = AuditChunk.objects.filter(run=run, kind="gallery")[:2]
    AuditChunk.objects.filter(pk=busy.pk).update(status="running", owner="w9", heartbeat_at=timezone.now())
    AuditRun = type(run)
    AuditRun.objects.filter(pk=run.pk).update(coordinator_seen_at=timezone.now())
    chunks, tasks = [], []
    monkeypatch.setattr(dispatch, "_send_chunk", lambda pk, kind: chunks.append(pk) or True)
    monkeypatch.setattr(dispatch, "send_task", lambda *a, **k: tasks.append(a) or True)
    resend = lambda: leases.resend_lost(ImportJob.objects.all(), lambda pk: sent.append(pk) or True)  # noqa: E731
    sent = []
    assert resend() == 0  # sent just now, the run busy: nothing is lost yet
    assert dispatch.reconcile(run.pk)["resent_lost"] == 0 and not chunks and not tasks
    old = leases.reconnected_at()
    try:
        leases.messages_lost()  # what the worker's consumer step calls after a reconnect
        assert resend() == 1 and sent == [job.pk]
        assert resend() == 1 - 1  # once per reconnect
        out = dispatch.reconcile(run.pk)
        assert out["resent_lost"] >= 1 and waiting.pk in chunks and busy.pk not in chunks
        assert out["coordinator"] == 1 and tasks  # the coordinator's countdown message was lost too
    finally:
        leases._lost_before = old


def test_a_stopping_workers_jobs_are_released_never_sent_and_not_counted():
    job = ImportJob.objects.create(dataset_name="x", format="circo", files=[str(VAL)])
    other = ImportJob.objects.create(dataset_name="y", format="circo", files=[str(VAL)])
    assert leases.claim(ImportJob, job.pk, "host:11") and leases.claim(ImportJob, other.pk, "host:12")
    assert leases.release(["host:11", "host:10"]) == {"retrieval.ImportJob": 1}
    job.refresh_from_db()
    other.refresh_from_db()
    assert (job.status, job.owner, job.attempts, job.enqueued_at) == ("queued", "", 0, None)
    assert (other.status, other.owner) == ("running", "host:12")
    sent = []
    assert leases.resend_lost(ImportJob.objects.all(), lambda pk: sent.append(pk) or True) == 1 and sent == [job.pk]


def test_health_counts_only_work_a_worker_still_has_to_run(tmp_path):
    """/healthz's workers are down when work waits and none beats: chunks of a failed audit
    never run again and do not count."""
    from audit.models import AuditRun
    from retrieval.jobs import workers

    run = _planned_run(tmp_path)
    assert workers.waiting_jobs().get("audit.AuditChunk") == run.chunks.count()
    assert workers.health()["ok"] is False and workers.health()["alive"] == 0
    AuditRun.objects.filter(pk=run.pk).update(status="failed")
    assert "audit.AuditChunk" not in workers.waiting_jobs()
    assert workers.health()["ok"] is (not workers.waiting_jobs())
