"""Sending chunks to the workers, coordinating a run and recovering stale chunks."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from retrieval.jobs import leases as jobs
from retrieval.jobs.sending import send_task

from ..models import AuditChunk, AuditRun
from .aggregation import aggregate_run
from .base import (
    SESSION_CHUNK_KINDS,
    AuditError,
    Progress,
    coordinator_seconds,
    default_owner,
    lease_seconds,
    logger,
    max_attempts,
)
from .execution import fail_chunk, gallery_ready, process_chunk
from .planning import drop_planned_reads, fail_run, plan_run


def start_run(run: AuditRun) -> None:
    """Hand a queued run to the workers (after the current transaction commits)."""
    if settings.CELERY_TASK_ALWAYS_EAGER:
        run_inline(run)
        return
    transaction.on_commit(lambda: kick_coordinator(run.pk))


def run_inline(run: AuditRun, progress: Progress | None = None) -> AuditRun:
    """Plan and run every chunk in this process, then aggregate (no worker needed).

    A chunk a live worker holds (its sweep may have sent it) is left to that worker, and a
    query chunk waits for its gallery: the passes repeat, a short pause apart, until every
    chunk is done (a lease gone stale is claimed here, as a worker would), so the run is
    aggregated only once it is complete."""
    try:
        plan_run(run, keep_reads=True)  # its query rows serve the query chunks run here next
    except AuditError as exc:
        fail_run(run.pk, str(exc))
        run.refresh_from_db()
        return run
    try:
        run.refresh_from_db()
        if not _run_passes(run, progress):
            run.refresh_from_db()
            return run
    finally:
        drop_planned_reads()
    aggregate_run(run.pk)
    run.refresh_from_db()
    return run


def _run_passes(run: AuditRun, progress: Progress | None) -> bool:
    """:func:`_inline_pass` until every chunk is done (``True``) or one failed (``False``)."""
    owner = f"inline:{default_owner()}"
    while (outcome := _inline_pass(run, owner, progress)) != "complete":
        if outcome == "failed":
            return False
        if outcome == "idle":  # a worker holds every chunk left, or a query chunk waits for its gallery
            time.sleep(INLINE_WAIT_SECONDS)
    return True


#: Pause between two inline passes that found every chunk left busy or waiting.
INLINE_WAIT_SECONDS = 0.5
_INLINE_ORDER = (AuditChunk.Kind.GALLERY, AuditChunk.Kind.QUERIES, AuditChunk.Kind.SESSIONS)


def _inline_pass(run: AuditRun, owner: str, progress: Progress | None) -> str:
    """One pass over the run's chunks not done yet, in the order an audit needs them (each
    retriever's gallery, its queries, its sessions; the session texts last): ``"failed"``,
    ``"complete"`` (none left), ``"ran"`` (some ran here) or ``"idle"`` (every one left was busy
    with a worker or waiting)."""
    order = [(spec, kind) for spec in run.retrievers for kind in _INLINE_ORDER]
    order.append((None, AuditChunk.Kind.TEXTS))
    todo: dict[tuple[str | None, str], list[int]] = defaultdict(list)
    for pk, spec, kind in (
        AuditChunk.objects.filter(run=run)
        .exclude(status=AuditChunk.Status.DONE)
        .order_by("index", "pk")
        .values_list("pk", "retriever", "kind")
    ):
        todo[(None if kind == AuditChunk.Kind.TEXTS else spec, kind)].append(pk)
    if not todo:
        return "complete"
    ran = False
    run_here: set[int] = set()  # chunks run in this pass, siblings run with another included
    for spec, kind in order:
        for chunk_id in todo.get((spec, kind), []):
            if chunk_id in run_here:  # run with a sibling: not read again in this pass
                continue
            # a chunk leased by a live worker is left to it; re-claiming is allowed only once
            # the lease is stale (the workers' rule); a chunk finished meanwhile says "done"
            result = process_chunk(chunk_id, owner=owner, heartbeat=False, ran=run_here)
            if result == "failed":
                return "failed"
            ran = ran or result in ("ok", "done")
            if progress:
                run.refresh_from_db()
                progress(run)
    return "ran" if ran else "idle"


#: The Celery task of each chunk kind (:mod:`audit.tasks`), looked up by name in the app's
#: registry so that this module does not import the tasks that import it.
CHUNK_TASKS = {
    AuditChunk.Kind.GALLERY: "audit.tasks.encode_gallery_chunk",
    AuditChunk.Kind.QUERIES: "audit.tasks.rank_query_chunk",
    AuditChunk.Kind.SESSIONS: "audit.tasks.rank_session_chunk",
    AuditChunk.Kind.TEXTS: "audit.tasks.encode_session_texts_chunk",
}
COORDINATE_TASK = "audit.tasks.coordinate"


def _send_chunk(chunk_id: int, kind: str | None) -> bool:
    """Send a chunk's task; ``False`` when the broker is down (a later sweep sends it)."""
    if kind is None:
        kind = AuditChunk.objects.filter(pk=chunk_id).values_list("kind", flat=True).first()
    return send_task(CHUNK_TASKS[kind], chunk_id)


