"""Audit runs: planning, chunk execution with leases, recovery and aggregation.

How a computed run goes (see also :mod:`audit.tasks`):

1. :func:`create_run` stores the run (status ``queued``); :func:`start_run` hands it to
   the coordinating task (or runs it in-process when asked to, :func:`run_inline`).
2. The coordinator *plans* it (:func:`plan_run`): which single-turn queries and which
   multi-turn sessions can be audited (the others are counted as skipped, with a
   reason), what the gallery is, and one chunk per (retriever, slice of the gallery),
   (retriever, slice of the queries) and (retriever, slice of the sessions), plus
   ``texts`` chunks for the tau encoder. Gallery chunks encode images into the
   embedding cache; query chunks encode the queries (one image and one text embedding
   each), rank the three modalities and write one :class:`AuditRank` row per (query,
   retriever); session chunks do the same for every turn of a session on its
   aggregated history (:func:`audit.engine.rank_sessions`) and write one
   :class:`AuditSessionRank` row per (session, retriever, strategy, modality); texts
   chunks store each session's largest text-text cosine (tau-diversity).
3. Chunks are Celery tasks. A task first *claims* its chunk (an atomic update that
   succeeds only for a pending chunk or one whose lease is stale); a done chunk
   returns at once, so a redelivered message is harmless, and rank rows are unique per
   (run, query, retriever) in the database. While it works, a heartbeat thread
   renews the lease.
4. When every chunk is done, :func:`aggregate_run` labels the queries with
   :func:`audit.labels.label_queries`, stores :class:`AuditLabel` rows, the report
   figures and the query subsets; :func:`aggregate_sessions` adds the session
   metrics, the CIRCLED filter table and the ``audit<id>:sessions_kept`` subset.

Sessions: turn ``l`` of a session is ranked with the history of turns ``1..l``
aggregated as latest, average or weighted (alpha = 0.8), for the multimodal
(composed), text-only and image-only embeddings; the positives are the session's
final targets; with ``exclude_reference`` turn ``l``'s own reference image is left out
of turn ``l``'s gallery. The filters (success, multi-turn, epsilon-consistency with
the run's ``epsilon``) are applied to the multimodal *latest* ranks of the run's first
retriever (:data:`SESSION_FILTER_BASIS`: the closest to CIRCLED's construction-time
single retriever, which ranks the newest query), tau-diversity to the text
embeddings of the run's ``tau_encoder`` (default: the first retriever).

Recovery (:func:`reconcile`): a chunk that is not done and whose lease is stale (its
worker was killed; with the filesystem broker its message is gone for good) is sent
again; a chunk that was sent but never started is sent again once the whole run has
shown no activity for a lease period. Reconcile runs in the coordinator's periodic
re-check, in ``run_audit --wait``, in ``manage.py resume_audits`` and when a worker
starts (Celery's ``worker_ready`` signal), which also takes over coordination.

Gallery: the split's :class:`~retrieval.models.GalleryEntry` images in their
ordinal order, or every image of the dataset when the split has no gallery entries.
Images without a file (``missing`` at import, or unreadable now) are left out.
"""
from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Max, Q, Sum
from django.utils import timezone

from retrieval.imagefiles import PathEscapeError, resolve_under
from retrieval.metrics import MODALITIES, modality_scores
from retrieval.models import Dataset, GalleryEntry, Image, Query, QuerySubset, Target, Turn, turn_text

from .labels import LABELS, SHORTCUT_FREE, SUPPORT_KEYS, AuditLabels, label_queries
from .models import AuditChunk, AuditLabel, AuditRank, AuditRun, AuditSessionRank

logger = logging.getLogger(__name__)

SKIP_REASONS: tuple[str, ...] = (
    "no_reference",
    "empty_text",
    "reference_missing",
    "reference_unreadable",
    "no_target",
)
SESSION_SKIP_REASONS: tuple[str, ...] = (
    "missing_turn",
    "no_reference",
    "empty_text",
    "reference_missing",
    "reference_unreadable",
    "no_target",
)
SUBSET_NAMES: tuple[str, ...] = ("shortcut_free", "composition_required", "unresolved", "shortcut_solvable")
LATEST_SUBSET = "shortcut_free"
SESSIONS_KEPT = "sessions_kept"
#: The ranks the session filters read: the first retriever of the pool, this strategy and modality.
SESSION_FILTER_BASIS: dict[str, str] = {"strategy": "latest", "modality": "multimodal"}
SESSION_CHUNK_KINDS = (AuditChunk.Kind.QUERIES, AuditChunk.Kind.SESSIONS)  # need the gallery first

Progress = Callable[[AuditRun], None]


class AuditError(ValueError):
    """An audit cannot be created or run as asked (the message says why)."""


class LeaseLost(RuntimeError):
    """Another worker took over this chunk; stop without writing."""


# ----------------------------------------------------------------------------- settings


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


def lease_seconds() -> float:
    return float(_setting("AUDIT_LEASE_SECONDS", 300))


def coordinator_seconds() -> float:
    return float(_setting("AUDIT_COORDINATOR_SECONDS", 15))


def max_attempts() -> int:
    return int(_setting("AUDIT_MAX_ATTEMPTS", 3))


def panel_k() -> int:
    return int(_setting("AUDIT_PANEL_K", 10))


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def subset_name(run: AuditRun, label: str) -> str:
    """Name of a run's query subset, e.g. ``audit3:shortcut_free``."""
    return f"audit{run.pk}:{label}"


# ----------------------------------------------------------------------------- creation


def query_splits(dataset: Dataset) -> list[str]:
    return sorted(set(Query.objects.filter(dataset=dataset).values_list("split", flat=True)))


def resolve_split(dataset: Dataset, split: str | None) -> str:
    """The split to audit: the one given, or the dataset's only split."""
    splits = query_splits(dataset)
    if not splits:
        raise AuditError(f"dataset {dataset.name!r} has no queries")
    if split:
        if split not in splits:
            raise AuditError(f"dataset {dataset.name!r} has no split {split!r} (splits: {', '.join(splits)})")
        return split
    if len(splits) > 1:
        raise AuditError(f"dataset {dataset.name!r} has several splits ({', '.join(splits)}); choose one")
    return splits[0]


def normalise_retrievers(specs: Iterable[str]) -> list[str]:
    """Validate retriever specs and return their canonical forms, de-duplicated in order."""
    from retrieval.encoders import parse_retriever_spec

    out: list[str] = []
    for spec in specs:
        spec = (spec or "").strip()
        if not spec:
            continue
        canonical = parse_retriever_spec(spec)["canonical"]
        if canonical not in out:
            out.append(canonical)
    if not out:
        raise AuditError("name at least one retriever, e.g. 'openclip:cirval-tiny-vit'")
    return out


