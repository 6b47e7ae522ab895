"""Aggregating a finished run: labels, per-retriever figures, session filters, subsets."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from retrieval.metrics import MODALITIES
from retrieval.models import Query, QuerySubset, Turn

from ..labels import (
    COUNT_KEYS,
    LABELS,
    SHORTCUT_FREE_NAME,
    SUPPORT_KEYS,
    AuditLabels,
    label_pool,
    label_queries,
    read_pool,
    retriever_scores,
    sub_pool,
)
from ..models import AuditChunk, AuditLabel, AuditRank, AuditRun, AuditSessionRank
from .base import (
    LATEST_SUBSET,
    SESSION_FILTER_BASIS,
    SESSION_SKIP_REASONS,
    SESSIONS_KEPT,
    SKIP_REASONS,
    SUBSET_NAMES,
    plain_rows,
    subset_name,
)
from .bulkwrite import insert_rows
from .planning import skip_examples, tau_encoder_spec


def _rank_rows(run: AuditRun, exclude_queries: set[int] = frozenset()) -> list[tuple[Any, ...]]:
    """:func:`audit.labels.label_queries` rows in query order, then pool order:
    ``(query, retriever, mm, text, image, extras)`` where each rank is the list of every
    positive's rank when the row has it (else the best rank) and ``extras`` carries the
    graded-only targets and subset ranks."""
    order = {name: n for n, name in enumerate(run.retrievers)}
    fields = (
        "query_id",
        "retriever",
        "mm",
        "text",
        "image",
        "mm_all",
        "text_all",
        "image_all",
        "graded",
        "subset",
        "query__ordinal",
    )
    rows = [
        (q, r, mm_all or mm, t_all or t, i_all or i, {"graded": graded or {}, "subset": subset or {}}, ordinal)
        for q, r, mm, t, i, mm_all, t_all, i_all, graded, subset, ordinal in plain_rows(
            AuditRank.objects.filter(run=run), fields, json_at=(5, 6, 7, 8, 9)
        )
        if q not in exclude_queries
    ]
    rows.sort(key=lambda x: (x[6], x[0], order.get(x[1], len(order)), str(x[1])))
    return [row[:6] for row in rows]


def _stats_json(stats: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    return {str(k): v for k, v in stats.items()}


def subset_scores(run: AuditRun, query_ids: Iterable[int]) -> dict[str, dict[str, Any]]:
    """Per-retriever :func:`retrieval.metrics.modality_scores` over some of the run's labelled queries."""
    wanted = set(query_ids)
    labelled = set(AuditLabel.objects.filter(run=run, query_id__in=wanted).values_list("query_id", flat=True))
    return subset_scores_from_rows(run, _rank_rows(run), labelled)


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
    steps.append(
        {
            "name": "tau_diversity",
            "removed": len(removed),
            "removed_ids": removed,
            "remaining": len(kept),
            "removed_alone": len(fails),
            "skipped": False,
        }
    )
    return {
        "n_sessions": report["n_sessions"],
        "kept": kept,
        "n_kept": len(kept),
        "steps": steps,
        "tau_missing": sum(1 for q in sessions if q not in max_text_cosine),
    }


