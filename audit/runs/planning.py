"""Planning an audit run: which queries and sessions, which gallery, which chunks."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from retrieval.captions import CAPTION_JOINS, DEFAULT_JOIN, ranking_text
from retrieval.evaltargets import dataset_format, facts_by_query, positive_image_ids
from retrieval.galleries import (
    ScopeError,
    gallery_image_ids,
    mixed_fallback,
    parse_scope,
    query_gallery_keys,
    scope_text,
    split_of_scope,
)
from retrieval.models import (
    Dataset,
    Query,
    Turn,
    turn_text,
)
from retrieval.retrievers import MODALITY_RULES, canonical_spec
from retrieval.targets import TargetFacts

from ..models import AuditChunk, AuditRun
from .base import SESSION_SKIP_REASONS, SKIP_REASONS, AuditError, plain_rows


def query_splits(dataset: Dataset) -> list[str]:
    return sorted(set(Query.objects.filter(dataset=dataset).values_list("split", flat=True)))


def resolve_split(dataset: Dataset, split: str | None) -> str:
    """The scope to audit (stored as ``AuditRun.split``): the split given, a category of it
    (``dress/val``) or a category of the only split (``dress``), else the dataset's only split
    (:func:`retrieval.galleries.parse_scope`)."""
    splits = query_splits(dataset)
    if not splits:
        raise AuditError(f"dataset {dataset.name!r} has no queries")
    categories = set(Query.objects.filter(dataset=dataset).order_by().values_list("category", flat=True).distinct())
    try:
        return scope_text(*parse_scope(split, splits, categories - {""}))
    except ScopeError as exc:
        raise AuditError(f"dataset {dataset.name!r}: {exc}") from None


def scope_queries(run: AuditRun) -> Any:
    """The queries of the run's scope (its split, and its category when it names one)."""
    return queries_in_scope(run.dataset_id, run.split)


def queries_in_scope(dataset_id: int, scope: str) -> Any:
    """The queries of a stored scope (:func:`resolve_split`): a split and, when the scope names
    one, a category of it; the empty scope of an imported run made without a split is every
    query of the dataset."""
    qs = Query.objects.filter(dataset_id=dataset_id)
    if not scope:
        return qs
    split, category = split_of_scope(scope)
    qs = qs.filter(split=split)
    return qs.filter(category=category) if category else qs


def normalise_retrievers(specs: Iterable[str]) -> list[str]:
    """Validate retriever specs and return their canonical forms, de-duplicated in order."""
    out: list[str] = []
    for spec in specs:
        spec = (spec or "").strip()
        if not spec:
            continue
        canonical = canonical_spec(spec)
        if canonical not in out:
            out.append(canonical)
    if not out:
        raise AuditError("name at least one retriever, e.g. 'openclip:cirval-tiny-vit'")
    return out


def _find_dataset(dataset: Dataset | str) -> Dataset:
    if not isinstance(dataset, str):
        return dataset
    found = Dataset.objects.filter(name=dataset).first()
    if found is None:
        raise AuditError(f"no dataset named {dataset!r}")
    return found