def create_run(
    dataset: Dataset | str,
    retrievers: Sequence[str],
    split: str | None = None,
    k: int = 10,
    min_mm_retrievers: int = 1,
    exclude_reference: bool = True,
    chunk_queries: int | None = None,
    chunk_gallery: int | None = None,
    created_by: Any = None,
    epsilon: float | None = None,
    tau: float | None = None,
    tau_encoder: str | None = None,
) -> AuditRun:
    """Validate the request and store a queued run (nothing is computed yet).

    ``epsilon``, ``tau`` and ``tau_encoder`` parameterise the session filters
    (defaults: ``AUDIT_SESSION_EPSILON`` = 30, ``AUDIT_SESSION_TAU`` = 0.8 and the
    pool's first retriever); they are stored on the run, the encoder as a canonical spec.
    """
    if isinstance(dataset, str):
        found = Dataset.objects.filter(name=dataset).first()
        if found is None:
            raise AuditError(f"no dataset named {dataset!r}")
        dataset = found
    if isinstance(k, bool) or int(k) < 1:
        raise AuditError("K must be an integer >= 1")
    if isinstance(min_mm_retrievers, bool) or int(min_mm_retrievers) < 0:
        raise AuditError("the minimum number of multimodal retrievers must be >= 0")
    from retrieval.sessions import DEFAULT_EPSILON, DEFAULT_TAU

    specs = normalise_retrievers(retrievers)
    eps = float(_setting("AUDIT_SESSION_EPSILON", DEFAULT_EPSILON) if epsilon is None else epsilon)
    if isinstance(epsilon, bool) or not math.isfinite(eps) or eps < 0:
        raise AuditError("epsilon must be a finite number >= 0")
    t = float(_setting("AUDIT_SESSION_TAU", DEFAULT_TAU) if tau is None else tau)
    if isinstance(tau, bool) or not math.isfinite(t) or not -1.0 <= t <= 1.0:
        raise AuditError("tau must be a cosine between -1 and 1")
    tau_spec = normalise_retrievers([tau_encoder])[0] if (tau_encoder or "").strip() else specs[0]
    cq = int(chunk_queries or _setting("AUDIT_CHUNK_QUERIES", 512))
    cg = int(chunk_gallery or _setting("AUDIT_CHUNK_GALLERY", 4096))
    if cq < 1 or cg < 1:
        raise AuditError("chunk sizes must be >= 1")
    return AuditRun.objects.create(
        dataset=dataset, split=resolve_split(dataset, split), retrievers=specs, k=int(k),
        min_mm_retrievers=int(min_mm_retrievers), exclude_reference=bool(exclude_reference),
        chunk_queries=cq, chunk_gallery=cg, created_by=created_by if getattr(created_by, "pk", None) else None,
        epsilon=eps, tau=t, tau_encoder=tau_spec,
    )


def _tau_encoder(run: AuditRun) -> str:
    """The spec whose text encoder the tau filter uses (the first retriever unless set)."""
    return run.tau_encoder or run.retrievers[0]


def start_run(run: AuditRun) -> None:
    """Hand a queued run to the workers (after the current transaction commits)."""
    if getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False):
        run_inline(run)
        return
    transaction.on_commit(lambda: kick_coordinator(run.pk))


# ----------------------------------------------------------------------------- planning


def _turn_text(texts: Any) -> str:
    return turn_text(texts or [])


def _eligibility(run: AuditRun, query_ids: Sequence[int] | None = None) -> tuple[list[int], dict[int, str]]:
    """Eligible single-turn query ids in (ordinal, id) order and the skipped ones with a reason.

    Multi-turn queries are not considered here (see :func:`_session_eligibility`).
    """
    qs = Query.objects.filter(dataset_id=run.dataset_id, split=run.split, n_turns__lte=1)
    if query_ids is not None:
        qs = qs.filter(pk__in=list(query_ids))
    queries = list(qs.order_by("ordinal", "id").values_list("id", "n_turns"))
    ids = [q for q, _ in queries]
    first_turns = {
        t["query_id"]: t
        for t in Turn.objects.filter(query__in=qs, index=1).values(
            "query_id", "reference_image_id", "reference_image__missing", "reference_image__sha256",
            "reference_image__path", "texts",
        )
    }
    with_positive = set(
        Target.objects.filter(query__in=qs, relevance__gt=0).exclude(role="neg").values_list("query_id", flat=True)
    )
    eligible: list[int] = []
    skipped: dict[int, str] = {}
    for qid, n_turns in queries:
        turn = first_turns.get(qid)
        if turn is None or turn["reference_image_id"] is None:
            skipped[qid] = "no_reference"
        elif not _turn_text(turn["texts"]):
            skipped[qid] = "empty_text"
        elif turn["reference_image__missing"] or not turn["reference_image__sha256"] or not turn["reference_image__path"]:
            skipped[qid] = "reference_missing"
        elif qid not in with_positive:
            skipped[qid] = "no_target"
        else:
            eligible.append(qid)
    assert len(eligible) + len(skipped) == len(ids)
    return eligible, skipped


_TURN_FIELDS = (
    "query_id", "index", "reference_image_id", "reference_image__missing", "reference_image__sha256",
    "reference_image__path", "texts",
)


def _session_turns(query_ids: Any) -> dict[int, list[dict[str, Any]]]:
    """Query id -> its turns (dicts of :data:`_TURN_FIELDS`) in turn order."""
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for t in Turn.objects.filter(query_id__in=query_ids).order_by("query_id", "index").values(*_TURN_FIELDS):
        out[t["query_id"]].append(t)
    return out


def _session_eligibility(run: AuditRun, query_ids: Sequence[int] | None = None) -> tuple[list[int], dict[int, str]]:
    """Eligible multi-turn sessions in (ordinal, id) order and the skipped ones with a reason.

    A session is scored when its turns are numbered 1..n_turns, every turn has a
    reference image with a file and a non-empty text, and it has a positive target.
    """
    qs = Query.objects.filter(dataset_id=run.dataset_id, split=run.split, n_turns__gt=1)
    if query_ids is not None:
        qs = qs.filter(pk__in=list(query_ids))
    queries = list(qs.order_by("ordinal", "id").values_list("id", "n_turns"))
    turns = _session_turns(qs.values("pk"))
    with_positive = set(
        Target.objects.filter(query__in=qs, relevance__gt=0).exclude(role="neg").values_list("query_id", flat=True)
    )
    eligible: list[int] = []
    skipped: dict[int, str] = {}
    for qid, n_turns in queries:
        ts = turns.get(qid, [])
        if [t["index"] for t in ts] != list(range(1, n_turns + 1)):
            skipped[qid] = "missing_turn"
        elif any(t["reference_image_id"] is None for t in ts):
            skipped[qid] = "no_reference"
        elif not all(_turn_text(t["texts"]) for t in ts):
            skipped[qid] = "empty_text"
        elif any(t["reference_image__missing"] or not t["reference_image__sha256"] or not t["reference_image__path"]
                 for t in ts):
            skipped[qid] = "reference_missing"
        elif qid not in with_positive:
            skipped[qid] = "no_target"
        else:
            eligible.append(qid)
    return eligible, skipped


def _gallery_rows(run: AuditRun) -> tuple[list[int], dict[str, Any]]:
    """Gallery image ids in order, and a description of where they came from."""
    entries = GalleryEntry.objects.filter(dataset_id=run.dataset_id, split=run.split)
    if entries.exists():
        rows = list(entries.order_by("ordinal", "image_id").values_list("image_id", "image__missing", "image__sha256", "image__path"))
        source = "split gallery"
    else:
        rows = list(
            Image.objects.filter(dataset_id=run.dataset_id).order_by("id").values_list("id", "missing", "sha256", "path")
        )
        source = "all dataset images (the split has no gallery)"
    seen: set[int] = set()
    ids: list[int] = []
    left_out = 0
    for image_id, missing, sha, path in rows:
        if image_id in seen:
            continue
        seen.add(image_id)
        if missing or not sha or not path:
            left_out += 1
            continue
        ids.append(image_id)
    return ids, {"source": source, "images": len(ids), "missing_left_out": left_out}


def _examples(skipped: dict[Any, str], n: int = 10) -> dict[str, list[int]]:
    """The first ``n`` query ids skipped for each reason."""
    out: dict[str, list[int]] = defaultdict(list)
    for q, reason in skipped.items():
        if len(out[reason]) < n:
            out[reason].append(int(q))
    return dict(out)