def _session_chunk_outcomes(plan: dict[str, Any], chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What the session and text chunks recorded: skipped sessions (with reasons and
    examples), the largest text-text cosine per session and sessions without a positive."""
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
    for reason, ids in skip_examples(chunk_skips).items():
        examples[reason] = (examples.get(reason, []) + ids)[:10]
    return {
        "dropped": {int(q) for q in chunk_skips},
        "max_cos": max_cos,
        "no_positive": no_positive,
        "reasons": reasons,
        "examples": examples,
    }


def _scored_sessions(table: dict[str, Any], dropped: set[int]) -> tuple[list[int], dict[int, int]]:
    """The scored session ids in query order, and each session's number of turns."""
    scored = {q for r in table.values() for s in r.values() for m in s.values() for q in m} - dropped
    order = dict(Query.objects.filter(pk__in=scored).values_list("pk", "ordinal"))
    ids = sorted(scored, key=lambda q: (order.get(q, 0), q))
    lengths = {
        q: len(next(m[q] for r in table.values() for s in r.values() for m in s.values() if q in m)) for q in ids
    }
    return ids, lengths


def _per_ranking(
    run: AuditRun, ranks_of: Any, ids: list[int], max_cos: dict[int, float | None]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per retriever x strategy x modality: the session metrics and how many sessions pass all filters."""
    from retrieval.sessions import STRATEGIES, session_metrics

    k, eps, tau = run.k, run.epsilon, run.tau
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
    return metrics, kept_per


#: How many flagged turns of each check the run's summary lists (the counts cover them all).
CHECK_EXAMPLES = 200


def turn_flags(
    run: AuditRun, ids: Iterable[int] | None = None, chunks: list[dict[str, Any]] | None = None
) -> tuple[dict[tuple[int, int], dict[str, int | None]], int]:
    """``{(session id, turn): {check: earlier turn or None}}`` for every turn of the scored
    sessions ``ids`` (default: every session the run ranked), and how many of those turns have
    a retrospective reference: the first retriever's consistency checks (stored by its session
    chunks) and the reference checks stored on the turns. ``chunks``: the run's chunk rows
    (``kind``, ``retriever``, ``stats``) when the caller read them."""
    if chunks is None:
        chunks = list(
            AuditChunk.objects.filter(run=run, kind=AuditChunk.Kind.SESSIONS).values("kind", "stats", "retriever")
        )
    first = run.retrievers[0] if run.retrievers else None
    found: dict[int, list[dict[str, int]]] = {}
    for c in chunks:
        if c["kind"] == AuditChunk.Kind.SESSIONS and c["retriever"] == first:
            found.update({int(q): v for q, v in (c["stats"] or {}).get("consistency", {}).items()})
    scored = set(found) if ids is None else set(ids)
    per_turn: dict[tuple[int, int], dict[str, int | None]] = defaultdict(dict)
    for q, turns in found.items():
        if q in scored:
            for n, flags in enumerate(turns, start=1):
                per_turn[(q, n)].update(flags)
    retro = 0
    for q, n, checks, refs in Turn.objects.filter(query_id__in=scored).values_list(
        "query_id", "index", "reference_checks", "reference_turns"
    ):
        retro += bool(refs)
        per_turn[(q, n)].update({c: None for c in checks or ()})
    return dict(per_turn), retro


def latest_turn_checks(query_ids: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
    """Per session of ``query_ids``: each turn's ``{turn, reference_turns, checks}`` (``checks``:
    ``{check: earlier turn or None}``, the reference checks stored on the turn and the consistency
    checks of the newest finished audit that ranked the session; none when no audit did). For
    staff and exports only, never for annotators."""
    ids = list(query_ids)
    newest: dict[int, int] = {}
    for q, run_id in (
        AuditSessionRank.objects.filter(query_id__in=ids, run__status=AuditRun.Status.DONE)
        .order_by("query_id", "run_id")
        .values_list("query_id", "run_id")
        .distinct()
    ):
        newest[q] = max(run_id, newest.get(q, 0))
    flags: dict[tuple[int, int], dict[str, Any]] = {}
    for run in AuditRun.objects.filter(pk__in=set(newest.values())):
        mine = [q for q, r in newest.items() if r == run.pk]
        flags.update(turn_flags(run, mine)[0])
    out: dict[int, list[dict[str, Any]]] = {}
    for q, n, refs, checks in (
        Turn.objects.filter(query_id__in=ids)
        .order_by("query_id", "index")
        .values_list("query_id", "index", "reference_turns", "reference_checks")
    ):
        got = flags.get((q, n), {c: None for c in checks or ()})
        out.setdefault(q, []).append({"turn": n, "reference_turns": refs or [], "checks": got})
    return out


def session_checks(run: AuditRun, chunks: list[dict[str, Any]], ids: list[int]) -> dict[str, Any]:
    """The automatic checks on the scored sessions, for staff (never for annotators).

    ``consistency``: the embedding checks of the first retriever's session chunks
    (:func:`retrieval.sessions.session_consistency`), with their thresholds; ``reference``: the
    reference checks stored on the turns at import (:data:`retrieval.sessions.REFERENCE_CHECKS`)
    and how many turns have a retrospective (effective) reference. ``counts``: turns failing each
    check; ``sessions``: sessions with at least one; ``flagged``: ``[{query, external_id, turn,
    checks: {check: earlier turn or null}}]`` in query and turn order (at most
    :data:`CHECK_EXAMPLES` rows)."""
    from retrieval.sessions import CONSISTENCY_CHECKS, REFERENCE_CHECKS

    per_turn, retro = turn_flags(run, ids, chunks)
    order = {q: i for i, q in enumerate(ids)}
    names = dict(Query.objects.filter(pk__in={q for q, _ in per_turn}).values_list("pk", "external_id"))
    flagged = sorted(((key, f) for key, f in per_turn.items() if f), key=lambda x: (order.get(x[0][0], 0), x[0][1]))

    def count(check: str) -> dict[str, int]:
        hits = [key for key, f in flagged if check in f]
        return {"turns": len(hits), "sessions": len({q for q, _ in hits})}

    from .base import conflict_source, consistency_thresholds

    th = consistency_thresholds()
    return {
        "consistency": {c: count(c) for c in CONSISTENCY_CHECKS},
        "reference": {c: count(c) for c in REFERENCE_CHECKS},
        "thresholds": {"noop": th.noop, "duplicate": th.duplicate, "circle": th.circle, "conflict": th.conflict},
        "conflict_directions": conflict_source(),
        "retriever": run.retrievers[0] if run.retrievers else None,
        "retrospective_turns": retro,
        "flagged_turns": len(flagged),
        "flagged": [
            {"query": q, "external_id": names.get(q, str(q)), "turn": n, "checks": f}
            for (q, n), f in flagged[:CHECK_EXAMPLES]
        ],
    }


def _skipped_counts(reasons: Counter) -> dict[str, int]:
    """Skip counts, the known session reasons first, in their fixed order."""
    return {r: reasons[r] for r in SESSION_SKIP_REASONS if reasons.get(r)} | {
        r: n for r, n in reasons.items() if r not in SESSION_SKIP_REASONS
    }


def aggregate_sessions(run: AuditRun, chunks: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[int]]:
    """The ``sessions`` part of the run's summary and the ids of the sessions kept by every filter.

    Per retriever x strategy x modality: :func:`retrieval.sessions.session_metrics`
    (Hits@K curve over turns ``1..L_max``, Final Recall@K, AUC, epsilon-consistent
    count) and how many sessions pass all filters; the filter table (success ->
    multi-turn -> epsilon -> tau) on :data:`SESSION_FILTER_BASIS` of the first
    retriever; the turn-length histograms. ``(None, [])`` when the split has no sessions.
    """
    from retrieval.sessions import DEFAULT_ALPHA, STRATEGIES

    plan = run.summary.get("session_plan")
    if plan is None:
        return None, []
    outcomes = _session_chunk_outcomes(plan, chunks)
    max_cos, reasons = outcomes["max_cos"], outcomes["reasons"]
    table = session_rank_table(run)
    ids, lengths = _scored_sessions(table, outcomes["dropped"])
    k, eps, tau = run.k, run.epsilon, run.tau

    def ranks_of(name: str, strategy: str, modality: str) -> dict[int, list[Any]]:
        got = table.get(name, {}).get(strategy, {}).get(modality, {})
        return {q: got.get(q, [None] * lengths[q]) for q in ids}

    metrics, kept_per = _per_ranking(run, ranks_of, ids, max_cos)
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
        "k": k,
        "alpha": DEFAULT_ALPHA,
        "epsilon": eps,
        "tau": tau,
        "tau_encoder": tau_encoder_spec(run),
        "strategies": list(STRATEGIES),
        "modalities": list(MODALITIES),
        "metrics": metrics,
        "kept_per_ranking": kept_per,
        "filter_basis": basis,
        "filters": filters,
        "turn_histogram": {str(n): c for n, c in sorted(Counter(lengths.values()).items())},
        "kept_turn_histogram": {str(n): c for n, c in sorted(Counter(lengths[q] for q in kept).items())},
        "text_cosine": {
            "sessions": len(worst),
            "at_or_above_tau": sum(1 for v in worst if v >= tau),
            "max": max(worst, default=None),
        },
        "skipped": _skipped_counts(reasons),
        "skipped_total": sum(reasons.values()),
        "skipped_examples": outcomes["examples"],
        "no_positive_in_gallery": max(outcomes["no_positive"].values(), default=0),
        "subset": subset_name(run, SESSIONS_KEPT),
        "checks": session_checks(run, chunks, ids),
    }
    return summary, kept


def _chunk_outcomes(run: AuditRun, chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Queries skipped by a chunk (with reasons and examples) and queries without a positive in the gallery."""
    chunk_skips: dict[str, str] = {}
    no_positive: dict[str, int] = defaultdict(int)
    for c in chunks:
        chunk_skips.update((c["stats"] or {}).get("skipped", {}))
        if c["kind"] == AuditChunk.Kind.QUERIES:
            no_positive[c["retriever"]] += int((c["stats"] or {}).get("no_positive_in_gallery", 0))
    reasons = Counter(run.summary.get("plan_skipped", {}))
    reasons.update(chunk_skips.values())
    examples = dict(run.summary.get("skipped_examples", {}))
    for reason, ids in skip_examples(chunk_skips).items():
        examples[reason] = (examples.get(reason, []) + ids)[:10]
    return {
        "dropped": {int(q) for q in chunk_skips},
        "skipped": {r: reasons[r] for r in SKIP_REASONS if reasons.get(r)}
        | {r: n for r, n in reasons.items() if r not in SKIP_REASONS},
        "skipped_total": sum(reasons.values()),
        "skipped_examples": examples,
        "no_positive_in_gallery": max(no_positive.values())
        if no_positive
        else run.summary.get("no_positive_in_gallery", 0),
    }


