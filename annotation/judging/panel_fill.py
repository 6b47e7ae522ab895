"""Filling an item's candidate panel, on a worker only (the ``annotation.fill_candidates``
task): the newest audit's pooled top lists (:func:`audit.runs.panels.candidate_panel`), or a
retriever on demand (:mod:`audit.runs.ondemand`) for a query no audit ranked. The web tier
reads stored panels through :mod:`annotation.judging.candidates` and never imports this
module (the contract "Serving an item never imports the audit executor", ``.importlinter``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.conf import settings

from annotation.core.serving import queue_fields
from annotation.models import Study, StudyItem
from retrieval.models import Query

logger = logging.getLogger(__name__)


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
            stored += StudyItem.objects.filter(pk=pk, candidates_source="").update(
                candidates=ids, candidates_source=source[:200]
            )
    return stored


def fill_study_candidates(study_id: int, batch: int = 200) -> int:
    """Store the panel of every item of a study that has none, in queue order (the items
    annotators reach first are filled first); a worker task, never run by the web tier."""
    serve_order = Study.objects.filter(pk=study_id).values_list("serve_order", flat=True).first() or ""
    qs = (
        StudyItem.objects.filter(study_id=study_id, candidates_source="", query__n_turns=1)
        .select_related("study", "query")
        .order_by(*queue_fields(serve_order))
    )
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