def _chunks(items: Sequence[int], size: int) -> list[list[int]]:
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def plan_run(run: AuditRun) -> bool:
    """Create the run's chunks once (idempotent); returns True if this call planned it."""
    with transaction.atomic():
        run = AuditRun.objects.select_for_update().get(pk=run.pk)
        if run.planned or not run.is_active:
            return False
        eligible, skipped = _eligibility(run)
        sessions, session_skipped = _session_eligibility(run)
        gallery, gallery_info = _gallery_rows(run)
        if not eligible and not sessions:
            why = Counter(skipped.values())
            why.update(f"session {r}" for r in session_skipped.values())
            raise AuditError("no query can be audited: " + (
                ", ".join(f"{n} {r}" for r, n in why.items()) or "the split is empty"
            ))
        if not gallery:
            raise AuditError("the gallery is empty (no image with a file on disk)")
        chunks: list[AuditChunk] = []
        for spec in run.retrievers:
            for n, part in enumerate(_chunks(gallery, run.chunk_gallery)):
                chunks.append(AuditChunk(run=run, retriever=spec, kind=AuditChunk.Kind.GALLERY, index=n,
                                         items=part, n_items=len(part)))
            for n, part in enumerate(_chunks(eligible, run.chunk_queries)):
                chunks.append(AuditChunk(run=run, retriever=spec, kind=AuditChunk.Kind.QUERIES, index=n,
                                         items=part, n_items=len(part)))
            for n, part in enumerate(_chunks(sessions, run.chunk_queries)):
                chunks.append(AuditChunk(run=run, retriever=spec, kind=AuditChunk.Kind.SESSIONS, index=n,
                                         items=part, n_items=len(part)))
        for n, part in enumerate(_chunks(sessions, run.chunk_queries)):
            chunks.append(AuditChunk(run=run, retriever=_tau_encoder(run), kind=AuditChunk.Kind.TEXTS, index=n,
                                     items=part, n_items=len(part)))
        AuditChunk.objects.bulk_create(chunks, batch_size=500)
        reasons = Counter(skipped.values())
        session_reasons = Counter(session_skipped.values())
        run.summary = {
            **run.summary,
            "plan": {
                "queries_in_split": len(eligible) + len(skipped) + len(sessions) + len(session_skipped),
                "eligible": len(eligible),
                "sessions_in_split": len(sessions) + len(session_skipped),
                "sessions_eligible": len(sessions),
                "gallery": gallery_info,
                "chunks": len(chunks),
                "retrievers": len(run.retrievers),
            },
            "skipped": {r: reasons[r] for r in SKIP_REASONS if reasons.get(r)},
            "plan_skipped": {r: reasons[r] for r in SKIP_REASONS if reasons.get(r)},
            "skipped_total": len(skipped),
            "skipped_examples": _examples(skipped),
        }
        if sessions or session_skipped:
            run.summary["session_plan"] = {
                "skipped": {r: session_reasons[r] for r in SESSION_SKIP_REASONS if session_reasons.get(r)},
                "skipped_examples": _examples(session_skipped),
            }
        run.total = sum(c.n_items for c in chunks)
        run.done = 0
        run.planned = True
        run.status = AuditRun.Status.RUNNING
        run.stage = "encoding gallery"
        run.started_at = run.started_at or timezone.now()
        run.save()
    return True


def fail_run(run_id: int, message: str) -> None:
    AuditRun.objects.filter(pk=run_id).exclude(status=AuditRun.Status.DONE).update(
        status=AuditRun.Status.FAILED, error=message[:20000], stage="failed", finished_at=timezone.now()
    )


# ----------------------------------------------------------------------------- leases


def claim_chunk(chunk_id: int, owner: str) -> bool:
    """Take the lease of a pending chunk, or of a running one whose lease is stale."""
    now = timezone.now()
    stale = now - timedelta(seconds=lease_seconds())
    return bool(
        AuditChunk.objects.filter(pk=chunk_id, attempts__lt=max_attempts())
        .filter(
            Q(status=AuditChunk.Status.PENDING)
            | Q(status=AuditChunk.Status.RUNNING, heartbeat_at__lt=stale)
            | Q(status=AuditChunk.Status.RUNNING, heartbeat_at__isnull=True)
        )
        .update(status=AuditChunk.Status.RUNNING, owner=owner, started_at=now, heartbeat_at=now,
                attempts=F("attempts") + 1, error="")
    )


class Heartbeat:
    """Renews a chunk's lease from a background thread while the chunk is computed."""

    def __init__(self, chunk_id: int, owner: str, interval: float) -> None:
        self.chunk_id = chunk_id
        self.owner = owner
        self.interval = max(0.05, interval)
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"audit-heartbeat-{chunk_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    n = AuditChunk.objects.filter(
                        pk=self.chunk_id, owner=self.owner, status=AuditChunk.Status.RUNNING
                    ).update(heartbeat_at=timezone.now())
                except Exception:  # a DB hiccup: try again at the next beat
                    logger.warning("heartbeat of chunk %s failed", self.chunk_id, exc_info=True)
                    continue
                if n == 0:
                    self.lost = True
                    return
        finally:
            connection.close()

    def check(self) -> None:
        if self.lost:
            raise LeaseLost(f"chunk {self.chunk_id} was taken over by another worker")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


# ----------------------------------------------------------------------------- chunk work


def _retriever(spec: str) -> Any:
    from .engine import get_retriever

    return get_retriever(
        spec, device=_setting("AUDIT_DEVICE", "") or None, batch_size=int(_setting("AUDIT_BATCH_SIZE", 64)),
        precision=_setting("AUDIT_PRECISION", "fp32"),
    )


def _cache(retriever: Any) -> Any:
    from retrieval.embcache import EmbeddingCache

    return EmbeddingCache(settings.EMBEDDING_CACHE_DIR, retriever.spec, retriever.dim)


def _image_path(root: str, rel: str) -> Path:
    try:
        return resolve_under(Path(root), rel) if root else Path(rel)
    except PathEscapeError:
        return Path("/nonexistent-escaped-path") / rel