def _override_support(audit: AuditLabels, override: dict[int, dict[str, int]]) -> None:
    """Replace derived support counts with those an imported aggregated file recorded."""
    for q, sup in override.items():
        if q in audit.support:
            audit.support[q] = {key: int(sup.get(key, audit.support[q][key])) for key in SUPPORT_KEYS}
    audit.support_histograms = {
        key: dict(sorted(Counter(s[key] for s in audit.support.values()).items())) for key in SUPPORT_KEYS
    }


def _label_rows(run: AuditRun, audit: AuditLabels) -> list[dict[str, Any]]:
    """The :class:`AuditLabel` rows (field values, for :func:`insert_rows`)."""
    return [
        {
            "run_id": run.pk,
            "query_id": q,
            "label": audit.labels[q],
            "detail": audit.detail[q],
            "legacy": audit.legacy[q],
            "support_mm": audit.support[q]["multimodal"],
            "support_text": audit.support[q]["text_only"],
            "support_image": audit.support[q]["image_only"],
            "support_either": audit.support[q]["either_unimodal"],
            "best_mm": audit.best_ranks[q]["multimodal"],
            "best_text": audit.best_ranks[q]["text_only"],
            "best_image": audit.best_ranks[q]["image_only"],
            "best_retriever": {m: (str(v) if v is not None else None) for m, v in audit.best_retriever[q].items()},
        }
        for q in audit.queries
    ]


