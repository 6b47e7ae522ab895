"""Prediction files for the benchmarks' evaluation servers, from an audit's retriever.

* **CIRR test server** (Cuberick-Orion/CIRR ``Test-split_server.md``): two JSON objects,
  ``{"version": "rc2", "metric": "recall", "<pairid>": [50 image names], ...}`` (the top 50 of
  the split's gallery, the reference removed, as CLIP4Cir and CIRPLANT rank) and the same with
  ``"metric": "recall_subset"`` and the top 3 of the query's ``img_set`` members (the
  reference removed);
* **CIRCO** (miccunifi/CIRCO ``submission_examples``; ``src/evaluation.py`` checks 50 unique
  ids): ``{"<query id>": [50 COCO image ids (integers)], ...}``, the top 50 of the gallery with
  the reference kept, as SEARLE ranks.

The queries are ranked by the audit's retriever (``--retriever``, default its first) with
the multimodal query, against the gallery each query searches (:mod:`retrieval.galleries`),
through the embedding cache the audit filled (so an audited gallery is not encoded again):
:func:`audit.runs.ondemand.rank_with_scores`, the same ranking
(:func:`retrieval.ranking.rank_queries`) and composition the audit uses. Test splits have no
targets, so an audit cannot label them; their predictions are ranked here. For a split the
audit ranked, the top 50 equal the audit's stored multimodal top lists (a test checks it).

A server scores every query of its split, so every query is ranked with the text it has: a
blank one (CIRR test1's pairid 27098, caption ``' '``) as the retriever family ranks an empty
text (:data:`retrieval.captions.BLANK_TEXT_RULE`, as the CIRR test scripts do); the result
names those queries (:attr:`Predictions.blank`). Only a query whose reference image has no
readable file cannot be ranked, and that refuses the export.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retrieval.captions import BLANK_TEXT_RULE, ranking_text
from retrieval.models import Image, Query, Turn, turn_text

from .models import AuditRun
from .runs.ondemand import rank_with_scores

TOP, SUBSET_TOP = 50, 3
CIRR_VERSION = "rc2"


class PredictionError(ValueError):
    """The predictions cannot be written (naming what and why)."""


@dataclass
class Predictions:
    files: list[Path] = field(default_factory=list)
    queries: int = 0
    unranked: list[str] = field(default_factory=list)
    blank: list[str] = field(default_factory=list)  # queries ranked with the empty text (BLANK_TEXT_RULE)

    def blank_text(self) -> str:
        """One sentence naming the queries ranked with the empty text ('' when none was)."""
        if not self.blank:
            return ""
        shown = ", ".join(self.blank[:10]) + (f" and {len(self.blank) - 10} more" if len(self.blank) > 10 else "")
        return (
            f"{len(self.blank)} quer{'y has' if len(self.blank) == 1 else 'ies have'} a blank text ({shown}): "
            f"{BLANK_TEXT_RULE}"
        )


def _queries(run: AuditRun, split: str) -> list[Query]:
    qs = list(Query.objects.filter(dataset_id=run.dataset_id, split=split, n_turns=1).order_by("ordinal", "id"))
    if not qs:
        splits = sorted(set(Query.objects.filter(dataset_id=run.dataset_id).values_list("split", flat=True)))
        raise PredictionError(
            f"dataset {run.dataset.name!r} has no single-turn query in split {split!r} (splits: {', '.join(splits)})"
        )
    return qs


def _names(ids: set[int]) -> dict[int, str]:
    return dict(Image.objects.filter(pk__in=list(ids)).values_list("pk", "external_id"))


def _write(path: Path, data: dict[str, Any]) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
    return path


def _retriever_of(run: AuditRun, retriever: str | None) -> str:
    """The audit retriever that ranks the predictions (default: its first computed one)."""
    external = set(run.external_retrievers or [])
    spec = retriever or next((r for r in run.retrievers if r not in external), None)
    if spec is None or spec not in run.retrievers or spec in external:
        raise PredictionError(
            f"retriever {retriever!r} is not one this audit ran (its pool: {', '.join(run.retrievers)})"
        )
    return spec


def _img_sets(run: AuditRun, queries: list[Query]) -> dict[int, list[int]]:
    """query id -> image ids of its CIRR ``img_set`` members."""
    by_ext = dict(Image.objects.filter(dataset_id=run.dataset_id).values_list("external_id", "pk"))
    return {
        q.pk: [by_ext[m] for m in ((q.extra or {}).get("img_set") or {}).get("members", []) if m in by_ext]
        for q in queries
    }


def _cirr_files(queries: list[Query], ranked: dict, refs: dict[int, int], out_dir: Path, suffix: str) -> list[Path]:
    names = _names({i for top, group in ranked.values() for i in (*top, *group)})
    recall: dict[str, Any] = {"version": CIRR_VERSION, "metric": "recall"}
    subset: dict[str, Any] = {"version": CIRR_VERSION, "metric": "recall_subset"}
    for q in queries:
        top, group = ranked[q.pk]
        recall[q.external_id] = [names[i] for i in top if i != refs.get(q.pk)][:TOP]
        subset[q.external_id] = [names[i] for i in group if i != refs.get(q.pk)][:SUBSET_TOP]
    return [
        _write(out_dir / f"recall_submission{suffix}.json", recall),
        _write(out_dir / f"recall_subset_submission{suffix}.json", subset),
    ]


def _circo_file(queries: list[Query], ranked: dict, split: str, out_dir: Path, suffix: str) -> list[Path]:
    names = _names({i for top, _ in ranked.values() for i in top})
    return [
        _write(
            out_dir / f"circo_{split}_submission{suffix}.json",
            {q.external_id: [int(names[i]) for i in ranked[q.pk][0][:TOP]] for q in queries},
        )
    ]


def export_predictions(
    run: AuditRun, split: str, out_dir: Path, retriever: str | None = None, name: str = ""
) -> Predictions:
    """Write the evaluation server's prediction file(s) for ``split`` of the run's dataset."""
    fmt = run.dataset.format
    if fmt not in ("cirr", "circo"):
        raise PredictionError(f"no evaluation server format for {fmt!r} datasets (CIRR and CIRCO have one)")
    spec = _retriever_of(run, retriever)
    queries = _queries(run, split)
    turns = {
        qid: (ref, texts)
        for qid, ref, texts in Turn.objects.filter(query__in=queries, index=1).values_list(
            "query_id", "reference_image_id", "texts"
        )
    }
    refs = {qid: ref for qid, (ref, _) in turns.items()}
    ranked = rank_with_scores(queries, TOP + 1, spec, _img_sets(run, queries) if fmt == "cirr" else {}, blank_text=True)
    out = Predictions(queries=len(queries))
    out.unranked = [q.external_id for q in queries if q.pk not in ranked]
    if out.unranked:
        raise PredictionError(
            f"{len(out.unranked)} queries could not be ranked (no readable reference image), "
            f"e.g. {', '.join(out.unranked[:5])}; a submission needs every query"
        )
    out.blank = [
        q.external_id for q in queries if ranking_text(turn_text(turns.get(q.pk, (None, []))[1] or [])) is None
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = f"_{name}" if name else ""
    out.files = (
        _cirr_files(queries, ranked, refs, out_dir, suffix)
        if fmt == "cirr"
        else _circo_file(queries, ranked, split, out_dir, suffix)
    )
    return out
