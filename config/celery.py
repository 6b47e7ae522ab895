"""The Celery app. Workers: ``celery -A config worker -Q celery,gpu,interactive``."""

import os
import threading

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from config import fsbroker, redisbroker  # noqa: E402

fsbroker.register()  # filesystem:// = atomic writes and takes (config/fsbroker.py)
redisbroker.register()  # redis:// = survives a Redis restart (config/redisbroker.py)

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


#: The worker's own bookkeeping, registered by the app that keeps it (``retrieval.tasks``:
#: the worker beats and the job leases; this package imports no app): ``beat(name, queues)``
#: on every sweep, ``release(owners)`` and ``gone(name)`` when the worker stops, and
#: ``reconnected()`` after a lost broker connection.
_WORKER_HOOKS: dict[str, list] = {"beat": [], "release": [], "gone": [], "reconnected": []}


def on_worker(event: str):
    """Register ``fn`` for one of the worker's events (see ``_WORKER_HOOKS``)."""

    def register(fn):
        _WORKER_HOOKS[event].append(fn)
        return fn

    return register


def _call_hooks(event: str, *args):
    """Run the hooks of ``event``; what they return (one hook: its value; several: a list)."""
    done = [fn(*args) for fn in list(_WORKER_HOOKS[event])]
    return done[0] if len(done) == 1 else [d for d in done if d]


def sweep_once() -> dict[str, object]:
    """Run every registered sweep once; returns what each did (errors are logged)."""
    out: dict[str, object] = {}
    for what, fn in list(_SWEEPS):
        ok, done = _run_logged(fn, f"{what} by the sweep", f"sweep {what!r} failed")
        if ok:
            out[what] = done
    return out


#: This worker: its name (host:pid of the main process), queues, and every pool process
#: seen (their leases are released when it stops).
_WORKER: dict[str, object] = {"name": "", "queues": [], "pids": set()}
_wake = None  # threading.Event: wakes the sweep thread at once (a broker reconnect)


def _pool_pids(consumer) -> set[int]:
    try:
        return set(consumer.controller.pool.info.get("processes") or [])
    except Exception:  # noqa: BLE001 - a pool without processes (solo, threads)
        return set()


_beat_lock = threading.Lock()


def _beat_worker() -> None:
    """Record this worker alive (the ``beat`` hooks: "no worker alive" on pages); nothing
    once it stops (:func:`_release_all` runs the ``gone`` hooks under the same lock)."""
    with _beat_lock:
        if not _WORKER.get("stopped"):
            _run_logged(
                lambda: _call_hooks("beat", _WORKER["name"], _WORKER["queues"]), "worker beat", "worker beat failed"
            )


def _start_sweeper(sender=None, **kwargs) -> None:
    """One daemon thread per worker that beats the worker's row and runs :func:`sweep_once`
    every ``JOB_SWEEP_SECONDS`` (at once when woken by a broker reconnect)."""
    import os
    import socket

    from django.conf import settings

    global _sweeper_started, _wake
    if _sweeper_started:
        return
    _sweeper_started = True
    _WORKER["name"] = f"{socket.gethostname()}:{os.getpid()}"
    try:
        _WORKER["queues"] = sorted(q.name for q in sender.task_consumer.queues)
    except Exception:  # noqa: BLE001
        _WORKER["queues"] = sorted(app.amqp.queues.consume_from or ["celery"])
    _install_fast_stop(sender)
    _wake = threading.Event()

    def loop() -> None:
        while True:
            _WORKER["pids"] |= _pool_pids(sender)
            _beat_worker()
            sweep_once()
            _wake.wait(float(settings.JOB_SWEEP_SECONDS))
            _wake.clear()

    threading.Thread(target=loop, name="cirval-sweep", daemon=True).start()


def _install_fast_stop(consumer) -> None:
    """SIGTERM stops the worker within ``WORKER_STOP_SECONDS``: a running task gets that
    long to finish (Celery's soft shutdown), then it is cancelled and its work released
    (:func:`_stopped`) and sent again at once. Celery's own SIGTERM is a warm shutdown that
    waits for every running task, however long (an audit chunk: minutes)."""
    import logging

    try:
        from celery.apps import worker as celery_worker
        from celery.platforms import EX_OK

        def cold_stop(worker) -> None:
            _end_idle_pool_processes(consumer)
            celery_worker.on_cold_shutdown(worker)

        # exit code 0: a stop that was asked for is no failure (systemd, the supervisor)
        celery_worker._shutdown_handler(
            consumer.controller, sig="SIGTERM", how="Cold", callback=cold_stop, exitcode=EX_OK
        )
    except Exception:  # noqa: BLE001 - e.g. a Celery without it: the warm shutdown stays
        logging.getLogger("config.celery").warning("could not install the fast SIGTERM stop", exc_info=True)