def _write_finished(
    run: AuditRun,
    audit: AuditLabels,
    summary: dict[str, Any],
    timings: dict[str, Any],
    sessions_kept: list[int] | None,
    started: float,
) -> bool:
    """Write labels, subsets and the summary, and mark the run done, unless another call already did."""
    label_rows = _label_rows(run, audit)
    with transaction.atomic():
        locked = AuditRun.objects.select_for_update().get(pk=run.pk)
        if locked.status != AuditRun.Status.RUNNING:
            return False
        AuditLabel.objects.filter(run=run).delete()
        insert_rows(AuditLabel, label_rows)
        _write_subsets(run, audit)
        if sessions_kept is not None:
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


#: Sent (``sender=AuditRun``, ``run``) once a run is finished and committed: the annotation
#: app fills the candidate panels still missing in its studies of that dataset (one-way
#: imports: audit never imports annotation).
audit_finished = Signal()


def aggregate_run(run_id: int, override_support: dict[int, dict[str, int]] | None = None) -> bool:
    """Label the run's queries once every chunk is done; returns True if this call finished it.

    Safe to call twice or concurrently: the labels are computed outside the
    transaction and written only by the call that still finds the run unfinished.
    ``override_support`` (imported aggregated files) replaces the support counts that
    :func:`label_queries` derives with those the file recorded for the real pool.
    """
    started = time.perf_counter()
    try:  # get(), not first(): no ordering to compile for one row by its key
        run = AuditRun.objects.select_related("dataset").get(pk=run_id)
    except AuditRun.DoesNotExist:
        return False
    if run.status != AuditRun.Status.RUNNING:
        return False
    chunks = list(AuditChunk.objects.filter(run=run).values("kind", "status", "stats", "retriever"))
    if any(c["status"] != AuditChunk.Status.DONE for c in chunks):
        return False
    # Queries skipped by a chunk (e.g. a reference file that became unreadable) are
    # left out for the whole pool, so every labelled query has a row per retriever.
    outcomes = _chunk_outcomes(run, chunks)
    pool = read_pool(_rank_rows(run, exclude_queries=outcomes.pop("dropped")))
    audit = label_pool(pool, k=run.k, min_mm_retrievers=run.min_mm_retrievers)
    if override_support:
        _override_support(audit, override_support)
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
        "shortcut_free_stats": _pool_scores(run, pool, set(audit.shortcut_free)),
        **outcomes,
    }
    if sessions is not None:
        summary["sessions"] = sessions
    finished = _write_finished(
        run, audit, summary, _timings(run, chunks), sessions_kept if sessions is not None else None, started
    )
    if finished:
        transaction.on_commit(lambda: audit_finished.send(sender=AuditRun, run=run))
    return finished


