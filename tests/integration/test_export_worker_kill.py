"""A worker SIGKILLed in the middle of an export: a new worker finishes it, files identical."""

from __future__ import annotations

import hashlib
import signal
import time
from pathlib import Path

import pytest

from annotation.export.validated import export_study
from annotation.models import ExportJob, Study
from annotation.tasks import run_export
from tests.conftest import bench_module, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def bench_export():
    return bench_module("export")


def digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*.jsonl"))
    }


def test_killed_export_is_finished_by_the_next_worker(tmp_path, worker_factory, capsys):
    study = Study.objects.get(pk=bench_export().build_study(4000, 3))
    reference = export_study(study, out_dir=tmp_path / "reference")
    env = {"EXPORT_CHUNK_SIZE": "10", "JOB_STALE_SECONDS": "2", "JOB_HEARTBEAT_SECONDS": "0.5"}
    job = ExportJob.objects.create(study=study, policy="majority")

    first = worker_factory(queues="celery", extra_env=env).start("export1")
    run_export.delay(job.pk)

    def midway():
        j = ExportJob.objects.get(pk=job.pk)
        return j.status == "running" and 0 < j.done < j.total

    wait_for(midway, timeout=120, interval=0.02, what=f"the export to be under way\n{first.log()}")
    first.kill(signal.SIGKILL)
    killed = ExportJob.objects.get(pk=job.pk)
    assert killed.status == "running" and killed.done < killed.total  # really interrupted
    time.sleep(2.5)  # its heartbeat goes stale

    second = worker_factory(queues="celery", extra_env=env).start("export2")

    def finished():
        j = ExportJob.objects.get(pk=job.pk)
        return j if j.status in ("done", "failed") else None

    done = wait_for(finished, timeout=180, what=f"the second worker to finish the export\n{second.log()}")
    assert done.status == "done", done.error
    # sent again by the starting worker's hook or by its first sweep, whichever ran first
    assert "exports sent again" in second.log()
    out = Path(done.path)
    assert digests(out) == digests(reference.path) and digests(out)
    assert done.manifest["counts"] == reference.manifest["counts"]
    assert not list(out.parent.glob(f".export-job{job.pk}.tmp*"))  # the half-written attempt is gone
