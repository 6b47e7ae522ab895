"""The calls and cost of the ``api:`` retrievers of an audit, read from the database before the
run is created (``manage.py run_audit`` prints them and refuses a run over ``--max-cost``; the
audit form can show them). Reads only: no file or row is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from retrieval.captions import DEFAULT_JOIN
from retrieval.galleries import gallery_image_ids, query_gallery_keys, split_of_scope
from retrieval.models import Dataset, Image, Query, Turn, turn_text
from retrieval.retrievers.api import client_config
from retrieval.retrievers.api.catalog import model_info
from retrieval.retrievers.api.cost import CandidateInput, Estimate, QueryInput, Workload, estimate
from retrieval.retrievers.base import parse_spec, spec_prefix


def scope_workload(dataset_id: int, scope: str, caption_join: str = DEFAULT_JOIN) -> Workload:
    """What an early-fusion audit of ``scope`` (a stored scope: ``val``, ``dress/val``; '' for
    the whole dataset) sends: every turn with a readable reference image and a text as a
    query, and the images of the galleries its queries search as candidates."""
    queries = Query.objects.filter(dataset_id=dataset_id)
    if scope:
        split, category = split_of_scope(scope)
        queries = queries.filter(split=split, **({"category": category} if category else {}))
    turns = (
        Turn.objects.filter(query__in=queries.values("pk"), reference_image__missing=False)
        .exclude(reference_image__sha256="")
        .exclude(reference_image__path="")
        .order_by("query_id", "index")
        .values_list("reference_image__sha256", "reference_image__width", "reference_image__height", "texts")
    )
    work = Workload()
    for sha, w, h, texts in turns:
        text = turn_text(texts or [], caption_join)
        if text.strip():
            work.queries.append(QueryInput(sha, w, h, text))
    keys = set(query_gallery_keys(queries.values("pk")).values())
    ids = list(
        dict.fromkeys(
            i
            for key in sorted(keys, key=lambda k: (k is None, k or ""))
            for i in gallery_image_ids(dataset_id, key, readable=True)
        )
    )
    rows = Image.objects.filter(pk__in=ids).values_list("sha256", "width", "height")
    work.candidates = [CandidateInput(sha, w, h) for sha, w, h in rows]
    return work


def _uncached(work: Workload, spec: str, dim: int, cache_root: Path | None) -> Workload:
    """``work`` less the candidates already in the embedding cache of ``spec`` (looked up only
    when its folder exists: an estimate creates no cache)."""
    if cache_root is None:
        return work
    from retrieval.embcache import EmbeddingCache, spec_folder_name

    if not (Path(cache_root) / spec_folder_name(spec) / "cache.sqlite3").is_file():
        return work
    cache = EmbeddingCache(cache_root, spec, dim)
    try:
        missing = set(cache.missing_images([c.image_key for c in work.candidates]))
    finally:
        cache.close()
    return Workload(work.queries, [c for c in work.candidates if c.image_key in missing])


def pool_estimates(
    specs: Sequence[str],
    dataset_id: int,
    scope: str,
    modality_rule: str = "family",
    caption_join: str = DEFAULT_JOIN,
    cache_root: Path | None = None,
) -> list[Estimate]:
    """An :class:`~.cost.Estimate` for each ``api:`` spec of ``specs`` (none for the others;
    ValueError for an ``api:`` spec that does not parse)."""
    api = [s for s in specs if spec_prefix(s or "") == "api"]
    if not api:
        return []
    work = scope_workload(dataset_id, scope, caption_join)
    out: list[Estimate] = []
    for spec in dict.fromkeys(api):
        _, parsed = parse_spec(spec)
        config = client_config(model_info(parsed["provider"], parsed["model"]))
        out.append(
            estimate(parsed, _uncached(work, parsed["canonical"], parsed["dim"], cache_root), modality_rule, config)
        )
    return out


def audit_estimates(
    dataset_name: str,
    split: str | None,
    specs: Sequence[str],
    resolve_scope: Callable[[Dataset, str | None], str],
    caption_join: str = DEFAULT_JOIN,
    modality_rule: str = "family",
    cache_root: Path | None = None,
) -> list[Estimate]:
    """:func:`pool_estimates` of an audit not yet created: the dataset by name, the scope by
    ``resolve_scope(dataset, split)`` (the audit's own rule). Nothing is read when no spec is an
    ``api:`` one; nothing is estimated for a dataset that does not exist (the run's creation
    says so)."""
    if not any(spec_prefix(s or "") == "api" for s in specs):
        return []
    dataset = Dataset.objects.filter(name=dataset_name).first()
    if dataset is None:
        return []
    return pool_estimates(
        specs,
        dataset.pk,
        resolve_scope(dataset, split),
        modality_rule=modality_rule,
        caption_join=caption_join,
        cache_root=cache_root,
    )


def refusal(estimates: Sequence[Estimate], max_cost: float | None) -> str | None:
    """Why a run of these estimates is refused under ``max_cost`` US dollars (None: it is not)."""
    total = sum(e.usd for e in estimates)
    if max_cost is None or total <= max_cost:
        return None
    return (
        f"the hosted retrievers' estimated cost ${total:.2f} is over --max-cost ${max_cost:.2f}; "
        "nothing was started (raise --max-cost to run it)"
    )
