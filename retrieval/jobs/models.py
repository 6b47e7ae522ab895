"""Abstract job models shared by ImportJob, ExportJob, AuditRun and AuditChunk."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import models


class Status(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class Leased(models.Model):
    """A unit of work a worker claims, renews by heartbeat and finishes (see :mod:`.leases`)."""

    #: Whether ``/healthz`` counts its :meth:`unfinished` rows as work waiting for a worker
    #: (:func:`retrieval.jobs.workers.waiting_jobs`). Any model may say so, with an
    #: ``unfinished()`` classmethod: the interactive rounds of the annotation app do.
    waits_for_worker = True
    #: The status of work waiting for a worker (audit chunks say "pending").
    WAITING = Status.QUEUED.value

    Status = Status
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    owner = models.CharField(max_length=200, blank=True, help_text="host:pid of the worker holding the lease")
    attempts = models.PositiveIntegerField(default=0)
    enqueued_at = models.DateTimeField(null=True, blank=True, help_text="When its message was last sent.")
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True, help_text="Last beat of the worker running it.")
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        abstract = True

    @classmethod
    def unfinished(cls):
        """Rows some worker still has to run (waiting or running)."""
        return cls.objects.filter(status__in=[cls.WAITING, Status.RUNNING])

    @property
    def queue_unavailable(self) -> bool:
        """Waiting, and its message could not be sent (the broker was down)."""
        return self.status == self.WAITING and self.enqueued_at is None


class Progress(models.Model):
    """What a progress page shows: a stage and done / total (needs ``status`` and ``error``)."""

    #: The Celery queue whose workers run this kind of job (audits: ``gpu``).
    QUEUE = "celery"

    stage = models.CharField(max_length=100, blank=True)
    done = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)

    class Meta:
        abstract = True

    @property
    def is_active(self) -> bool:
        return self.status in (Status.QUEUED, Status.RUNNING)

    @property
    def percent(self) -> int:
        if self.status == Status.DONE:
            return 100
        return min(100, int(100 * self.done / self.total)) if self.total else 0

    def eta(self) -> float | None:
        """Seconds left, where the job can tell (``None`` otherwise)."""
        return None

    def progress_json(self, report: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        """The one JSON shape of every progress endpoint (read by ``static/cirval/jobs.js``)."""
        eta = self.eta()
        return {
            "id": self.pk,
            "status": self.status,
            "stage": self.stage,
            "done": self.done,
            "total": self.total,
            "percent": self.percent,
            "eta_seconds": None if eta is None else round(eta, 1),
            "error": self.error.splitlines()[0] if self.error else "",
            "report": report or {},
            "no_worker": self.no_worker_message,
            **extra,
        }

    @property
    def no_worker_message(self) -> str:
        """Unfinished, and no worker of its queue beats (:mod:`.workers`): what the page
        says (nothing runs it); empty otherwise."""
        return no_worker_message(self.QUEUE) if self.is_active else ""


class Job(Leased, Progress):
    """A background job run by one worker at a time: leased, with progress."""

    class Meta:
        abstract = True


#: What a page says when work waits and no worker of its queue is alive.
NO_WORKER = "No worker alive: nothing will run this job until one is started (./cirval worker)."


def no_worker_message(queue: str) -> str:
    """:data:`NO_WORKER` when no live worker consumes ``queue`` (work of that queue waits
    for nothing), else empty: what a page shows beside waiting work of that queue."""
    return "" if WorkerBeat.alive(queue) else NO_WORKER


class WorkerBeat(models.Model):
    """A live Celery worker: its main process beats every ``JOB_SWEEP_SECONDS`` (see
    :mod:`.workers`); one silent for ``JOB_STALE_SECONDS`` is taken for dead."""

    name = models.CharField(max_length=200, unique=True, help_text="host:pid of the worker's main process")
    queues = models.CharField(max_length=500, help_text="the queues it consumes, comma-separated")
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField(db_index=True)

    class Meta:
        app_label = "retrieval"

    def __str__(self) -> str:
        return f"{self.name} ({self.queues})"

    @classmethod
    def live(cls) -> list[WorkerBeat]:
        """Workers that beat within ``JOB_STALE_SECONDS`` (a read only: pages call it)."""
        from django.conf import settings
        from django.utils import timezone

        before = timezone.now() - timedelta(seconds=float(settings.JOB_STALE_SECONDS))
        return list(cls.objects.filter(beat_at__gte=before))

    @classmethod
    def alive(cls, queue: str | None = None) -> int:
        """How many live workers consume ``queue`` (any queue when ``None``)."""
        return sum(1 for w in cls.live() if queue is None or queue in w.queues.split(","))
