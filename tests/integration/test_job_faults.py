"""Jobs that survive their worker and the broker (real workers, a private Redis).

* an import whose worker is SIGKILLed is finished by the next worker, nothing partial;
* the broker restarted (every message lost) mid-run: an audit, an import and an export
  all finish with no human action (the workers' sweep resends what was lost);
* the broker down when a job is started: the page says so (no 500) and the sweep starts
  the job once the broker is back;
* a worker killed mid-chunk is found by its short heartbeat, not the long audit lease.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from annotation.models import ExportJob, Study
from annotation.tasks import RUN_EXPORT
from audit.models import AuditChunk, AuditLabel, AuditRank, AuditRun
from audit.runs import dispatch, planning
from retrieval.demo import build_demo
from retrieval.jobs.sending import QUEUE_DOWN, enqueue
from retrieval.loader import load_parsed
from retrieval.models import ImportJob, Query
from retrieval.tasks import RUN_IMPORT
from tests.brokers import PrivateRedis, celery_broker, needs_redis_server
from tests.conftest import FIXTURES, bench_module, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

VAL = FIXTURES / "datasets" / "circo" / "val.json"
#: Short beats so that the tests run in seconds (the defaults: 5 s beat, 25 s stale, 5 s sweep).
FAST = {"JOB_HEARTBEAT_SECONDS": "0.5", "JOB_STALE_SECONDS": "3", "JOB_SWEEP_SECONDS": "1"}
SPECS = ["openclip:cirval-tiny-vit", "openclip:cirval-tiny-vit-b"]


def ended(model, pk):
    def check():
        row = model.objects.get(pk=pk)
        return row if row.status in ("done", "failed") else None

    return check


def big_circo(folder, n: int):
    """A CIRCO-style file of ``n`` queries (the fixture's records, renumbered)."""
    records = json.loads(VAL.read_text())
    out = []
    for i in range(n):
        r = dict(records[i % len(records)])
        shift = 10_000_000 * (i // len(records))
        r.update(
            id=i,
            reference_img_id=r["reference_img_id"] + shift,
            target_img_id=r["target_img_id"] + shift,
            gt_img_ids=[g + shift for g in r["gt_img_ids"]],
        )
        out.append(r)
    path = folder / "val.json"
    path.write_text(json.dumps(out))
    return path


def small_study(n: int = 200) -> Study:
    return Study.objects.get(pk=bench_module("export").build_study(n, 3))


def test_killed_import_is_finished_by_the_next_worker_with_nothing_partial(tmp_path, worker_factory):
    n = 10000  # an import of 10,000 queries runs for seconds (about 8 s of CPU), the kill comes 1 s in
    path = big_circo(tmp_path, n)
    job = ImportJob.objects.create(dataset_name="big", format="circo", files=[str(path)])
    first = worker_factory(queues="celery", extra_env=FAST).start("import1")
    assert enqueue(ImportJob, job.pk, RUN_IMPORT)
    wait_for(
        lambda: ImportJob.objects.get(pk=job.pk).status == "running",
        timeout=120,
        interval=0.05,
        what=f"the import to start\n{first.log()}",
    )
    time.sleep(1.0)
    first.kill(signal.SIGKILL)
    killed = ImportJob.objects.get(pk=job.pk)
    assert killed.status == "running" and killed.attempts == 1, killed.error  # really interrupted
    assert not Query.objects.filter(dataset__name="big").exists()  # nothing partial

    second = worker_factory(queues="celery", extra_env=FAST).start("import2")
    done = wait_for(ended(ImportJob, job.pk), timeout=240, what=f"the second worker to finish\n{second.log()}")
    assert done.status == "done", done.error
    assert done.attempts == 2 and done.report["queries"] == n
    assert Query.objects.filter(dataset__name="big").count() == n
    assert "imports sent again by the sweep" in second.log()


def test_broker_restart_loses_every_message_and_audit_import_export_still_finish(tmp_path, worker_factory):
    needs_redis_server()
    redis = PrivateRedis(tmp_path, persist=False).start()
    try:
        root = tmp_path / "demo"
        load_parsed(build_demo(root, n_gallery=60, n_single=24, n_sessions=4), "demo", images_root=root)
        study = small_study()
        env = {
            **FAST,
            "CELERY_BROKER_URL": redis.url,
            "EMBEDDING_CACHE_DIR": str(tmp_path / "emb"),
            "AUDIT_LEASE_SECONDS": "3",
            "AUDIT_COORDINATOR_SECONDS": "1",
            "JOB_RESEND_SECONDS": "3",
            "AUDIT_MAX_ATTEMPTS": "5",
            "CELERY_VISIBILITY_TIMEOUT": "5",
        }
        with celery_broker(redis.url):
            worker = worker_factory(extra_env=env).start("restart")
            run = planning.create_run("demo", SPECS, chunk_queries=4, chunk_gallery=20)
            dispatch.kick_coordinator(run.pk)
            wait_for(
                lambda: run.chunks.filter(status="done").exists(),
                timeout=120,
                interval=0.05,
                what=f"a first chunk\n{worker.log()}",
            )
            imp = ImportJob.objects.create(dataset_name="circo-restart", format="circo", files=[str(VAL)])
            exp = ExportJob.objects.create(study=study, policy="majority", total=study.items.count())
            assert enqueue(ImportJob, imp.pk, RUN_IMPORT) and enqueue(ExportJob, exp.pk, RUN_EXPORT)
            redis.stop()  # no persistence: queued and unacknowledged messages are gone
            time.sleep(1)
            redis.start()

            final = wait_for(ended(AuditRun, run.pk), timeout=240, what=f"the audit\n{worker.log()[-3000:]}")
            imported = wait_for(ended(ImportJob, imp.pk), timeout=120, what=f"the import\n{worker.log()[-3000:]}")
            exported = wait_for(ended(ExportJob, exp.pk), timeout=120, what=f"the export\n{worker.log()[-3000:]}")
        assert final.status == "done", final.error
        assert AuditLabel.objects.filter(run=final).count() == 24
        assert AuditRank.objects.filter(run=final).count() == 2 * 24  # no duplicate rank rows
        assert imported.status == "done", imported.error
        assert Query.objects.filter(dataset__name="circo-restart").count() == 220
        assert exported.status == "done", exported.error
        assert exported.manifest["counts"]["items"] == 200
        assert "by the sweep" in worker.log()
    finally:
        redis.stop()


def test_broker_down_the_page_says_so_and_the_sweep_starts_the_job_later(
    tmp_path, client, demo_accounts, worker_factory
):
    needs_redis_server()
    redis = PrivateRedis(tmp_path)  # not started yet: the broker is down
    study = small_study(50)
    assert client.login(username="admin", password=demo_accounts["admin"])
    with celery_broker(redis.url):
        with open(VAL, "rb") as fh:
            resp = client.post(
                "/datasets/import/", {"format": "circo", "name": "circo-down", "files": [fh]}, follow=True
            )
        assert resp.status_code == 200 and QUEUE_DOWN in resp.content.decode()
        imp = ImportJob.objects.get()
        assert imp.status == "queued" and imp.enqueued_at is None
        resp = client.post(f"/studies/{study.pk}/export/", {"policy": "majority"}, follow=True)
        assert resp.status_code == 200 and QUEUE_DOWN in resp.content.decode()
        exp = ExportJob.objects.get()
        assert exp.status == "queued" and exp.enqueued_at is None
        # the job pages say it too, after the message is gone
        for url in (f"/datasets/imports/{imp.pk}/", f"/exports/{exp.pk}/"):
            assert (
                "The job queue is unavailable, the job will start when it is back." in client.get(url).content.decode()
            )

        redis.start()
        try:
            worker = worker_factory(extra_env={**FAST, "CELERY_BROKER_URL": redis.url}).start("down")
            imported = wait_for(ended(ImportJob, imp.pk), timeout=120, what=f"the import\n{worker.log()}")
            exported = wait_for(ended(ExportJob, exp.pk), timeout=120, what=f"the export\n{worker.log()}")
        finally:
            redis.stop()
    assert imported.status == "done" and imported.report["queries"] == 220, imported.error
    assert exported.status == "done", exported.error
    assert "imports sent again by the sweep" in worker.log() and "exports sent again" in worker.log()


def test_a_worker_killed_mid_chunk_is_found_by_its_heartbeat_not_the_lease(tmp_path, worker_factory, capsys):
    """Two workers; the one running a chunk is killed. The long audit lease is 600 s here;
    the other worker's sweep takes the chunk back after the short heartbeat's staleness
    (3 s here, 25 s by default) plus at most one sweep period."""
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=60, n_single=24, n_sessions=0), "demo", images_root=root)
    env = {
        **FAST,
        "EMBEDDING_CACHE_DIR": str(tmp_path / "emb"),
        "AUDIT_LEASE_SECONDS": "600",
        "AUDIT_COORDINATOR_SECONDS": "1",
        "CELERY_VISIBILITY_TIMEOUT": "600",
    }
    run = planning.create_run("demo", SPECS[:1], chunk_queries=4, chunk_gallery=20)
    workers = [worker_factory(extra_env=env).start(name) for name in ("beat1", "beat2")]
    wait_for(lambda: all("ready" in w.log() for w in workers), timeout=120, what="both workers")
    dispatch.kick_coordinator(run.pk)

    def under_way():
        return run.chunks.filter(status="done").exists() and run.chunks.filter(status="running").first()

    cut: dict = {}
    for _ in range(20):  # a chunk of this tiny audit can end between being seen and the kill: try another
        chunk = wait_for(under_way, timeout=120, interval=0.02, what=f"a chunk under way\n{workers[0].log()}")
        pid = int(chunk.owner.rsplit(":", 1)[1])  # a pool process of one of the workers
        victim = next(w for w in workers if os.getpgid(pid) == w.proc.pid)
        os.killpg(victim.proc.pid, signal.SIGSTOP)  # frozen: what it runs now stays running
        cut = {c.pk: c.heartbeat_at for c in run.chunks.filter(status="running", owner=chunk.owner)}
        if cut:
            break
        os.killpg(victim.proc.pid, signal.SIGCONT)
    assert cut, "no chunk was still running when its worker was frozen, in 20 tries"
    survivor = next(w for w in workers if w is not victim)
    victim.kill(signal.SIGKILL)
    final = wait_for(ended(AuditRun, run.pk), timeout=180, what=f"the run to finish\n{survivor.log()[-3000:]}")
    assert final.status == "done", final.error
    for pk, last_beat in cut.items():
        chunk = AuditChunk.objects.get(pk=pk)
        assert chunk.attempts == 2 and chunk.status == "done"
        resent_after = (chunk.started_at - last_beat).total_seconds()
        print(
            f"chunk {pk}: taken again {resent_after:.1f} s after its worker's last beat "
            f"(stale after 3 s, sweep every 1 s; the lease is 600 s)"
        )
        assert resent_after < 600  # the heartbeat found it, not the lease
