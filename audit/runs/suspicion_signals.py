"""The signals of :mod:`audit.suspicion` for many single-turn queries, read from a finished audit.

The audit is the newest finished one that ranked the query, chosen as the candidate pool
chooses it (:func:`audit.runs.panels.latest_pool_rankings`). Ranks and each retriever's
multimodal top list come from its rank rows (:func:`rank_rows`, the one read the breadth part
makes: a pool that grows other lists, e.g. other modalities or images near the target, leaves
the consensus over the multimodal lists as it is); the text-image cosines and the rival gap
come from the embedding cache the audit filled (nothing is encoded here: a text or image the
cache lacks leaves that retriever out of those parts).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from retrieval.galleries import gallery_image_ids, query_gallery_keys
from retrieval.models import Image, Query, Target, Turn, turn_text

from ..models import AuditRank, AuditRun
from ..suspicion import Signals, consensus_rivals, lead_index
from .panels import latest_pool_rankings

logger = logging.getLogger(__name__)


def latest_runs(query_ids: Sequence[int]) -> dict[int, int]:
    """query id -> the audit run its candidate pool comes from (:func:`audit.runs.panels.latest_pool_rankings`)."""
    return {q: run for q, (run, _) in latest_pool_rankings(list(query_ids)).items()}


def rank_rows(run: AuditRun, query_ids: Sequence[int]) -> dict[int, list[tuple]]:
    """query -> per retriever (by name) ``(mm, text, image, multimodal top list, retriever)`` of ``run``."""
    out: dict[int, list[tuple]] = {}
    for q, mm, text, image, top, spec in (
        AuditRank.objects.filter(run=run, query_id__in=query_ids)
        .order_by("query_id", "retriever")
        .values_list("query_id", "mm", "text", "image", "top_mm", "retriever")
    ):
        out.setdefault(q, []).append((mm, text, image, list(top or []), spec))
    return out


def lead_retriever(run: AuditRun) -> str | None:
    """The retriever of ``run`` whose multimodal ranks of the labelled targets have the best mean
    reciprocal rank over all the queries it ranked (:func:`audit.suspicion.lead_index`): the
    pool's own measure, the same for every query of the audit. None without rank rows."""
    per_query: dict[int, dict[str, int | None]] = {}
    for q, spec, mm in AuditRank.objects.filter(run=run).values_list("query_id", "retriever", "mm"):
        per_query.setdefault(q, {})[spec] = mm
    specs = sorted({spec for row in per_query.values() for spec in row})
    index = lead_index([[row.get(spec) for spec in specs] for row in per_query.values()])
    return None if index is None else specs[index]


def _facts(query_ids: Sequence[int]) -> tuple[dict[int, int], dict[int, str], dict[int, set[int]]]:
    """Reference image, first turn's text (its captions, as stored) and target ids per query."""
    refs: dict[int, int] = {}
    texts: dict[int, list] = {}
    for qid, ref, t in Turn.objects.filter(query_id__in=query_ids, index=1).values_list(
        "query_id", "reference_image_id", "texts"
    ):
        refs[qid], texts[qid] = ref, t
    targets: dict[int, set[int]] = {}
    for qid, image in Target.objects.filter(query_id__in=query_ids).values_list("query_id", "image_id"):
        targets.setdefault(qid, set()).add(image)
    return refs, texts, targets


def _positives(query_ids: Sequence[int]) -> dict[int, list[int]]:
    """The positive targets of each query (:meth:`retrieval.models.Query.positive_targets`, the target rule)."""
    out: dict[int, list[int]] = {}
    for query in Query.objects.filter(pk__in=query_ids).select_related("dataset").prefetch_related("targets"):
        out[query.pk] = [t.image_id for t in query.positive_targets(list(query.targets.all()))]
    return out


