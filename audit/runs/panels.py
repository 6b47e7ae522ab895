"""The candidate panel of a query (fused from the audit's top lists) and session ranks, read by
the annotation app.

The candidate *pool* of a query is every retriever's top lists in the three modalities
(multimodal, text only, image only) plus the images nearest its labelled targets (image to
image), :data:`POOL_FIELDS` of each :class:`~audit.models.AuditRank` row. The panel fuses them
by reciprocal rank (:func:`retrieval.fusion.candidate_list`): every retriever's lists count
alike, each list by its modality's weight (:data:`POOL_WEIGHTS`: the text-only lists, which
never see the reference, a quarter), so an image's place depends on its ranks and on the
kinds of list that ranked it, never on which retriever found it, and nothing of it reads the
audit's label or the targets' ranks.
"""

from __future__ import annotations

from retrieval.fusion import Candidates, candidate_list, seeded_padding
from retrieval.galleries import query_gallery
from retrieval.models import Query, Target, Turn

from ..models import AuditRank, AuditRun, AuditSessionRank
from .base import SESSION_FILTER_BASIS

#: The top lists of an audit rank row that make a query's candidate pool.
POOL_FIELDS = ("top_mm", "top_text", "top_image", "top_near")
#: What each pool list counts when the panel chooses its images (:func:`retrieval.fusion.candidate_list`'s
#: ``weights``, with :data:`retrieval.fusion.POOL_K`): the text-only lists a quarter, since they
#: read the words without the reference and bring images that match the text but not the
#: scene; a list without a field (rank files, tests) counts 1. Issue 39, item 1: with every
#: list at 1 the demo's seed 11 and 13 panels held 0.80 and 0.81 of the fitting images over
#: all audited queries, with the text-only lists at a quarter 0.83 and 0.85 (both at POOL_K).
POOL_WEIGHTS = {"top_mm": 1.0, "top_text": 0.25, "top_image": 1.0, "top_near": 1.0}
#: The pool lists that order a panel, likely fits first (:func:`retrieval.fusion.candidate_list`'s
#: ``order``), with their weights: the multimodal ones, which read the reference and the text
#: together, and at half weight the images nearest the targets (what fits looks like them).
ORDER_WEIGHTS = {"top_mm": 1.0, "top_near": 0.5}


class PoolList(list):
    """One top list of the pool (image ids, best first) that knows its :data:`POOL_FIELDS` field."""

    field = ""

    @classmethod
    def of(cls, field: str, ids) -> PoolList:
        out = cls(ids)
        out.field = field
        return out


def pool_lists(*tops: list[int] | None) -> list[list[int]]:
    """The non-empty top lists of one rank row (:data:`POOL_FIELDS` order), each a
    :class:`PoolList`: rows written before the other modalities were kept, or imported from a
    rank file, have ``top_mm`` only; a query without a target in the gallery has no ``top_near``."""
    return [PoolList.of(field, top) for field, top in zip(POOL_FIELDS, tops) if top]


def pool_rankings(run: AuditRun, query: Query | int) -> list[list[int]]:
    """Every retriever's pool lists (image ids, best first; :data:`POOL_FIELDS`) for ``query`` in ``run``."""
    qid = query if isinstance(query, int) else query.pk
    return [
        top
        for row in AuditRank.objects.filter(run=run, query_id=qid).order_by("retriever").values_list(*POOL_FIELDS)
        for top in pool_lists(*row)
    ]