def _session_parameters(epsilon: float | None, tau: float | None) -> tuple[float, float]:
    """The session filters' epsilon and tau, from the arguments or the settings, checked."""
    eps = float(settings.AUDIT_SESSION_EPSILON if epsilon is None else epsilon)
    if isinstance(epsilon, bool) or not math.isfinite(eps) or eps < 0:
        raise AuditError("epsilon must be a finite number >= 0")
    t = float(settings.AUDIT_SESSION_TAU if tau is None else tau)
    if isinstance(tau, bool) or not math.isfinite(t) or not -1.0 <= t <= 1.0:
        raise AuditError("tau must be a cosine between -1 and 1")
    return eps, t


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
    caption_join: str = "cirval",
    modality_rule: str | None = None,
) -> AuditRun:
    """Validate the request and store a queued run (nothing is computed yet).

    ``epsilon``, ``tau`` and ``tau_encoder`` parameterise the session filters
    (defaults: ``AUDIT_SESSION_EPSILON`` = 30, ``AUDIT_SESSION_TAU`` = 0.8 and the
    pool's first retriever); they are stored on the run, the encoder as a canonical spec.
    ``caption_join``: how a turn's captions become the encoded text (:mod:`retrieval.captions`).
    ``modality_rule``: how the text-only and image-only queries are formed (``family`` or
    ``circus``; default ``AUDIT_MODALITY_RULE``), recorded in the run's summary: every worker
    that runs its chunks uses the run's rule (:func:`run_modality_rule`), whatever its own setting.
    """
    dataset = _find_dataset(dataset)
    if isinstance(k, bool) or int(k) < 1:
        raise AuditError("K must be an integer >= 1")
    if isinstance(min_mm_retrievers, bool) or int(min_mm_retrievers) < 0:
        raise AuditError("the minimum number of multimodal retrievers must be >= 0")
    specs = normalise_retrievers(retrievers)
    eps, t = _session_parameters(epsilon, tau)
    tau_spec = normalise_retrievers([tau_encoder])[0] if (tau_encoder or "").strip() else specs[0]
    cq = int(chunk_queries or settings.AUDIT_CHUNK_QUERIES)
    cg = int(chunk_gallery or settings.AUDIT_CHUNK_GALLERY)
    if cq < 1 or cg < 1:
        raise AuditError("chunk sizes must be >= 1")
    if caption_join not in CAPTION_JOINS:
        raise AuditError(f"unknown caption join {caption_join!r}; expected one of {', '.join(CAPTION_JOINS)}")
    rule = modality_rule or settings.AUDIT_MODALITY_RULE
    if rule not in MODALITY_RULES:
        raise AuditError(f"unknown modality rule {rule!r}; expected one of {', '.join(MODALITY_RULES)}")
    return AuditRun.objects.create(
        summary={"modality_rule": rule},
        dataset=dataset,
        split=resolve_split(dataset, split),
        retrievers=specs,
        k=int(k),
        min_mm_retrievers=int(min_mm_retrievers),
        exclude_reference=bool(exclude_reference),
        chunk_queries=cq,
        chunk_gallery=cg,
        created_by=created_by if getattr(created_by, "pk", None) else None,
        epsilon=eps,
        tau=t,
        tau_encoder=tau_spec,
        caption_join=caption_join,
    )


def run_modality_rule(run: AuditRun) -> str:
    """The modality rule a run's retrievers use (:func:`create_run`); a run stored before runs
    recorded it used the setting of the worker that ran it, ``AUDIT_MODALITY_RULE``."""
    return str((run.summary or {}).get("modality_rule") or settings.AUDIT_MODALITY_RULE)


def tau_encoder_spec(run: AuditRun) -> str:
    """The spec whose text encoder the tau filter uses (the first retriever unless set)."""
    return run.tau_encoder or run.retrievers[0]


def joined_turn_text(texts: Any, join: str = DEFAULT_JOIN) -> str:
    """The encoded text of a turn; ``join``: the run's ``caption_join``."""
    return turn_text(texts or [], join)


_FIRST_TURN_FIELDS = (
    "query_id",
    "reference_image_id",
    "reference_image__missing",
    "reference_image__sha256",
    "reference_image__path",
    "texts",
)