def _unit(m: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return m / np.where(norms > 0, norms, 1.0)


def _embedding_parts(
    run: AuditRun, spec: str, query_ids: Sequence[int], facts: dict[str, dict]
) -> dict[int, tuple[float, float]]:
    """query -> (cos(text, best positive) - cos(text, reference), the rival gap in standard
    deviations of the gallery's multimodal scores) under one retriever, from its cache."""
    from .execution import embedding_cache, retriever_for

    retriever = retriever_for(spec, run)
    cache = embedding_cache(retriever)
    refs, positives, galleries = facts["refs"], facts["positives"], facts["galleries"]
    wanted = {i for q in query_ids for i in (refs.get(q), *positives.get(q, ()), *galleries.get(q, ())) if i}
    sha = dict(Image.objects.filter(pk__in=wanted).values_list("pk", "sha256"))
    keys = sorted({v for v in sha.values() if v})
    vec = dict(zip(keys, _unit(cache.get_many("image", keys).matrix)))
    words = {q: turn_text(facts["texts"].get(q) or [], run.caption_join) for q in query_ids}
    unique = sorted({w for w in words.values() if w})
    late = _late(retriever)
    if not late and getattr(retriever, "modality_rule", "family") != "family":
        return {}  # CIRCUS's text-only query depends on the reference: not read here
    tvec = dict(zip(unique, _unit(_text_rows(retriever, cache, unique))))
    compose_of = (
        (lambda q: retriever.compose) if late else _cached_queries(retriever, cache, query_ids, refs, sha, words)
    )
    matrices: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # one matrix per gallery (shared lists)
    out: dict[int, tuple[float, float]] = {}
    for q in query_ids:
        gallery = galleries.get(q, [])
        if id(gallery) not in matrices:
            matrices[id(gallery)] = _gallery_rows(gallery, vec, sha)
        got = _one_query(
            compose_of(q), tvec.get(words[q]), vec, sha, refs.get(q), positives.get(q, []), matrices[id(gallery)]
        )
        if got is not None:
            out[q] = got
    return out


def _gallery_rows(gallery: list[int], vec: dict, sha: dict) -> tuple[np.ndarray, np.ndarray]:
    """(image ids, their unit embeddings) of the gallery images the cache holds."""
    rows = [(i, vec.get(sha.get(i, ""))) for i in gallery]
    rows = [(i, v) for i, v in rows if _ok(v)]
    return (
        np.array([i for i, _ in rows], dtype=np.int64),
        np.stack([v for _, v in rows]) if rows else np.zeros((0, 1), np.float32),
    )


def _late(retriever) -> bool:
    from retrieval.retrievers.pipeline import late_path

    return late_path(retriever)


def _text_rows(retriever, cache, texts: list[str]) -> np.ndarray:
    """The text-only queries of ``texts`` as the audit cached them (a text embedding on the late
    path, else the whole-query pass of the text alone)."""
    if _late(retriever):
        return cache.get_many("text", texts).matrix
    return cache.get_many("query", [retriever.query_cache_key(None, t) for t in texts]).matrix


def _cached_queries(retriever, cache, query_ids: Sequence[int], refs: dict, sha: dict, words: dict):
    """query -> a ``compose(image, text)`` that gives the query's multimodal pass as the audit
    cached it (a retriever that does not compose: early fusion)."""
    import torch

    keys = [retriever.query_cache_key(sha.get(refs.get(q), ""), words[q]) for q in query_ids]
    rows = dict(zip(query_ids, cache.get_many("query", keys).matrix))

    def compose_of(q: int):
        row = torch.from_numpy(np.asarray(rows[q], dtype=np.float32)[None, :].copy())
        return lambda _image, _text: row

    return compose_of


def _ok(v: np.ndarray | None) -> bool:
    return v is not None and not np.isnan(v).any()


def _one_query(
    compose,
    text: np.ndarray | None,
    vec: dict,
    sha: dict,
    ref: int | None,
    positives: list[int],
    gallery: tuple[np.ndarray, np.ndarray],
) -> tuple[float, float] | None:
    """(consistency delta, rival gap) of one query, or None when an embedding is missing.
    ``gallery``: (image ids, their unit embeddings) of the query's gallery; ``compose(image,
    text)``: the query's multimodal embedding."""
    import torch

    r = vec.get(sha.get(ref, ""))
    targets = [v for v in (vec.get(sha.get(i, "")) for i in positives) if _ok(v)]
    if not (_ok(text) and _ok(r) and targets):
        return None
    delta = max(float(text @ t) for t in targets) - float(text @ r)
    ids, matrix = gallery
    keep = ~np.isin(ids, [i for i in (ref, *positives) if i is not None])
    if keep.sum() < 2:
        return delta, float("nan")
    query = compose(torch.from_numpy(r[None, :].copy()), torch.from_numpy(text[None, :].copy()))
    query = query.detach().cpu().numpy()[0]
    if not _ok(query):
        return None
    scores = matrix[keep] @ query
    best_target = max(float(t @ query) for t in targets)
    std = float(scores.std())
    return delta, (float(scores.max()) - best_target) / std if std > 0 else 0.0


def embedding_signals(
    run: AuditRun, query_ids: Sequence[int], facts: dict[str, dict]
) -> dict[int, tuple[list[float], list[float], dict[str, float]]]:
    """query -> (consistency deltas, rival gaps, rival gap by retriever), one of each per
    computed retriever of ``run`` whose embeddings are cached (imported rank files have none)."""
    out: dict[int, tuple[list[float], list[float], dict[str, float]]] = {q: ([], [], {}) for q in query_ids}
    external = set(run.external_retrievers or [])
    for spec in run.retrievers:
        if spec in external:
            continue
        try:
            got = _embedding_parts(run, spec, query_ids, facts)
        except Exception:  # a retriever that cannot be opened here: the parts go without it
            logger.warning("suspicion: no embeddings of %s", spec, exc_info=True)
            continue
        for q, (delta, gap) in got.items():
            out[q][0].append(delta)
            if not np.isnan(gap):
                out[q][1].append(gap)
                out[q][2][spec] = gap
    return out


def _galleries(query_ids: Sequence[int]) -> dict[int, list[int]]:
    """query -> the image ids its gallery holds (:mod:`retrieval.galleries`), each gallery read once."""
    keys = query_gallery_keys(query_ids)
    datasets = dict(Query.objects.filter(pk__in=query_ids).values_list("pk", "dataset_id"))
    read: dict[tuple, list[int]] = {}
    out: dict[int, list[int]] = {}
    for q, key in keys.items():
        at = (datasets[q], key)
        if at not in read:
            read[at] = gallery_image_ids(datasets[q], key, order="id", readable=True)
        out[q] = read[at]
    return out


def audit_signals(query_ids: Sequence[int]) -> dict[int, tuple[int, Signals]]:
    """query -> (audit run, signals without votes) of every single-turn query the newest
    finished audit ranked. Queries no audit ranked are left out."""
    runs = latest_runs(query_ids)
    if not runs:
        return {}
    qids = list(runs)
    refs, texts, targets = _facts(qids)
    facts = {"refs": refs, "texts": texts, "positives": _positives(qids), "galleries": _galleries(qids)}
    by_run: dict[int, list[int]] = {}
    for q, run_id in runs.items():
        by_run.setdefault(run_id, []).append(q)
    out: dict[int, tuple[int, Signals]] = {}
    for run in AuditRun.objects.filter(pk__in=by_run):
        some = by_run[run.pk]
        rows = rank_rows(run, some)
        emb = embedding_signals(run, some, facts)
        lead = lead_retriever(run)
        for q in some:
            lists = [r[3] for r in rows.get(q, [])]
            positives = facts["positives"].get(q, [])
            rivals = consensus_rivals(
                lists, [_list_rank(top, positives) for top in lists], targets.get(q, set()) | {refs.get(q)}
            )
            deltas, gaps, by_spec = emb.get(q, ([], [], {}))
            specs = [r[4] for r in rows.get(q, [])]
            out[q] = (
                run.pk,
                Signals(
                    ranks=tuple(r[:3] for r in rows.get(q, [])),
                    n_gallery=len(facts["galleries"].get(q, ())),
                    rivals=rivals,
                    consistency=tuple(deltas),
                    gaps=tuple(gaps),
                    lead=specs.index(lead) if lead in specs else None,
                    lead_gap=by_spec.get(lead),
                ),
            )
    return out


def _list_rank(top: list[int], positives: list[int]) -> int | None:
    """1-based position of the first positive in a top list (None: not in it)."""
    wanted = set(positives)
    return next((n + 1 for n, image in enumerate(top) if image in wanted), None)
