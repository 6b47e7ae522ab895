"""An item's candidate panel: fixed the first time it is needed, then the same for every
annotator and every revision (ticked alternatives are checked against it).

The panel comes from :func:`audit.runs.panels.candidate_panel`: the newest audit's pooled
multimodal top lists fused by reciprocal rank, minus every labelled target and the
reference, ``study.candidates`` images. A query no audit ranked is ranked on demand by one
retriever (:mod:`audit.runs.ondemand`). Annotators get the images only; where the panel came
from is staff information.

**No model in the web tier, ever.** Panels are computed by a worker only
(:func:`annotation.judging.panel_fill.fill_study_candidates`, the ``annotation.fill_candidates``
task; this module imports neither it nor the audit executor): when a study is
created, when an audit of its dataset finishes, and whenever the web tier serves an item
whose panel is missing. The web tier only reads stored panels (:func:`item_candidates`): an
item without one is served without a panel (no ticks can be given on it) and its study's
panels are requested from a worker, so the next annotator of that item gets one. Ranking a
query on demand loads torch and a model (seconds of CPU, hundreds of MB per process), which
would stall every annotator that web process serves.
"""

from __future__ import annotations

import logging

from django.core.cache import cache
from django.db import connection

from annotation.alternatives.paging import PAGE_SIZE  # noqa: F401  (re-exported: pages and the API read it here)
from annotation.models import Study, StudyItem

logger = logging.getLogger(__name__)


#: The worker task that fills a study's missing panels (``annotation.tasks.fill_candidates``).
FILL_TASK = "annotation.fill_candidates"

#: A study's panels are requested from a worker at most once per this many seconds.
REQUEST_EVERY_SECONDS = 30


def panels_after_audit(sender, run, **kwargs) -> list[int]:
    """An audit finished (``audit.runs.aggregation.audit_finished``): ask a worker to fill
    the missing panels of every open study over that dataset, now from the audit's top
    lists. Returns the studies asked for."""
    studies = list(
        Study.objects.filter(
            status=Study.Status.OPEN,
            items__query__dataset_id=run.dataset_id,
            items__candidates_source="",
            items__query__n_turns=1,
        )
        .order_by("pk")
        .values_list("pk", flat=True)
        .distinct()
    )
    return [pk for pk in studies if send_fill(pk)]


def item_candidates(item: StudyItem) -> list[int]:
    """The item's stored candidate image ids; [] for sessions and for an item whose panel a
    worker has not filled yet (then :func:`request_panels` asks one to). Never computes a
    panel: this runs in the web tier."""
    if item.query.n_turns != 1:
        return []
    if not item.candidates_source:
        request_panels(item.study_id)
        return []
    return list(item.candidates)


def _requested_key(study_id: int) -> str:
    """The cache key of a recent request, per database (one Redis cache may serve several)."""
    return f"cirval:panels-requested:{connection.settings_dict['NAME']}:{study_id}"


def request_panels(study_id: int) -> bool:
    """Ask a worker to fill the study's missing panels, at most once per
    ``REQUEST_EVERY_SECONDS`` per study (a shared cache key); True when a task was sent."""
    try:
        first = cache.add(_requested_key(study_id), 1, REQUEST_EVERY_SECONDS)
    except Exception:  # the cache is down: send anyway (the task is idempotent and cheap when all is filled)
        logger.warning("cache unavailable while requesting the panels of study %s", study_id, exc_info=True)
        first = True
    return bool(first) and send_fill(study_id)


def send_fill(study_id: int) -> bool:
    """Send ``annotation.tasks.fill_candidates`` (registered in every process by
    ``AnnotationConfig.ready``); False when the broker is down."""
    from retrieval.jobs.sending import send_task

    return send_task(FILL_TASK, study_id)
