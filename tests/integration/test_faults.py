"""Faults: the database connection dropped mid-request, Redis restarted mid-run."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client

from annotation.assignment import queue as engine
from annotation.models import Assignment, Judgement, StudyItem
from annotation.studies.building import StudySpec, create_study
from audit.models import AuditLabel, AuditRank, AuditRun
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from tests.conftest import FIXTURES, ROOT, database_url_for_subprocess, make_annotator, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("drops a PostgreSQL backend with pg_terminate_backend: set DATABASE_URL=postgres://... (CI does)")


def test_db_connection_dropped_mid_submit_then_retry_succeeds():
    needs_postgres()
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    user = make_annotator("ann")
    study, _ = create_study(StudySpec(name="drop", datasets=["circo"], overlap=1, total=3, annotators=["ann"]))
    asg = engine.next_assignment(study, user).assignment
    url = f"/api/assignments/{asg.pk}/judgements/"
    body = {"category": "VALIDATED", "time_spent_ms": 10, "client_token": "drop-1"}
    client = Client(raise_request_exception=False)
    client.force_login(user)
    admin_url = database_url_for_subprocess().rsplit("/", 1)[0] + "/postgres"

    killed = []

    def kill_after_insert(execute, sql, params, many, context):
        # the judgement row is written; the connection dies before the item counters are
        if 'UPDATE "annotation_studyitem"' in sql and not killed:
            pid = context["connection"].connection.info.backend_pid
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            killed.append(pid)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(kill_after_insert):
        resp = client.post(url, body, content_type="application/json")
    assert killed and resp.status_code == 500
    connection.close()  # this thread's connection died with the backend
    assert not Judgement.objects.filter(assignment=asg).exists()  # nothing half-written
    assert StudyItem.objects.get(pk=asg.item_id).completed == 0

    retry = client.post(url, body, content_type="application/json")
    assert retry.status_code == 201
    again = client.post(url, body, content_type="application/json")
    assert again.status_code == 200 and again.json()["duplicate"]
    assert Judgement.objects.filter(assignment=asg).count() == 1
    assert Assignment.objects.get(pk=asg.pk).status == "done"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(port: int, folder) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(folder),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    wait_for(
        lambda: (
            subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip()
            == "PONG"
        ),
        timeout=20,
        what="redis to start",
    )
    return proc


@pytest.mark.worker
def test_redis_restarted_during_an_audit_the_run_resumes(tmp_path, worker_factory):
    if shutil.which("redis-server") is None:
        pytest.skip("needs the redis-server binary to restart a private Redis (apt-get install redis-server)")
    port = free_port()
    broker = f"redis://127.0.0.1:{port}/0"
    redis = start_redis(port, tmp_path)
    try:
        root = tmp_path / "demo"
        load_parsed(build_demo(root, n_gallery=60, n_single=24, n_sessions=4), "demo", images_root=root)
        env = {
            "CELERY_BROKER_URL": broker,
            "EMBEDDING_CACHE_DIR": str(tmp_path / "emb"),
            "AUDIT_LEASE_SECONDS": "3",
            "AUDIT_COORDINATOR_SECONDS": "1",
            "AUDIT_MAX_ATTEMPTS": "5",
            "CELERY_VISIBILITY_TIMEOUT": "5",
        }
        worker = worker_factory(extra_env=env).start("redis-restart")
        sub_env = dict(os.environ, DATABASE_URL=database_url_for_subprocess(), **env)
        subprocess.run(
            [
                sys.executable,
                "manage.py",
                "run_audit",
                "--dataset",
                "demo",
                "--retriever",
                "openclip:cirval-tiny-vit",
                "--retriever",
                "openclip:cirval-tiny-vit-b",
                "--chunk-queries",
                "4",
                "--chunk-gallery",
                "20",
            ],
            cwd=ROOT,
            env=sub_env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        run = AuditRun.objects.get()
        wait_for(
            lambda: AuditRun.objects.get(pk=run.pk).chunks.filter(status="done").exists(),
            timeout=90,
            interval=0.05,
            what=f"a first chunk\n{worker.log()}",
        )
        subprocess.run(["redis-cli", "-p", str(port), "shutdown"], capture_output=True)  # AOF is flushed
        redis.wait(timeout=20)
        time.sleep(2)
        redis = start_redis(port, tmp_path)

        def finished():
            r = AuditRun.objects.get(pk=run.pk)
            return r if r.status in ("done", "failed") else None

        final = wait_for(finished, timeout=180, what=f"the run to finish after the restart\n{worker.log()[-3000:]}")
        assert final.status == "done", final.error
        n_queries = AuditLabel.objects.filter(run=final).count()
        assert n_queries == 24
        assert AuditRank.objects.filter(run=final).count() == 2 * n_queries  # no duplicate rank rows
    finally:
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)
        redis.wait(timeout=20)