def kick_coordinator(run_id: int, countdown: float = 0) -> str:
    """Start a new coordinating task for the run; any older one stops at its next tick."""
    token = uuid.uuid4().hex
    n = AuditRun.objects.filter(pk=run_id, status__in=[AuditRun.Status.QUEUED, AuditRun.Status.RUNNING]).update(
        coordinator_token=token, coordinator_seen_at=timezone.now()
    )
    if n:
        send_task(COORDINATE_TASK, run_id, token, countdown=countdown or None)
    return token


def dispatch_ready(run_id: int) -> int:
    """Send every chunk that can run and was never sent; returns how many were sent."""
    sent = 0
    chunks = list(
        AuditChunk.objects.filter(run_id=run_id, enqueued_at__isnull=True, status=AuditChunk.Status.PENDING)
        .order_by("kind", "retriever", "index")
        .values_list("pk", "kind", "retriever")
    )
    ready_specs: dict[str, bool] = {}
    for pk, kind, spec in chunks:
        if kind in SESSION_CHUNK_KINDS:
            if spec not in ready_specs:
                ready_specs[spec] = gallery_ready(run_id, spec)
            if not ready_specs[spec]:
                continue
        if AuditChunk.objects.filter(pk=pk, enqueued_at__isnull=True).update(enqueued_at=timezone.now()):
            if not _send_chunk(pk, kind):  # the broker is down: the next sweep sends it
                AuditChunk.objects.filter(pk=pk, status=AuditChunk.Status.PENDING).update(enqueued_at=None)
                break
            sent += 1
    return sent