def _end_idle_pool_processes(consumer) -> None:
    """At a stop, before Celery's cold shutdown waits for every pool process to end: close the
    pool (no process is started in place of one that ends) and end each pool process that
    runs no task at once. A process still starting (it imports torch: 20 s on a loaded
    machine) held that wait, so a stop took 25-45 s; a process with a task keeps its
    ``WORKER_STOP_SECONDS`` grace."""
    import os
    import signal

    from celery.worker import state

    try:
        consumer.controller.pool._pool.close()  # billiard's Pool: CLOSE, no more replacements
        busy = {getattr(request, "worker_pid", None) for request in state.active_requests}
        for pid in _pool_pids(consumer) - busy:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    except Exception:  # noqa: BLE001 - never in the way of the stop itself
        import logging

        logging.getLogger("config.celery").warning("could not end the idle pool processes", exc_info=True)


def _stopped(sender=None, how: str = "", **kwargs) -> None:
    """The worker stops: release the leases of its processes and send that work again at
    once (another worker, or this one restarted, takes it), and say this worker is gone.

    Connected to ``worker_shutting_down`` (sent from the signal handler, after a cold stop
    cancelled the running tasks; a warm stop is left to finish them) and ``worker_shutdown``
    (the end of a warm stop). Runs on a thread of its own: its own database connection."""
    if not _WORKER["name"] or how == "Warm" or _WORKER.get("stopped"):
        return
    _WORKER["stopped"] = True
    t = threading.Thread(target=_release_all, name="cirval-stopped")
    t.start()
    t.join(timeout=15)


def _release_all() -> None:
    import os
    import socket

    host = socket.gethostname()
    owners = [f"{host}:{pid}" for pid in {*_WORKER["pids"], os.getpid()}]
    _run_logged(
        lambda: _call_hooks("release", owners),
        "work released by the stopping worker",
        "could not release the stopping worker's work",
    )
    sweep_once()
    with _beat_lock:
        _run_logged(lambda: _call_hooks("gone", _WORKER["name"]), "", "could not remove the worker's beat")


def _connect_sweeper() -> None:
    from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

    worker_ready.connect(_start_sweeper, weak=False, dispatch_uid="cirval-sweeper")
    worker_shutdown.connect(_stopped, weak=False, dispatch_uid="cirval-stopped")
    worker_shutting_down.connect(_stopped, weak=False, dispatch_uid="cirval-stopping")


_connect_sweeper()


# --- a worker that survives its broker ---------------------------------------------------
from celery import bootsteps  # noqa: E402
from celery.worker.consumer import Consumer as _CeleryConsumer  # noqa: E402


class Consumer(_CeleryConsumer):
    """Celery's consumer without gossip and mingle (``CELERY_WORKER_CONSUMER``).

    CIRVal uses neither (no worker elections, no state sync between workers), and restarting
    Gossip after a Redis restart touches channels of the closed connection inside kombu's
    Redis transport (``'NoneType' object has no attribute ...``, celery/kombu#582): a plain
    ``celery -A config worker`` is the same as one started with ``--without-gossip
    --without-mingle``."""

    def __init__(self, *args, worker_options=None, **kwargs):
        options = {**(worker_options or {}), "without_gossip": True, "without_mingle": True}
        super().__init__(*args, worker_options=options, **kwargs)


class BrokerReconnected(bootsteps.StartStopStep):
    """Starts with the consumer, again after each lost broker connection: then messages sent
    before may be gone (a Redis restart), so the sweep runs at once and resends them
    (the ``reconnected`` hooks: :func:`retrieval.jobs.leases.messages_lost`) instead of after ``JOB_RESEND_SECONDS``."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c, **kwargs):
        super().__init__(c, **kwargs)
        self.starts = 0

    def start(self, c):
        self.starts += 1
        if self.starts > 1:
            _call_hooks("reconnected")
            if _wake is not None:
                _wake.set()


app.steps["consumer"].add(BrokerReconnected)
