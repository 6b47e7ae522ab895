"""Celery tasks of the annotation app (the default queue, ``celery``; only audit tasks go to ``gpu``)."""

from __future__ import annotations

from celery import shared_task
from celery.signals import worker_process_init

from annotation.agreement.intervals import INTERVALS_TASK
from annotation.export.validated import run_export_job
from annotation.interactive.service import RANK_TASK
from annotation.interactive.warm import WARM_TASK, wait_for_warm, warm_in_background, warm_study
from annotation.judging.candidates import FILL_TASK
from annotation.models import ExportJob, ReleaseJob, RoomImportJob
from annotation.release.bundle import RUN_RELEASE, run_release_job
from annotation.room.imports import RUN_ROOM_IMPORT, run_room_import_job
from annotation.verdicts.refit import REFIT_TASK
from config.celery import at_worker_start, every_sweep
from retrieval.jobs import leases
from retrieval.jobs.sending import send_task
from retrieval.services import discard_uploads

RUN_EXPORT = "annotation.run_export"


@shared_task(name=RUN_EXPORT, acks_late=True)
def run_export(job_id: int) -> str:
    """Run a queued export. A finished job is not run again; a job redelivered after its
    worker died starts over in the same temporary folder (the export appears only once
    it is complete, by renaming that folder)."""
    job = ExportJob.objects.filter(pk=job_id).first()
    if job is None:
        return "missing"
    return run_export_job(job).status


@shared_task(name=RUN_RELEASE, acks_late=True)
def run_release(job_id: int) -> str:
    """Run a queued release (:func:`annotation.release.bundle.build_release`); a finished job is
    not run again, a redelivered one starts over in the same temporary folder."""
    job = ReleaseJob.objects.filter(pk=job_id).first()
    if job is None:
        return "missing"
    return run_release_job(job).status


@shared_task(name=RUN_ROOM_IMPORT, acks_late=True)
def run_room_import(job_id: int) -> str:
    """Run a queued project room import (rank files or a CIRCUS study); a finished job is not
    run again, a redelivered one runs again on the uploads still there."""
    job = RoomImportJob.objects.filter(pk=job_id).first()
    if job is None:
        return "missing"
    return run_room_import_job(job).status


@shared_task(name=REFIT_TASK, acks_late=True)
def refit_reliability(study_id: int, due: str | None = None) -> int:
    """Refit a study's reliability model on all its judgements and set every item's slots under
    it (:mod:`annotation.verdicts.refit`; sent after submits, at most one pending per study;
    ``due``: the study's refit flag this task was sent for, which it clears)."""
    from annotation.verdicts.refit import run_refit

    return run_refit(study_id, due)


@shared_task(name=INTERVALS_TASK, acks_late=True)
def agreement_intervals(study_id: int, options: dict, due: str | None = None) -> str:
    """Bootstrap intervals of a study's agreement report for one set of options, stored with the
    study's fingerprint (:mod:`annotation.agreement.intervals`; sent after submits, debounced, and
    by a report page that found them stale; ``due``: the flag this task was sent for)."""
    from annotation.agreement.intervals import run_intervals

    return run_intervals(study_id, options, due)


@shared_task(name=FILL_TASK)
def fill_candidates(study_id: int) -> int:
    """Fix the candidate panel of every item of a study that has none, in queue order: sent
    when the study is created, when an audit of its dataset finishes and when the web tier
    serves an item without a panel (the web tier never computes one). Then the study's
    suspicion scores are computed again (:mod:`annotation.studies.suspicion_scores`)."""
    from annotation.judging.panel_fill import fill_study_candidates
    from annotation.studies.suspicion_scores import refresh_suspicion

    filled = fill_study_candidates(study_id)
    refresh_suspicion(study_id)  # the same audit's ranks and pool: the suspicion scores follow the panels
    return filled


def send_export(job_id: int) -> bool:
    return send_task(RUN_EXPORT, job_id)


def send_release(job_id: int) -> bool:
    return send_task(RUN_RELEASE, job_id)


def send_room_import(job_id: int) -> bool:
    return send_task(RUN_ROOM_IMPORT, job_id)


def _give_up(model, job) -> None:
    leases.fail(model, job.pk, f"given up after {job.attempts} attempts (its worker was lost each time)")
    if model is RoomImportJob:
        discard_uploads(list(job.paths))


def _resend(model, send) -> dict[str, int]:
    jobs = model.objects.all()
    out = leases.resend_stale(jobs, send, give_up=lambda job: _give_up(model, job))
    out["resent_lost"] = leases.resend_lost(jobs, send)
    return {k: v for k, v in out.items() if v}


@every_sweep("exports sent again")
def resume_stale_exports() -> dict[str, int]:
    """Send again the exports and releases no live worker runs: running with a stale heartbeat
    (its worker died), or queued and never sent (broker down) or sent long ago (message lost)."""
    out = _resend(ExportJob, send_export)
    out.update({f"release_{k}": v for k, v in _resend(ReleaseJob, send_release).items()})
    out.update({f"room_import_{k}": v for k, v in _resend(RoomImportJob, send_room_import).items()})
    return out


@at_worker_start("exports sent again")
def resume_exports_on_worker_start() -> dict[str, int]:
    """A starting worker picks up exports whose worker died (kombu's filesystem broker loses
    a taken message with its worker; Redis returns it only after the visibility timeout)."""
    return resume_stale_exports()


@every_sweep("interactive rounds sent again")
def resend_interactive_rounds() -> int:
    """Rounds whose worker died or whose message was lost are sent again."""
    from annotation.interactive.service import resend_stale_rounds

    return resend_stale_rounds()


@shared_task(name=RANK_TASK, acks_late=True)
def rank_interactive_round(round_id: int) -> str:
    """Re-rank the gallery for one round of an interactive session (the web tier never loads
    the retriever); a round ranked already is left as it is. A round that arrives while this
    process warms the retriever waits for it (:mod:`annotation.interactive.warm`)."""
    from annotation.interactive.service import rank_round

    wait_for_warm()
    return rank_round(round_id)


@shared_task(name=WARM_TASK)
def warm_interactive(study_id: int) -> dict:
    """Load an interactive study's retriever and gallery in this worker process (sent to the
    ``interactive`` queue when an annotator opens the study; :func:`annotation.interactive.warm.warm_study`)."""
    wait_for_warm()
    return warm_study(study_id)


# every pool process of a worker that ranks rounds warms the open interactive studies on start
worker_process_init.connect(warm_in_background, weak=False, dispatch_uid="cirval-warm-interactive")
