"""Celery tasks of the corpus app."""
from __future__ import annotations

from celery import shared_task

from .models import ImportJob
from .services import run_import_job


@shared_task(name="retrieval.run_import", acks_late=True)
def run_import(job_id: int) -> str:
    """Run a queued import. Idempotent: a finished job is not run again, and the loader
    upserts, so a redelivered task after a worker crash leaves no duplicates."""
    job = ImportJob.objects.filter(pk=job_id).first()
    if job is None:
        return "missing"
    if job.status in (ImportJob.Status.DONE, ImportJob.Status.FAILED):
        return job.status
    return run_import_job(job).status
