"""Warm the retriever of interactive studies before the first round needs it (issue 39, item 5).

A round is ranked by a worker of the ``interactive`` queue (:mod:`.service`). The first
round a worker process ranks used to load torch, the model and the gallery's embeddings:
about 25 s where later rounds take well under a second. So the work is done ahead:

* every pool process of a worker warms the retrievers of the open interactive studies when
  it starts (Celery's ``worker_process_init``, :func:`warm_in_background`: in a thread, so the
  process is up at once and a round that arrives meanwhile waits for the warm model, not for
  a second load);
* opening an interactive item page sends :data:`WARM_TASK` to the ``interactive`` queue
  (:func:`request_warm`, at most once a minute per study), for a worker started before the
  study was opened.

Warming ranks one throw-away round per dataset of the study (the study's retriever, its
history strategy, the gallery the query searches): the model, the gallery matrix and the
first kernels are then in memory, in that process. Nothing is stored but a state in the cache
(:func:`warm_state`): while it says ``warming``, the annotator's page says that the retriever
is warming up. The web tier only reads that state and sends the task; it never loads a model.
"""

from __future__ import annotations

import logging
import threading
import time

from django.core.cache import cache
from django.db import close_old_connections, connection

from retrieval.jobs.sending import send_task

logger = logging.getLogger(__name__)

WARM_TASK = "annotation.warm_interactive"
#: How long a study's warm request stands (a page opened again within it sends none).
REQUEST_EVERY_SECONDS = 60
#: How long a ``warming`` state holds when its process dies mid-way.
WARMING_TTL_SECONDS = 300
WARMING = "warming"
READY = "ready"
WARMING_MESSAGE = (
    "The retriever is warming up (a worker is loading the model): your first round may wait a few seconds for it."
)


def _key(study_id: int) -> str:
    return f"cirval:interactive-warm:{connection.settings_dict['NAME']}:{study_id}"


def warm_state(study_id: int) -> str:
    """``warming``, ``ready`` or ``""`` (never warmed, or the state expired)."""
    try:
        return cache.get(_key(study_id)) or ""
    except Exception:  # the cache is down: say nothing
        return ""


def _set_state(study_id: int, state: str) -> None:
    try:
        cache.set(_key(study_id), state, WARMING_TTL_SECONDS if state == WARMING else None)
    except Exception:
        logger.warning("cache unavailable while marking study %s %s", study_id, state, exc_info=True)


def page_state(session, user_id: int) -> dict:
    """:func:`annotation.interactive.service.session_state` with ``warming``: what the page says
    while a worker loads the study's retriever (empty once it is ready)."""
    from annotation.interactive.service import session_state

    state = session_state(session, user_id)
    state["warming"] = WARMING_MESSAGE if warm_state(session.study_id) == WARMING else ""
    return state


def request_warm(study_id: int) -> bool:
    """Ask a worker of the ``interactive`` queue to warm the study's retriever, at most once
    per :data:`REQUEST_EVERY_SECONDS`; True when a task was sent."""
    try:
        first = cache.add(f"{_key(study_id)}:asked", 1, REQUEST_EVERY_SECONDS)
    except Exception:
        first = True
    return bool(first) and send_task(WARM_TASK, study_id)


def warm_study(study_id: int) -> dict[str, float]:
    """Rank one throw-away round per dataset of an interactive study in this process (its
    retriever, strategy and depth); returns seconds per dataset name. Stores nothing."""
    from annotation.core.rounds import InteractiveSettings
    from annotation.interactive.service import start_reference
    from annotation.models import Study, StudyItem
    from audit.runs.ondemand import rank_turns

    study = Study.objects.filter(pk=study_id).first()
    if study is None or not study.interactive:
        return {}
    rules = InteractiveSettings.from_dict(study.interactive)
    _set_state(study_id, WARMING)
    took: dict[str, float] = {}
    try:
        seen: set[int] = set()
        for item in StudyItem.objects.filter(study=study).select_related("query__dataset").order_by("pk").iterator():
            if item.query.dataset_id in seen:
                continue
            seen.add(item.query.dataset_id)
            started = time.perf_counter()
            rank_turns(
                item.query,
                rules.retriever,
                [(start_reference(item.query), "warm up")],
                [],
                rules.strategy,
                rules.alpha,
                rules.top_n,
            )
            took[item.query.dataset.name] = round(time.perf_counter() - started, 3)
    finally:
        _set_state(study_id, READY)
    logger.info("interactive study %s warmed: %s", study_id, took)
    return took


def open_interactive_studies() -> list[int]:
    from annotation.models import Study

    return [
        pk
        for pk, conf in Study.objects.filter(status=Study.Status.OPEN)
        .exclude(interactive=None)
        .values_list("pk", "interactive")
        if conf
    ]


def warm_open_studies() -> dict[int, dict[str, float]]:
    """:func:`warm_study` of every open interactive study (one failing is logged, the rest go on)."""
    out = {}
    try:
        for pk in open_interactive_studies():
            try:
                out[pk] = warm_study(pk)
            except Exception:
                logger.exception("could not warm interactive study %s", pk)
    finally:
        close_old_connections()
    return out


_thread: threading.Thread | None = None


def warm_in_background(sender=None, **kwargs) -> threading.Thread | None:
    """``worker_process_init``: warm the open interactive studies in a thread of this pool
    process (Celery gives a starting process a few seconds to report; a model takes longer),
    when the worker consumes the ``interactive`` queue."""
    global _thread
    if not _consumes_rounds():
        return None
    _thread = threading.Thread(target=warm_open_studies, name="cirval-warm-interactive", daemon=True)
    _thread.start()
    return _thread


def wait_for_warm(timeout: float = 120.0) -> None:
    """A round that arrives while this process warms waits for that (one model load, not two)."""
    thread = _thread
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout)


def _consumes_rounds() -> bool:
    """Whether this worker consumes the queue interactive rounds go to (``-Q``)."""
    from celery import current_app

    from annotation.interactive.service import rank_queue

    try:
        selected = current_app.amqp.queues.consume_from
    except Exception:
        return True
    return not selected or rank_queue() in selected