def latest_pool_rankings(query_ids: list[int]) -> dict[int, tuple[int, list[list[int]]]]:
    """query id -> (run id, pool lists: :func:`pool_rankings`) from the newest finished audit
    that ranked it, for many queries in one read."""
    by_query: dict[int, dict[int, list[tuple[str, list[list[int]]]]]] = {}
    for qid, run_id, retriever, *tops in AuditRank.objects.filter(
        query_id__in=query_ids, run__status=AuditRun.Status.DONE
    ).values_list("query_id", "run_id", "retriever", *POOL_FIELDS):
        by_query.setdefault(qid, {}).setdefault(run_id, []).append((retriever, pool_lists(*tops)))
    runs = {r for per in by_query.values() for r in per}
    order = {
        pk: (at is not None, at, pk) for pk, at in AuditRun.objects.filter(pk__in=runs).values_list("pk", "finished_at")
    }
    out = {}
    for qid, per in by_query.items():
        run_id = max(per, key=lambda r: order[r])
        out[qid] = (run_id, [top for _, tops in sorted(per[run_id]) for top in tops])
    return out


def batch_exclusions(query_ids: list[int]) -> dict[int, set[int]]:
    """:func:`panel_exclusions` of many queries in two reads."""
    out: dict[int, set[int]] = {q: set() for q in query_ids}
    for qid, image in Target.objects.filter(query_id__in=query_ids).values_list("query_id", "image_id"):
        out[qid].add(image)
    for qid, image in Turn.objects.filter(query_id__in=query_ids).values_list("query_id", "reference_image_id"):
        if image:
            out[qid].add(image)
    return out


def panel_exclusions(query: Query | int) -> set[int]:
    """Images a candidate panel must never show: every labelled target of the query
    (primary or not, any relevance or role) and every turn's reference image."""
    qid = query if isinstance(query, int) else query.pk
    banned = set(Target.objects.filter(query_id=qid).values_list("image_id", flat=True))
    banned.update(i for i in Turn.objects.filter(query_id=qid).values_list("reference_image_id", flat=True) if i)
    return banned


def gallery_ids(query: Query) -> list[int]:
    """The query's retrieval gallery by image id: :func:`retrieval.galleries.query_gallery`."""
    return query_gallery(query)


def candidate_panel(
    query: Query,
    rankings: list[list[int]],
    size: int,
    gallery: list[int] | None = None,
    exclude: set[int] | None = None,
) -> Candidates:
    """THE candidate panel of a query (the one function every page and the API use).

    ``size`` images: the reciprocal-rank fusion of ``rankings`` (the pool's top lists:
    :func:`pool_rankings`, each counting its :data:`POOL_WEIGHTS`), minus every labelled target
    and the reference; when the lists run short, padded
    from a deterministic shuffle of the query's gallery. Neither its content nor its size
    reads the audit's label or the targets' ranks. The multimodal lists among ``rankings``
    and, at half weight, those nearest the targets (:data:`ORDER_WEIGHTS`) order it, likely
    fits first. ``gallery``: the query's gallery ids in
    id order, and ``exclude``, :func:`panel_exclusions`, when the caller has them already.
    """
    banned = panel_exclusions(query) if exclude is None else exclude

    def padding():
        ids = gallery if gallery is not None else gallery_ids(query)
        yield from seeded_padding(ids, f"panel:{query.pk}", 2 * size + len(banned))

    order = [r for r in rankings if getattr(r, "field", "") in ORDER_WEIGHTS]
    return candidate_list(
        rankings,
        banned,
        size,
        padding(),
        order=order,
        order_weights=[ORDER_WEIGHTS[r.field] for r in order],
        weights=[POOL_WEIGHTS.get(getattr(r, "field", ""), 1.0) for r in rankings],
    )


def latest_session_ranks(query: Query | int) -> list[int | None]:
    """Target rank after each turn (multimodal, latest turn, first retriever) from the newest
    finished audit that scored this session; [] when none did."""
    qid = query if isinstance(query, int) else query.pk
    run = (
        AuditRun.objects.filter(status=AuditRun.Status.DONE, session_ranks__query_id=qid)
        .order_by("-finished_at", "-pk")
        .first()
    )
    if run is None or not run.retrievers:
        return []
    row = (
        AuditSessionRank.objects.filter(run=run, query_id=qid, retriever=run.retrievers[0], **SESSION_FILTER_BASIS)
        .values_list("ranks", flat=True)
        .first()
    )
    return list(row or [])