def single_turn_inputs(
    run: AuditRun, query_ids: Sequence[int] | None = None, fmt: str | None = None
) -> tuple[list[int], dict[int, str], dict[int, dict[str, Any]], dict[int, list[TargetFacts]]]:
    """Eligible single-turn query ids in (ordinal, id) order, the skipped ones with a reason
    (multi-turn queries are not considered here, see :func:`session_eligibility`), and what
    was read for them: ``(eligible, skipped, first turn of each query
    (dicts of :data:`_FIRST_TURN_FIELDS`), targets of each query (:func:`facts_by_query`))``.

    One read of the queries, one of their first turns and one of their targets: a query
    chunk checks eligibility again (files can vanish between plan and run) and goes on
    with the same rows.
    """
    qs = scope_queries(run).filter(n_turns__lte=1)
    if query_ids is not None:
        qs = qs.filter(pk__in=list(query_ids))
    ids = list(qs.order_by("ordinal", "id").values_list("id", flat=True))
    wanted = ids if query_ids is not None else qs.values("pk")
    first_turns = {
        row[0]: dict(zip(_FIRST_TURN_FIELDS, row))
        for row in plain_rows(Turn.objects.filter(query_id__in=wanted, index=1), _FIRST_TURN_FIELDS, json_at=(5,))
    }
    facts = facts_by_query(wanted)
    with_positive = set(positive_image_ids(fmt if fmt is not None else dataset_format(run.dataset_id), (), facts))
    eligible: list[int] = []
    skipped: dict[int, str] = {}
    for qid in ids:
        turn = first_turns.get(qid)
        if turn is None or turn["reference_image_id"] is None:
            skipped[qid] = "no_reference"
        elif ranking_text(joined_turn_text(turn["texts"])) is None:  # a blank text: not ranked for labels
            skipped[qid] = "empty_text"
        elif (
            turn["reference_image__missing"] or not turn["reference_image__sha256"] or not turn["reference_image__path"]
        ):
            skipped[qid] = "reference_missing"
        elif qid not in with_positive:
            skipped[qid] = "no_target"
        else:
            eligible.append(qid)
    assert len(eligible) + len(skipped) == len(ids)
    return eligible, skipped, first_turns, facts


_TURN_FIELDS = (
    "query_id",
    "index",
    "reference_image_id",
    "reference_image__missing",
    "reference_image__sha256",
    "reference_image__path",
    "texts",
    "reference_turns",
    "turn_target_id",
    "turn_target__sha256",
)


def session_turns(query_ids: Any) -> dict[int, list[dict[str, Any]]]:
    """Query id -> its turns (dicts of :data:`_TURN_FIELDS`) in turn order."""
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for t in Turn.objects.filter(query_id__in=query_ids).order_by("query_id", "index").values(*_TURN_FIELDS):
        out[t["query_id"]].append(t)
    return out


def session_eligibility(
    run: AuditRun, query_ids: Sequence[int] | None = None, fmt: str | None = None
) -> tuple[list[int], dict[int, str]]:
    """Eligible multi-turn sessions in (ordinal, id) order and the skipped ones with a reason.

    A session is scored when its turns are numbered 1..n_turns, every turn has a
    reference image with a file and a non-empty text, and it has a positive target.
    ``fmt``: the dataset's format when the caller has it (else it is read).
    """
    qs = scope_queries(run).filter(n_turns__gt=1)
    if query_ids is not None:
        qs = qs.filter(pk__in=list(query_ids))
    queries = list(qs.order_by("ordinal", "id").values_list("id", "n_turns"))
    if not queries:  # no session (most single-turn datasets): nothing more to read
        return [], {}
    turns = session_turns(qs.values("pk"))
    with_positive = set(positive_image_ids(fmt if fmt is not None else dataset_format(run.dataset_id), qs.values("pk")))
    eligible: list[int] = []
    skipped: dict[int, str] = {}
    for qid, n_turns in queries:
        ts = turns.get(qid, [])
        if [t["index"] for t in ts] != list(range(1, n_turns + 1)):
            skipped[qid] = "missing_turn"
        elif any(t["reference_image_id"] is None for t in ts):
            skipped[qid] = "no_reference"
        elif any(ranking_text(joined_turn_text(t["texts"])) is None for t in ts):
            skipped[qid] = "empty_text"
        elif any(
            t["reference_image__missing"] or not t["reference_image__sha256"] or not t["reference_image__path"]
            for t in ts
        ):
            skipped[qid] = "reference_missing"
        elif qid not in with_positive:
            skipped[qid] = "no_target"
        else:
            eligible.append(qid)
    return eligible, skipped