def _image_files(image_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
    """Image id -> (sha256, path relative to the images root)."""
    out: dict[int, tuple[str, str]] = {}
    ids = list(image_ids)
    for start in range(0, len(ids), 5000):
        for pk, sha, path in Image.objects.filter(pk__in=ids[start:start + 5000]).values_list("id", "sha256", "path"):
            out[pk] = (sha, path)
    return out


def _locator(run: AuditRun, key_to_rel: dict[str, str]) -> Callable[[str], Path]:
    """key -> file, resolved (and checked against the images root) only when needed."""
    root = run.dataset.images_root
    return lambda key: _image_path(root, key_to_rel[key])


_gallery_memo: dict[tuple[int, str, str], tuple[list[int], list[str], dict[str, str]]] = {}


def _gallery_of(run: AuditRun, spec: str) -> tuple[list[int], list[str], dict[str, str]]:
    """The gallery of one retriever: its gallery chunks' images minus unreadable ones.

    Read once per process and run (done gallery chunks never change).
    """
    key = (run.pk, run.created_at.isoformat() if run.created_at else "", spec)
    if key not in _gallery_memo:
        if len(_gallery_memo) >= 4:
            _gallery_memo.pop(next(iter(_gallery_memo)))
        _gallery_memo[key] = _read_gallery(run, spec)
    return _gallery_memo[key]


def _read_gallery(run: AuditRun, spec: str) -> tuple[list[int], list[str], dict[str, str]]:
    ids: list[int] = []
    unreadable: set[int] = set()
    for items, stats in AuditChunk.objects.filter(run=run, retriever=spec, kind=AuditChunk.Kind.GALLERY).order_by(
        "index"
    ).values_list("items", "stats"):
        ids.extend(items)
        unreadable.update(int(i) for i in (stats or {}).get("unreadable", {}))
    ids = [i for i in ids if i not in unreadable]
    files = _image_files(ids)
    ids = [i for i in ids if i in files and files[i][0]]
    return ids, [files[i][0] for i in ids], {files[i][0]: files[i][1] for i in ids}


def _encode_gallery_chunk(run: AuditRun, chunk: AuditChunk, beat: Heartbeat | None) -> dict[str, Any]:
    from .engine import encode_images

    started = time.perf_counter()
    retriever = _retriever(chunk.retriever)
    build_s = time.perf_counter() - started
    cache = _cache(retriever)
    files = _image_files(chunk.items)
    ids = [i for i in chunk.items if i in files]
    enc = encode_images(
        retriever, cache, [files[i][0] for i in ids], _locator(run, {files[i][0]: files[i][1] for i in ids}),
        max_pixels=int(_setting("IMAGE_MAX_PIXELS", 64_000_000)), check=beat.check if beat else None,
    )
    bad = {str(i): enc.unreadable[files[i][0]] for i in ids if files[i][0] in enc.unreadable}
    return {
        "seconds": {"build": build_s, "encode": enc.seconds},
        "cache": {"gallery_hits": enc.hits, "gallery_encoded": enc.encoded},
        "unreadable": bad,
    }


def _chunk_gallery(run: AuditRun, chunk: AuditChunk, beat: Heartbeat | None) -> tuple[Any, ...]:
    """The retriever, its cache and the gallery matrix a ranking chunk works against.

    Returns ``(retriever, cache, max_pixels, gallery, gallery image ids, row of each image id,
    gallery encode stats, build seconds, gallery seconds)``."""
    from .engine import gallery_matrix

    t0 = time.perf_counter()
    retriever = _retriever(chunk.retriever)
    cache = _cache(retriever)
    build_s = time.perf_counter() - t0
    max_pixels = int(_setting("IMAGE_MAX_PIXELS", 64_000_000))

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


def _rank_query_chunk(run: AuditRun, chunk: AuditChunk, beat: Heartbeat | None) -> tuple[dict[str, Any], list[AuditRank]]:
    from .engine import encode_images, encode_texts, rank_three

    retriever, cache, max_pixels, gallery, g_ids, index_of, g_enc, build_s, gallery_s = _chunk_gallery(run, chunk, beat)

    # The chunk's queries, checked again (files can vanish between plan and run).
    eligible, skipped = _eligibility(run, chunk.items)
    skipped_out: dict[str, str] = {str(q): r for q, r in skipped.items()}
    turns = {
        t["query_id"]: t
        for t in Turn.objects.filter(query_id__in=eligible, index=1).values(
            "query_id", "reference_image_id", "reference_image__sha256", "reference_image__path", "texts"
        )
    }
    positives_of: dict[int, list[int]] = defaultdict(list)
    for qid, image_id in (
        Target.objects.filter(query_id__in=eligible, relevance__gt=0).exclude(role="neg").order_by("id")
        .values_list("query_id", "image_id")
    ):
        positives_of[qid].append(image_id)
    keys = [turns[q]["reference_image__sha256"] for q in eligible]
    locate = _locator(run, {turns[q]["reference_image__sha256"]: turns[q]["reference_image__path"] for q in eligible})
    img = encode_images(retriever, cache, keys, locate, max_pixels=max_pixels, check=beat.check if beat else None)
    kept = [q for q, ok in zip(eligible, img.ok) if ok]
    for q, ok in zip(eligible, img.ok):
        if not ok:
            skipped_out[str(q)] = "reference_unreadable"
    texts = [_turn_text(turns[q]["texts"]) for q in kept]
    txt = encode_texts(retriever, cache, texts)
    if beat:
        beat.check()

    positives = [[index_of[i] for i in positives_of[q] if i in index_of] for q in kept]
    exclude = [
        index_of.get(turns[q]["reference_image_id"]) if run.exclude_reference else None for q in kept
    ]
    no_positive = sum(
        1 for pos, ex in zip(positives, exclude) if not [p for p in pos if p != ex]
    )
    ranks = rank_three(retriever, img.matrix, txt.matrix, gallery, positives, exclude, panel_k=panel_k())
    rank_rows = [
        AuditRank(run_id=run.pk, query_id=q, retriever=chunk.retriever, mm=ranks.mm[n], text=ranks.text[n],
                  image=ranks.image[n], top_mm=[g_ids[j] for j in ranks.top_mm[n]])
        for n, q in enumerate(kept)
    ]
    stats = {
        "seconds": {"build": build_s, "gallery": gallery_s, "encode_images": img.seconds,
                    "encode_texts": txt.seconds, "rank": ranks.seconds},
        "cache": {
            "query_image_hits": img.hits, "query_image_encoded": img.encoded,
            "text_hits": txt.hits, "text_encoded": txt.encoded,
            # the gallery matrix read back for ranking (normally all cache hits)
            "gallery_read_hits": g_enc.hits if g_enc else 0, "gallery_read_encoded": g_enc.encoded if g_enc else 0,
            "gallery_memo": g_enc is None,
        },
        "skipped": skipped_out,
        "no_positive_in_gallery": no_positive,
        "ranked": len(kept),
        "gallery_size": len(g_ids),
    }
    return stats, rank_rows


def _rank_session_chunk(
    run: AuditRun, chunk: AuditChunk, beat: Heartbeat | None
) -> tuple[dict[str, Any], list[AuditSessionRank]]:
    """Rank every turn of the chunk's sessions (3 modalities x 3 strategies) for one retriever."""
    from .engine import encode_images, encode_texts, rank_sessions

    retriever, cache, max_pixels, gallery, g_ids, index_of, g_enc, build_s, gallery_s = _chunk_gallery(run, chunk, beat)

    eligible, skipped = _session_eligibility(run, chunk.items)
    skipped_out: dict[str, str] = {str(q): r for q, r in skipped.items()}
    turns = _session_turns(eligible)
    positives_of: dict[int, list[int]] = defaultdict(list)
    for qid, image_id in (
        Target.objects.filter(query_id__in=eligible, relevance__gt=0).exclude(role="neg").order_by("id")
        .values_list("query_id", "image_id")
    ):
        positives_of[qid].append(image_id)

    # One image encoding per distinct reference file, one text encoding per distinct text.
    key_rel = {t["reference_image__sha256"]: t["reference_image__path"] for q in eligible for t in turns[q]}
    keys = list(key_rel)
    img = encode_images(retriever, cache, keys, _locator(run, key_rel), max_pixels=max_pixels,
                        check=beat.check if beat else None)
    readable = [k for k, ok in zip(keys, img.ok) if ok]
    image_row = {k: n for n, k in enumerate(readable)}
    kept = []
    for q in eligible:
        if all(t["reference_image__sha256"] in image_row for t in turns[q]):
            kept.append(q)
        else:
            skipped_out[str(q)] = "reference_unreadable"
    texts = {q: [_turn_text(t["texts"]) for t in turns[q]] for q in kept}
    unique_texts = list(dict.fromkeys(x for q in kept for x in texts[q]))
    txt = encode_texts(retriever, cache, unique_texts)
    text_row = {x: n for n, x in enumerate(unique_texts)}
    if beat:
        beat.check()

    rank_s = 0.0
    out_rows: list[AuditSessionRank] = []
    no_positive = 0
    n_turns = sum(len(turns[q]) for q in kept)
    if kept:
        image_emb = img.matrix[[image_row[t["reference_image__sha256"]] for q in kept for t in turns[q]]]
        text_emb = txt.matrix[[text_row[x] for q in kept for x in texts[q]]]
        positives = [[index_of[i] for i in positives_of[q] if i in index_of] for q in kept]
        exclude = [
            index_of.get(t["reference_image_id"]) if run.exclude_reference else None for q in kept for t in turns[q]
        ]
        no_positive = sum(1 for pos in positives if not pos)
        from retrieval.sessions import DEFAULT_ALPHA

        result = rank_sessions(retriever, image_emb, text_emb, [len(turns[q]) for q in kept], gallery, positives,
                               exclude, alpha=DEFAULT_ALPHA)
        rank_s = result.seconds
        for (strategy, modality), per_session in result.ranks.items():
            out_rows.extend(
                AuditSessionRank(run_id=run.pk, query_id=q, retriever=chunk.retriever, strategy=strategy,
                                 modality=modality, ranks=per_session[n])
                for n, q in enumerate(kept)
            )
    stats = {
        "seconds": {"build": build_s, "gallery": gallery_s, "encode_images": img.seconds,
                    "encode_texts": txt.seconds, "rank": rank_s},
        "cache": {
            "session_image_hits": img.hits, "session_image_encoded": img.encoded,
            "session_text_hits": txt.hits, "session_text_encoded": txt.encoded,
            "gallery_read_hits": g_enc.hits if g_enc else 0, "gallery_read_encoded": g_enc.encoded if g_enc else 0,
        },
        "session_skipped": skipped_out,
        "no_positive_in_gallery": no_positive,
        "sessions_ranked": len(kept),
        "turns_ranked": n_turns,
        "gallery_size": len(g_ids),
    }
    return stats, out_rows


def _session_texts_chunk(run: AuditRun, chunk: AuditChunk, beat: Heartbeat | None) -> dict[str, Any]:
    """Each session's largest text-text cosine with the tau encoder (stored in the chunk's stats)."""
    from .engine import session_texts_max_cosine

    t0 = time.perf_counter()
    retriever = _retriever(chunk.retriever)
    cache = _cache(retriever)
    build_s = time.perf_counter() - t0
    turns = _session_turns(chunk.items)
    texts = [[x for x in (_turn_text(t["texts"]) for t in turns.get(q, [])) if x] for q in chunk.items]
    if beat:
        beat.check()
    worst, enc = session_texts_max_cosine(retriever, cache, texts)
    return {
        "seconds": {"build": build_s, "encode_texts": enc.seconds},
        "cache": {"tau_text_hits": enc.hits, "tau_text_encoded": enc.encoded},
        "max_text_cosine": {str(q): v for q, v in zip(chunk.items, worst)},
    }


def gallery_ready(run_id: int, spec: str) -> bool:
    return not AuditChunk.objects.filter(run_id=run_id, retriever=spec, kind=AuditChunk.Kind.GALLERY).exclude(
        status=AuditChunk.Status.DONE
    ).exists()


def process_chunk(chunk_id: int, owner: str | None = None, heartbeat: bool = True) -> str:
    """Run one chunk if it still needs running; returns what happened.

    ``"done"`` (it was already done: nothing recomputed), ``"busy"`` (another worker
    holds a live lease), ``"waiting"`` (a query chunk whose gallery is not encoded
    yet), ``"ok"`` (computed now), ``"failed"``, ``"lost"`` (lease taken over while
    computing; nothing written), ``"missing"``.
    """
    chunk = AuditChunk.objects.select_related("run", "run__dataset").filter(pk=chunk_id).first()
    if chunk is None:
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
            _fail_chunk(chunk, f"given up after {chunk.attempts} attempts (its worker was lost each time)")
            return "failed"
        return "busy" if chunk.status != AuditChunk.Status.FAILED else "failed"
    beat = Heartbeat(chunk.pk, owner, lease_seconds() / 4) if heartbeat else None
    rows: list[AuditRank] = []
    session_rows: list[AuditSessionRank] = []
    try:
        if chunk.kind == AuditChunk.Kind.GALLERY:
            stats = _encode_gallery_chunk(run, chunk, beat)
        elif chunk.kind == AuditChunk.Kind.SESSIONS:
            stats, session_rows = _rank_session_chunk(run, chunk, beat)
        elif chunk.kind == AuditChunk.Kind.TEXTS:
            stats = _session_texts_chunk(run, chunk, beat)
        else:
            stats, rows = _rank_query_chunk(run, chunk, beat)
        if beat:
            beat.check()
    except LeaseLost:
        logger.warning("audit chunk %s: lease lost, leaving it to its new owner", chunk.pk)
        return "lost"
    except Exception as exc:  # recorded on the run; a person decides whether to retry
        logger.exception("audit chunk %s failed", chunk.pk)
        _fail_chunk(chunk, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
        return "failed"
    finally:
        if beat:
            beat.stop()
    t0 = time.perf_counter()
    with transaction.atomic():
        if rows:
            AuditRank.objects.bulk_create(rows, batch_size=1000, ignore_conflicts=True)
        if session_rows:
            AuditSessionRank.objects.bulk_create(session_rows, batch_size=1000, ignore_conflicts=True)
        stats.setdefault("seconds", {})["write"] = time.perf_counter() - t0
        AuditChunk.objects.filter(pk=chunk.pk).exclude(status=AuditChunk.Status.DONE).update(
            status=AuditChunk.Status.DONE, finished_at=timezone.now(), heartbeat_at=timezone.now(), stats=stats,
        )
    update_progress(run.pk)
    return "ok"


def _fail_chunk(chunk: AuditChunk, message: str) -> None:
    AuditChunk.objects.filter(pk=chunk.pk).exclude(status=AuditChunk.Status.DONE).update(
        status=AuditChunk.Status.FAILED, error=message[:20000], finished_at=timezone.now()
    )
    first_line = message.splitlines()[0] if message else "failed"
    fail_run(chunk.run_id, f"chunk {chunk.kind} #{chunk.index} of {chunk.retriever}: {first_line}\n\n{message}")


def update_progress(run_id: int) -> None:
    """Recount finished work and refresh the ETA."""
    done = AuditChunk.objects.filter(run_id=run_id, status=AuditChunk.Status.DONE).aggregate(s=Sum("n_items"))["s"] or 0
    run = AuditRun.objects.filter(pk=run_id).only("started_at", "total", "status").first()
    if run is None:
        return
    eta = None
    if run.started_at and done and run.total:
        elapsed = (timezone.now() - run.started_at).total_seconds()
        eta = max(0.0, elapsed * (run.total - done) / done)
    gallery_left = AuditChunk.objects.filter(run_id=run_id, kind=AuditChunk.Kind.GALLERY).exclude(
        status=AuditChunk.Status.DONE
    ).exists()
    AuditRun.objects.filter(pk=run_id, status=AuditRun.Status.RUNNING).update(
        done=done, eta_seconds=eta, stage="encoding gallery" if gallery_left else "ranking queries"
    )


# ----------------------------------------------------------------------------- aggregation


def _rank_rows(run: AuditRun, exclude_queries: set[int] = frozenset()) -> list[tuple[int, str, Any, Any, Any]]:
    """(query, retriever, mm, text, image) rows in query order, then pool order."""
    order = {name: n for n, name in enumerate(run.retrievers)}
    rows = [
        (q, r, mm, t, i, ordinal)
        for q, r, mm, t, i, ordinal in AuditRank.objects.filter(run=run).values_list(
            "query_id", "retriever", "mm", "text", "image", "query__ordinal"
        )
        if q not in exclude_queries
    ]
    rows.sort(key=lambda x: (x[5], x[0], order.get(x[1], len(order)), str(x[1])))
    return [row[:5] for row in rows]


def _stats_json(stats: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    return {str(k): v for k, v in stats.items()}


def subset_scores(run: AuditRun, query_ids: Iterable[int]) -> dict[str, dict[str, Any]]:
    """Per-retriever :func:`retrieval.metrics.modality_scores` over some of the run's queries."""
    wanted = set(query_ids)
    per: dict[str, dict[int, tuple[Any, Any, Any]]] = defaultdict(dict)
    labelled = set(AuditLabel.objects.filter(run=run, query_id__in=wanted).values_list("query_id", flat=True))
    for q, r, mm, t, i in AuditRank.objects.filter(run=run, query_id__in=labelled).values_list(
        "query_id", "retriever", "mm", "text", "image"
    ):
        per[r][q] = (mm, t, i)
    out: dict[str, dict[str, Any]] = {}
    if not labelled:
        return out
    qs = sorted(labelled)
    for name in run.retrievers:
        got = per.get(name, {})
        triples = [got.get(q, (None, None, None)) for q in qs]
        out[name] = modality_scores({m: [t[n] for t in triples] for n, m in enumerate(MODALITIES)}, k=run.k)
    return out


def _fmt_json(stats: dict[str, Any]) -> dict[str, Any]:
    """A :func:`retrieval.sessions.session_metrics` dict with the violation ids replaced by their count."""
    out = dict(stats)
    out["epsilon_violations"] = len(out.get("epsilon_violations", []))
    return out


def session_rank_table(run: AuditRun) -> dict[str, dict[str, dict[str, dict[int, list[Any]]]]]:
    """``{retriever: {strategy: {modality: {session id: [r_1, ..., r_L]}}}}`` from the stored rows."""
    table: dict[str, dict[str, dict[str, dict[int, list[Any]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(dict))
    )
    for q, r, strategy, modality, ranks in AuditSessionRank.objects.filter(run=run).values_list(
        "query_id", "retriever", "strategy", "modality", "ranks"
    ):
        table[r][strategy][modality][q] = ranks
    return table


def filter_sessions(
    sessions: dict[Any, list[Any]],
    max_text_cosine: dict[Any, float | None],
    k: int,
    epsilon: float,
    tau: float,
) -> dict[str, Any]:
    """The CIRCLED filter chain on ranks plus the tau step on precomputed text cosines.

    Success, multi-turn and epsilon-consistency come from
    :func:`retrieval.sessions.apply_filters`; tau-diversity removes a session whose
    largest text-text cosine is ``>= tau`` (same rule as
    :func:`retrieval.sessions.passes_tau_diversity`; a session without a computed value
    passes and is counted in ``tau_missing``). Returns the
    :meth:`~retrieval.sessions.FilterReport.as_dict` form (``removed_ids`` kept).
    """
    from retrieval.sessions import apply_filters

    report = apply_filters(sessions, None, k=k, epsilon=epsilon, tau=tau).as_dict()
    steps = [st for st in report["steps"] if st["name"] != "tau_diversity"]
    remaining = list(report["kept"])
    fails = {q for q in sessions if max_text_cosine.get(q) is not None and max_text_cosine[q] >= tau}
    removed = [q for q in remaining if q in fails]
    kept = [q for q in remaining if q not in fails]
    steps.append({"name": "tau_diversity", "removed": len(removed), "removed_ids": removed, "remaining": len(kept),
                  "removed_alone": len(fails), "skipped": False})
    return {
        "n_sessions": report["n_sessions"], "kept": kept, "n_kept": len(kept), "steps": steps,
        "tau_missing": sum(1 for q in sessions if q not in max_text_cosine),
    }


def aggregate_sessions(run: AuditRun, chunks: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[int]]:
    """The ``sessions`` part of the run's summary and the ids of the sessions kept by every filter.

    Per retriever x strategy x modality: :func:`retrieval.sessions.session_metrics`
    (Hits@K curve over turns ``1..L_max``, Final Recall@K, AUC, epsilon-consistent
    count) and how many sessions pass all filters; the filter table (success ->
    multi-turn -> epsilon -> tau) on :data:`SESSION_FILTER_BASIS` of the first
    retriever; the turn-length histograms. ``(None, [])`` when the split has no sessions.
    """
    from retrieval.sessions import DEFAULT_ALPHA, STRATEGIES, session_metrics

    plan = run.summary.get("session_plan")
    if plan is None:
        return None, []
    chunk_skips: dict[str, str] = {}
    max_cos: dict[int, float | None] = {}
    no_positive: dict[str, int] = defaultdict(int)
    for c in chunks:
        st = c["stats"] or {}
        if c["kind"] == AuditChunk.Kind.SESSIONS:
            chunk_skips.update(st.get("session_skipped", {}))
            no_positive[c["retriever"]] += int(st.get("no_positive_in_gallery", 0))
        elif c["kind"] == AuditChunk.Kind.TEXTS:
            max_cos.update({int(q): v for q, v in st.get("max_text_cosine", {}).items()})
    reasons = Counter(plan.get("skipped", {}))
    reasons.update(chunk_skips.values())
    examples = dict(plan.get("skipped_examples", {}))
    for reason, ids in _examples(chunk_skips).items():
        examples[reason] = (examples.get(reason, []) + ids)[:10]

    table = session_rank_table(run)
    dropped = {int(q) for q in chunk_skips}
    scored = {q for r in table.values() for s in r.values() for m in s.values() for q in m} - dropped
    order = dict(Query.objects.filter(pk__in=scored).values_list("pk", "ordinal"))
    ids = sorted(scored, key=lambda q: (order.get(q, 0), q))
    lengths = {q: len(next(m[q] for r in table.values() for s in r.values() for m in s.values() if q in m))
               for q in ids}
    k, eps, tau = run.k, run.epsilon, run.tau

    def ranks_of(name: str, strategy: str, modality: str) -> dict[int, list[Any]]:
        got = table.get(name, {}).get(strategy, {}).get(modality, {})
        return {q: got.get(q, [None] * lengths[q]) for q in ids}

    metrics: dict[str, Any] = {}
    kept_per: dict[str, Any] = {}
    for name in run.retrievers:
        for strategy in STRATEGIES:
            for modality in MODALITIES:
                sess = ranks_of(name, strategy, modality)
                metrics.setdefault(name, {}).setdefault(strategy, {})[modality] = _fmt_json(
                    session_metrics(sess, k=k, epsilon=eps)
                )
                kept_per.setdefault(name, {}).setdefault(strategy, {})[modality] = (
                    filter_sessions(sess, max_cos, k, eps, tau)["n_kept"] if ids else 0
                )
    basis = {"retriever": run.retrievers[0], **SESSION_FILTER_BASIS}
    filters = filter_sessions(ranks_of(basis["retriever"], basis["strategy"], basis["modality"]), max_cos, k, eps, tau)
    kept = filters.pop("kept")
    for st in filters["steps"]:
        st["removed_examples"] = st.pop("removed_ids")[:10]
    worst = [max_cos[q] for q in ids if max_cos.get(q) is not None]
    summary = {
        "n_sessions": len(ids),
        "sessions_in_split": run.summary.get("plan", {}).get("sessions_in_split", len(ids)),
        "l_max": max(lengths.values(), default=0),
        "k": k, "alpha": DEFAULT_ALPHA, "epsilon": eps, "tau": tau, "tau_encoder": _tau_encoder(run),
        "strategies": list(STRATEGIES), "modalities": list(MODALITIES),
        "metrics": metrics,
        "kept_per_ranking": kept_per,
        "filter_basis": basis,
        "filters": filters,
        "turn_histogram": {str(n): c for n, c in sorted(Counter(lengths.values()).items())},
        "kept_turn_histogram": {str(n): c for n, c in sorted(Counter(lengths[q] for q in kept).items())},
        "text_cosine": {"sessions": len(worst), "at_or_above_tau": sum(1 for v in worst if v >= tau),
                        "max": max(worst, default=None)},
        "skipped": {r: reasons[r] for r in SESSION_SKIP_REASONS if reasons.get(r)}
        | {r: n for r, n in reasons.items() if r not in SESSION_SKIP_REASONS},
        "skipped_total": sum(reasons.values()),
        "skipped_examples": examples,
        "no_positive_in_gallery": max(no_positive.values(), default=0),
        "subset": subset_name(run, SESSIONS_KEPT),
    }
    return summary, kept


def aggregate_run(run_id: int, override_support: dict[int, dict[str, int]] | None = None) -> bool:
    """Label the run's queries once every chunk is done; returns True if this call finished it.

    Safe to call twice or concurrently: the labels are computed outside the
    transaction and written only by the call that still finds the run unfinished.
    ``override_support`` (imported aggregated files) replaces the support counts that
    :func:`label_queries` derives with those the file recorded for the real pool.
    """
    started = time.perf_counter()
    run = AuditRun.objects.select_related("dataset").filter(pk=run_id).first()
    if run is None or run.status != AuditRun.Status.RUNNING:
        return False
    chunks = list(AuditChunk.objects.filter(run=run).values("kind", "status", "stats", "retriever"))
    if any(c["status"] != AuditChunk.Status.DONE for c in chunks):
        return False

    # Queries skipped by a chunk (e.g. a reference file that became unreadable) are
    # left out for the whole pool, so every labelled query has a row per retriever.
    chunk_skips: dict[str, str] = {}
    no_positive: dict[str, int] = defaultdict(int)
    for c in chunks:
        chunk_skips.update((c["stats"] or {}).get("skipped", {}))
        if c["kind"] == AuditChunk.Kind.QUERIES:
            no_positive[c["retriever"]] += int((c["stats"] or {}).get("no_positive_in_gallery", 0))
    reasons = Counter(run.summary.get("plan_skipped", {}))
    reasons.update(chunk_skips.values())
    examples = dict(run.summary.get("skipped_examples", {}))
    for reason, ids in _examples(chunk_skips).items():
        examples[reason] = (examples.get(reason, []) + ids)[:10]
    rows = _rank_rows(run, exclude_queries={int(q) for q in chunk_skips})
    audit = label_queries(rows, k=run.k, min_mm_retrievers=run.min_mm_retrievers)
    if override_support:
        for q, sup in override_support.items():
            if q in audit.support:
                audit.support[q] = {key: int(sup.get(key, audit.support[q][key])) for key in SUPPORT_KEYS}
        audit.support_histograms = {
            key: dict(sorted(Counter(s[key] for s in audit.support.values()).items())) for key in SUPPORT_KEYS
        }
    sf_scores = subset_scores_from_rows(run, rows, set(audit.shortcut_free))
    sessions, sessions_kept = aggregate_sessions(run, chunks)
    summary = {
        **run.summary,
        "k": run.k,
        "min_mm_retrievers": run.min_mm_retrievers,
        "n_queries": len(audit.queries),
        "counts": audit.counts,
        "detail_counts": audit.detail_counts,
        "support_histograms": {k: {str(n): c for n, c in h.items()} for k, h in audit.support_histograms.items()},
        "retriever_stats": _stats_json(audit.retriever_stats),
        "shortcut_free_stats": sf_scores,
        "skipped": {r: reasons[r] for r in SKIP_REASONS if reasons.get(r)}
        | {r: n for r, n in reasons.items() if r not in SKIP_REASONS},
        "skipped_total": sum(reasons.values()),
        "skipped_examples": examples,
        "no_positive_in_gallery": max(no_positive.values()) if no_positive else run.summary.get("no_positive_in_gallery", 0),
    }
    if sessions is not None:
        summary["sessions"] = sessions
    timings = _timings(run, chunks)
    label_rows = [
        AuditLabel(
            run=run, query_id=q, label=audit.labels[q], detail=audit.detail[q], legacy=audit.legacy[q],
            support_mm=audit.support[q]["multimodal"], support_text=audit.support[q]["text_only"],
            support_image=audit.support[q]["image_only"], support_either=audit.support[q]["either_unimodal"],
            best_mm=audit.best_ranks[q]["multimodal"], best_text=audit.best_ranks[q]["text_only"],
            best_image=audit.best_ranks[q]["image_only"],
            best_retriever={m: (str(v) if v is not None else None) for m, v in audit.best_retriever[q].items()},
        )
        for q in audit.queries
    ]
    with transaction.atomic():
        locked = AuditRun.objects.select_for_update().get(pk=run.pk)
        if locked.status != AuditRun.Status.RUNNING:
            return False
        AuditLabel.objects.filter(run=run).delete()
        AuditLabel.objects.bulk_create(label_rows, batch_size=1000)
        _write_subsets(run, audit)
        if sessions is not None:
            subset, _ = QuerySubset.objects.update_or_create(
                dataset=run.dataset, name=subset_name(run, SESSIONS_KEPT), defaults={"source": f"audit {run.pk}"}
            )
            subset.queries.set(sessions_kept)
        timings["aggregate"] = time.perf_counter() - started
        now = timezone.now()
        if locked.started_at:
            timings["wall"] = (now - locked.started_at).total_seconds()
        locked.summary = summary
        locked.timings = {**locked.timings, **timings}
        locked.status = AuditRun.Status.DONE
        locked.stage = "done"
        locked.done = locked.total
        locked.eta_seconds = 0.0
        locked.finished_at = now
        locked.error = ""
        locked.save()
    return True


def subset_scores_from_rows(
    run: AuditRun, rows: Sequence[tuple[int, str, Any, Any, Any]], queries: set[Any]
) -> dict[str, dict[str, Any]]:
    """Per-retriever scores over ``queries`` from already-loaded rank rows."""
    if not queries:
        return {}
    per: dict[str, dict[Any, tuple[Any, Any, Any]]] = defaultdict(dict)
    for q, r, mm, t, i in rows:
        if q in queries:
            per[r][q] = (mm, t, i)
    qs = sorted(queries, key=str)
    out: dict[str, dict[str, Any]] = {}
    for name in run.retrievers:
        got = per.get(name, {})
        triples = [got.get(q, (None, None, None)) for q in qs]
        out[name] = modality_scores({m: [t[n] for t in triples] for n, m in enumerate(MODALITIES)}, k=run.k)
    return out


def _timings(run: AuditRun, chunks: list[dict[str, Any]]) -> dict[str, Any]:
    secs: dict[str, float] = defaultdict(float)
    cache: dict[str, int] = defaultdict(int)
    per: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for c in chunks:
        st = c["stats"] or {}
        s = st.get("seconds", {})
        name = c["retriever"]
        if c["kind"] == AuditChunk.Kind.GALLERY:
            secs["encode_gallery"] += s.get("encode", 0.0)
            per[name]["encode_gallery"] += s.get("encode", 0.0)
        elif c["kind"] == AuditChunk.Kind.SESSIONS:
            q = s.get("encode_images", 0.0) + s.get("encode_texts", 0.0)
            secs["encode_sessions"] += q
            secs["load_gallery"] += s.get("gallery", 0.0)
            secs["rank_sessions"] += s.get("rank", 0.0) + s.get("write", 0.0)
            per[name]["encode_sessions"] += q
            per[name]["rank_sessions"] += s.get("rank", 0.0) + s.get("write", 0.0)
        elif c["kind"] == AuditChunk.Kind.TEXTS:
            secs["encode_session_texts"] += s.get("encode_texts", 0.0)
            per[name]["encode_session_texts"] += s.get("encode_texts", 0.0)
        else:
            q = s.get("encode_images", 0.0) + s.get("encode_texts", 0.0)
            secs["encode_queries"] += q
            secs["load_gallery"] += s.get("gallery", 0.0)
            secs["rank"] += s.get("rank", 0.0) + s.get("write", 0.0)
            per[name]["encode_queries"] += q
            per[name]["rank"] += s.get("rank", 0.0) + s.get("write", 0.0)
        secs["build_models"] += s.get("build", 0.0)
        for key, value in st.get("cache", {}).items():
            if isinstance(value, bool):
                cache[key + "_count"] += int(value)
            else:
                cache[key] += int(value)
    cache["encoded"] = sum(cache.get(k, 0) for k in (
        "gallery_encoded", "query_image_encoded", "text_encoded", "gallery_read_encoded",
        "session_image_encoded", "session_text_encoded", "tau_text_encoded"))
    return {**{k: round(v, 4) for k, v in secs.items()}, "cache": dict(cache),
            "per_retriever": {k: {kk: round(vv, 4) for kk, vv in v.items()} for k, v in per.items()}}


def _write_subsets(run: AuditRun, audit: AuditLabels) -> None:
    by_label: dict[str, list[int]] = defaultdict(list)
    for q, label in audit.labels.items():
        by_label[label].append(q)
    members = {
        "shortcut_free": [q for q in audit.queries if audit.labels[q] in SHORTCUT_FREE],
        **{label: by_label.get(label, []) for label in LABELS},
    }
    source = f"audit {run.pk}"
    for name in SUBSET_NAMES:
        subset, _ = QuerySubset.objects.update_or_create(
            dataset=run.dataset, name=subset_name(run, name), defaults={"source": source}
        )
        subset.queries.set(members[name])
    if not audit.queries:
        return  # a sessions-only audit says nothing about single-turn shortcuts: keep the latest subset
    latest, _ = QuerySubset.objects.update_or_create(
        dataset=run.dataset, name=LATEST_SUBSET, defaults={"source": f"{source} (latest audit)"}
    )
    latest.queries.set(members["shortcut_free"])


# ----------------------------------------------------------------------------- in-process run


def run_inline(run: AuditRun, progress: Progress | None = None) -> AuditRun:
    """Plan and run every chunk in this process, then aggregate (no worker needed)."""
    try:
        plan_run(run)
    except AuditError as exc:
        fail_run(run.pk, str(exc))
        run.refresh_from_db()
        return run
    run.refresh_from_db()
    owner = f"inline:{default_owner()}"
    order = [(spec, kind) for spec in run.retrievers
             for kind in (AuditChunk.Kind.GALLERY, AuditChunk.Kind.QUERIES, AuditChunk.Kind.SESSIONS)]
    order.append((None, AuditChunk.Kind.TEXTS))
    for spec, kind in order:
        chunks = AuditChunk.objects.filter(run=run, kind=kind)
        if spec is not None:
            chunks = chunks.filter(retriever=spec)
        for chunk_id in chunks.exclude(status=AuditChunk.Status.DONE).order_by("index").values_list("pk", flat=True):
            # A chunk leased by a live worker is left to it; re-claiming is allowed
            # only once the lease is stale (same rule as for workers).
            result = process_chunk(chunk_id, owner=owner, heartbeat=False)
            if result == "failed":
                run.refresh_from_db()
                return run
            if progress:
                run.refresh_from_db()
                progress(run)
    aggregate_run(run.pk)
    run.refresh_from_db()
    return run


# ----------------------------------------------------------------------------- dispatch and recovery


def _send_chunk(chunk_id: int, kind: str) -> None:
    from . import tasks

    task = {
        AuditChunk.Kind.GALLERY: tasks.encode_gallery_chunk,
        AuditChunk.Kind.QUERIES: tasks.rank_query_chunk,
        AuditChunk.Kind.SESSIONS: tasks.rank_session_chunk,
        AuditChunk.Kind.TEXTS: tasks.encode_session_texts_chunk,
    }[kind]
    task.delay(chunk_id)


def kick_coordinator(run_id: int, countdown: float = 0) -> str:
    """Start a new coordinating task for the run; any older one stops at its next tick."""
    from . import tasks

    token = uuid.uuid4().hex
    n = AuditRun.objects.filter(pk=run_id, status__in=[AuditRun.Status.QUEUED, AuditRun.Status.RUNNING]).update(
        coordinator_token=token, coordinator_seen_at=timezone.now()
    )
    if n:
        tasks.coordinate.apply_async((run_id, token), countdown=countdown or None)
    return token


def dispatch_ready(run_id: int) -> int:
    """Send every chunk that can run and was never sent; returns how many were sent."""
    sent = 0
    chunks = list(
        AuditChunk.objects.filter(run_id=run_id, enqueued_at__isnull=True, status=AuditChunk.Status.PENDING)
        .order_by("kind", "retriever", "index").values_list("pk", "kind", "retriever")
    )
    ready_specs: dict[str, bool] = {}
    for pk, kind, spec in chunks:
        if kind in SESSION_CHUNK_KINDS:
            if spec not in ready_specs:
                ready_specs[spec] = gallery_ready(run_id, spec)
            if not ready_specs[spec]:
                continue
        if AuditChunk.objects.filter(pk=pk, enqueued_at__isnull=True).update(enqueued_at=timezone.now()):
            _send_chunk(pk, kind)
            sent += 1
    return sent


def reconcile(run: AuditRun | int, takeover: bool = False) -> dict[str, int]:
    """Bring a run forward: resend stale chunks, send ready ones, restart coordination.

    * a running chunk whose heartbeat is older than the lease: its worker is gone; it
      is set back to pending and sent again (or failed after too many attempts);
    * a pending chunk sent more than a lease ago, while the run showed no activity for
      a lease: its message was lost; it is sent again;
    * chunks whose dependencies are met and that were never sent are sent;
    * the coordinating task is restarted when it has not ticked for a while, or
      always with ``takeover`` (a worker starting up takes over).

    Every resend is harmless: a chunk that turns out to be done or leased returns at
    once. Returns counts of what was done.
    """
    run_id = run if isinstance(run, int) else run.pk
    run = AuditRun.objects.filter(pk=run_id).first()
    out = {"resent_stale": 0, "resent_lost": 0, "sent": 0, "failed": 0, "coordinator": 0, "aggregated": 0}
    if run is None or not run.is_active:
        return out
    now = timezone.now()
    lease = lease_seconds()
    stale = now - timedelta(seconds=lease)
    coord_stale = now - timedelta(seconds=max(lease, 3 * coordinator_seconds()))
    if run.planned:
        for chunk in AuditChunk.objects.filter(run=run, status=AuditChunk.Status.RUNNING).filter(
            Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True)
        ):
            if chunk.attempts >= max_attempts():
                _fail_chunk(chunk, f"given up after {chunk.attempts} attempts (its worker was lost each time)")
                out["failed"] += 1
                return out
            if AuditChunk.objects.filter(pk=chunk.pk, status=AuditChunk.Status.RUNNING, heartbeat_at=chunk.heartbeat_at).update(
                status=AuditChunk.Status.PENDING, owner="", enqueued_at=now
            ):
                _send_chunk(chunk.pk, chunk.kind)
                out["resent_stale"] += 1
        last = AuditChunk.objects.filter(run=run).aggregate(
            beat=Max("heartbeat_at"), sent=Max("enqueued_at")
        )
        activity = max([t for t in (last["beat"], run.started_at) if t is not None], default=None)
        if activity is None or activity < stale:
            for pk, kind in AuditChunk.objects.filter(
                run=run, status=AuditChunk.Status.PENDING, enqueued_at__lt=stale
            ).values_list("pk", "kind"):
                if AuditChunk.objects.filter(pk=pk, status=AuditChunk.Status.PENDING, enqueued_at__lt=stale).update(
                    enqueued_at=now
                ):
                    _send_chunk(pk, kind)
                    out["resent_lost"] += 1
        out["sent"] = dispatch_ready(run.pk)
        if not AuditChunk.objects.filter(run=run).exclude(status=AuditChunk.Status.DONE).exists():
            out["aggregated"] = int(aggregate_run(run.pk))
            if out["aggregated"]:
                return out
    if takeover or run.coordinator_seen_at is None or run.coordinator_seen_at < coord_stale:
        kick_coordinator(run.pk)
        out["coordinator"] = 1
    return out


def reconcile_active(takeover: bool = False) -> dict[int, dict[str, int]]:
    """:func:`reconcile` every queued or running computed run."""
    out: dict[int, dict[str, int]] = {}
    for pk in AuditRun.objects.filter(
        status__in=[AuditRun.Status.QUEUED, AuditRun.Status.RUNNING], source=AuditRun.Source.COMPUTED
    ).values_list("pk", flat=True):
        try:
            out[pk] = reconcile(pk, takeover=takeover)
        except Exception:
            logger.exception("reconcile of audit %s failed", pk)
    return out


def coordinate(run_id: int, token: str) -> str:
    """One tick of the coordinating task: plan, reconcile, aggregate or re-check later."""
    run = AuditRun.objects.filter(pk=run_id).first()
    if run is None:
        return "missing"
    if not run.is_active:
        return run.status
    if run.coordinator_token != token:
        return "superseded"
    AuditRun.objects.filter(pk=run_id, coordinator_token=token).update(coordinator_seen_at=timezone.now())
    if not run.planned:
        try:
            plan_run(run)
        except AuditError as exc:
            fail_run(run.pk, str(exc))
            return "failed"
    result = reconcile(run.pk)
    run.refresh_from_db()
    if not run.is_active:
        return run.status
    from . import tasks

    tasks.coordinate.apply_async((run_id, token), countdown=coordinator_seconds())
    return "waiting" if not result["aggregated"] else "done"


def retry_failed(run: AuditRun) -> int:
    """Put a failed run's failed chunks back to pending and the run back to running."""
    n = AuditChunk.objects.filter(run=run, status=AuditChunk.Status.FAILED).update(
        status=AuditChunk.Status.PENDING, attempts=0, enqueued_at=None, error="", owner=""
    )
    AuditChunk.objects.filter(run=run, status=AuditChunk.Status.PENDING).update(enqueued_at=None)
    AuditRun.objects.filter(pk=run.pk, status=AuditRun.Status.FAILED).update(
        status=AuditRun.Status.RUNNING if run.planned else AuditRun.Status.QUEUED, error="", finished_at=None
    )
    return n


# ----------------------------------------------------------------------------- read side


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
    k = panel_k()
    ids: list[int] = []
    for pos in range(k):
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


def label_table(runs: Iterable[AuditRun]) -> list[dict[str, Any]]:
    """One CIRCUS-Table-1-like row per finished run: dataset, total and label counts."""
    rows = []
    for run in runs:
        counts = run.summary.get("counts", {})
        rows.append({
            "run": run, "dataset": run.dataset.name, "split": run.split, "total": run.summary.get("n_queries", 0),
            **{label: counts.get(label, 0) for label in (*LABELS, "shortcut_free")},
        })
    return rows
