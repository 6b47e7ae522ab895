"""The target rule (:mod:`retrieval.targets`) applied to ``Target`` rows (Django; thin)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .models import Dataset, Image, Query, Target
from .targets import TargetFacts, graded_targets, positive_targets

_FIELDS = ("query_id", "image_id", "relevance", "is_primary", "role")


def facts_by_query(query_ids: Iterable[int] | Any) -> dict[int, list[TargetFacts]]:
    """Query id -> its targets as :class:`TargetFacts` (image = image id), primary first, then by id."""
    out: dict[int, list[TargetFacts]] = defaultdict(list)
    rows = Target.objects.filter(query_id__in=query_ids).order_by("query_id", "-is_primary", "id")
    for qid, image_id, relevance, primary, role in rows.values_list(*_FIELDS):
        out[qid].append(TargetFacts(image_id, relevance, primary, role))
    return out


def dataset_format(dataset: Dataset | int) -> str:
    if isinstance(dataset, Dataset):
        return dataset.format
    found = list(Dataset.objects.filter(pk=dataset).order_by().values_list("format", flat=True))
    return (found[0] if found else "") or ""


def positive_image_ids(
    fmt: str, query_ids: Iterable[int] | Any, facts_of: dict[int, list[TargetFacts]] | None = None
) -> dict[int, list[int]]:
    """Query id -> image ids of its positive targets under ``fmt``'s rule (queries with none are left out).

    ``facts_of``: the targets already read by :func:`facts_by_query` (``query_ids`` is then not read)."""
    out: dict[int, list[int]] = {}
    for qid, facts in (facts_by_query(query_ids) if facts_of is None else facts_of).items():
        ids = [t.image for t in positive_targets(fmt, facts)]
        if ids:
            out[qid] = ids
    return out


@dataclass
class QueryTargets:
    """What one query is evaluated against (image ids; see :mod:`retrieval.targets`).

    ``positives``: the positive targets (rule order); ``extras``/``gains``: graded-only
    targets and their gains (CIRR's soft targets); ``group``: the images of the query's
    subset group for Recall_subset (CIRR's ``img_set`` members), empty elsewhere.
    """

    positives: list[int] = field(default_factory=list)
    extras: list[int] = field(default_factory=list)
    gains: list[float] = field(default_factory=list)
    group: list[int] = field(default_factory=list)


def _subset_groups(dataset_id: int, query_ids: Iterable[int] | Any) -> dict[int, list[int]]:
    """Query id -> image ids of its CIRR ``img_set`` members (queries without one are left out)."""
    members = {
        qid: list((extra or {}).get("img_set", {}).get("members") or [])
        for qid, extra in Query.objects.filter(pk__in=query_ids).values_list("pk", "extra")
    }
    wanted = {m for ms in members.values() for m in ms}
    by_ext = dict(Image.objects.filter(dataset_id=dataset_id, external_id__in=wanted).values_list("external_id", "pk"))
    return {qid: [by_ext[m] for m in ms if m in by_ext] for qid, ms in members.items() if ms}


def evaluation_targets(
    dataset: Dataset | int, query_ids: Iterable[int] | Any, facts_of: dict[int, list[TargetFacts]] | None = None
) -> dict[int, QueryTargets]:
    """Query id -> :class:`QueryTargets` for every query with at least one positive.

    ``facts_of``: the targets already read by :func:`facts_by_query` for (at least) these
    queries; only those of ``query_ids`` are used, and the targets are not read again."""
    fmt = dataset_format(dataset)
    ids = list(query_ids)
    if facts_of is None:
        facts_of = facts_by_query(ids)
    else:
        facts_of = {q: facts_of[q] for q in sorted(set(ids)) if q in facts_of}
    out: dict[int, QueryTargets] = {}
    for qid, facts in facts_of.items():
        graded = graded_targets(fmt, facts)
        n_pos = len(positive_targets(fmt, facts))
        if n_pos:
            out[qid] = QueryTargets(
                [t.image for t, _ in graded[:n_pos]],
                [t.image for t, _ in graded[n_pos:]],
                [g for _, g in graded[n_pos:]],
            )
    if fmt == "cirr":
        dataset_id = dataset.pk if isinstance(dataset, Dataset) else dataset
        for qid, group in _subset_groups(dataset_id, list(out)).items():
            out[qid].group = group
    return out
