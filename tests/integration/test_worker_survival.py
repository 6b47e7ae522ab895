"""Workers that cannot die quietly (issue 29): real workers, a real private Redis.

* the embedded filesystem broker never hands out half a message, and an unreadable one is
  set aside without killing the worker;
* a worker started as the README says survives Redis restarts during an import and an
  export, and an audit resumes at once after the restart (the broker reconnect resends
  what the restart lost, not the 120 s resend timeout);
* SIGTERM stops a busy worker within seconds and its job is sent again at once;
* pages and ``/healthz`` say "no worker alive" while jobs wait and no worker beats.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from django.conf import settings

from annotation.models import ExportJob
from annotation.tasks import RUN_EXPORT
from audit.models import AuditLabel, AuditRun
from audit.runs import dispatch, planning
from config.fsbroker import PARTIAL
from retrieval.demo import build_demo
from retrieval.jobs import workers
from retrieval.jobs.sending import enqueue
from retrieval.loader import load_parsed
from retrieval.models import ImportJob, Query
from retrieval.tasks import RUN_IMPORT
from tests.brokers import PrivateRedis, celery_broker, needs_redis_server
from tests.conftest import FIXTURES, ROOT, bench_module, wait_for
from tests.integration.test_job_faults import big_circo, ended

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

VAL = FIXTURES / "datasets" / "circo" / "val.json"
SPECS = ["openclip:cirval-tiny-vit", "openclip:cirval-tiny-vit-b"]
#: Short beats; the resend and audit-lease timeouts long, so that only the new paths (a
#: broker reconnect, a stopping worker's release) can explain a prompt resend.
BEATS = {"JOB_HEARTBEAT_SECONDS": "0.5", "JOB_SWEEP_SECONDS": "1"}
NO_TIMEOUT_RESEND = {"JOB_RESEND_SECONDS": "600", "AUDIT_LEASE_SECONDS": "600", "JOB_STALE_SECONDS": "600"}


#: A producer in another process: ``n`` messages of ``size`` characters on queue "stress".
PRODUCER = """
import json, sys
from kombu import Connection
from config import fsbroker
fsbroker.register()
options, n, size = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with Connection("filesystem://", transport_options=options) as conn:
    q = conn.SimpleQueue("stress")
    for i in range(n):
        q.put({"i": i, "pad": "x" * size})
    q.close()
"""


def test_filesystem_broker_never_delivers_half_a_message(tmp_path):
    """A producer process writes large messages while this one consumes as fast as it can:
    every message arrives whole (kombu's own transport hands out files still being written)."""
    from kombu import Connection

    from config import fsbroker

    fsbroker.register()
    folders = {k: tmp_path / k for k in ("queue", "processed", "control")}
    for f in folders.values():
        f.mkdir()
    options = {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),
        "store_processed": False,
    }
    n = 300
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, json.dumps(options), str(n), "400000"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
    )
    got = []
    with Connection("filesystem://", transport_options=options) as conn:
        assert type(conn.transport).__module__ == "config.fsbroker"
        q = conn.SimpleQueue("stress")
        deadline = time.monotonic() + 120
        while len(got) < n and time.monotonic() < deadline:
            try:
                msg = q.get(timeout=0.01)
            except q.Empty:
                continue
            got.append(msg.payload["i"])
            assert len(msg.payload["pad"]) == 400_000
            msg.ack()
        q.close()
    assert producer.wait(timeout=30) == 0
    assert sorted(got) == list(range(n))
    assert not (tmp_path / "bad").exists() or not list((tmp_path / "bad").iterdir())


def filesystem_options() -> dict:
    """The embedded broker's folders under this test run's var/ (made here: with a Redis broker
    configured, as in CI, the settings do not make them)."""
    folders = {k: settings.BROKER_DIR / k for k in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),
        "store_processed": False,
        "polling_interval": 0.1,
    }


def test_an_unreadable_broker_message_is_set_aside_and_the_worker_lives_on(worker_factory):
    """On the embedded filesystem broker whatever broker the rest of the run uses."""
    with celery_broker("filesystem://", filesystem_options()):
        unreadable_message_is_set_aside(worker_factory)


