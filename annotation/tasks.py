"""Celery tasks of the annotation app (the default queue, ``celery``; only audit tasks go to ``gpu``)."""
from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_ready

from .export import run_export_job
from .models import ExportJob

logger = logging.getLogger(__name__)


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


def resume_stale_exports() -> list[int]:
    """Send again the exports that no live worker is running (queued, or silent too long)."""
    from .export import claimable_jobs, stale_before

    jobs = list(claimable_jobs().filter(created_at__lt=stale_before()).values_list("pk", flat=True))
    for pk in jobs:
        run_export.delay(pk)
    return jobs


@worker_ready.connect
def resume_exports_on_worker_start(sender=None, **kwargs) -> None:
    """A starting worker picks up exports whose worker died (kombu's filesystem broker loses
    a taken message with its worker; Redis returns it only after the visibility timeout)."""
    from django.db import close_old_connections

    try:
        close_old_connections()
        resumed = resume_stale_exports()
        if resumed:
            logger.info("exports sent again on worker start: %s", resumed)
    except Exception:  # never keep a worker from starting
        logger.exception("could not resume exports on worker start")
    finally:
        close_old_connections()