def _gallery_rows(run: AuditRun) -> tuple[list[int], dict[str, Any]]:
    """Gallery image ids in order (the union of the galleries the run's queries search, by
    :func:`retrieval.galleries.query_gallery_keys`), and a description of where they came from:
    ``galleries`` maps each key searched (``"*"``: every image of the dataset) to its readable
    images."""
    keys = sorted(set(query_gallery_keys(scope_queries(run).values("pk")).values()), key=lambda k: (k is None, k or ""))
    per_key = {key: gallery_image_ids(run.dataset_id, key, readable=True) for key in keys}
    listed = sum(len(gallery_image_ids(run.dataset_id, key)) for key in keys)
    ids = list(dict.fromkeys(i for part in per_key.values() for i in part))
    source = (
        "split gallery"
        if keys and None not in keys
        else "all dataset images (the split has no gallery)"
        if keys == [None]
        else "per-query galleries"
    )
    galleries = {("*" if key is None else key): len(part) for key, part in per_key.items()}
    return ids, {
        "source": source,
        "images": len(ids),
        "missing_left_out": listed - sum(galleries.values()),
        "galleries": galleries,
        "mixed": mixed_fallback(run.dataset_id, scope_queries(run)),
    }


def skip_examples(skipped: dict[Any, str], n: int = 10) -> dict[str, list[int]]:
    """The first ``n`` query ids skipped for each reason."""
    out: dict[str, list[int]] = defaultdict(list)
    for q, reason in skipped.items():
        if len(out[reason]) < n:
            out[reason].append(int(q))
    return dict(out)


