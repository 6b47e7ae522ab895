"""The target rule (:mod:`retrieval.targets`) applied to ``Target`` rows (Django; thin)."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from .models import Dataset, Target
from .targets import TargetFacts, graded_targets, positive_targets

_FIELDS = ("query_id", "image_id", "relevance", "is_primary", "role")


def _facts_by_query(query_ids: Iterable[int] | Any) -> dict[int, list[TargetFacts]]:
    """Query id -> its targets as :class:`TargetFacts` (image = image id), primary first, then by id."""
    out: dict[int, list[TargetFacts]] = defaultdict(list)
    rows = Target.objects.filter(query_id__in=query_ids).order_by("query_id", "-is_primary", "id")
    for qid, image_id, relevance, primary, role in rows.values_list(*_FIELDS):
        out[qid].append(TargetFacts(image_id, relevance, primary, role))
    return out


def dataset_format(dataset: Dataset | int) -> str:
    if isinstance(dataset, Dataset):
        return dataset.format
    return Dataset.objects.filter(pk=dataset).values_list("format", flat=True).first() or ""


def positive_image_ids(fmt: str, query_ids: Iterable[int] | Any) -> dict[int, list[int]]:
    """Query id -> image ids of its positive targets under ``fmt``'s rule (queries with none are left out)."""
    out: dict[int, list[int]] = {}
    for qid, facts in _facts_by_query(query_ids).items():
        ids = [t.image for t in positive_targets(fmt, facts)]
        if ids:
            out[qid] = ids
    return out


def graded_image_ids(fmt: str, query_ids: Iterable[int] | Any) -> dict[int, list[tuple[int, float]]]:
    """Query id -> ``(image id, gain)`` of :func:`retrieval.targets.graded_targets`."""
    return {qid: [(t.image, g) for t, g in graded_targets(fmt, facts)]
            for qid, facts in _facts_by_query(query_ids).items()}