def unreadable_message_is_set_aside(worker_factory):
    queue_dir = settings.BROKER_DIR / "queue"
    for old in queue_dir.glob("*.msg"):  # messages left by earlier tests name jobs of their databases
        old.unlink()
    torn = queue_dir / f"{int(time.monotonic() * 1000) - 10_000}_torn.celery.msg"
    torn.write_text('{"body": "eyJhIjog')  # half a message under a final name
    partial = queue_dir / f"{PARTIAL}being-written"
    partial.write_text('{"body"')  # a message still being written: never taken
    job = ImportJob.objects.create(dataset_name="after-torn", format="circo", files=[str(VAL)])
    worker = worker_factory(queues="celery", extra_env={"CELERY_BROKER_URL": "filesystem://"}).start("torn")
    assert enqueue(ImportJob, job.pk, RUN_IMPORT)
    done = wait_for(ended(ImportJob, job.pk), timeout=120, what=f"the import\n{worker.log()[-3000:]}")
    assert done.status == "done", done.error
    assert worker.proc.poll() is None, worker.log()[-3000:]  # still alive
    assert "Unrecoverable error" not in worker.log()
    wait_for(lambda: (settings.BROKER_DIR / "bad" / torn.name).exists(), timeout=30, what="the torn message set aside")
    assert not torn.exists() and "is unreadable" in worker.log()
    assert worker.proc.poll() is None
    assert partial.exists()
    partial.unlink()


def test_plain_worker_survives_redis_restarts_during_an_import_an_export_and_an_audit(tmp_path, worker_factory):
    needs_redis_server()
    redis = PrivateRedis(tmp_path, persist=False).start()
    try:
        root = tmp_path / "demo"
        load_parsed(build_demo(root, n_gallery=60, n_single=24, n_sessions=4), "demo", images_root=root)
        study = bench_module("export").build_study(3000, 3)
        big = big_circo(tmp_path, 20000)
        env = {
            **BEATS,
            **NO_TIMEOUT_RESEND,
            "CELERY_BROKER_URL": redis.url,
            "EMBEDDING_CACHE_DIR": str(tmp_path / "emb"),
            "AUDIT_COORDINATOR_SECONDS": "1",
            "AUDIT_MAX_ATTEMPTS": "5",
            "CELERY_VISIBILITY_TIMEOUT": "5",
            "JOB_STALE_SECONDS": "5",
        }
        with celery_broker(redis.url):
            worker = worker_factory(extra_env=env, plain=True, concurrency=2).start("plain")
            # 1. an import running while Redis restarts
            imp = ImportJob.objects.create(dataset_name="big", format="circo", files=[str(big)])
            assert enqueue(ImportJob, imp.pk, RUN_IMPORT)
            wait_for(
                lambda: ImportJob.objects.get(pk=imp.pk).status == "running",
                timeout=120,
                interval=0.05,
                what=f"the import to start\n{worker.log()[-3000:]}",
            )
            redis.stop()
            time.sleep(2)
            redis.start()
            # (SQLite: the import holds the write lock until it ends; the export is created after)
            assert (
                wait_for(ended(ImportJob, imp.pk), timeout=240, what=f"the import\n{worker.log()[-3000:]}").status
                == "done"
            )
            # 2. an export running while Redis restarts
            exp = ExportJob.objects.create(study_id=study, policy="majority", total=3000)
            assert enqueue(ExportJob, exp.pk, RUN_EXPORT)
            wait_for(
                lambda: ExportJob.objects.get(pk=exp.pk).status != "queued",
                timeout=120,
                interval=0.02,
                what=f"the export to start\n{worker.log()[-3000:]}",
            )
            redis.stop()
            time.sleep(2)
            redis.start()
            assert (
                wait_for(ended(ExportJob, exp.pk), timeout=120, what=f"the export\n{worker.log()[-3000:]}").status
                == "done"
            )
            # 3. an audit whose queued chunk messages the restart loses
            run = planning.create_run("demo", SPECS, chunk_queries=4, chunk_gallery=20)
            dispatch.kick_coordinator(run.pk)
            wait_for(
                lambda: run.chunks.filter(status="done").exists(),
                timeout=120,
                interval=0.05,
                what=f"a first chunk\n{worker.log()[-3000:]}",
            )
            redis.stop()
            time.sleep(2)
            redis.start()
            restarted = time.monotonic()
            # resend and lease timeouts are 600 s: only the reconnect can bring it back in time
            final = wait_for(ended(AuditRun, run.pk), timeout=240, what=f"the audit\n{worker.log()[-3000:]}")
            print(f"audit finished {time.monotonic() - restarted:.1f} s after the broker restart")
        assert final.status == "done", final.error
        assert AuditLabel.objects.filter(run=final).count() == 24
        assert Query.objects.filter(dataset__name="big").count() == 20000
        log = worker.log()
        assert worker.proc.poll() is None, log[-3000:]  # the worker is alive
        assert "Unrecoverable error" not in log and "AttributeError" not in log, log[-5000:]
        assert "the broker connection came back" in log
    finally:
        redis.stop()


