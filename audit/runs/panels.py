"""The candidate panel of a query (fused from the audit's top lists) and session ranks, read by
the annotation app."""
from __future__ import annotations

from retrieval.fusion import Candidates, candidate_list, seeded_order
from retrieval.models import GalleryEntry, Image, Query, Target, Turn

from ..models import AuditRank, AuditRun, AuditSessionRank
from .base import SESSION_FILTER_BASIS


def pool_rankings(run: AuditRun, query: Query | int) -> list[list[int]]:
    """Every retriever's multimodal top list (image ids, best first) for ``query`` in ``run``."""
    qid = query if isinstance(query, int) else query.pk
    return [list(top) for top in AuditRank.objects.filter(run=run, query_id=qid).order_by("retriever")
            .values_list("top_mm", flat=True)]


def latest_ranked_run(query: Query | int) -> AuditRun | None:
    """The newest finished audit that ranked ``query`` (multimodal top lists), or None."""
    qid = query if isinstance(query, int) else query.pk
    return (
        AuditRun.objects.filter(status=AuditRun.Status.DONE, ranks__query_id=qid)
        .order_by("-finished_at", "-pk")
        .first()
    )


def panel_exclusions(query: Query | int) -> set[int]:
    """Images a candidate panel must never show: every labelled target of the query
    (primary or not, any relevance or role) and every turn's reference image."""
    qid = query if isinstance(query, int) else query.pk
    banned = set(Target.objects.filter(query_id=qid).values_list("image_id", flat=True))
    banned.update(i for i in Turn.objects.filter(query_id=qid).values_list("reference_image_id", flat=True) if i)
    return banned


def gallery_ids(query: Query) -> list[int]:
    """The query's retrieval gallery: its split's gallery entries, else the dataset's readable images."""
    entries = GalleryEntry.objects.filter(dataset_id=query.dataset_id, split=query.split)
    if query.split and entries.exists():
        return list(entries.values_list("image_id", flat=True))
    return list(Image.objects.filter(dataset_id=query.dataset_id, missing=False).values_list("id", flat=True))


def candidate_panel(query: Query, rankings: list[list[int]], size: int) -> Candidates:
    """THE candidate panel of a query (the one function every page and the API use).

    ``size`` images: the reciprocal-rank fusion of ``rankings`` (the pool's multimodal top
    lists), minus every labelled target and the reference; when the lists run short, padded
    from a deterministic shuffle of the query's gallery. Neither its content nor its size
    reads the audit's label or the targets' ranks.
    """
    def padding():
        yield from seeded_order(gallery_ids(query), f"panel:{query.pk}")

    return candidate_list(rankings, panel_exclusions(query), size, padding())


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
    row = AuditSessionRank.objects.filter(
        run=run, query_id=qid, retriever=run.retrievers[0], **SESSION_FILTER_BASIS
    ).values_list("ranks", flat=True).first()
    return list(row or [])