def reconcile(run: AuditRun | int, takeover: bool = False) -> dict[str, int]:
    """Bring a run forward: resend stale chunks, send ready ones, restart coordination.

    * a running chunk whose heartbeat is older than the lease: its worker is gone; it
      is set back to pending and sent again (or failed after too many attempts);
    * a pending chunk sent before the worker's last broker reconnect, or sent more than
      ``JOB_RESEND_SECONDS`` ago while the run showed no activity that long: its message
      was lost; it is sent again (:func:`retrieval.jobs.leases.resend_lost`);
    * chunks whose dependencies are met and that were never sent are sent;
    * the coordinating task is restarted when it has not ticked for ``AUDIT_LEASE_SECONDS``
      or since the broker reconnect, or always with ``takeover`` (a worker starting up).

    Every resend is harmless: a chunk that turns out to be done or leased returns at
    once. Returns counts of what was done.
    """
    run_id = run if isinstance(run, int) else run.pk
    run = AuditRun.objects.filter(pk=run_id).first()
    out = {"resent_stale": 0, "resent_lost": 0, "sent": 0, "failed": 0, "coordinator": 0, "aggregated": 0}
    if run is None or not run.is_active:
        return out
    now = timezone.now()
    coord_stale = now - timedelta(seconds=max(lease_seconds(), 3 * coordinator_seconds()))
    reconnected = jobs.reconnected_at()
    if run.planned:
        chunks = AuditChunk.objects.filter(run=run)
        out.update(
            jobs.resend_stale(
                chunks,
                lambda pk: _send_chunk(pk, None),
                give_up=lambda chunk: fail_chunk(
                    chunk, f"given up after {chunk.attempts} attempts (its worker was lost each time)"
                ),
                limit=max_attempts(),
            )
        )
        if out["failed"]:
            return out
        # A sent chunk that never started has lost its message: after a broker reconnect at
        # once, otherwise once the run shows no activity for JOB_RESEND_SECONDS (queued chunks
        # of a busy run are not lost, just waiting their turn).
        last = chunks.aggregate(beat=Max("heartbeat_at"))["beat"]
        activity = max([t for t in (last, run.started_at) if t is not None], default=None)
        idle = activity is None or activity < now - timedelta(seconds=jobs.resend_seconds())
        out["resent_lost"] = jobs.resend_lost(
            chunks, lambda pk: _send_chunk(pk, None), never_sent=False, after_reconnect_only=not idle
        )
        out["sent"] = dispatch_ready(run.pk)
        if not chunks.exclude(status=AuditChunk.Status.DONE).exists():
            out["aggregated"] = int(aggregate_run(run.pk))
            if out["aggregated"]:
                return out
    seen = run.coordinator_seen_at
    if takeover or seen is None or seen < coord_stale or (reconnected is not None and seen < reconnected):
        kick_coordinator(run.pk)
        out["coordinator"] = 1
    return out


def reconcile_active(takeover: bool = False) -> dict[int, dict[str, int]]:
    """:func:`reconcile` every queued or running computed run."""
    out: dict[int, dict[str, int]] = {}
    for pk in AuditRun.objects.filter(
        status__in=[AuditRun.Status.QUEUED, AuditRun.Status.RUNNING], source=AuditRun.Source.COMPUTED
    ).values_list("pk", flat=True):
        try:
            out[pk] = reconcile(pk, takeover=takeover)
        except Exception:
            logger.exception("reconcile of audit %s failed", pk)
    return out


def coordinate(run_id: int, token: str) -> str:
    """One tick of the coordinating task: plan, reconcile, aggregate or re-check later."""
    run = AuditRun.objects.filter(pk=run_id).first()
    if run is None:
        return "missing"
    if not run.is_active:
        return run.status
    if run.coordinator_token != token:
        return "superseded"
    AuditRun.objects.filter(pk=run_id, coordinator_token=token).update(coordinator_seen_at=timezone.now())
    if not run.planned:
        try:
            plan_run(run)
        except AuditError as exc:
            fail_run(run.pk, str(exc))
            return "failed"
    result = reconcile(run.pk)
    run.refresh_from_db()
    if not run.is_active:
        return run.status
    send_task(COORDINATE_TASK, run_id, token, countdown=coordinator_seconds())
    return "waiting" if not result["aggregated"] else "done"


def retry_failed(run: AuditRun) -> int:
    """Put a failed run's failed chunks back to pending and the run back to running."""
    n = AuditChunk.objects.filter(run=run, status=AuditChunk.Status.FAILED).update(
        status=AuditChunk.Status.PENDING, attempts=0, enqueued_at=None, error="", owner=""
    )
    AuditChunk.objects.filter(run=run, status=AuditChunk.Status.PENDING).update(enqueued_at=None)
    AuditRun.objects.filter(pk=run.pk, status=AuditRun.Status.FAILED).update(
        status=AuditRun.Status.RUNNING if run.planned else AuditRun.Status.QUEUED, error="", finished_at=None
    )
    return n
