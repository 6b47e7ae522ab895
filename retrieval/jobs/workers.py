"""Which workers are alive: every worker's main process beats a :class:`WorkerBeat` row from
its sweep thread (``config/celery.py``); pages and ``/healthz`` read it, so "no worker alive"
is shown when jobs wait and nothing would run them (a worker that died, or none started)."""

from __future__ import annotations

from datetime import timedelta

from django.apps import apps
from django.utils import timezone

from .models import NO_WORKER, WorkerBeat, no_worker_message

__all__ = ["NO_WORKER", "alive", "beat", "gone", "health", "live", "no_worker_message", "waiting_jobs"]


def beat(name: str, queues: list[str]) -> None:
    """Record that worker ``name`` (consuming ``queues``) is alive now (and forget workers
    silent for a day: killed without a word)."""
    now = timezone.now()
    n = WorkerBeat.objects.filter(name=name).update(beat_at=now, queues=",".join(sorted(queues))[:500])
    if not n:
        WorkerBeat.objects.filter(beat_at__lt=now - timedelta(days=1)).delete()
        WorkerBeat.objects.update_or_create(
            name=name, defaults={"queues": ",".join(sorted(queues))[:500], "started_at": now, "beat_at": now}
        )


def gone(name: str) -> None:
    """A worker that stops says so (its row is removed at once)."""
    WorkerBeat.objects.filter(name=name).delete()


live = WorkerBeat.live
alive = WorkerBeat.alive


def waiting_jobs() -> dict[str, int]:
    """Unfinished work of every kind a worker runs, by model: the leased kinds (imports,
    exports, audit chunks) and any other model that sets ``waits_for_worker`` (the interactive
    rounds waiting to be re-ranked)."""
    out = {}
    for model in apps.get_models():
        if getattr(model, "waits_for_worker", False):
            n = model.unfinished().count()
            if n:
                out[model._meta.label] = n
    return out


def health() -> dict:
    """``/healthz``'s workers entry: down when work waits and no worker is alive."""
    workers = live()
    waiting = waiting_jobs()
    out = {
        "ok": bool(workers) or not waiting,
        "alive": len(workers),
        "workers": [{"name": w.name, "queues": w.queues} for w in workers],
        "unfinished": waiting,
    }
    if not out["ok"]:
        out["error"] = NO_WORKER
    return out
