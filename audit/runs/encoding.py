"""The numeric core of an audit chunk: cached encoding and three-modality ranking.

No Django and no Celery here (torch, open_clip through :mod:`retrieval.encoders`, the
embedding cache). :mod:`audit.runs` feeds it database rows and stores its output.

One image and one text encoding per query serve the three modalities:

* multimodal query = ``retriever.compose(image emb, text emb)`` (normalised sum);
* text-only query = the text embedding;
* image-only query = the image embedding.

Sessions (multi-turn queries) use the same per-turn encodings: :func:`rank_sessions`
aggregates each session's history of turns per modality and strategy and ranks every
turn; :func:`session_texts_max_cosine` serves the tau-diversity filter.

Built retrievers and gallery matrices are kept per process (small LRU memos), so the
successive chunks a worker process runs neither rebuild the model nor re-read the
gallery embeddings.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from retrieval.embcache import EmbeddingCache, encode_with_cache
from retrieval.encoders import DEFAULT_MAX_PIXELS, IMAGE_ERRORS, load_image, shared_preprocessed_batches
from retrieval.ranking import rank_queries
from retrieval.retrievers.pipeline import BLACK_PREFIX, audit_retriever, late_path, modality_pairs
from retrieval.sessions import DEFAULT_ALPHA, STRATEGIES, aggregate_history, max_pairwise_cosine

__all__ = [
    "IMAGE_ERRORS",
    "encode_images",
    "encode_images_shared",
    "encode_queries",
    "encode_query_pairs",
    "encode_texts",
    "gallery_matrix",
    "get_retriever",
    "rank_three",
]

_memo_lock = threading.Lock()
_retrievers: OrderedDict[tuple, Any] = OrderedDict()
_galleries: OrderedDict[tuple, tuple[torch.Tensor, list[int]]] = OrderedDict()
RETRIEVER_MEMO = 2
GALLERY_MEMO = 2


def get_retriever(
    spec: str, device: str | None = None, batch_size: int = 64, precision: str = "fp32", modality_rule: str = "family"
) -> Any:
    """A retriever for ``spec`` of any kind (:func:`retrieval.retrievers.pipeline.audit_retriever`),
    reused within this process (LRU of two).

    The model itself is built on the first encode (:class:`retrieval.encoders.LazyRetriever`;
    other kinds when they can name their identity unbuilt): an audit served wholly from the
    embedding cache never builds it."""
    key = (spec, device or "", int(batch_size), precision, modality_rule)
    with _memo_lock:
        if key in _retrievers:
            _retrievers.move_to_end(key)
            return _retrievers[key]
    retriever = audit_retriever(
        spec, device=device or None, batch_size=batch_size, precision=precision, modality_rule=modality_rule
    )
    with _memo_lock:
        _retrievers[key] = retriever
        while len(_retrievers) > RETRIEVER_MEMO:
            _retrievers.popitem(last=False)
    return retriever


def clear_memos() -> None:
    """Forget built retrievers and gallery matrices (tests, benchmarks)."""
    with _memo_lock:
        _retrievers.clear()
        _galleries.clear()


@dataclass
class Encoded:
    """Embeddings of the readable keys and what it cost.

    ``matrix`` has one row per key of ``ok`` (the readable keys, in input order);
    ``unreadable`` maps each key whose image could not be loaded to the reason.
    """

    matrix: torch.Tensor
    ok: list[bool]
    hits: int = 0
    encoded: int = 0
    seconds: float = 0.0
    unreadable: dict[str, str] = field(default_factory=dict)


def encode_images(
    retriever: Any,
    cache: EmbeddingCache,
    keys: Sequence[str],
    locate: Callable[[str], Path],
    max_pixels: int = DEFAULT_MAX_PIXELS,
    check: Callable[[], None] | None = None,
    workers: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Encoded:
    """Image embeddings for ``keys`` (file sha256s); ``locate(key)`` gives a file.

    Only keys missing from the cache are located and streamed through
    :func:`retrieval.encoders.preprocessed_batches` (decoded and preprocessed in ``workers``
    loader processes), encoded a model batch at a time and written to the cache batch by
    batch (an interrupted run keeps what it finished). An unreadable file is reported, not
    raised, and never cached. ``check()`` runs between batches (lease checks);
    ``progress(done, total)`` after each batch, counting the missing keys.
    """
    return encode_images_shared([retriever], [cache], keys, locate, max_pixels, check, workers, progress)[0]


def encode_images_shared(
    retrievers: Sequence[Any],
    caches: Sequence[EmbeddingCache],
    keys: Sequence[str],
    locate: Callable[[str], Path],
    max_pixels: int = DEFAULT_MAX_PIXELS,
    check: Callable[[], None] | None = None,
    workers: int = 0,
    progress: Callable[[int, int], None] | None = None,
    vectors: bool = True,
) -> list[Encoded]:
    """:func:`encode_images` for several retrievers (each with its cache) over the same keys,
    each file decoded once for all of them (:func:`retrieval.encoders.shared_preprocessed_batches`):
    the keys that some cache lacks are streamed once, and each retriever encodes those its own
    cache lacks. One :class:`Encoded` per retriever, as :func:`encode_images` would give it;
    the time spent decoding is shared out evenly in their ``seconds``. ``progress`` counts the
    keys streamed. ``vectors=False`` (a gallery chunk, which only makes sure its images are in
    the cache): the cache is asked which keys it holds, no stored vector is read, and each
    :class:`Encoded` has an empty matrix."""
    started = time.perf_counter()
    keys = list(keys)
    lookups = [cache.get_many("image", keys) if vectors else _presence(cache, keys) for cache in caches]
    found = [lookup.found_mask for lookup in lookups]
    need = [set(lookup.missing) for lookup in lookups]
    todo = list(dict.fromkeys(k for lookup in lookups for k in lookup.missing))
    fresh: list[dict[str, np.ndarray]] = [{} for _ in retrievers]
    unreadable: list[dict[str, str]] = [{} for _ in retrievers]
    own = [0.0] * len(retrievers)
    if todo:
        active = [i for i, n in enumerate(need) if n]
        batches = shared_preprocessed_batches(
            [(k, locate(k)) for k in todo],
            [retrievers[i].preprocess for i in active],
            min(retrievers[i].batch_size for i in active),
            workers=workers,
            max_pixels=max_pixels,
        )
        done = 0
        for batch_keys, pixels, bad in batches:
            if check is not None:
                check()
            for j, i in enumerate(active):
                t0 = time.perf_counter()
                _encode_batch(retrievers[i], caches[i], batch_keys, pixels[j], bad[j], need[i], fresh[i], unreadable[i])
                own[i] += time.perf_counter() - t0
            done += len(batch_keys)
            if progress is not None:
                progress(done, len(todo))
    shared = (time.perf_counter() - started - sum(own)) / max(1, len(retrievers))
    return [
        _encoded(keys, lookups[i].matrix, found[i], fresh[i], unreadable[i], shared + own[i])
        for i in range(len(retrievers))
    ]


def _encode_batch(
    retriever: Any,
    cache: EmbeddingCache,
    batch_keys: list[str],
    pixels: torch.Tensor | None,
    bad: dict[str, str],
    need: set[str],
    fresh: dict[str, np.ndarray],
    unreadable: dict[str, str],
) -> None:
    """Encode and cache the keys of one loaded batch that ``retriever`` needs (``pixels`` holds
    the rows of the batch's keys not in ``bad``)."""
    unreadable.update((k, why) for k, why in bad.items() if k in need)
    if pixels is None:
        return
    ok_keys = [k for k in batch_keys if k not in bad]
    rows = [n for n, k in enumerate(ok_keys) if k in need]
    if not rows:
        return
    wanted = [ok_keys[n] for n in rows]
    if len(rows) != len(ok_keys):
        pixels = pixels[rows] if isinstance(pixels, torch.Tensor) else [pixels[n] for n in rows]
    emb = retriever.embed_pixels(pixels).numpy()
    cache.put_many("image", wanted, emb)
    fresh.update(zip(wanted, emb))


class _Presence(NamedTuple):
    """Which of the keys a cache holds (:func:`encode_images_shared` without vectors): a
    :class:`retrieval.embcache.CacheLookup` with a matrix of no columns."""

    matrix: np.ndarray
    missing: list[str]
    found_mask: np.ndarray


def _presence(cache: EmbeddingCache, keys: list[str]) -> _Presence:
    rows = cache.image_rows(keys)
    found = np.fromiter((k in rows for k in keys), dtype=bool, count=len(keys))
    missing = list(dict.fromkeys(k for k, ok in zip(keys, found) if not ok))
    return _Presence(np.empty((len(keys), 0), dtype=np.float32), missing, found)


def _encoded(
    keys: list[str],
    matrix: np.ndarray,
    found: np.ndarray,
    fresh: dict[str, np.ndarray],
    unreadable: dict[str, str],
    seconds: float,
) -> Encoded:
    """The :class:`Encoded` of ``keys`` from a cache lookup's matrix and the rows encoded now
    (a matrix of no columns: an empty one, see :func:`encode_images_shared`)."""
    ok = [k not in unreadable for k in keys]
    if not matrix.shape[1]:
        return Encoded(
            matrix=torch.empty(0),
            ok=ok,
            hits=int(found.sum()),
            encoded=len(fresh),
            seconds=seconds,
            unreadable=unreadable,
        )
    for row in np.flatnonzero(~found).tolist():
        if keys[row] in fresh:
            matrix[row] = fresh[keys[row]]
    tensor = torch.from_numpy(matrix)
    tensor = tensor[torch.tensor(ok, dtype=torch.bool)] if not all(ok) else tensor
    return Encoded(
        matrix=tensor.contiguous(),
        ok=ok,
        hits=int(found.sum()),
        encoded=len(fresh),
        seconds=seconds,
        unreadable=unreadable,
    )


def encode_texts(retriever: Any, cache: EmbeddingCache, texts: Sequence[str], chunk_size: int = 1024) -> Encoded:
    """Text embeddings for ``texts``, encoding only what the cache lacks."""
    started = time.perf_counter()
    texts = list(texts)
    matrix, stats = encode_with_cache(retriever, cache, "text", texts, chunk_size=chunk_size)
    return Encoded(
        matrix=matrix,
        ok=[True] * len(texts),
        hits=stats.hits,
        encoded=stats.encoded,
        seconds=time.perf_counter() - started,
    )


def encode_query_pairs(
    retriever: Any,
    cache: EmbeddingCache,
    pairs: Sequence[tuple[str | None, str | None]],
    locate: Callable[[str], Path],
    max_pixels: int = DEFAULT_MAX_PIXELS,
    chunk_size: int = 256,
) -> Encoded:
    """Whole-query embeddings of ``pairs`` (image key or ``None``, text or ``None``; an image key
    ``black:KEY`` is a black image of KEY's size), one :meth:`embed_queries` pass each, cached
    (kind ``query``) under :meth:`query_cache_key`: only what the cache lacks is encoded, and
    only its images are read. ``ok[i]``: pair ``i``'s image could be read (the matrix holds
    the rows of those)."""
    started = time.perf_counter()
    pairs = list(pairs)
    keys = [retriever.query_cache_key(k, t) for k, t in pairs]
    lookup = cache.get_many("query", keys)
    missing = set(lookup.missing)
    need = list(dict.fromkeys(_image_of(k) for (k, _), key in zip(pairs, keys) if key in missing and k))
    images, unreadable = _read_images(need, locate, max_pixels)
    ok = [not (k and _image_of(k) in unreadable) for k, _ in pairs]
    good = [n for n, flag in enumerate(ok) if flag]
    by_key = {key: pairs[n] for n, key in enumerate(keys) if ok[n]}

    def load(chunk: list[str]) -> list[tuple[Any, str | None]]:
        return [(_query_image(by_key[key][0], images), by_key[key][1]) for key in chunk]

    def embed(items: list[tuple[Any, str | None]]) -> torch.Tensor:
        return retriever.embed_queries([im for im, _ in items], [t for _, t in items])

    matrix, stats = encode_with_cache(
        retriever, cache, "query", [keys[n] for n in good], loader=load, chunk_size=chunk_size, embed=embed
    )
    return Encoded(
        matrix=matrix,
        ok=ok,
        hits=stats.hits,
        encoded=stats.encoded,
        seconds=time.perf_counter() - started,
        unreadable={_image_of(k): unreadable[_image_of(k)] for k, _ in pairs if k and _image_of(k) in unreadable},
    )


def _image_of(image_key: str) -> str:
    return image_key[len(BLACK_PREFIX) :] if image_key.startswith(BLACK_PREFIX) else image_key


def _query_image(image_key: str | None, images: dict[str, Any]) -> Any:
    if not image_key:
        return None
    from retrieval.retrievers.base import black_like

    image = images[_image_of(image_key)]
    return black_like(image) if image_key.startswith(BLACK_PREFIX) else image


def _read_images(keys: Sequence[str], locate: Callable[[str], Path], max_pixels: int) -> tuple[dict, dict]:
    """(key -> decoded RGB image, key -> why it could not be read)."""
    images: dict[str, Any] = {}
    unreadable: dict[str, str] = {}
    for key in keys:
        try:
            images[key] = load_image(locate(key), max_pixels=max_pixels)
        except IMAGE_ERRORS as exc:
            unreadable[key] = f"{type(exc).__name__}: {exc}"
    return images, unreadable


@dataclass
class QueryEncodings:
    """The three modalities' query embeddings of a batch of queries and what they cost: ``img``
    (image-only rows; its ``ok`` says which queries' references could be read), ``txt``
    (text-only rows) and ``mm`` (multimodal rows), each over the queries kept (``img.ok``)."""

    img: Encoded
    txt: Encoded
    mm: Encoded | None  # None: late fusion (``compose(img, txt)`` at ranking time)


def encode_queries(
    retriever: Any,
    cache: EmbeddingCache,
    image_keys: Sequence[str],
    texts: Sequence[str],
    locate: Callable[[str], Path],
    max_pixels: int = DEFAULT_MAX_PIXELS,
    check: Callable[[], None] | None = None,
    workers: int = 0,
) -> QueryEncodings:
    """The queries (reference image key, text) in every modality, through the retriever's
    interface: late fusion (:func:`retrieval.retrievers.pipeline.late_path`): one image encode
    and one text encode per query (the multimodal query composed at ranking time, ``mm`` None);
    otherwise three whole-query passes, each cached (:func:`encode_query_pairs`) under the
    retriever's modality rule (:func:`retrieval.retrievers.pipeline.modality_pairs`)."""
    if late_path(retriever):
        img = encode_images(retriever, cache, image_keys, locate, max_pixels=max_pixels, check=check, workers=workers)
        kept_texts = [t for t, ok in zip(texts, img.ok) if ok]
        return QueryEncodings(img, encode_texts(retriever, cache, kept_texts), None)
    rule = getattr(retriever, "modality_rule", "family")
    pairs = [modality_pairs(rule, k, t) for k, t in zip(image_keys, texts)]
    done = {}
    for modality in ("mm", "image", "text"):
        done[modality] = encode_query_pairs(retriever, cache, [p[modality] for p in pairs], locate, max_pixels)
        if check is not None:
            check()
    ok = [all(done[m].ok[n] for m in done) for n in range(len(pairs))]  # a reference read in every pass
    for enc in done.values():
        enc.matrix = enc.matrix[[r for r, n in enumerate(i for i, flag in enumerate(enc.ok) if flag) if ok[n]]]
        enc.ok = ok
    done["image"].unreadable = {k: why for enc in done.values() for k, why in enc.unreadable.items()}
    return QueryEncodings(done["image"], done["text"], done["mm"])


def multimodal_queries(
    retriever: Any,
    cache: EmbeddingCache,
    image_keys: Sequence[str],
    texts: Sequence[str],
    locate: Callable[[str], Path],
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> tuple[list[bool], torch.Tensor]:
    """The multimodal queries alone (on-demand and interactive ranking): ``ok[i]`` (query ``i``'s
    reference could be read) and the rows of those, composed from one image and one text
    encode on the late path, else one cached whole-query pass each."""
    if late_path(retriever):
        img = encode_images(retriever, cache, image_keys, locate, max_pixels=max_pixels)
        if not any(img.ok):
            return img.ok, img.matrix
        txt = encode_texts(retriever, cache, [t for t, ok in zip(texts, img.ok) if ok])
        return img.ok, retriever.compose(img.matrix, txt.matrix)
    mm = encode_query_pairs(retriever, cache, list(zip(image_keys, texts)), locate, max_pixels)
    return mm.ok, mm.matrix


#: Gallery images encoded per step when a gallery matrix finds some not yet in the cache.
GALLERY_STEP = 16384


def _encode_missing(
    retriever: Any, cache: EmbeddingCache, keys: list[str], locate: Callable[[str], Path], max_pixels: int
) -> tuple[Encoded, dict[str, int]]:
    """What the gallery ``keys`` cost, and the cache's row of each key stored: those the cache
    lacks encoded (GALLERY_STEP at a time) and stored; ``ok[i]`` whether key ``i`` has an
    embedding now (an unreadable image has none). No stored vector is read."""
    rows = cache.image_rows(keys)
    missing = [k for k in dict.fromkeys(keys) if k not in rows]
    total = Encoded(matrix=torch.empty(0), ok=[True] * len(keys), hits=sum(1 for k in keys if k in rows))
    for start in range(0, len(missing), GALLERY_STEP):
        enc = encode_images(retriever, cache, missing[start : start + GALLERY_STEP], locate, max_pixels=max_pixels)
        total.encoded += enc.encoded
        total.seconds += enc.seconds
        total.unreadable.update(enc.unreadable)
    if missing:
        rows = cache.image_rows(keys)
        total.ok = [k in rows for k in keys]
    return total, rows


def gallery_matrix(
    retriever: Any,
    cache: EmbeddingCache,
    memo_key: Hashable,
    keys: Sequence[str],
    locate: Callable[[str], Path],
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> tuple[torch.Tensor, list[int], Encoded | None]:
    """The gallery embeddings and the positions they cover.

    Returns ``(matrix [G', dim], rows, encoded)`` where ``rows`` lists the input
    positions that have an embedding (unreadable images are left out) and
    ``encoded`` is ``None`` when the matrix came from this process's memo. Normally
    every key is already cached by the gallery chunks; any that is not is encoded.

    The matrix is read from the embedding cache's one store of image embeddings
    (:meth:`retrieval.embcache.EmbeddingCache.image_matrix`): on a CPU worker it is a
    memory-mapped view of that file when the gallery's rows follow each other there (a
    gallery encoded in its order, as an audit's gallery chunks encode it), and the ranking
    reads it block by block, so the process never holds the whole gallery (the page cache
    does); otherwise a copy. On another device the matrix is moved there.
    """
    keys = list(keys)
    digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()
    device = str(getattr(retriever, "device", "cpu"))
    full_key = (memo_key, retriever.spec, device, digest)
    with _memo_lock:
        if full_key in _galleries:
            _galleries.move_to_end(full_key)
            matrix, rows = _galleries[full_key]
            return matrix, rows, None
    enc, stored = _encode_missing(retriever, cache, keys, locate, max_pixels)
    rows = [n for n, ok in enumerate(enc.ok) if ok]
    mapped = cache.image_matrix([keys[n] for n in rows], stored)
    matrix = torch.from_numpy(mapped) if device == "cpu" else torch.from_numpy(np.array(mapped)).to(device)
    with _memo_lock:
        _galleries[full_key] = (matrix, rows)
        while len(_galleries) > GALLERY_MEMO:
            _galleries.popitem(last=False)
    return matrix, rows, enc


@dataclass
class ThreeRanks:
    """Ranks of one batch of queries in the three modalities.

    ``mm``/``text``/``image``: best rank over the query's positives (``None``: no
    positive in the gallery). ``all[field][q]``: the rank of every positive, in the
    order given. ``extra[field][q]``: ranks of the graded-only targets (CIRR's soft
    ones). ``group[field][q]``: rank within the query's group (CIRR's ``img_set``) or
    ``None``. ``top_mm[q]``: the multimodal top list (gallery rows, best first; targets
    and the reference included); ``top_text[q]``/``top_image[q]`` the text-only and
    image-only top lists, ``top_near[q]`` the images nearest the query's positive targets
    and its reference (image to image, :func:`near_targets`; [] without a positive in the
    gallery); together they are the candidate pool
    (:func:`audit.runs.panels.pool_lists`). ``ahead[field][q][i]``: whether the reference scores >=
    positive ``i`` (protocols that keep the reference add it to the rank).
    """

    mm: list[int | None]
    text: list[int | None]
    image: list[int | None]
    top_mm: list[list[int]]
    seconds: float
    all: dict[str, list[list[int | None]]] = field(default_factory=dict)
    extra: dict[str, list[list[int | None]]] = field(default_factory=dict)
    group: dict[str, list[int | None]] = field(default_factory=dict)
    ahead: dict[str, list[list[bool]]] = field(default_factory=dict)
    top_text: list[list[int]] = field(default_factory=list)
    top_image: list[list[int]] = field(default_factory=list)
    top_near: list[list[int]] = field(default_factory=list)


def _top_rows(topk: torch.Tensor) -> list[list[int]]:
    """Gallery rows of a top-k index matrix, padding (-1) dropped (a gallery of at least k
    rows pads nothing: the lists as they are)."""
    rows = topk.tolist()  # tolist() gives ints
    return [[i for i in row if i >= 0] for row in rows] if bool((topk < 0).any()) else rows


def near_targets(
    gallery: torch.Tensor,
    positives: Sequence[Sequence[int]],
    top_k: int,
    references: Sequence[int | None] | None = None,
) -> list[list[int]]:
    """Per query, the ``top_k`` gallery rows nearest its labelled targets and its reference
    (image to image: the gallery ranked by ``normalise(normalise(mean of the positives) +
    reference)``, the reference left out where a query has none in the gallery); [] for a
    query without a positive in the gallery. An image that fits the query as well as its
    target is one edit from both: nearer to that pair than to either alone."""
    having = [n for n, pos in enumerate(positives) if pos]
    out: list[list[int]] = [[] for _ in positives]
    if not having or top_k <= 0 or not len(gallery):
        return out
    queries = _near_queries(
        gallery, [positives[n] for n in having], [references[n] if references is not None else None for n in having]
    )
    res = rank_queries(queries.to(gallery.device), gallery, [[] for _ in having], None, top_k=min(top_k, len(gallery)))
    for n, row in zip(having, _top_rows(res.topk)):
        out[n] = row
    return out


def _near_queries(
    gallery: torch.Tensor, positives: Sequence[Sequence[int]], references: Sequence[int | None]
) -> torch.Tensor:
    """:func:`near_targets`' query of each row: ``normalise(normalise(mean of its positives'
    embeddings) + its reference's)``, every row at once (one gather, one segment sum)."""
    import torch.nn.functional as F

    flat = torch.as_tensor([p for pos in positives for p in pos], dtype=torch.long)
    segment = torch.repeat_interleave(torch.as_tensor([len(pos) for pos in positives], dtype=torch.long))
    picked = gallery[flat].float().cpu()
    sums = torch.zeros((len(positives), picked.shape[1]), dtype=torch.float32).index_add_(0, segment, picked)
    counts = torch.bincount(segment, minlength=len(positives)).to(torch.float32).unsqueeze(1)
    queries = F.normalize(sums / counts, dim=-1)
    with_ref = [n for n, ref in enumerate(references) if ref is not None]
    if with_ref:
        refs = torch.as_tensor([int(references[n]) for n in with_ref], dtype=torch.long)
        queries[with_ref] += gallery[refs].float().cpu()
    return F.normalize(queries, dim=-1)


def rank_three(
    retriever: Any,
    image_emb: torch.Tensor,
    text_emb: torch.Tensor,
    gallery: torch.Tensor,
    positives: Sequence[Sequence[int]],
    exclude: Sequence[int | None] | None,
    panel_k: int = 64,
    extra: Sequence[Sequence[int]] | None = None,
    groups: Sequence[Sequence[int]] | None = None,
    references: Sequence[int | None] | None = None,
    mm: torch.Tensor | None = None,
) -> ThreeRanks:
    """Rank the multimodal, text-only and image-only queries of one batch of queries.

    ``positives[q]``/``exclude[q]``/``extra[q]``/``groups[q]`` are gallery row indices
    (see :func:`retrieval.ranking.rank_queries`). Only the multimodal query keeps a top
    list (``panel_k`` gallery rows, best first, padding dropped). ``references[q]``: the
    reference's gallery row, for :attr:`ThreeRanks.ahead` (see ``reference_ahead`` of
    :func:`retrieval.ranking.rank_queries`). ``mm``: the multimodal queries when the retriever
    does not compose them from ``image_emb`` and ``text_emb`` (early fusion: its own pass).
    """
    started = time.perf_counter()
    n = len(positives)
    modal = {"mm": retriever.compose(image_emb, text_emb) if mm is None else mm, "text": text_emb, "image": image_emb}
    # the near-targets queries (near_targets' rule) ranked in the same pass: one ranking call,
    # not four (each costs tens of small tensor operations whatever its size)
    having = [q for q, pos in enumerate(positives) if pos] if panel_k > 0 and len(gallery) else []
    refs = list(references) if references is not None else [None] * n
    stacked = [m.float() for m in modal.values()]
    if having:
        stacked.append(_near_queries(gallery, [positives[q] for q in having], [refs[q] for q in having]))

    def each(rows: Sequence[Any] | None, near_row: Any) -> list[Any] | None:
        return None if rows is None else [*rows, *rows, *rows, *([near_row] * len(having))]

    res = rank_queries(
        torch.cat(stacked).to(gallery.device),
        gallery,
        each(positives, []),
        each(list(exclude) if exclude is not None else [None] * n, None),
        top_k=panel_k,
        return_per_positive=True,
        groups=each(groups, []),
        extra=each(extra, []),
        references=each(references, None),
    )
    return _three_of(res, list(modal), n, having, time.perf_counter() - started)


def _three_of(res: Any, names: list[str], n: int, having: list[int], seconds: float) -> ThreeRanks:
    """The :class:`ThreeRanks` of one ranking of ``n`` rows per modality of ``names`` followed
    by the near-targets rows of the queries ``having`` positives (see :func:`rank_three`)."""
    part = {name: slice(m * n, (m + 1) * n) for m, name in enumerate(names)}
    top = {name: _top_rows(res.topk[rows]) for name, rows in part.items()}
    top_near: list[list[int]] = [[] for _ in range(n)]
    for q, row in zip(having, _top_rows(res.topk[len(names) * n :])):
        top_near[q] = row
    group = res.group_rank if res.group_rank is not None else [None] * (len(names) * n)
    ahead = res.reference_ahead if res.reference_ahead is not None else [[] for _ in range(len(names) * n)]
    return ThreeRanks(
        res.best_rank[part["mm"]],
        res.best_rank[part["text"]],
        res.best_rank[part["image"]],
        top["mm"],
        seconds,
        all={name: (res.per_positive_ranks or [])[rows] for name, rows in part.items()},
        extra={name: (res.extra_ranks or [])[rows] for name, rows in part.items()},
        group={name: group[rows] for name, rows in part.items()},
        ahead={name: ahead[rows] for name, rows in part.items()},
        top_text=top["text"],
        top_image=top["image"],
        top_near=top_near,
    )


#: Modalities of a session audit, and the strategies of history aggregation.
SESSION_MODALITIES: tuple[str, str, str] = ("multimodal", "text_only", "image_only")


@dataclass
class SessionRanks:
    """``ranks[(strategy, modality)][s]`` = ranks ``r_1..r_L`` of session ``s`` (``None``: not retrieved)."""

    ranks: dict[tuple[str, str], list[list[int | None]]]
    seconds: float


def rank_sessions(
    retriever: Any,
    image_emb: torch.Tensor,
    text_emb: torch.Tensor,
    turn_counts: Sequence[int],
    gallery: torch.Tensor,
    positives: Sequence[Sequence[int]],
    exclude: Sequence[int | None] | None,
    alpha: float = DEFAULT_ALPHA,
    strategies: Sequence[str] = STRATEGIES,
    mm: torch.Tensor | None = None,
) -> SessionRanks:
    """Turn-wise ranks of a batch of sessions in every modality and aggregation strategy.

    ``image_emb``/``text_emb`` hold one row per turn, the sessions one after the other
    (``turn_counts[s]`` rows for session ``s``). Per modality (multimodal =
    ``retriever.compose(image, text)``, text only, image only) and strategy, the
    history of turns ``1..l`` of each session is aggregated with
    :func:`retrieval.sessions.aggregate_history` and ranked against ``gallery``;
    ``positives[s]`` are gallery rows of session ``s``'s ground truths (the same for
    every turn) and ``exclude[t]`` a gallery row left out for turn row ``t`` (its
    reference image) or ``None``.
    """
    started = time.perf_counter()
    n_rows = sum(turn_counts)
    if image_emb.shape[0] != n_rows or text_emb.shape[0] != n_rows:
        raise ValueError(f"{n_rows} turns, but {image_emb.shape[0]} image and {text_emb.shape[0]} text rows")
    if len(positives) != len(turn_counts):
        raise ValueError("one positives list per session")
    if exclude is not None and len(exclude) != n_rows:
        raise ValueError("one exclude entry per turn")
    device = gallery.device
    bases = {  # mm: an early-fusion retriever's own multimodal pass of each turn
        "multimodal": retriever.compose(image_emb, text_emb) if mm is None else mm,
        "text_only": text_emb,
        "image_only": image_emb,
    }
    starts = [0]
    for n in turn_counts:
        starts.append(starts[-1] + n)
    row_positives = [positives[s] for s, n in enumerate(turn_counts) for _ in range(n)]
    combos = [(strategy, modality) for modality in SESSION_MODALITIES for strategy in strategies]
    blocks: list[np.ndarray] = []
    for modality in SESSION_MODALITIES:
        # numpy (float64 sums): for sessions of a few turns this is much faster than
        # many tiny torch calls, and gives the same result for the same input.
        base = bases[modality].float().cpu().numpy()
        for strategy in strategies:
            blocks.extend(
                aggregate_history(base[starts[s] : starts[s + 1]], strategy, alpha) for s in range(len(turn_counts))
            )
    out: dict[tuple[str, str], list[list[int | None]]] = {}
    if n_rows:
        # one ranking call for every (strategy, modality) block of rows
        queries = torch.from_numpy(np.concatenate(blocks)).to(device)
        row_exclude = list(exclude) if exclude is not None else [None] * n_rows
        best = rank_queries(queries, gallery, row_positives * len(combos), row_exclude * len(combos), top_k=0).best_rank
    else:
        best = []
    for c, combo in enumerate(combos):
        part = best[c * n_rows : (c + 1) * n_rows]
        out[combo] = [part[starts[s] : starts[s + 1]] for s in range(len(turn_counts))]
    return SessionRanks(out, time.perf_counter() - started)


def session_texts_max_cosine(
    retriever: Any, cache: EmbeddingCache, sessions: Sequence[Sequence[str]]
) -> tuple[list[float | None], Encoded]:
    """Largest text-embedding cosine between two of each session's texts (``None``: < 2 texts).

    Every distinct text is encoded once (through the cache); repeated texts within a
    session count as a pair (cosine 1).
    """
    unique = list(dict.fromkeys(t for texts in sessions for t in texts))
    enc = encode_texts(retriever, cache, unique)
    row = {t: n for n, t in enumerate(unique)}
    out: list[float | None] = []
    for texts in sessions:
        if len(texts) < 2:
            out.append(None)
            continue
        out.append(max_pairwise_cosine(enc.matrix[[row[t] for t in texts]]))
    return out, enc
