"""Celery tasks of the annotation app (the default queue, ``celery``; only audit tasks go to ``gpu``)."""
from __future__ import annotations

from celery import shared_task

from .export import run_export_job
from .models import ExportJob


@shared_task(name="annotation.run_export", acks_late=True)
def run_export(job_id: int) -> str:
    """Run a queued export. A finished job is not run again; a job redelivered after its
    worker died starts over in the same temporary folder (the export appears only once
    it is complete, by renaming that folder)."""
    job = ExportJob.objects.filter(pk=job_id).first()
    if job is None:
        return "missing"
    if job.status in (ExportJob.Status.DONE, ExportJob.Status.FAILED):
        return job.status
    return run_export_job(job).status