def test_sigterm_stops_a_busy_worker_in_seconds_and_its_job_is_sent_again_at_once(tmp_path, worker_factory):
    path = big_circo(tmp_path, 30000)
    job = ImportJob.objects.create(dataset_name="big", format="circo", files=[str(path)])
    env = {**BEATS, **NO_TIMEOUT_RESEND, "WORKER_STOP_SECONDS": "1"}
    first = worker_factory(queues="celery", extra_env=env, plain=True).start("term1")
    assert enqueue(ImportJob, job.pk, RUN_IMPORT)
    wait_for(
        lambda: ImportJob.objects.get(pk=job.pk).status == "running",
        timeout=120,
        interval=0.05,
        what=f"the import to start\n{first.log()}",
    )
    wait_for(lambda: workers.alive("celery"), timeout=30, what="the worker's beat")
    time.sleep(1.0)
    t0 = time.monotonic()
    first.proc.send_signal(signal.SIGTERM)  # the main process only, as systemd or a supervisor does
    assert first.proc.wait(timeout=30) == 0  # the import alone needs far longer; a stop asked for is no failure
    print(f"worker stopped {time.monotonic() - t0:.1f} s after SIGTERM")
    released = ImportJob.objects.get(pk=job.pk)
    assert released.status == "queued" and released.owner == "" and released.attempts == 0, first.log()[-3000:]
    assert "work released by the stopping worker" in first.log()
    assert not workers.alive(), "a stopped worker removes its beat"
    # the stale timeout is 600 s: the next worker runs it because it was released and resent
    second = worker_factory(queues="celery", extra_env=env).start("term2")
    done = wait_for(ended(ImportJob, job.pk), timeout=240, what=f"the next worker\n{second.log()[-3000:]}")
    assert done.status == "done" and done.report["queries"] == 30000, done.error


def test_pages_and_healthz_say_no_worker_alive_while_jobs_wait(client, demo_accounts, worker_factory, settings):
    settings.JOB_STALE_SECONDS = 3  # this process judges the beats; the worker beats every second
    job = ImportJob.objects.create(dataset_name="waits", format="circo", files=[str(VAL)])
    assert client.login(username="admin", password=demo_accounts["admin"])
    status = client.get(f"/datasets/imports/{job.pk}/status/").json()
    assert status["no_worker"] == workers.NO_WORKER
    page = client.get(f"/datasets/imports/{job.pk}/").content.decode()
    assert workers.NO_WORKER in page
    health = client.get("/healthz")
    assert health.status_code == 503
    assert health.json()["workers"]["ok"] is False and health.json()["workers"]["alive"] == 0
    assert health.json()["workers"]["error"] == workers.NO_WORKER  # staff see why

    worker = worker_factory(queues="celery", extra_env=BEATS).start("alive")
    wait_for(lambda: workers.alive("celery"), timeout=60, what=f"the worker's beat\n{worker.log()}")
    assert enqueue(ImportJob, job.pk, RUN_IMPORT)
    wait_for(ended(ImportJob, job.pk), timeout=120, what="the import")
    assert client.get(f"/datasets/imports/{job.pk}/status/").json()["no_worker"] == ""
    health = client.get("/healthz")
    assert health.status_code == 200, health.json()
    assert health.json()["workers"]["alive"] == 1
    # a worker killed without a word: its beat goes stale, the page says so again
    worker.kill(signal.SIGKILL)
    waiting = ImportJob.objects.create(dataset_name="waits2", format="circo", files=[str(VAL)])
    assert workers.alive("celery")  # its last beat is still fresh
    wait_for(
        lambda: client.get(f"/datasets/imports/{waiting.pk}/status/").json()["no_worker"],
        timeout=60,
        what="the dead worker's beat to go stale",
    )
    assert json.loads(client.get("/healthz").content)["workers"]["ok"] is False
