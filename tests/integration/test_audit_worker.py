"""Acceptance: an audit on a real Celery worker survives a SIGKILLed worker.

The worker is killed while the run is part-way (some chunks done, some not); a new
worker starts, takes over (worker_ready reconcile), resends the chunks whose lease went
stale or whose message was lost, and the run completes with the labels of an
uninterrupted in-process run and no duplicate rank rows. Locally the broker is kombu's
filesystem transport (a taken message is gone once its worker dies); in CI it is Redis
with a 5 s visibility timeout (the message comes back, and must not do harm).
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from audit.models import AuditChunk, AuditLabel, AuditRank, AuditRun
from audit.runs import base, chunk_leases, dispatch, planning
from audit.runs.encoding import clear_memos
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from retrieval.models import Dataset, Query
from tests.conftest import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SPECS = ["openclip:cirval-tiny-vit", "openclip:cirval-tiny-vit-b"]
LEASE = 2


def stop(worker) -> None:
    """Warm shutdown through the main process only (a SIGTERM to the whole process group can
    leave billiard's pool waiting on a child that died first, for the fixture's full timeout)."""
    if worker.proc and worker.proc.poll() is None:
        worker.proc.send_signal(signal.SIGTERM)
        try:
            worker.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()


def test_killed_worker_is_recovered_and_labels_match_an_eager_run(tmp_path, settings, worker_factory):
    cache_dir = tmp_path / "embeddings"
    settings.EMBEDDING_CACHE_DIR = cache_dir
    settings.AUDIT_LEASE_SECONDS = LEASE
    settings.JOB_STALE_SECONDS = LEASE
    settings.AUDIT_COORDINATOR_SECONDS = 1
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=60, n_single=24, n_sessions=4), "demo", images_root=root)
    dataset = Dataset.objects.get(name="demo")
    env = {
        "EMBEDDING_CACHE_DIR": str(cache_dir),
        "AUDIT_LEASE_SECONDS": str(LEASE),
        "JOB_STALE_SECONDS": str(LEASE),
        "JOB_HEARTBEAT_SECONDS": "0.5",
        "AUDIT_COORDINATOR_SECONDS": "1",
        "AUDIT_MAX_ATTEMPTS": "5",
        "CELERY_VISIBILITY_TIMEOUT": "5",
    }
    run = planning.create_run(dataset, SPECS, chunk_queries=6, chunk_gallery=30)

    first = worker_factory(extra_env=env).start("audit1")
    dispatch.kick_coordinator(run.pk)

    def part_done():
        done = AuditChunk.objects.filter(run=run, status="done").count()
        return done >= 3 and AuditChunk.objects.filter(run=run, status="running").exists()

    wait_for(part_done, timeout=60, interval=0.02, what=f"the first chunks\n{first.log()}")
    first.kill(signal.SIGKILL)
    total = AuditChunk.objects.filter(run=run).count()
    assert (
        total == 2 * (5 + 4 + 1) + 1
    )  # gallery (133 images: the near misses), queries and sessions per retriever; one texts chunk
    done_at_kill = AuditChunk.objects.filter(run=run, status="done").count()
    assert 3 <= done_at_kill < total
    interrupted = list(AuditChunk.objects.filter(run=run, status="running").values_list("pk", flat=True))
    assert AuditRun.objects.get(pk=run.pk).status == "running"

    second = worker_factory(extra_env=env).start("audit2")

    def finished():
        r = AuditRun.objects.get(pk=run.pk)
        return r.status in ("done", "failed") and r

    result = wait_for(finished, timeout=60, interval=0.2, what=f"the second worker to finish the run\n{second.log()}")
    assert result.status == "done", result.error
    # chunks cut off by the kill were run again under a new lease
    for pk in interrupted:
        chunk = AuditChunk.objects.get(pk=pk)
        assert chunk.status == "done" and chunk.attempts >= 2
    assert "audit.tasks" in second.log()
    stop(second)

    pairs = list(AuditRank.objects.filter(run=run).values_list("query_id", "retriever"))
    assert len(pairs) == len(set(pairs)) == 2 * 24
    worker_labels = dict(AuditLabel.objects.filter(run=run).values_list("query_id", "label"))
    assert set(worker_labels) == set(Query.objects.filter(dataset=dataset, n_turns=1).values_list("pk", flat=True))
    assert result.summary["skipped"] == {}
    assert result.summary["sessions"]["n_sessions"] == 4

    # The same audit uninterrupted, in-process (same cache, so the same embeddings).
    clear_memos()
    eager = dispatch.run_inline(planning.create_run(dataset, SPECS, chunk_queries=6, chunk_gallery=30))
    assert eager.status == "done"
    assert eager.timings["cache"]["encoded"] == 0
    assert dict(AuditLabel.objects.filter(run=eager).values_list("query_id", "label")) == worker_labels
    ranks = {
        r.pk: sorted(AuditRank.objects.filter(run=r).values_list("query_id", "retriever", "mm", "text", "image"))
        for r in (result, eager)
    }
    assert ranks[result.pk] == ranks[eager.pk]
    assert result.summary["counts"] == eager.summary["counts"]


def test_resume_command_resends_a_stale_chunk(tmp_path, settings, worker_factory):
    """With no coordinator left (all its messages lost), resume_audits gets the run going again."""
    from django.core.management import call_command

    cache_dir = tmp_path / "embeddings"
    settings.EMBEDDING_CACHE_DIR = cache_dir
    settings.AUDIT_LEASE_SECONDS = LEASE
    settings.JOB_STALE_SECONDS = LEASE
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=30, n_single=8, n_sessions=2), "demo", images_root=root)
    run = planning.create_run(
        "demo", SPECS[:1], chunk_queries=4, chunk_gallery=60
    )  # the 59 images in one gallery chunk
    planning.plan_run(run)
    # pretend a worker took the gallery chunk and died two leases ago
    from datetime import timedelta

    from django.utils import timezone

    old = timezone.now() - timedelta(seconds=3 * LEASE)
    AuditChunk.objects.filter(run=run, kind="gallery").update(
        status="running", owner="gone:1", attempts=1, heartbeat_at=old, started_at=old, enqueued_at=old
    )
    AuditRun.objects.filter(pk=run.pk).update(coordinator_seen_at=old, coordinator_token="lost")
    env = {
        "EMBEDDING_CACHE_DIR": str(cache_dir),
        "AUDIT_LEASE_SECONDS": str(LEASE),
        "JOB_STALE_SECONDS": str(LEASE),
        "JOB_HEARTBEAT_SECONDS": "0.5",
        "AUDIT_COORDINATOR_SECONDS": "1",
        "CELERY_VISIBILITY_TIMEOUT": "5",
    }
    worker = worker_factory(extra_env=env).start("resume")
    call_command("resume_audits", str(run.pk))
    r = wait_for(
        lambda: (x := AuditRun.objects.get(pk=run.pk)).status in ("done", "failed") and x,
        timeout=60,
        what=f"the resumed run\n{worker.log()}",
    )
    stop(worker)
    assert r.status == "done", r.error
    assert AuditChunk.objects.get(run=run, kind="gallery").attempts == 2
    assert AuditLabel.objects.filter(run=run).count() == 8


def test_heartbeat_renews_the_lease_and_notices_a_takeover(tmp_path, settings):
    settings.AUDIT_LEASE_SECONDS = LEASE
    settings.JOB_STALE_SECONDS = LEASE
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=20, n_single=4, n_sessions=0), "demo", images_root=root)
    run = planning.create_run("demo", SPECS[:1])
    planning.plan_run(run)
    chunk = AuditChunk.objects.filter(run=run).first()
    assert chunk_leases.claim_chunk(chunk.pk, "w1")
    first_beat = AuditChunk.objects.get(pk=chunk.pk).heartbeat_at
    beat = chunk_leases.Heartbeat(chunk.pk, "w1", interval=0.1)
    try:
        wait_for(lambda: AuditChunk.objects.get(pk=chunk.pk).heartbeat_at > first_beat, timeout=5, what="a heartbeat")
        beat.check()  # still ours
        AuditChunk.objects.filter(pk=chunk.pk).update(owner="w2")  # another worker took it over
        wait_for(lambda: beat.lost, timeout=5, what="the heartbeat to notice")
        with pytest.raises(base.LeaseLost):
            beat.check()
    finally:
        beat.stop()
    assert AuditChunk.objects.get(pk=chunk.pk).owner == "w2"
