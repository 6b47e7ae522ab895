"""Candidate rankings for queries no audit ranked: one retriever run on demand.

A study built without an audit still shows a candidate panel. Its multimodal top list comes
from one retriever of any kind (through :mod:`retrieval.retrievers`) (the dataset's newest audited spec, else
``settings.CANDIDATE_RETRIEVER``), encoded through the on-disk embedding cache, so a second
call only encodes what is new. The callers store the resulting panels, so each query is
ranked once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from django.conf import settings

from retrieval.galleries import query_gallery, query_gallery_keys
from retrieval.models import Image, Query, Turn

from ..models import AuditRun
from .execution import embedding_cache, image_files, image_path, retriever_for


def candidate_retriever(dataset_id: int) -> str:
    """The spec that ranks a dataset's queries on demand: the first in-process retriever of the
    dataset's newest audit that costs nothing to call, else ``CANDIDATE_RETRIEVER`` (default:
    the tiny open_clip model). A hosted embedder (``api:``) is never called for a panel: an
    annotator opening an item must not spend a study's API budget."""
    for retrievers, external in (
        AuditRun.objects.filter(dataset_id=dataset_id)
        .order_by("-created_at", "-pk")
        .values_list("retrievers", "external_retrievers")[:5]
    ):
        inside = [r for r in retrievers or [] if r not in set(external or []) and _free_to_call(r)]
        if inside:
            return inside[0]
    return str(settings.CANDIDATE_RETRIEVER)


def _free_to_call(spec: str) -> bool:
    """Whether ``spec``'s kind says its calls cost nothing (a local model; see
    :meth:`retrieval.retrievers.base.RetrieverKind.estimate_cost`)."""
    from retrieval.retrievers.base import parse_spec

    try:
        kind, parsed = parse_spec(spec)
    except ValueError:
        return False
    return kind.estimate_cost(parsed, 1) is None


def _encode_gallery(retriever, cache, image_ids: list[int], root: str):
    from .encoding import encode_images

    files = image_files(image_ids)
    ids = [i for i in image_ids if i in files and files[i][0]]
    rel = {files[i][0]: files[i][1] for i in ids}
    enc = encode_images(
        retriever,
        cache,
        [files[i][0] for i in ids],
        lambda key: image_path(root, rel[key]),
        max_pixels=int(settings.IMAGE_MAX_PIXELS),
    )
    return enc.matrix, [i for i, ok in zip(ids, enc.ok) if ok]


def _query_inputs(
    group: Sequence[Query], blank_text: bool = False
) -> tuple[list[Query], list[str], dict[str, str], list[str], list[int]]:
    """The queries of ``group`` that can be encoded, with their reference keys (sha256),
    key -> relative path, texts and reference image ids. A blank text is ranked as
    :func:`retrieval.captions.ranking_text` says (``blank_text``: with the empty text)."""
    from retrieval.captions import ranking_text

    from .planning import joined_turn_text

    turns = {t.query_id: t for t in Turn.objects.filter(query__in=group, index=1)}
    refs = dict(
        Image.objects.filter(pk__in=[t.reference_image_id for t in turns.values() if t.reference_image_id])
        .exclude(sha256="")
        .values_list("pk", "sha256")
    )
    rel = dict(Image.objects.filter(pk__in=refs).values_list("sha256", "path"))
    texts = {q.pk: ranking_text(joined_turn_text(turns[q.pk].texts), blank_text) for q in group if q.pk in turns}
    usable = [
        q for q in group if q.pk in turns and refs.get(turns[q.pk].reference_image_id) and texts[q.pk] is not None
    ]
    return (
        usable,
        [refs[turns[q.pk].reference_image_id] for q in usable],
        rel,
        [texts[q.pk] for q in usable],
        [turns[q.pk].reference_image_id for q in usable],
    )


def _rank_group(
    group: Sequence[Query],
    depth: int,
    spec: str | None,
    members: dict[int, list[int]] | None = None,
    blank_text: bool = False,
) -> dict[int, tuple[list[int], list[int]]]:
    """query id -> (top ``depth`` gallery ids, ``members[q]`` ordered by score) for a group of
    queries that search one gallery (``blank_text``: :func:`_query_inputs`)."""
    import torch

    from retrieval.ranking import rank_queries

    from .encoding import multimodal_queries

    dataset = group[0].dataset
    retriever = retriever_for(spec or candidate_retriever(dataset.pk))
    cache = embedding_cache(retriever)
    gallery, g_ids = _encode_gallery(retriever, cache, query_gallery(group[0]), dataset.images_root)
    usable, keys, rel, texts, ref_ids = _query_inputs(group, blank_text)
    if not g_ids or not usable:
        return {}
    ok, composed = multimodal_queries(
        retriever, cache, keys, texts, lambda key: image_path(dataset.images_root, rel[key])
    )
    keep = [n for n, flag in enumerate(ok) if flag]
    if not keep:
        return {}
    composed = composed.to(gallery.device)
    row_of = {image_id: n for n, image_id in enumerate(g_ids)}
    ranked = rank_queries(
        composed, gallery, [[] for _ in keep], [row_of.get(ref_ids[n]) for n in keep], top_k=min(int(depth), len(g_ids))
    )
    out = {}
    for m, (n, row) in enumerate(zip(keep, ranked.topk.tolist())):
        qid = usable[n].pk
        rows = [row_of[i] for i in (members or {}).get(qid, []) if i in row_of]
        scores = (
            (composed[m : m + 1] @ gallery[torch.as_tensor(rows, dtype=torch.long)].to(composed.dtype).T)[0]
            if rows
            else composed.new_zeros(0)
        )
        order = sorted(range(len(rows)), key=lambda j: -float(scores[j]))  # stable: members' order among ties
        out[qid] = ([g_ids[int(j)] for j in row if int(j) >= 0], [g_ids[rows[j]] for j in order])
    return out


