"""The Celery app. Workers: ``celery -A config worker -Q celery,gpu``."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("cirval")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

from config import worker_tuning  # noqa: E402

worker_tuning.connect()


def at_worker_start(what: str):
    """Register ``fn()`` to run when a worker is ready (recovery of interrupted work).

    What it returns is logged when truthy; an error is logged and never keeps the worker
    from starting. Database connections are fresh before and closed after."""
    import logging

    from celery.signals import worker_ready

    log = logging.getLogger("config.celery")

    def register(fn):
        def handler(sender=None, **kwargs):
            from django.db import close_old_connections

            try:
                close_old_connections()
                done = fn()
                if done:
                    log.info("%s on worker start: %s", what, done)
            except Exception:
                log.exception("could not finish %s on worker start", what)
            finally:
                close_old_connections()

        worker_ready.connect(handler, weak=False, dispatch_uid=f"cirval-worker-start:{fn.__module__}.{fn.__name__}")
        return fn

    return register
