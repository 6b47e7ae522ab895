"""The audit's per-query image panels and session ranks, read by the annotation app."""
from __future__ import annotations

from retrieval.models import Image, Query, Turn

from ..models import AuditRank, AuditRun, AuditSessionRank
from .base import SESSION_FILTER_BASIS, panel_k


def aggregate_panel(run: AuditRun, query: Query | int) -> list[Image]:
    """The aggregate multimodal panel: de-duplicated union of every retriever's top-10.

    Ordered by position (every retriever's first result, then every second, ...),
    retrievers in pool order. Images that no longer exist are left out.
    """
    qid = query if isinstance(query, int) else query.pk
    order = {name: n for n, name in enumerate(run.retrievers)}
    lists = sorted(
        AuditRank.objects.filter(run=run, query_id=qid).values_list("retriever", "top_mm"),
        key=lambda x: (order.get(x[0], len(order)), x[0]),
    )
    # the stored top lists include the reference (AUDIT_CANDIDATES_N long): leave it out
    hidden = set(Turn.objects.filter(query_id=qid, index=1).values_list("reference_image_id", flat=True))
    lists = [(name, [i for i in top if i not in hidden][:panel_k()]) for name, top in lists]
    ids: list[int] = []
    for pos in range(panel_k()):
        for _, top in lists:
            if pos < len(top) and top[pos] not in ids:
                ids.append(top[pos])
    images = Image.objects.in_bulk(ids)
    return [images[i] for i in ids if i in images]


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


def latest_panel(query: Query | int) -> list[Image]:
    """The aggregate multimodal panel of the newest finished audit that ranked ``query``."""
    qid = query if isinstance(query, int) else query.pk
    run = (
        AuditRun.objects.filter(status=AuditRun.Status.DONE, ranks__query_id=qid)
        .order_by("-finished_at", "-pk")
        .first()
    )
    return aggregate_panel(run, qid) if run is not None else []