def _by_gallery(queries: Sequence[Query]) -> list[list[Query]]:
    """The queries grouped by the gallery they search (:mod:`retrieval.galleries`)."""
    keys = query_gallery_keys([q.pk for q in queries])
    by_gallery: dict[tuple[int, str | None], list[Query]] = defaultdict(list)
    for q in queries:
        by_gallery[(q.dataset_id, keys.get(q.pk))].append(q)
    return list(by_gallery.values())


def retrieve_top_lists(queries: Sequence[Query], depth: int, spec: str | None = None) -> dict[int, list[int]]:
    """query id -> the retriever's multimodal top ``depth`` gallery image ids (best first,
    the reference left out). Queries whose reference or text is missing get no entry."""
    out: dict[int, list[int]] = {}
    for group in _by_gallery(queries):
        out.update({q: top for q, (top, _) in _rank_group(group, depth, spec).items()})
    return out


def rank_with_scores(
    queries: Sequence[Query], depth: int, spec: str, members: dict[int, list[int]], blank_text: bool = False
) -> dict[int, tuple[list[int], list[int]]]:
    """query id -> (the multimodal top ``depth`` gallery ids, best first, the reference
    ranked like any image; ``members[q]`` ordered by the same scores, best first). Queries
    whose reference is missing get no entry, nor those whose text is blank unless
    ``blank_text`` (:func:`retrieval.captions.ranking_text`)."""
    out: dict[int, tuple[list[int], list[int]]] = {}
    for group in _by_gallery(queries):
        out.update(_rank_group(group, depth, spec, members, blank_text))
    return out


def rank_turns(
    query: Query,
    spec: str,
    turns: Sequence[tuple[int, str]],
    positives: Sequence[int],
    strategy: str,
    alpha: float,
    depth: int,
) -> tuple[list[int], int | None]:
    """One interactive round: the history ``turns`` (reference image id, text) of a session
    over ``query``'s gallery, each turn composed as the audit composes it, aggregated with
    :func:`retrieval.sessions.aggregate_history` (``strategy``) and ranked with the latest
    turn's reference left out. Returns (the top ``depth`` gallery image ids, best first; the
    best rank of ``positives``, ``None`` when none is in the gallery). The gallery comes
    from the embedding cache (memory-mapped, memoised in the process); only new texts and
    new reference images are encoded."""
    import torch

    from retrieval.ranking import rank_queries
    from retrieval.sessions import aggregate_history

    from .encoding import gallery_matrix, multimodal_queries

    dataset = query.dataset
    retriever = retriever_for(spec)
    cache = embedding_cache(retriever)
    g_ids_all = query_gallery(query)
    files = image_files([*g_ids_all, *(ref for ref, _ in turns)])
    g_ids = [i for i in g_ids_all if i in files and files[i][0]]
    rel = {files[i][0]: files[i][1] for i in files}
    locate = lambda key: image_path(dataset.images_root, rel[key])  # noqa: E731
    gallery, rows, _ = gallery_matrix(
        retriever,
        cache,
        ("interactive", dataset.pk),
        [files[i][0] for i in g_ids],
        locate,
        max_pixels=int(settings.IMAGE_MAX_PIXELS),
    )
    g_ids = [g_ids[r] for r in rows]
    refs = [files.get(ref, ("", ""))[0] for ref, _ in turns]
    if not all(refs):
        raise ValueError("a reference image of the session has no readable file")
    ok, composed_t = multimodal_queries(
        retriever, cache, refs, [text for _, text in turns], locate, max_pixels=int(settings.IMAGE_MAX_PIXELS)
    )
    if not all(ok):
        raise ValueError("a reference image of the session could not be read")
    composed = composed_t.float().cpu().numpy()
    history = aggregate_history(composed, strategy, alpha)[-1:]
    row_of = {image_id: n for n, image_id in enumerate(g_ids)}
    ranked = rank_queries(
        torch.from_numpy(history).to(gallery.device),
        gallery,
        [[row_of[p] for p in positives if p in row_of]],
        [row_of.get(turns[-1][0])],
        top_k=min(int(depth), len(g_ids)),
    )
    top = [g_ids[int(j)] for j in ranked.topk[0].tolist() if int(j) >= 0]
    return top, ranked.best_rank[0]
