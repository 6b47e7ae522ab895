"""Sending a job's task to the broker without failing when the broker is down."""

from __future__ import annotations

import logging

from django.utils import timezone

logger = logging.getLogger(__name__)

#: What a page says when a job was stored but its message could not be sent.
QUEUE_DOWN = "The job queue is unavailable, the job will start when it is back."

#: A short publish retry: the request answers in about a second when the broker is down.
RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.3, "interval_max": 0.5}


def send_task(name: str, *args, countdown: float | None = None) -> bool:
    """Send the registered task ``name`` with ``args``; ``False`` when the broker is down."""
    from celery import current_app

    try:
        current_app.tasks[name].apply_async(args, countdown=countdown, retry=True, retry_policy=RETRY_POLICY)
    except Exception:  # kombu's OperationalError, a refused connection, a timeout
        if current_app.conf.task_always_eager:
            raise  # the task itself failed in this process
        logger.warning("could not send %s%r: the broker is unavailable", name, args, exc_info=True)
        return False
    return True


def enqueue(model, pk: int, task: str) -> bool:
    """Send the task of waiting row ``pk`` and record when; ``False`` (and the row marked
    never sent, for the sweep) when the broker is down."""
    now = timezone.now()
    model.objects.filter(pk=pk).update(enqueued_at=now)
    if send_task(task, pk):
        return True
    model.objects.filter(pk=pk, enqueued_at=now).update(enqueued_at=None)
    return False
