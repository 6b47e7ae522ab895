"""Celery tasks of the corpus app."""

from __future__ import annotations

from celery import shared_task

from config.celery import every_sweep, on_worker

from .jobs import leases, workers
from .jobs.sending import send_task
from .models import ImportJob
from .services import run_import_job

RUN_IMPORT = "retrieval.run_import"

# The worker's own bookkeeping (config.celery runs these hooks and imports no app): its beat
# row says it is alive; when it stops its leases are released and its row removed; after a
# lost broker connection the messages sent before are taken as lost.
on_worker("beat")(workers.beat)
on_worker("release")(leases.release)
on_worker("gone")(workers.gone)
on_worker("reconnected")(leases.messages_lost)


@shared_task(name=RUN_IMPORT, acks_late=True)
def run_import(job_id: int) -> str:
    """Run a queued import. Idempotent: a finished job is not run again, a job alive in
    another worker is left alone, and the import is one transaction with its ``done``
    mark, so a redelivered task after a worker crash leaves no duplicates."""
    job = ImportJob.objects.filter(pk=job_id).first()
    if job is None:
        return "missing"
    return run_import_job(job).status


def send_import(job_id: int) -> bool:
    return send_task(RUN_IMPORT, job_id)


@every_sweep("imports sent again")
def resume_stale_imports() -> dict[str, int]:
    """Send again the imports no live worker runs (stale heartbeat, or message never
    sent or lost). Imports run inline in the web request are claimed there too."""
    imports = ImportJob.objects.all()
    out = leases.resend_stale(
        imports,
        send_import,
        give_up=lambda job: leases.fail(
            ImportJob, job.pk, f"given up after {job.attempts} attempts (its worker was lost each time)"
        ),
    )
    out["resent_lost"] = leases.resend_lost(imports, send_import)
    return {k: v for k, v in out.items() if v}
