"""Keep background work from starving the web tier on a shared machine.

A worker lowers its CPU priority (``WORKER_NICE``, default ``idle``: Linux's idle scheduling
class, so the worker runs only on cores the web tier leaves idle; a number: that nice value) and gives torch only the cores that are left to it: the machine's cores
less ``WORKER_RESERVED_CORES`` (default 1, for the web tier), shared among the worker's
pool processes. ``WORKER_TORCH_THREADS`` overrides the count. Gallery images are decoded in
:func:`loader_workers` processes (``AUDIT_LOADER_WORKERS`` overrides). On a GPU host with no web
tier, set ``WORKER_RESERVED_CORES=0`` and ``WORKER_NICE=0``.
"""

from __future__ import annotations

import gc
import logging
import os

log = logging.getLogger("config.worker")


def torch_threads(cpus: int, reserved: int, processes: int) -> int:
    """Intra-op threads per pool process: the cores left after ``reserved``, split evenly, at least 1."""
    return max(1, (max(cpus, 1) - max(reserved, 0)) // max(processes, 1))


#: At most this many image loader processes by default (decoding rarely needs more to feed one GPU).
MAX_LOADER_WORKERS = 8


def loader_workers(cpus: int, reserved: int, processes: int) -> int:
    """Image loader processes per pool process: its share of the cores left, less the one that
    runs the model; 0 (decode in-process) when only one core is left."""
    return min(MAX_LOADER_WORKERS, torch_threads(cpus, reserved, processes) - 1)


def default_loader_workers() -> int:
    """``AUDIT_LOADER_WORKERS`` when set (>= 0), else :func:`loader_workers` for this process."""
    from django.conf import settings

    if settings.AUDIT_LOADER_WORKERS >= 0:
        return settings.AUDIT_LOADER_WORKERS
    return loader_workers(os.cpu_count() or 1, settings.WORKER_RESERVED_CORES, _pool_size(default=1))


def lower_priority(sender=None, **kwargs) -> None:
    """``worker_init``: lower the worker's CPU priority before it forks its pool (children,
    and their image loader processes, inherit it). ``WORKER_NICE=idle`` (the default):
    Linux's idle scheduling class, where the worker runs only on cores that nothing else
    wants and a waking web request takes the core at once; where that class is refused or
    missing, nice 19. A number: that nice value (0 keeps the normal priority)."""
    from django.conf import settings

    value = settings.WORKER_NICE.strip().lower()
    try:
        if value == "idle" and _set_idle_class():
            return
        nice = 19 if value == "idle" else _nice_value(value)
        if nice > 0:
            os.nice(nice)
    except OSError as exc:  # not permitted: run at normal priority
        log.warning("could not lower the worker's priority: %s", exc)


def _nice_value(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"WORKER_NICE={value!r}: use idle or a nice value (0 to 19)") from None


def _set_idle_class() -> bool:
    """Put this process in Linux's SCHED_IDLE class; False where that is not possible."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError) as exc:  # not Linux, or refused
        log.info("no idle scheduling class here (%s): nice 19 instead", exc)
        return False
    return True


def scheduling() -> str:
    """This process's CPU priority in words, for the log."""
    try:
        if os.sched_getscheduler(0) == os.SCHED_IDLE:
            return "idle class"
    except (OSError, AttributeError):
        pass
    return f"nice {os.nice(0)}"


def limit_torch_threads(sender=None, **kwargs) -> None:
    """``worker_process_init``: set torch's thread count in each pool process."""
    from django.conf import settings

    n = settings.WORKER_TORCH_THREADS or torch_threads(
        os.cpu_count() or 1, settings.WORKER_RESERVED_CORES, _pool_size()
    )
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a requirement
        return
    torch.set_num_threads(n)
    log.info("torch uses %d thread(s) in this worker process (%s)", n, scheduling())


def _pool_size(default: int | None = None) -> int:
    """The worker's pool processes (``-c`` / ``CELERY_WORKER_CONCURRENCY``), else ``default``, else the cores."""
    from celery import current_app

    return int(current_app.conf.worker_concurrency or default or os.cpu_count() or 1)


def freeze_startup_heap(sender=None, **kwargs) -> None:
    """Move every object alive after start-up (modules, Django, torch: some 400,000) out of
    the garbage collector's generations (``gc.freeze``). A full collection, which Python
    starts now and then on its own, then scans only what the work allocated since, instead
    of pausing the process for about 0.2 s. Called last when a worker process starts, and
    by the web application once it is warmed (config/wsgi.py)."""
    gc.collect()
    gc.freeze()


def connect() -> None:
    from celery.signals import worker_init, worker_process_init

    worker_init.connect(lower_priority, weak=False, dispatch_uid="cirval-worker-nice")
    worker_process_init.connect(limit_torch_threads, weak=False, dispatch_uid="cirval-worker-torch-threads")
    worker_process_init.connect(freeze_startup_heap, weak=False, dispatch_uid="cirval-worker-freeze-heap")
