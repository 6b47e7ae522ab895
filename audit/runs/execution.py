"""Running one chunk: encode the gallery, rank queries and sessions, write rank rows."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from retrieval.evaltargets import QueryTargets, evaluation_targets
from retrieval.galleries import gallery_image_ids, query_gallery_keys
from retrieval.imagefiles import PathEscapeError, UnderRoot, resolve_under
from retrieval.jobs import leases as jobs
from retrieval.jobs.leases import error_reference
from retrieval.models import Image

from ..models import AuditChunk, AuditRank, AuditRun, AuditSessionRank
from ..rankfiles import RANK_FIELDS
from .base import (
    SESSION_CHUNK_KINDS,
    LeaseLost,
    candidates_n,
    default_owner,
    logger,
    max_attempts,
)
from .bulkwrite import insert_rows, json_int_list
from .chunk_leases import Heartbeat, claim_chunk
from .planning import (
    fail_run,
    joined_turn_text,
    planned_reads,
    run_modality_rule,
    session_eligibility,
    session_turns,
    single_turn_inputs,
)
from .progress_lines import encoding_stage


def retriever_for(spec: str, run: AuditRun | None = None) -> Any:
    """The built (or lazily built) retriever of ``spec`` as this worker runs it, under ``run``'s
    modality rule (:func:`audit.runs.planning.run_modality_rule`; without a run, the setting's)."""
    from .encoding import get_retriever

    return get_retriever(
        spec,
        device=settings.AUDIT_DEVICE or None,
        batch_size=int(settings.AUDIT_BATCH_SIZE),
        precision=settings.AUDIT_PRECISION,
        modality_rule=run_modality_rule(run) if run is not None else settings.AUDIT_MODALITY_RULE,
    )


_caches: dict[tuple[str, str, int], Any] = {}


def embedding_cache(retriever: Any) -> Any:
    """The embedding cache of the retriever, opened once per process (opening checks and may
    write its metadata, in a write transaction)."""
    from retrieval.embcache import EmbeddingCache

    key = (str(settings.EMBEDDING_CACHE_DIR), retriever.spec, int(retriever.dim))
    if key not in _caches or not _caches[key].db_path.exists():
        if len(_caches) >= 8:
            _caches.pop(next(iter(_caches)))
        _caches[key] = EmbeddingCache(*key)
    return _caches[key]


def image_path(root: str, rel: str) -> Path:
    try:
        return resolve_under(Path(root), rel) if root else Path(rel)
    except PathEscapeError:
        return Path("/nonexistent-escaped-path") / rel


def image_files(image_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
    """Image id -> (sha256, path relative to the images root).

    One plain ``SELECT ... WHERE id IN (...)`` per 5,000 ids: the ORM's ``pk__in`` prepares
    every id through the field (about 3 us each: 8 ms of a warm audit's 4 reads of a
    681-image gallery)."""
    out: dict[int, tuple[str, str]] = {}
    ids = [int(i) for i in image_ids]
    quote = connection.ops.quote_name
    meta = Image._meta
    cols = ", ".join(quote(meta.get_field(name).column) for name in ("id", "sha256", "path"))
    head = f"SELECT {cols} FROM {quote(meta.db_table)} WHERE {quote(meta.pk.column)} IN "
    with connection.cursor() as cursor:
        for start in range(0, len(ids), 5000):
            part = ids[start : start + 5000]
            cursor.execute(head + "(" + ", ".join(["%s"] * len(part)) + ")", part)
            out.update((pk, (sha, path)) for pk, sha, path in cursor.fetchall())
    return out


def _locator(run: AuditRun, key_to_rel: dict[str, str]) -> Callable[[str], Path]:
    """key -> file, resolved (and checked against the images root) only when needed, each
    folder once (:class:`retrieval.imagefiles.UnderRoot`)."""
    root = run.dataset.images_root
    if not root:
        return lambda key: Path(key_to_rel[key])
    under = UnderRoot(Path(root))

    def locate(key: str) -> Path:
        try:
            return under(key_to_rel[key])
        except PathEscapeError:
            return Path("/nonexistent-escaped-path") / key_to_rel[key]

    return locate


_gallery_memo: dict[tuple[int, str, str], tuple[list[int], list[str], dict[str, str]]] = {}


def _gallery_of(run: AuditRun, spec: str) -> tuple[list[int], list[str], dict[str, str]]:
    """The gallery of one retriever: its gallery chunks' images minus unreadable ones.

    Read once per process and run (done gallery chunks never change), with the galleries of
    the run's other retrievers whose gallery chunks are all done (one read of the chunks and
    of the images' files for all of them).
    """
    created = run.created_at.isoformat() if run.created_at else ""
    key = (run.pk, created, spec)
    if key not in _gallery_memo:
        galleries = _read_galleries(run, spec)
        for other in sorted(galleries, key=lambda s: s == spec):  # the one asked for last: kept longest
            _gallery_memo.pop((run.pk, created, other), None)
            _gallery_memo[(run.pk, created, other)] = galleries[other]
        while len(_gallery_memo) > GALLERY_MEMO:
            _gallery_memo.pop(next(iter(_gallery_memo)))
    return _gallery_memo[key]


#: Galleries (ids, keys, files) kept per process.
GALLERY_MEMO = 4


def _read_galleries(run: AuditRun, spec: str) -> dict[str, tuple[list[int], list[str], dict[str, str]]]:
    """:func:`_gallery_of` ``spec``, and the other retrievers' galleries that are fully encoded."""
    chunks: dict[str, list[tuple[list[int], Any, str]]] = defaultdict(list)
    for retriever, items, stats, status in (
        AuditChunk.objects.filter(run=run, kind=AuditChunk.Kind.GALLERY)
        .order_by("index")
        .values_list("retriever", "items", "stats", "status")
    ):
        chunks[retriever].append((items, stats, status))
    kept: dict[str, list[int]] = {}
    for retriever, parts in chunks.items():
        if retriever != spec and any(status != AuditChunk.Status.DONE for _, _, status in parts):
            continue
        unreadable = {int(i) for _, stats, _ in parts for i in (stats or {}).get("unreadable", {})}
        kept[retriever] = [i for items, _, _ in parts for i in items if i not in unreadable]
    kept.setdefault(spec, [])
    files = image_files(list(dict.fromkeys(i for ids in kept.values() for i in ids)))
    out = {}
    for retriever, ids in kept.items():
        ids = [i for i in ids if i in files and files[i][0]]
        out[retriever] = (ids, [files[i][0] for i in ids], {files[i][0]: files[i][1] for i in ids})
    return out


def _loader_workers() -> int:
    from config.worker_tuning import default_loader_workers

    return default_loader_workers()


def _encode_gallery_chunk(run: AuditRun, chunk: AuditChunk, beat: Heartbeat | None) -> dict[str, Any]:
    return _encode_gallery_group(run, [chunk], [beat])[0]


def _encode_gallery_group(
    run: AuditRun, chunks: list[AuditChunk], beats: list[Heartbeat | None]
) -> list[dict[str, Any]]:
    """The stats of gallery chunks over the same images for different retrievers, encoded
    together: each file decoded once (:func:`audit.runs.encoding.encode_images_shared`)."""
    from .encoding import encode_images_shared

    started = time.perf_counter()
    retrievers = [retriever_for(c.retriever, run) for c in chunks]
    build_s = (time.perf_counter() - started) / len(chunks)
    caches = [embedding_cache(r) for r in retrievers]
    items = chunks[0].items
    files = image_files(items)
    ids = [i for i in items if i in files]

    def check() -> None:
        for beat in beats:
            if beat:
                beat.check()

    encs = encode_images_shared(
        retrievers,
        caches,
        [files[i][0] for i in ids],
        _locator(run, {files[i][0]: files[i][1] for i in ids}),
        max_pixels=int(settings.IMAGE_MAX_PIXELS),
        check=check,
        workers=_loader_workers(),
        progress=GalleryProgress(run.pk, chunks=len(chunks)),
        vectors=False,
    )
    return [
        {
            "seconds": {"build": build_s, "encode": enc.seconds},
            "cache": {"gallery_hits": enc.hits, "gallery_encoded": enc.encoded},
            "unreadable": {str(i): enc.unreadable[files[i][0]] for i in ids if files[i][0] in enc.unreadable},
            "loader_workers": _loader_workers(),
            "model_built": bool(getattr(retriever, "is_built", True)),
            **({"run_with": [c.pk for c in chunks if c.pk != chunk.pk]} if len(chunks) > 1 else {}),
        }
        for chunk, retriever, enc in zip(chunks, retrievers, encs)
    ]


def retrievers_together() -> bool:
    """Whether a worker runs the chunks of every retriever over the same gallery images or the
    same queries together (``AUDIT_RETRIEVERS_TOGETHER``, default on): each gallery file is
    decoded once for all of them, each query chunk's queries, turns and targets read once."""
    return bool(settings.AUDIT_RETRIEVERS_TOGETHER)


def _siblings(run: AuditRun, chunk: AuditChunk, owner: str) -> list[AuditChunk]:
    """The other retrievers' gallery or query chunks over the same items as ``chunk``, claimed
    now by ``owner`` to run with it (:func:`retrievers_together`); a query chunk only once its
    retriever's gallery is encoded. Those another worker holds or finished are left alone."""
    kinds = (AuditChunk.Kind.GALLERY, AuditChunk.Kind.QUERIES)
    if chunk.kind not in kinds or not retrievers_together() or len(run.retrievers) < 2:
        return []
    out = []
    for sibling in (
        AuditChunk.objects.filter(run_id=run.pk, kind=chunk.kind, index=chunk.index)
        .exclude(pk=chunk.pk)
        .exclude(status=AuditChunk.Status.DONE)
        .order_by("pk")
    ):
        if sibling.items != chunk.items:
            continue
        if sibling.kind == AuditChunk.Kind.QUERIES and not gallery_ready(run.pk, sibling.retriever):
            continue
        if claim_chunk(sibling.pk, owner):
            sibling.run = run
            out.append(sibling)
    return out


class GalleryProgress:
    """``progress(done, total)`` of one gallery chunk's encoding: writes the run's stage with the
    run's gallery images done, images/s of this chunk and an ETA, at most every ``every_s``."""

    def __init__(self, run_id: int, every_s: float = 2.0, chunks: int = 1) -> None:
        self.run_id, self.every_s, self.chunks = run_id, every_s, chunks
        self.started = self.last = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - self.last < self.every_s or done >= total:
            return
        self.last = now
        before, all_images = _gallery_counts(self.run_id)
        done *= self.chunks  # chunks encoded together: each file counts for each of them
        AuditRun.objects.filter(pk=self.run_id, status=AuditRun.Status.RUNNING).update(
            stage=encoding_stage(before + done, all_images, done / (now - self.started))
        )


def _chunk_counts(run_id: int) -> dict[tuple[str, str], int]:
    """Items per (chunk kind, status) of the run, in one query."""
    rows = AuditChunk.objects.filter(run_id=run_id).values("kind", "status").annotate(n=Sum("n_items")).order_by()
    return {(r["kind"], r["status"]): r["n"] or 0 for r in rows}


def _gallery_counts(run_id: int, counts: dict[tuple[str, str], int] | None = None) -> tuple[int, int]:
    """(gallery images in done chunks, gallery images of the run), over every retriever."""
    counts = _chunk_counts(run_id) if counts is None else counts
    gallery = {status: n for (kind, status), n in counts.items() if kind == AuditChunk.Kind.GALLERY}
    return gallery.get(AuditChunk.Status.DONE, 0), sum(gallery.values())


def _chunk_gallery(run: AuditRun, chunk: AuditChunk, beat: Heartbeat | None) -> tuple[Any, ...]:
    """The retriever, its cache and the gallery matrix a ranking chunk works against.

    Returns ``(retriever, cache, max_pixels, gallery, gallery image ids, row of each image id,
    gallery encode stats, build seconds, gallery seconds)``."""
    from .encoding import gallery_matrix

    t0 = time.perf_counter()
    retriever = retriever_for(chunk.retriever, run)
    cache = embedding_cache(retriever)
    build_s = time.perf_counter() - t0
    max_pixels = int(settings.IMAGE_MAX_PIXELS)

    t0 = time.perf_counter()
    g_ids, g_keys, g_rel = _gallery_of(run, chunk.retriever)
    gallery, rows, g_enc = gallery_matrix(
        retriever, cache, (run.pk, chunk.retriever), g_keys, _locator(run, g_rel), max_pixels
    )
    g_ids = [g_ids[r] for r in rows]
    index_of = {image_id: n for n, image_id in enumerate(g_ids)}
    gallery_s = time.perf_counter() - t0
    if beat:
        beat.check()
    return retriever, cache, max_pixels, gallery, g_ids, index_of, g_enc, build_s, gallery_s


def _expand(ids: Sequence[int], index_of: dict[int, int], ranks: Sequence[int | None]) -> list[int | None]:
    """Ranks of ``ids`` from the ranks of those in the gallery (in order); ``None`` for the others."""
    if len(ranks) == len(ids):  # every one in the gallery (most queries): the ranks as they are
        return list(ranks)
    it = iter(ranks)
    return [next(it) if i in index_of else None for i in ids]


def _rows(ids: Sequence[int], index_of: dict[int, int]) -> list[int]:
    return [index_of[i] for i in ids if i in index_of]


QueryRead = tuple[list[int], dict[int, str], dict[int, dict[str, Any]], dict[int, QueryTargets]]


def _read_queries(run: AuditRun, items: Sequence[int]) -> QueryRead:
    """A query chunk's eligible queries, the skipped ones with a reason, their first turns and
    the eligible ones' targets: one read of the queries, turns and targets (files can vanish
    between plan and run, so eligibility is checked again), shared by the retrievers' chunks
    over the same queries. An inline run's chunks, run just after the plan in the process that
    made it, take the plan's read instead (:func:`audit.runs.planning.planned_reads`)."""
    read = planned_reads(run, items) or single_turn_inputs(run, items, run.dataset.format)
    eligible, skipped, turns, facts = read
    return eligible, skipped, turns, evaluation_targets(run.dataset, eligible, facts)


def _query_inputs(
    run: AuditRun, chunk: AuditChunk, gallery_ctx: tuple, beat: Heartbeat | None, read: QueryRead | None = None
) -> dict[str, Any]:
    """The chunk's eligible queries, their encodings and targets (``read``: :func:`_read_queries`
    of the chunk's items, when it was made for a group of chunks)."""
    from .encoding import encode_queries

    retriever, cache, max_pixels = gallery_ctx[:3]
    eligible, skipped, turns, targets = read or _read_queries(run, chunk.items)
    skipped_out: dict[str, str] = {str(q): r for q, r in skipped.items()}
    keys = [turns[q]["reference_image__sha256"] for q in eligible]
    locate = _locator(run, {turns[q]["reference_image__sha256"]: turns[q]["reference_image__path"] for q in eligible})
    enc = encode_queries(
        retriever,
        cache,
        keys,
        [joined_turn_text(turns[q]["texts"], run.caption_join) for q in eligible],
        locate,
        max_pixels=max_pixels,
        check=beat.check if beat else None,
        workers=_loader_workers(),
    )
    img = enc.img
    kept = [q for q, ok in zip(eligible, img.ok) if ok]
    skipped_out.update({str(q): "reference_unreadable" for q, ok in zip(eligible, img.ok) if not ok})
    if beat:
        beat.check()
    return {
        "kept": kept,
        "turns": turns,
        "img": img,
        "txt": enc.txt,
        "skipped": skipped_out,
        "targets": {q: targets[q] for q in kept if q in targets},
        **({"mm": enc.mm} if enc.mm else {}),
    }


def _rank_row(
    run: AuditRun, spec: str, q: int, n: int, ranks: Any, t: QueryTargets, index_of: dict[int, int], id_texts: list[str]
) -> dict[str, Any]:
    """One :class:`AuditRank` row (its field values, for :func:`insert_rows`): best ranks, every
    positive's rank, graded-only targets, subset ranks, top lists (as JSON text of gallery
    image ids: ``id_texts[row]`` is the id of gallery row ``row``, written out once)."""
    every = {f: _expand(t.positives, index_of, ranks.all[f][n]) for f in RANK_FIELDS}
    return {
        "run_id": run.pk,
        "query_id": q,
        "retriever": spec,
        "mm": ranks.mm[n],
        "text": ranks.text[n],
        "image": ranks.image[n],
        "mm_all": every["mm"],
        "text_all": every["text"],
        "image_all": every["image"],
        "graded": {"gains": t.gains, **{f: _expand(t.extras, index_of, ranks.extra[f][n]) for f in RANK_FIELDS}}
        if t.extras
        else {},
        "subset": {f: ranks.group[f][n] for f in RANK_FIELDS} if t.group else {},
        **{f"top_{m}": json_int_list(id_texts, getattr(ranks, f"top_{m}")[n]) for m in ("mm", "text", "image", "near")},
        "reference_ahead": {f: _expand(t.positives, index_of, ranks.ahead[f][n]) for f in RANK_FIELDS},
    }


def _searched_groups(run: AuditRun, query_ids: Sequence[int], ctx: tuple) -> list[tuple[list[int], tuple]]:
    """The queries grouped by the gallery they search (:mod:`retrieval.galleries`), each with
    ``ctx`` (:func:`_chunk_gallery`) cut to that gallery's rows: a FashionIQ dress query
    ranks against dress's gallery only. One group over the whole gallery when the run's
    queries all search one gallery (the plan's ``galleries``)."""
    galleries = ((run.summary or {}).get("plan") or {}).get("gallery", {}).get("galleries") or {}
    if len(galleries) <= 1 or not query_ids:
        return [(list(query_ids), ctx)]
    keys = query_gallery_keys(query_ids)
    by_key: dict[str | None, list[int]] = defaultdict(list)
    for q in query_ids:
        by_key[keys.get(q)].append(q)
    return [(members, _cut_gallery(run, key, ctx)) for key, members in by_key.items()]


_searched_memo: dict[tuple[int, str, str | None], frozenset[int]] = {}


def _cut_gallery(run: AuditRun, key: str | None, ctx: tuple) -> tuple:
    """``ctx`` with its gallery matrix, ids and row index cut to the images of gallery ``key``."""
    import torch

    memo_key = (run.pk, run.created_at.isoformat() if run.created_at else "", key)
    if memo_key not in _searched_memo:
        while len(_searched_memo) >= 16:
            _searched_memo.pop(next(iter(_searched_memo)))
        _searched_memo[memo_key] = frozenset(gallery_image_ids(run.dataset_id, key))
    wanted = _searched_memo[memo_key]
    g_ids = ctx[4]
    rows = [n for n, image_id in enumerate(g_ids) if image_id in wanted]
    if len(rows) == len(g_ids):
        return ctx
    sub_ids = [g_ids[n] for n in rows]
    gallery = ctx[3][torch.as_tensor(rows, dtype=torch.long)]
    return (*ctx[:3], gallery, sub_ids, {image_id: n for n, image_id in enumerate(sub_ids)}, *ctx[6:])


def _rank_searched(
    run: AuditRun, spec: str, ctx: tuple, inp: dict[str, Any], rows_of: list[int]
) -> tuple[list[dict[str, Any]], int, float]:
    """Rank rows of the queries at positions ``rows_of`` of ``inp['kept']`` against the
    gallery of ``ctx``; the count of those without a positive in it; seconds."""
    from .encoding import rank_three

    retriever, gallery, g_ids, index_of = ctx[0], ctx[3], ctx[4], ctx[5]
    kept = [inp["kept"][n] for n in rows_of]
    empty = QueryTargets()
    tq = [inp["targets"].get(q, empty) for q in kept]
    positives = [_rows(t.positives, index_of) for t in tq]
    references = [index_of.get(inp["turns"][q]["reference_image_id"]) for q in kept]
    exclude = references if run.exclude_reference else [None] * len(kept)
    no_positive = sum(1 for pos, ex in zip(positives, exclude) if not [p for p in pos if p != ex])
    groups = [_rows(t.group, index_of) for t in tq] if any(t.group for t in tq) else None
    at = torch_rows(rows_of)
    ranks = rank_three(
        retriever,
        inp["img"].matrix[at],
        inp["txt"].matrix[at],
        gallery,
        positives,
        exclude,
        panel_k=candidates_n(),
        extra=[_rows(t.extras, index_of) for t in tq],
        groups=groups,
        references=references,
        mm=inp["mm"].matrix[at] if "mm" in inp else None,
    )
    id_texts = [str(image_id) for image_id in g_ids]
    rank_rows = [_rank_row(run, spec, q, n, ranks, tq[n], index_of, id_texts) for n, q in enumerate(kept)]
    return rank_rows, no_positive, ranks.seconds


def torch_rows(rows: Sequence[int]) -> Any:
    import torch

    return torch.as_tensor(list(rows), dtype=torch.long)


def _rank_query_chunk(
    run: AuditRun, chunk: AuditChunk, beat: Heartbeat | None, read: QueryRead | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    ctx = _chunk_gallery(run, chunk, beat)
    g_ids, g_enc, build_s, gallery_s = ctx[4], ctx[6], ctx[7], ctx[8]
    inp = _query_inputs(run, chunk, ctx, beat, read)
    kept, img, txt = inp["kept"], inp["img"], inp["txt"]
    position = {q: n for n, q in enumerate(kept)}
    rank_rows: list[dict[str, Any]] = []
    no_positive, rank_s = 0, 0.0
    for members, sub in _searched_groups(run, kept, ctx):
        rows, missing, seconds = _rank_searched(run, chunk.retriever, sub, inp, [position[q] for q in members])
        rank_rows.extend(rows)
        no_positive += missing
        rank_s += seconds
    stats = {
        "seconds": {
            "build": build_s,
            "gallery": gallery_s,
            "encode_images": img.seconds,
            "encode_texts": txt.seconds,
            "rank": rank_s,
        },
        "cache": {
            "query_image_hits": img.hits,
            "query_image_encoded": img.encoded,
            "text_hits": txt.hits,
            "text_encoded": txt.encoded,
            **({"query_mm_hits": inp["mm"].hits, "query_mm_encoded": inp["mm"].encoded} if "mm" in inp else {}),
            # the gallery matrix read back for ranking (normally all cache hits)
            "gallery_read_hits": g_enc.hits if g_enc else 0,
            "gallery_read_encoded": g_enc.encoded if g_enc else 0,
            "gallery_memo": g_enc is None,
        },
        "skipped": inp["skipped"],
        "no_positive_in_gallery": no_positive,
        "ranked": len(kept),
        "gallery_size": len(g_ids),
    }
    return stats, rank_rows


def _session_inputs(run: AuditRun, chunk: AuditChunk, ctx: tuple, beat: Heartbeat | None) -> dict[str, Any]:
    """Eligible sessions, one image encoding per distinct reference file, one text encoding per
    distinct text (a retriever off the late path: see :func:`_early_turns`)."""
    from retrieval.retrievers.pipeline import late_path

    from .encoding import encode_texts

    retriever, cache, max_pixels = ctx[:3]
    eligible, skipped = session_eligibility(run, chunk.items, run.dataset.format)
    skipped_out: dict[str, str] = {str(q): r for q, r in skipped.items()}
    turns = session_turns(eligible)
    key_rel = {t["reference_image__sha256"]: t["reference_image__path"] for q in eligible for t in turns[q]}
    keys = list(key_rel)
    locate = _locator(run, key_rel)
    late = late_path(retriever)
    img = _session_references(retriever, cache, keys, locate, max_pixels, beat)
    image_row = {k: n for n, k in enumerate(k for k, ok in zip(keys, img.ok) if ok)}
    kept = [q for q in eligible if all(t["reference_image__sha256"] in image_row for t in turns[q])]
    skipped_out.update({str(q): "reference_unreadable" for q in eligible if q not in set(kept)})
    texts = {q: [joined_turn_text(t["texts"], run.caption_join) for t in turns[q]] for q in kept}
    early: dict[str, Any] | None = None
    if late:
        unique_texts = list(dict.fromkeys(x for q in kept for x in texts[q]))
        txt, text_row = encode_texts(retriever, cache, unique_texts), {x: n for n, x in enumerate(unique_texts)}
    else:
        early = _early_turns(retriever, cache, kept, turns, texts, locate, max_pixels)
        txt, text_row = early["txt"], early["text_row"]
    if beat:
        beat.check()
    return {
        "kept": kept,
        "turns": turns,
        "texts": texts,
        "img": img,
        "txt": txt,
        "image_row": image_row,
        "text_row": text_row,
        "skipped": skipped_out,
        "targets": evaluation_targets(run.dataset, kept),
        **({"early": early} if early is not None else {}),
    }


def _session_references(
    retriever: Any, cache: Any, keys: list[str], locate: Callable, max_pixels: int, beat: Heartbeat | None
) -> Any:
    """The sessions' reference files encoded once each: image embeddings on the late path, else
    each reference's image-only query."""
    from retrieval.retrievers.pipeline import late_path, modality_pairs

    from .encoding import encode_images, encode_query_pairs

    if late_path(retriever):
        return encode_images(
            retriever,
            cache,
            keys,
            locate,
            max_pixels=max_pixels,
            check=beat.check if beat else None,
            workers=_loader_workers(),
        )
    rule = getattr(retriever, "modality_rule", "family")
    return encode_query_pairs(
        retriever, cache, [modality_pairs(rule, k, "")["image"] for k in keys], locate, max_pixels
    )


def _early_turns(
    retriever: Any, cache: Any, kept: list[int], turns: dict, texts: dict, locate: Callable, max_pixels: int
) -> dict[str, Any]:
    """The turns' queries of a retriever that does not compose them from one image and one text
    encode (early fusion, or CIRCUS's modality rule): per turn row (the sessions one after the
    other) its multimodal (``mm``) and text-only (``txt``) query; ``text_row``: a text's first
    turn row; ``turn_row[(q, n)]``: turn ``n`` of session ``q``'s row. (The image-only queries,
    one per reference file, are the session's ``img``; a combined or rolled-back turn's
    effective reference is aggregated from them, its multimodal query is the turn's own pass.)"""
    from retrieval.retrievers.pipeline import modality_pairs

    from .encoding import encode_query_pairs

    rule = getattr(retriever, "modality_rule", "family")
    rows = [(q, n) for q in kept for n in range(len(turns[q]))]
    pairs = [modality_pairs(rule, turns[q][n]["reference_image__sha256"], texts[q][n]) for q, n in rows]
    mm = encode_query_pairs(retriever, cache, [p["mm"] for p in pairs], locate, max_pixels)
    txt = encode_query_pairs(retriever, cache, [p["text"] for p in pairs], locate, max_pixels)
    text_row: dict[str, int] = {}
    for row, (q, n) in enumerate(rows):
        text_row.setdefault(texts[q][n], row)
    return {"mm": mm, "txt": txt, "text_row": text_row, "turn_row": {qn: row for row, qn in enumerate(rows)}}


def _rank_sessions_of(
    run: AuditRun, spec: str, ctx: tuple, inp: dict[str, Any]
) -> tuple[list[AuditSessionRank], int, float]:
    """Session rank rows (every strategy x modality), sessions without a positive in the
    gallery, seconds; each session against the gallery it searches (:func:`_searched_groups`)."""
    rows: list[AuditSessionRank] = []
    no_positive, seconds = 0, 0.0
    for members, sub in _searched_groups(run, inp["kept"], ctx):
        part, missing, s = _rank_sessions_in(run, spec, sub, inp, members)
        rows.extend(part)
        no_positive += missing
        seconds += s
    return rows, no_positive, seconds


def _rank_sessions_in(
    run: AuditRun, spec: str, ctx: tuple, inp: dict[str, Any], kept: list[int]
) -> tuple[list[AuditSessionRank], int, float]:
    """:func:`_rank_sessions_of` for the sessions ``kept`` against the gallery of ``ctx``.

    Each turn's image is its *effective reference* (:func:`retrieval.sessions.effective_references`:
    a rollback turn's is the earlier turn's image, a combination's the normalised mean of its
    turns' images); the gallery row left out is still the turn's own reference (the image on
    screen). The session consistency checks are computed here too (:func:`_consistency_of`)."""
    from retrieval.sessions import DEFAULT_ALPHA

    from .encoding import rank_sessions

    retriever, gallery, index_of = ctx[0], ctx[3], ctx[5]
    turns, texts = inp["turns"], inp["texts"]
    if not kept:
        return [], 0, 0.0
    image_emb = _effective_image_rows(inp, kept)
    mm = None
    if "early" in inp:  # the turns' own passes (see _early_turns)
        at = [inp["early"]["turn_row"][(q, n)] for q in kept for n in range(len(turns[q]))]
        text_emb, mm = inp["txt"].matrix[at], inp["early"]["mm"].matrix[at]
    else:
        text_emb = inp["txt"].matrix[[inp["text_row"][x] for q in kept for x in texts[q]]]
    empty = QueryTargets()
    positives = [_rows(inp["targets"].get(q, empty).positives, index_of) for q in kept]
    exclude = [index_of.get(t["reference_image_id"]) if run.exclude_reference else None for q in kept for t in turns[q]]
    result = rank_sessions(
        retriever,
        image_emb,
        text_emb,
        [len(turns[q]) for q in kept],
        gallery,
        positives,
        exclude,
        alpha=DEFAULT_ALPHA,
        mm=mm,
    )
    rows = [
        AuditSessionRank(
            run_id=run.pk, query_id=q, retriever=spec, strategy=strategy, modality=modality, ranks=per_session[n]
        )
        for (strategy, modality), per_session in result.ranks.items()
        for n, q in enumerate(kept)
    ]
    inp.setdefault("consistency", {}).update(_consistency_of(inp, kept, image_emb, gallery, index_of, positives))
    return rows, sum(1 for pos in positives if not pos), result.seconds


def _effective_image_rows(inp: dict[str, Any], kept: list[int]) -> Any:
    """The turns' effective reference embeddings, the sessions one after the other."""
    import torch

    from retrieval.sessions import effective_references

    turns, matrix, row = inp["turns"], inp["img"].matrix, inp["image_row"]
    return torch.cat(
        [
            effective_references(
                matrix[[row[t["reference_image__sha256"]] for t in turns[q]]],
                [t.get("reference_turns") or [] for t in turns[q]],
            )
            for q in kept
        ]
    )


def _consistency_of(
    inp: dict[str, Any],
    kept: list[int],
    effective: Any,
    gallery: Any,
    index_of: dict[int, int],
    positives: list[list[int]],
) -> dict[str, list[dict[str, int]]]:
    """Per session (str id): the consistency checks each turn fails
    (:func:`retrieval.sessions.session_consistency`), from the reference, effective reference,
    turn target and text embeddings of this retriever. A turn target neither encoded as a
    reference nor in the searched gallery is unknown (its image checks are skipped)."""
    import numpy as np

    from retrieval.sessions import change_directions, session_consistency, text_directions

    from .base import conflict_source, consistency_thresholds

    turns, texts, img, row = inp["turns"], inp["texts"], inp["img"].matrix, inp["image_row"]
    from_text = conflict_source() == "text"
    directions = text_directions(inp["txt"].matrix) if from_text else None  # centred on this chunk's texts
    thresholds = consistency_thresholds()
    eff = effective.float().cpu().numpy()
    dim = eff.shape[1]
    out: dict[str, list[dict[str, int]]] = {}
    start = 0
    for q, pos in zip(kept, positives):
        ts = turns[q]
        targets = np.full((len(ts), dim), np.nan)
        for n, t in enumerate(ts):
            if t.get("turn_target__sha256") in row:
                targets[n] = img[row[t["turn_target__sha256"]]].float().cpu().numpy()
            elif t.get("turn_target_id") in index_of:
                targets[n] = gallery[index_of[t["turn_target_id"]]].float().cpu().numpy()
            elif n == len(ts) - 1 and pos:
                targets[n] = gallery[pos[0]].float().cpu().numpy()
        e = eff[start : start + len(ts)]
        d = directions[[inp["text_row"][x] for x in texts[q]]] if from_text else change_directions(targets, e)
        first = img[row[ts[0]["reference_image__sha256"]]].float().cpu().numpy()
        out[str(q)] = session_consistency(first, targets, e, d, thresholds)
        start += len(ts)
    return out


def _rank_session_chunk(
    run: AuditRun, chunk: AuditChunk, beat: Heartbeat | None
) -> tuple[dict[str, Any], list[AuditSessionRank]]:
    """Rank every turn of the chunk's sessions (3 modalities x 3 strategies) for one retriever."""
    ctx = _chunk_gallery(run, chunk, beat)
    g_ids, g_enc, build_s, gallery_s = ctx[4], ctx[6], ctx[7], ctx[8]
    inp = _session_inputs(run, chunk, ctx, beat)
    img, txt = inp["img"], inp["txt"]
    out_rows, no_positive, rank_s = _rank_sessions_of(run, chunk.retriever, ctx, inp)
    stats = {
        "seconds": {
            "build": build_s,
            "gallery": gallery_s,
            "encode_images": img.seconds,
            "encode_texts": txt.seconds,
            "rank": rank_s,
        },
        "cache": {
            "session_image_hits": img.hits,
            "session_image_encoded": img.encoded,
            "session_text_hits": txt.hits,
            "session_text_encoded": txt.encoded,
            **({"session_mm_encoded": inp["early"]["mm"].encoded} if "early" in inp else {}),
            "gallery_read_hits": g_enc.hits if g_enc else 0,
            "gallery_read_encoded": g_enc.encoded if g_enc else 0,
        },
        "session_skipped": inp["skipped"],
        "consistency": inp.get("consistency", {}),
        "no_positive_in_gallery": no_positive,
        "sessions_ranked": len(inp["kept"]),
        "turns_ranked": sum(len(inp["turns"][q]) for q in inp["kept"]),
        "gallery_size": len(g_ids),
    }
    return stats, out_rows


def _session_texts_chunk(run: AuditRun, chunk: AuditChunk, beat: Heartbeat | None) -> dict[str, Any]:
    """Each session's largest text-text cosine with the tau encoder (stored in the chunk's stats)."""
    from .encoding import session_texts_max_cosine

    t0 = time.perf_counter()
    retriever = retriever_for(chunk.retriever, run)
    cache = embedding_cache(retriever)
    build_s = time.perf_counter() - t0
    turns = session_turns(chunk.items)
    texts = [
        [x for x in (joined_turn_text(t["texts"], run.caption_join) for t in turns.get(q, [])) if x]
        for q in chunk.items
    ]
    if beat:
        beat.check()
    worst, enc = session_texts_max_cosine(retriever, cache, texts)
    return {
        "seconds": {"build": build_s, "encode_texts": enc.seconds},
        "cache": {"tau_text_hits": enc.hits, "tau_text_encoded": enc.encoded},
        "max_text_cosine": {str(q): v for q, v in zip(chunk.items, worst)},
    }


def gallery_ready(run_id: int, spec: str) -> bool:
    return (
        not AuditChunk.objects.filter(run_id=run_id, retriever=spec, kind=AuditChunk.Kind.GALLERY)
        .exclude(status=AuditChunk.Status.DONE)
        .exists()
    )


def process_chunk(chunk_id: int, owner: str | None = None, heartbeat: bool = True, ran: set[int] | None = None) -> str:
    """Run one chunk if it still needs running; returns what happened.

    ``"done"`` (it was already done: nothing recomputed), ``"busy"`` (another worker
    holds a live lease), ``"waiting"`` (a query chunk whose gallery is not encoded
    yet), ``"ok"`` (computed now), ``"failed"``, ``"lost"`` (lease taken over while
    computing; nothing written), ``"missing"``. ``ran``: gets the ids of the chunks run
    here (the chunk and the siblings run with it, :func:`_siblings`).
    """
    try:  # get(), not first(): no ordering (a join to the run) to compile for one row by its key
        chunk = AuditChunk.objects.select_related("run", "run__dataset").get(pk=chunk_id)
    except AuditChunk.DoesNotExist:
        return "missing"
    if chunk.status == AuditChunk.Status.DONE:
        return "done"
    if chunk.status == AuditChunk.Status.FAILED:
        return "failed"
    run = chunk.run
    if run.status in (AuditRun.Status.DONE, AuditRun.Status.FAILED):
        return run.status
    if chunk.kind in SESSION_CHUNK_KINDS and not gallery_ready(run.pk, chunk.retriever):
        return "waiting"
    owner = owner or default_owner()
    if not claim_chunk(chunk.pk, owner):
        chunk.refresh_from_db()
        if chunk.status == AuditChunk.Status.DONE:
            return "done"
        if chunk.status != AuditChunk.Status.FAILED and chunk.attempts >= max_attempts():
            fail_chunk(chunk, f"given up after {chunk.attempts} attempts (its worker was lost each time)")
            return "failed"
        return "busy" if chunk.status != AuditChunk.Status.FAILED else "failed"
    group = [chunk, *_siblings(run, chunk, owner)]
    if ran is not None:
        ran.update(c.pk for c in group)
    return _run_claimed(group, run, owner, heartbeat)


def _run_claimed(group: list[AuditChunk], run: AuditRun, owner: str, heartbeat: bool) -> str:
    """Compute and write claimed chunks: one chunk, or gallery chunks encoded together."""
    beats = [Heartbeat(c.pk, owner) if heartbeat else None for c in group]
    try:
        results = _compute_group(run, group, beats)
        for beat in beats:
            if beat:
                beat.check()
    except LeaseLost:
        logger.warning("audit chunks %s: lease lost, leaving them to their new owner", [c.pk for c in group])
        return "lost"
    except Exception as exc:  # recorded on the run; a person decides whether to retry
        # the page shows a reference number; the traceback is in the log under it
        message = error_reference(exc, f"audit chunks {[c.pk for c in group]}")
        for c in group:
            fail_chunk(c, message, owner=owner)
        return "failed"
    finally:
        for beat in beats:
            if beat:
                beat.stop()
    written = [
        _write_chunk(run, c, stats, rows, owner, progress=n == len(group) - 1)  # progress once, after the last
        for n, (c, (stats, rows)) in enumerate(zip(group, results))
    ]
    return "ok" if all(written) else "lost"


def _compute_group(
    run: AuditRun, group: list[AuditChunk], beats: list[Heartbeat | None]
) -> list[tuple[dict[str, Any], list[Any]]]:
    """:func:`_compute` of each chunk of a group (:func:`_siblings`): gallery chunks encoded
    together, query chunks on one read of their queries."""
    if len(group) == 1:
        return [_compute(run, group[0], beats[0])]
    if group[0].kind == AuditChunk.Kind.GALLERY:
        return [(stats, []) for stats in _encode_gallery_group(run, group, beats)]
    read = _read_queries(run, group[0].items)
    results = [_rank_query_chunk(run, c, beat, read) for c, beat in zip(group, beats)]
    for c, (stats, _rows) in zip(group, results):
        stats["run_with"] = [other.pk for other in group if other.pk != c.pk]
    return results


def _compute(run: AuditRun, chunk: AuditChunk, beat: Heartbeat | None) -> tuple[dict[str, Any], list[Any]]:
    """The chunk's stats and result rows (rank rows or session rank rows; none for the others)."""
    if chunk.kind == AuditChunk.Kind.GALLERY:
        return _encode_gallery_chunk(run, chunk, beat), []
    if chunk.kind == AuditChunk.Kind.SESSIONS:
        return _rank_session_chunk(run, chunk, beat)
    if chunk.kind == AuditChunk.Kind.TEXTS:
        return _session_texts_chunk(run, chunk, beat), []
    return _rank_query_chunk(run, chunk, beat)


def _write_chunk(
    run: AuditRun, chunk: AuditChunk, stats: dict[str, Any], rows: list[Any], owner: str, progress: bool = True
) -> bool:
    """Store the rows in bulk (COPY on PostgreSQL) and mark the chunk done with the job
    framework's owner-checked finish, in one transaction: a chunk another worker took over
    meanwhile writes nothing (``False``). Then refresh the run's progress unless told not to."""
    t0 = time.perf_counter()
    try:
        with transaction.atomic():
            insert_rows(AuditSessionRank if chunk.kind == AuditChunk.Kind.SESSIONS else AuditRank, rows)
            stats.setdefault("seconds", {})["write"] = time.perf_counter() - t0
            if not jobs.finish(AuditChunk, chunk.pk, owner, stats=stats):
                raise LeaseLost(f"audit chunk {chunk.pk} was taken over by another worker")
    except LeaseLost:
        logger.warning("audit chunk %s: lease lost before its rows were written; nothing written", chunk.pk)
        return False
    if progress:
        update_progress(run.pk, run)
    return True


def fail_chunk(chunk: AuditChunk, message: str, owner: str | None = None) -> None:
    """Fail the chunk (with ``owner``: only while that worker holds it) and its run."""
    if not jobs.fail(AuditChunk, chunk.pk, message, owner=owner):
        return
    first_line = message.splitlines()[0] if message else "failed"
    fail_run(chunk.run_id, f"chunk {chunk.kind} #{chunk.index} of {chunk.retriever}: {first_line}\n\n{message}")


def update_progress(run_id: int, run: AuditRun | None = None) -> None:
    """Recount finished work and refresh the ETA and the stage (gallery images/s while encoding).

    ``run``: the planned run when the caller holds it (its start and total are fixed once planned)."""
    counts = _chunk_counts(run_id)
    done = sum(n for (_kind, status), n in counts.items() if status == AuditChunk.Status.DONE)
    if run is None or not run.planned:
        run = AuditRun.objects.filter(pk=run_id).only("started_at", "total", "status").first()
    if run is None:
        return
    eta = None
    elapsed = (timezone.now() - run.started_at).total_seconds() if run.started_at else 0.0
    if elapsed and done and run.total:
        eta = max(0.0, elapsed * (run.total - done) / done)
    g_done, g_total = _gallery_counts(run_id, counts)
    stage = "ranking queries"
    if g_done < g_total:
        stage = encoding_stage(g_done, g_total, g_done / elapsed if elapsed > 0 else 0.0)
    AuditRun.objects.filter(pk=run_id, status=AuditRun.Status.RUNNING).update(done=done, eta_seconds=eta, stage=stage)
