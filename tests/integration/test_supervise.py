"""``./cirval up`` supervises its worker (config/supervise.py): a real worker killed with
SIGKILL is started again, the supervisor says so, and jobs sent afterwards run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from django.conf import settings

from retrieval.jobs.models import WorkerBeat
from retrieval.jobs.sending import enqueue
from retrieval.models import ImportJob
from retrieval.tasks import RUN_IMPORT
from tests.conftest import FIXTURES, ROOT, database_url_for_subprocess, wait_for
from tests.integration.test_job_faults import ended

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_a_killed_worker_is_started_again_and_the_supervisor_says_so(tmp_path):
    log = tmp_path / "worker.log"
    log.touch()
    env = {
        **os.environ,
        "DATABASE_URL": database_url_for_subprocess(),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "CIRVAL_VAR_DIR": str(settings.VAR_DIR),
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "PYTHONUNBUFFERED": "1",
        "JOB_SWEEP_SECONDS": "1",
        "JOB_HEARTBEAT_SECONDS": "0.5",
    }
    # the command ./cirval up runs
    sup = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "config.supervise",
            "--name",
            "worker",
            "--log",
            str(log),
            "--",
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "-Q",
            "celery,gpu",
            "--concurrency",
            "1",
            "--loglevel",
            "INFO",
        ],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        first = wait_for(lambda: WorkerBeat.objects.first(), timeout=120, what=f"the worker's beat\n{log.read_text()}")
        pid = int(first.name.rsplit(":", 1)[1])
        os.kill(pid, signal.SIGKILL)  # the worker dies without a word
        second = wait_for(
            lambda: WorkerBeat.objects.exclude(name=first.name).first(),
            timeout=120,
            what=f"a new worker\n{log.read_text()[-3000:]}",
        )
        assert second.name != first.name
        job = ImportJob.objects.create(
            dataset_name="after-restart", format="circo", files=[str(FIXTURES / "datasets/circo/val.json")]
        )
        assert enqueue(ImportJob, job.pk, RUN_IMPORT)
        assert wait_for(ended(ImportJob, job.pk), timeout=120, what="the import").status == "done"
    finally:
        sup.send_signal(signal.SIGTERM)
        _out, err = sup.communicate(timeout=60)
    assert "worker killed by SIGKILL" in err and "starting it again" in err, err
    assert "worker restarted" in err and "worker stopped" in err, err
    assert "worker killed by SIGKILL" in log.read_text()  # also in the worker's log
    assert sup.returncode == 0