def subset_scores_from_rows(
    run: AuditRun, rows: Sequence[tuple[Any, ...]], queries: set[Any]
) -> dict[str, dict[str, Any]]:
    """Per-retriever scores over ``queries`` from already-loaded rank rows (:func:`_rank_rows`);
    a query without a row for a retriever counts as not retrieved by it."""
    if not queries:
        return {}
    return _pool_scores(run, read_pool([row for row in rows if row[0] in queries]), queries)


def _pool_scores(run: AuditRun, pool: Any, queries: set[Any]) -> dict[str, dict[str, Any]]:
    """Per-retriever scores over ``queries`` (sorted as strings) of a pool read by
    :func:`audit.labels.read_pool` (the rows read once serve the labels and every subset)."""
    if not queries:
        return {}
    pool = sub_pool(pool, sorted(queries, key=str))
    return {name: retriever_scores(pool, name, run.k) for name in run.retrievers}


def _chunk_seconds(kind: str, s: dict[str, float]) -> dict[str, float]:
    """One chunk's recorded seconds under the summary's timing keys."""
    if kind == AuditChunk.Kind.GALLERY:
        return {"encode_gallery": s.get("encode", 0.0)}
    if kind == AuditChunk.Kind.TEXTS:
        return {"encode_session_texts": s.get("encode_texts", 0.0)}
    encode, rank = (
        ("encode_sessions", "rank_sessions") if kind == AuditChunk.Kind.SESSIONS else ("encode_queries", "rank")
    )
    return {
        encode: s.get("encode_images", 0.0) + s.get("encode_texts", 0.0),
        "load_gallery": s.get("gallery", 0.0),
        rank: s.get("rank", 0.0) + s.get("write", 0.0),
    }


