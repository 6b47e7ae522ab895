"""The demo world's truth file and what a study has found of its planted defects (issue 25,
item 6: the study page shows the share of planted defects found so far).

``manage.py make_demo`` writes every query's planted kind to :func:`truth_path` (under
``VAR_DIR``, never under an image root: nothing an annotator can fetch carries it). A study
over a dataset with such a file reads it here; annotators never see any of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings

from annotation.models import Study, StudyItem
from annotation.verdicts.readmodel import Verdicts, decide_row, iter_item_batches
from retrieval.demo import HUMAN_EXPECTED


def truth_path(name: str) -> Path:
    """The demo's truth file: every query's planted kind. Under var/, never under an image root."""
    return Path(settings.VAR_DIR) / "demo" / f"{name}.truth.json"


_LOADED: dict[str, tuple[float, dict[str, str]]] = {}


def planted_kinds(dataset: str) -> dict[str, str]:
    """Query external id -> planted kind of a dataset with a truth file (read again when the
    file changes); empty without one."""
    path = truth_path(dataset)
    try:
        stamp = path.stat().st_mtime
    except OSError:
        return {}
    cached = _LOADED.get(dataset)
    if cached is None or cached[0] != stamp:
        truth = json.loads(path.read_text(encoding="utf-8"))
        cached = (stamp, {q: t.get("kind", "") for q, t in truth.get("queries", {}).items()})
        _LOADED[dataset] = cached
    return cached[1]


def defects_found(study: Study) -> dict[str, Any] | None:
    """The study's items with a planted defect a human should reject
    (:data:`retrieval.demo.HUMAN_EXPECTED`) and what its consensus made of them so far:
    ``found`` (rejected), ``missed`` (validated), ``open`` (undecided), ``share`` (found /
    planted), per kind too. None when none of its datasets has a truth file."""
    datasets = list(
        StudyItem.objects.filter(study=study).order_by().values_list("query__dataset__name", flat=True).distinct()
    )
    kinds = {name: planted_kinds(name) for name in datasets}
    if not any(kinds.values()):
        return None
    planted: dict[int, str] = {}
    for item_id, dataset, external_id in StudyItem.objects.filter(
        study=study, query__dataset__name__in=[d for d in datasets if kinds[d]]
    ).values_list("id", "query__dataset__name", "query__external_id"):
        kind = kinds[dataset].get(external_id)
        if kind in HUMAN_EXPECTED:
            planted[item_id] = kind
    by_kind = {k: {"planted": 0, "found": 0, "missed": 0, "open": 0} for k in HUMAN_EXPECTED}
    verdicts = Verdicts.of(study)
    for batch in iter_item_batches(study, item_ids=sorted(planted)):
        for row in batch:
            d = decide_row(row, verdicts)
            entry = by_kind[planted[row.item_id]]
            entry["planted"] += 1
            entry["found" if d.status == "rejected" else "missed" if d.validated else "open"] += 1
    total = {f: sum(e[f] for e in by_kind.values()) for f in ("planted", "found", "missed", "open")}
    return {
        **total,
        "share": total["found"] / total["planted"] if total["planted"] else None,
        "by_kind": {k: e for k, e in by_kind.items() if e["planted"]},
    }
