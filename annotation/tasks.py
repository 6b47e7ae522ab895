"""Celery tasks of the annotation app (the default queue, ``celery``; only audit tasks go to ``gpu``)."""
from __future__ import annotations

from celery import shared_task

from config.celery import at_worker_start

from annotation.export.validated import run_export_job
from annotation.models import ExportJob

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


@shared_task(name="annotation.fill_candidates")
def fill_candidates(study_id: int) -> int:
    """Fix the candidate panel of every item of a study ahead of the annotators (the item
    page fills a missing one itself, but then the first annotator waits for it)."""
    from annotation.judging.candidates import fill_study_candidates

    return fill_study_candidates(study_id)


def resume_stale_exports() -> list[int]:
    """Send again the exports that no live worker is running (queued, or silent too long)."""
    from annotation.export.validated import claimable_jobs, stale_before

    jobs = list(claimable_jobs().filter(created_at__lt=stale_before()).values_list("pk", flat=True))
    for pk in jobs:
        run_export.delay(pk)
    return jobs


@at_worker_start("exports sent again")
def resume_exports_on_worker_start() -> list[int]:
    """A starting worker picks up exports whose worker died (kombu's filesystem broker loses
    a taken message with its worker; Redis returns it only after the visibility timeout)."""
    return resume_stale_exports()
