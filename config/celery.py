"""The Celery app. Workers: ``celery -A config worker -Q celery,gpu``."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("cirval")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

from config import worker_tuning  # noqa: E402

worker_tuning.connect()


def _run_logged(fn, done_note: str, failed_note: str) -> tuple[bool, object]:
    """``(True, fn())`` between fresh database connections, what it returns logged when
    truthy; ``(False, None)`` when it raised (the error is logged, never raised)."""
    import logging

    from django.db import close_old_connections

    log = logging.getLogger("config.celery")
    try:
        close_old_connections()
        done = fn()
        if done:
            log.info("%s: %s", done_note, done)
        return True, done
    except Exception:
        log.exception(failed_note)
        return False, None
    finally:
        close_old_connections()


def at_worker_start(what: str):
    """Register ``fn()`` to run when a worker is ready (recovery of interrupted work).

    What it returns is logged when truthy; an error is logged and never keeps the worker
    from starting. Database connections are fresh before and closed after."""
    from celery.signals import worker_ready

    def register(fn):
        def handler(sender=None, **kwargs):
            _run_logged(fn, f"{what} on worker start", f"could not finish {what} on worker start")

        worker_ready.connect(handler, weak=False, dispatch_uid=f"cirval-worker-start:{fn.__module__}.{fn.__name__}")
        return fn

    return register


_SWEEPS: list[tuple[str, object]] = []
_sweeper_started = False


def every_sweep(what: str):
    """Register ``fn()`` to run in every worker at start and then every ``JOB_SWEEP_SECONDS``
    (resending stale and lost jobs; ``./cirval up`` runs no Celery beat, so the worker
    keeps the time). What it returns is logged when truthy; an error is logged and the
    sweep goes on."""

    def register(fn):
        _SWEEPS.append((what, fn))
        return fn

    return register


def sweep_once() -> dict[str, object]:
    """Run every registered sweep once; returns what each did (errors are logged)."""
    out: dict[str, object] = {}
    for what, fn in list(_SWEEPS):
        ok, done = _run_logged(fn, f"{what} by the sweep", f"sweep {what!r} failed")
        if ok:
            out[what] = done
    return out


def _start_sweeper(sender=None, **kwargs) -> None:
    """One daemon thread per worker process that runs :func:`sweep_once` periodically."""
    import threading

    from django.conf import settings

    global _sweeper_started
    if _sweeper_started:
        return
    _sweeper_started = True
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            sweep_once()
            stop.wait(float(settings.JOB_SWEEP_SECONDS))

    threading.Thread(target=loop, name="cirval-sweep", daemon=True).start()


def _connect_sweeper() -> None:
    from celery.signals import worker_ready

    worker_ready.connect(_start_sweeper, weak=False, dispatch_uid="cirval-sweeper")


_connect_sweeper()
