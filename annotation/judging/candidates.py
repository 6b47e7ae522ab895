"""An item's candidate panel: fixed the first time it is needed, then the same for every
annotator and every revision (ticked alternatives are checked against it).

The panel comes from :func:`audit.runs.panels.candidate_panel`: the newest audit's pooled
multimodal top lists fused by reciprocal rank, minus every labelled target and the
reference, ``study.candidates`` images. A query no audit ranked is ranked on demand by one
retriever (:mod:`audit.runs.ondemand`). Annotators get the images only; where the panel came
from is staff information.

**No model in the web tier, ever.** Panels are computed by a worker only
(:func:`fill_study_candidates`, the ``annotation.fill_candidates`` task): when a study is
created, when an audit of its dataset finishes, and whenever the web tier serves an item
whose panel is missing. The web tier only reads stored panels (:func:`item_candidates`): an
item without one is served without a panel (no ticks can be given on it) and its study's
panels are requested from a worker, so the next annotator of that item gets one. Ranking a
query on demand loads torch and a model (seconds of CPU, hundreds of MB per process), which
would stall every annotator that web process serves.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

from django.conf import settings
from django.core.cache import cache
from django.db import connection

from retrieval.models import Query

from annotation.alternatives.paging import PAGE_SIZE  # noqa: F401  (re-exported: pages and the API read it here)
from annotation.assignment.rules import queue_fields
from annotation.models import Study, StudyItem

logger = logging.getLogger(__name__)


#: The worker task that fills a study's missing panels (``annotation.tasks.fill_candidates``).
FILL_TASK = "annotation.fill_candidates"

#: A study's panels are requested from a worker at most once per this many seconds.
REQUEST_EVERY_SECONDS = 30


def _depth(size: int) -> int:
    """How deep an on-demand ranking goes: the audit's top-list size, at least the panel plus
    room for the targets it must leave out."""
    stored = int(settings.AUDIT_CANDIDATES_N)
    return max(stored, size + 10)


def _compute(items: Sequence[StudyItem], size: int) -> dict[int, tuple[list[int], str]]:
    """item id -> (candidate ids, source) for items that have no panel yet."""
    from audit.runs.ondemand import retrieve_top_lists
    from audit.runs.panels import batch_exclusions, candidate_panel, gallery_ids, latest_pool_rankings
    from retrieval.galleries import query_gallery_keys

    qids = [i.query_id for i in items]
    queries = {q.pk: q for q in Query.objects.filter(pk__in=qids).select_related("dataset")}
    excluded = batch_exclusions(qids)
    ranked = latest_pool_rankings(qids)
    galleries: dict[tuple[int, str | None], list[int]] = {}
    searched = query_gallery_keys(qids)

    def panel(query: Query, lists: list[list[int]]):
        key = (query.dataset_id, searched.get(query.pk))  # the gallery it searches (retrieval.galleries)
        if key not in galleries:  # read once per batch (padding needs it)
            galleries[key] = gallery_ids(query)
        return candidate_panel(query, lists, size, galleries[key], excluded[query.pk])

    out: dict[int, tuple[list[int], str]] = {}
    unranked: list[StudyItem] = []
    for item in items:
        run_id, lists = ranked.get(item.query_id, (None, []))
        if lists:
            c = panel(queries[item.query_id], lists)
            out[item.pk] = (c.ids, f"audit {run_id}: RRF of {len(lists)} top lists, {c.padded} padded")
        else:
            unranked.append(item)
    if unranked:
        try:
            tops = retrieve_top_lists([queries[i.query_id] for i in unranked], _depth(size))
        except Exception:  # no model, no files: the item is judged without a panel, retried later
            logger.exception("on-demand candidate ranking failed")
            return out
        for item in unranked:
            c = panel(queries[item.query_id], [tops[item.query_id]] if item.query_id in tops else [])
            out[item.pk] = (c.ids, f"retriever on demand: {len(tops.get(item.query_id, []))} ranked, {c.padded} padded")
    return out


def panels_after_audit(sender, run, **kwargs) -> list[int]:
    """An audit finished (``audit.runs.aggregation.audit_finished``): ask a worker to fill
    the missing panels of every open study over that dataset, now from the audit's top
    lists. Returns the studies asked for."""
    from annotation.models import Study

    studies = list(Study.objects.filter(status=Study.Status.OPEN, items__query__dataset_id=run.dataset_id,
                                        items__candidates_source="", items__query__n_turns=1)
                   .order_by("pk").values_list("pk", flat=True).distinct())
    return [pk for pk in studies if _send_fill(pk)]


def fill_candidates(items: Sequence[StudyItem]) -> int:
    """Store the panel of every single-turn item that has none; returns how many were stored.

    The first writer wins: a panel once stored is never replaced (ticks refer to it)."""
    todo = [i for i in items if not i.candidates_source and i.query.n_turns == 1]
    if not todo:
        return 0
    stored = 0
    by_study: dict[int, list[StudyItem]] = {}
    for item in todo:
        by_study.setdefault(item.study_id, []).append(item)
    for group in by_study.values():
        size = group[0].study.candidates
        for pk, (ids, source) in _compute(group, size).items():
            stored += StudyItem.objects.filter(pk=pk, candidates_source="").update(candidates=ids,
                                                                                 candidates_source=source[:200])
    return stored


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
    return bool(first) and _send_fill(study_id)


def _send_fill(study_id: int) -> bool:
    """Send ``annotation.tasks.fill_candidates`` (registered in every process by
    ``AnnotationConfig.ready``); False when the broker is down."""
    from retrieval.jobs.queue import send_task

    return send_task(FILL_TASK, study_id)


def fill_study_candidates(study_id: int, batch: int = 200) -> int:
    """Store the panel of every item of a study that has none, in queue order (the items
    annotators reach first are filled first); a worker task, never run by the web tier."""
    serve_order = Study.objects.filter(pk=study_id).values_list("serve_order", flat=True).first() or ""
    qs = StudyItem.objects.filter(study_id=study_id, candidates_source="", query__n_turns=1).select_related(
        "study", "query").order_by(*queue_fields(serve_order))
    done = 0
    while True:
        chunk = list(qs[:batch])
        if not chunk:
            break
        n = fill_candidates(chunk)
        done += n
        if n == 0:
            break
    logger.info("study %s: %d candidate panels stored", study_id, done)
    return done
