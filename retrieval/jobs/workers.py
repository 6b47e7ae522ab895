"""Which workers are alive: every worker's main process beats a :class:`WorkerBeat` row from
its sweep thread (``config/celery.py``); pages and ``/healthz`` read it, so "no worker alive"
is shown when jobs wait and nothing would run them (a worker that died, or none started)."""
from __future__ import annotations

from datetime import timedelta

from django.apps import apps
from django.db.models import Q
from django.utils import timezone

from . import leases
from .models import Leased, Status, WorkerBeat

#: What a page says when work waits and no worker of its queue is alive.
NO_WORKER = "No worker alive: nothing will run this job until one is started (./cirval worker)."


def beat(name: str, queues: list[str]) -> None:
    """Record that worker ``name`` (consuming ``queues``) is alive now (and forget workers
    silent for a day: killed without a word)."""
    now = timezone.now()
    n = WorkerBeat.objects.filter(name=name).update(beat_at=now, queues=",".join(sorted(queues))[:500])
    if not n:
        WorkerBeat.objects.filter(beat_at__lt=now - timedelta(days=1)).delete()
        WorkerBeat.objects.update_or_create(name=name, defaults={
            "queues": ",".join(sorted(queues))[:500], "started_at": now, "beat_at": now})


def gone(name: str) -> None:
    """A worker that stops says so (its row is removed at once)."""
    WorkerBeat.objects.filter(name=name).delete()


def live() -> list[WorkerBeat]:
    """Workers that beat within ``JOB_STALE_SECONDS`` (a read only: pages call it)."""
    before = timezone.now() - timedelta(seconds=leases.stale_seconds())
    return list(WorkerBeat.objects.filter(beat_at__gte=before))


def alive(queue: str | None = None) -> int:
    """How many live workers consume ``queue`` (any queue when ``None``)."""
    return sum(1 for w in live() if queue is None or queue in w.queues.split(","))


def waiting_jobs() -> dict[str, int]:
    """Unfinished work of every leased kind (imports, exports, audit chunks), by model."""
    out = {}
    for model in apps.get_models():
        if issubclass(model, Leased):
            n = model.objects.filter(Q(status=model.WAITING) | Q(status=Status.RUNNING)).count()
            if n:
                out[model._meta.label] = n
    return out


def health() -> dict:
    """``/healthz``'s workers entry: down when work waits and no worker is alive."""
    workers = live()
    waiting = waiting_jobs()
    out = {"ok": bool(workers) or not waiting, "alive": len(workers),
           "workers": [{"name": w.name, "queues": w.queues} for w in workers], "unfinished": waiting}
    if not out["ok"]:
        out["error"] = NO_WORKER
    return out
