"""Celery tasks of the audit (all routed to the ``gpu`` queue by ``audit.tasks.*``).

Each task is idempotent: a chunk that is already done returns at once, a chunk leased
by a live worker is left alone, and rank rows are unique per (run, query, retriever)
(session rank rows per (run, query, retriever, strategy, modality)).
There is no automatic retry: a chunk that raises marks its run failed (with the
error); a chunk whose worker vanished is resent by :func:`audit.runs.dispatch.reconcile`.
"""

from __future__ import annotations

from celery import shared_task

from config.celery import at_worker_start, every_sweep

from .runs import aggregation, dispatch, execution


def _after_chunk(chunk_id: int, result: str) -> None:
    """Send what became ready and finish the run when this was its last chunk."""
    if result not in ("ok", "done"):
        return
    from .models import AuditChunk

    run_id = AuditChunk.objects.filter(pk=chunk_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return
    dispatch.dispatch_ready(run_id)
    if not AuditChunk.objects.filter(run_id=run_id).exclude(status=AuditChunk.Status.DONE).exists():
        aggregation.aggregate_run(run_id)


def _run_chunk(chunk_id: int) -> str:
    result = execution.process_chunk(chunk_id)
    _after_chunk(chunk_id, result)
    return result


@shared_task(acks_late=True, ignore_result=True)
def encode_gallery_chunk(chunk_id: int) -> str:
    """Encode one retriever's slice of the gallery into the embedding cache."""
    return _run_chunk(chunk_id)


@shared_task(acks_late=True, ignore_result=True)
def rank_query_chunk(chunk_id: int) -> str:
    """Encode and rank one retriever's slice of the queries in the three modalities."""
    return _run_chunk(chunk_id)


@shared_task(acks_late=True, ignore_result=True)
def rank_session_chunk(chunk_id: int) -> str:
    """Rank every turn of one retriever's slice of the sessions (3 modalities x 3 strategies)."""
    return _run_chunk(chunk_id)


@shared_task(acks_late=True, ignore_result=True)
def encode_session_texts_chunk(chunk_id: int) -> str:
    """Encode a slice of the sessions' texts with the tau encoder (tau-diversity filter)."""
    return _run_chunk(chunk_id)


@shared_task(acks_late=True, ignore_result=True)
def coordinate(run_id: int, token: str) -> str:
    """Plan the run, then re-check it every ``AUDIT_COORDINATOR_SECONDS`` until it ends."""
    return dispatch.coordinate(run_id, token)


@at_worker_start("audit runs resumed")
def resume_audits_on_worker_start() -> dict:
    """A worker that starts takes over coordination of unfinished audits and resends stale chunks."""
    return dispatch.reconcile_active(takeover=True)


@every_sweep("audit runs brought forward")
def sweep_audits() -> dict:
    """Resend chunks whose worker stopped beating or whose message was lost, restart a
    silent coordinator and finish runs whose chunks are all done (e.g. after a broker
    restart lost the coordinator's message)."""
    return {pk: {k: v for k, v in r.items() if v} for pk, r in dispatch.reconcile_active().items() if any(r.values())}