def _timings(run: AuditRun, chunks: list[dict[str, Any]]) -> dict[str, Any]:
    secs: dict[str, float] = defaultdict(float)
    cache: dict[str, int] = defaultdict(int)
    per: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for c in chunks:
        st = c["stats"] or {}
        s = st.get("seconds", {})
        name = c["retriever"]
        for key, value in _chunk_seconds(c["kind"], s).items():
            secs[key] += value
            if key != "load_gallery":  # the gallery is loaded once per worker, not per retriever
                per[name][key] += value
        secs["build_models"] += s.get("build", 0.0)
        for key, value in st.get("cache", {}).items():
            if isinstance(value, bool):
                cache[key + "_count"] += int(value)
            else:
                cache[key] += int(value)
    cache["encoded"] = sum(
        cache.get(k, 0)
        for k in (
            "gallery_encoded",
            "query_image_encoded",
            "text_encoded",
            "gallery_read_encoded",
            "session_image_encoded",
            "session_text_encoded",
            "tau_text_encoded",
            "query_mm_encoded",
            "session_mm_encoded",
        )
    )
    return {
        **{k: round(v, 4) for k, v in secs.items()},
        "cache": dict(cache),
        "per_retriever": {k: {kk: round(vv, 4) for kk, vv in v.items()} for k, v in per.items()},
    }


def _write_subsets(run: AuditRun, audit: AuditLabels) -> None:
    by_label: dict[str, list[int]] = defaultdict(list)
    for q, label in audit.labels.items():
        by_label[label].append(q)
    members = {
        SHORTCUT_FREE_NAME: audit.shortcut_free,
        **{label: by_label.get(label, []) for label in LABELS},
    }
    source = f"audit {run.pk}"
    subsets = {subset_name(run, name): (source, members[name]) for name in SUBSET_NAMES}
    if audit.queries:  # a sessions-only audit says nothing about single-turn shortcuts: keep the latest subset
        subsets[LATEST_SUBSET] = (f"{source} (latest audit)", members[SHORTCUT_FREE_NAME])
    set_subsets(run.dataset_id, subsets)


def set_subsets(dataset_id: int, subsets: dict[str, tuple[str, list[int]]]) -> None:
    """Create or update the dataset's subsets ``{name: (source, query ids)}`` in a few bulk
    queries (not a get, an update and a membership diff per subset)."""
    existing = {s.name: s for s in QuerySubset.objects.filter(dataset_id=dataset_id, name__in=list(subsets))}
    for name, subset in existing.items():
        subset.source = subsets[name][0]
    QuerySubset.objects.bulk_update(list(existing.values()), ["source"])
    QuerySubset.objects.bulk_create(
        [
            QuerySubset(dataset_id=dataset_id, name=name, source=source)
            for name, (source, _) in subsets.items()
            if name not in existing
        ],
        ignore_conflicts=True,
    )  # a concurrent run may create "latest" first
    ids = dict(QuerySubset.objects.filter(dataset_id=dataset_id, name__in=list(subsets)).values_list("name", "pk"))
    through = QuerySubset.queries.through
    through.objects.filter(querysubset_id__in=list(ids.values())).delete()
    insert_rows(
        through,
        [
            {"querysubset_id": ids[name], "query_id": q}
            for name, (_, queries) in subsets.items()
            for q in dict.fromkeys(queries)
        ],
    )


def label_table(runs: Iterable[AuditRun]) -> list[dict[str, Any]]:
    """One CIRCUS-Table-1-like row per finished run: dataset, total and label counts."""
    rows = []
    for run in runs:
        counts = run.summary.get("counts", {})
        rows.append(
            {
                "run": run,
                "dataset": run.dataset.name,
                "split": run.split,
                "total": run.summary.get("n_queries", 0),
                **{label: counts.get(label, 0) for label in COUNT_KEYS},
                "counts": [counts.get(label, 0) for label in COUNT_KEYS],  # under COUNT_HEADINGS
            }
        )
    return rows


def stored_labels(run: AuditRun) -> AuditLabels:
    """The finished run's labels and figures recomputed from its stored ranks.

    Only the queries the run labelled (those with an :class:`AuditLabel`) take part, as in
    :func:`aggregate_run`; queries are keyed by their external id, retrievers by spec.
    """
    labelled = dict(AuditLabel.objects.filter(run=run).values_list("query_id", "query__external_id"))
    rows = [(labelled[q], *rest) for q, *rest in _rank_rows(run) if q in labelled]
    return label_queries(rows, k=run.k, min_mm_retrievers=run.min_mm_retrievers)