def _chunks(items: Sequence[int], size: int) -> list[list[int]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def _plan_chunks(run: AuditRun, gallery: list[int], eligible: list[int], sessions: list[int]) -> list[AuditChunk]:
    """Per retriever: gallery, query and session chunks; then the tau encoder's text chunks."""
    parts = [
        (AuditChunk.Kind.GALLERY, gallery, run.chunk_gallery),
        (AuditChunk.Kind.QUERIES, eligible, run.chunk_queries),
        (AuditChunk.Kind.SESSIONS, sessions, run.chunk_queries),
    ]
    chunks: list[AuditChunk] = []
    for spec in run.retrievers:
        for kind, items, size in parts:
            chunks.extend(
                AuditChunk(run=run, retriever=spec, kind=kind, index=n, items=part, n_items=len(part))
                for n, part in enumerate(_chunks(items, size))
            )
    chunks.extend(
        AuditChunk(
            run=run, retriever=tau_encoder_spec(run), kind=AuditChunk.Kind.TEXTS, index=n, items=part, n_items=len(part)
        )
        for n, part in enumerate(_chunks(sessions, run.chunk_queries))
    )
    return chunks


def _nothing_to_audit(skipped: dict[int, str], session_skipped: dict[int, str]) -> AuditError:
    why = Counter(skipped.values())
    why.update(f"session {r}" for r in session_skipped.values())
    return AuditError(
        "no query can be audited: " + (", ".join(f"{n} {r}" for r, n in why.items()) or "the split is empty")
    )


def _plan_summary(
    run: AuditRun,
    eligible: list[int],
    skipped: dict[int, str],
    sessions: list[int],
    session_skipped: dict[int, str],
    gallery_info: Any,
    n_chunks: int,
) -> dict[str, Any]:
    reasons = Counter(skipped.values())
    summary = {
        **run.summary,
        "plan": {
            "queries_in_split": len(eligible) + len(skipped) + len(sessions) + len(session_skipped),
            "eligible": len(eligible),
            "sessions_in_split": len(sessions) + len(session_skipped),
            "sessions_eligible": len(sessions),
            "gallery": gallery_info,
            "chunks": n_chunks,
            "retrievers": len(run.retrievers),
        },
        "skipped": {r: reasons[r] for r in SKIP_REASONS if reasons.get(r)},
        "plan_skipped": {r: reasons[r] for r in SKIP_REASONS if reasons.get(r)},
        "skipped_total": len(skipped),
        "skipped_examples": skip_examples(skipped),
    }
    if sessions or session_skipped:
        session_reasons = Counter(session_skipped.values())
        summary["session_plan"] = {
            "skipped": {r: session_reasons[r] for r in SESSION_SKIP_REASONS if session_reasons.get(r)},
            "skipped_examples": skip_examples(session_skipped),
        }
    return summary


#: The single-turn reads of a plan made by :func:`plan_run` with ``keep_reads`` (an inline run,
#: whose query chunks run next in this process): ``{(run id, created): (eligible, first turns,
#: targets)}``, at most one run's, taken by :func:`planned_reads` until :func:`drop_planned_reads`.
_planned: dict[tuple[int, str], tuple[list[int], dict[int, dict[str, Any]], dict[int, list[TargetFacts]]]] = {}


def _run_key(run: AuditRun) -> tuple[int, str]:
    return run.pk, run.created_at.isoformat() if run.created_at else ""


def planned_reads(
    run: AuditRun, items: Sequence[int]
) -> tuple[list[int], dict[int, str], dict[int, dict[str, Any]], dict[int, list[TargetFacts]]] | None:
    """:func:`single_turn_inputs` of a query chunk's ``items`` from the plan's own read when this
    process planned the run inline just before (every item was eligible then: none skipped; the
    same rows, in the same (ordinal, id) order); ``None`` otherwise (the chunk reads them)."""
    kept = _planned.get(_run_key(run))
    if kept is None:
        return None
    eligible, first_turns, facts = kept
    wanted = set(items)
    if not wanted <= first_turns.keys() or len(wanted) != len(items):
        return None
    chunk = [q for q in eligible if q in wanted]
    if len(chunk) != len(wanted):
        return None
    return chunk, {}, {q: first_turns[q] for q in chunk}, {q: facts[q] for q in chunk if q in facts}


def drop_planned_reads() -> None:
    _planned.clear()


def plan_run(run: AuditRun, keep_reads: bool = False) -> bool:
    """Create the run's chunks once (idempotent); returns True if this call planned it.

    ``keep_reads``: keep the single-turn queries' rows read for the plan for the query chunks
    that run next in this process (:func:`planned_reads`; an inline run): the queries, first
    turns and targets are read once, not once for the plan and again for the chunks."""
    with transaction.atomic():
        run = AuditRun.objects.select_for_update().get(pk=run.pk)
        if run.planned or not run.is_active:
            return False
        fmt = dataset_format(run.dataset_id)
        eligible, skipped, first_turns, facts = single_turn_inputs(run, fmt=fmt)
        sessions, session_skipped = session_eligibility(run, fmt=fmt)
        gallery, gallery_info = _gallery_rows(run)
        if not eligible and not sessions:
            raise _nothing_to_audit(skipped, session_skipped)
        if not gallery:
            raise AuditError("the gallery is empty (no image with a file on disk)")
        chunks = _plan_chunks(run, gallery, eligible, sessions)
        AuditChunk.objects.bulk_create(chunks, batch_size=500)
        run.summary = _plan_summary(run, eligible, skipped, sessions, session_skipped, gallery_info, len(chunks))
        run.total = sum(c.n_items for c in chunks)
        run.done = 0
        run.planned = True
        run.status = AuditRun.Status.RUNNING
        run.stage = "encoding gallery"
        run.started_at = run.started_at or timezone.now()
        run.save()
    if keep_reads:
        _planned.clear()
        _planned[_run_key(run)] = (eligible, first_turns, facts)
    return True


def fail_run(run_id: int, message: str) -> None:
    AuditRun.objects.filter(pk=run_id).exclude(status=AuditRun.Status.DONE).update(
        status=AuditRun.Status.FAILED, error=message[:20000], stage="failed", finished_at=timezone.now()
    )
