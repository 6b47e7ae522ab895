"""The sessions written in an interactive study, as a CIRCLED-layout multi-turn dataset.

Layout (the validated export's for session studies, CIR-FORMATS §7.1)::

    manifest.json
    <dataset>/<subset>.json           a JSON list of CIRCLED sessions
    <dataset>/<subset>.trace.jsonl    one line per session: every round as it happened

Each ended session is one CIRCLED record ``{session_id, subset, ground_truth_ids, num_turns,
turns}``: turn ``t`` = round ``t``'s reference image (the query's reference, then the
candidate the annotator picked) and feedback text, with ``"provenance": "human"`` (the
CIRCLED importer keeps a turn's provenance when the record gives one; CIRCLED's own files
say nothing and their later turns are read as generated). ``ground_truth_ids`` are the
query's positive targets (:func:`retrieval.targets.positive_targets`). The subset is named
as :func:`annotation.export.validated.circled_subset` names it, so the file re-imports with
:mod:`retrieval.importers.circled` without ``--subset``. The trace line keeps, per round, the
candidates shown, the target's rank, the ranking and writing times and when it happened;
annotators appear as ``annotator_NN``. Sessions still going on are not exported.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

from django.utils import timezone

from annotation.agreement.reports import annotator_pseudonyms
from annotation.export.validated import circled_subset, export_destination, move_into_place
from annotation.interactive.service import positives
from annotation.models import InteractiveSession, Study
from retrieval.models import Image

FORMAT = "cirval.interactive_export"
PROVENANCE = "human"


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def session_records(study: Study) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(dataset, subset, CIRCLED record, trace line) of every ended session, in session order."""
    names = annotator_pseudonyms(study)
    sessions = (
        InteractiveSession.objects.filter(study=study)
        .exclude(outcome="")
        .select_related("item__query__dataset", "annotator")
        .order_by("id")
    )
    out = []
    for s in sessions:
        query = s.item.query
        rounds = list(s.rounds.filter(status="done").order_by("index"))
        if not rounds:
            continue
        ids = {r.reference_id for r in rounds} | {i for r in rounds for i in r.shown} | set(positives(query))
        ext = dict(Image.objects.filter(pk__in=ids).values_list("pk", "external_id"))
        subset = circled_subset(query.dataset.format, query.dataset.name, query.category, query.split)
        sid = f"{study.pk}-{s.pk}"
        record = {
            "session_id": sid,
            "subset": subset,
            "ground_truth_ids": [ext[p] for p in positives(query)],
            "num_turns": len(rounds),
            "turns": [
                {
                    "turn": r.index,
                    "reference_image_id": ext[r.reference_id],
                    "relative_caption": r.text,
                    "provenance": PROVENANCE,
                }
                for r in rounds
            ],
        }
        trace = {
            "session_id": sid,
            "study": study.name,
            "query": query.external_id,
            "dataset": query.dataset.name,
            "annotator": names.get(s.annotator.username, ""),
            "outcome": s.outcome,
            "settings": s.config,
            "started_at": _iso(s.started_at),
            "finished_at": _iso(s.finished_at),
            "rounds": [
                {
                    "turn": r.index,
                    "text": r.text,
                    "reference_image_id": ext[r.reference_id],
                    "shown": [ext[i] for i in r.shown],
                    "target_rank": r.target_rank,
                    "rank_ms": r.rank_ms,
                    "time_spent_ms": r.time_spent_ms,
                    "written_at": _iso(r.created_at),
                    "ranked_at": _iso(r.ranked_at),
                }
                for r in rounds
            ],
        }
        out.append((query.dataset.name, subset, record, trace))
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def export_interactive(study: Study, out_dir: Path | str | None = None) -> Path:
    """Write the study's ended sessions (module notes); returns the export folder."""
    final, auto = export_destination(study, Path(out_dir) if out_dir else None)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    grouped: dict[tuple[str, str], list[tuple[dict, dict]]] = defaultdict(list)
    for dataset, subset, record, trace in session_records(study):
        grouped[(dataset, subset)].append((record, trace))
    files = []
    for (dataset, subset), rows in sorted(grouped.items()):
        folder = tmp / dataset
        folder.mkdir(exist_ok=True)
        (folder / f"{subset}.json").write_text(json.dumps([r for r, _ in rows], indent=1) + "\n", encoding="utf-8")
        (folder / f"{subset}.trace.jsonl").write_text("".join(json.dumps(t) + "\n" for _, t in rows), encoding="utf-8")
        for name in (f"{subset}.json", f"{subset}.trace.jsonl"):
            path = folder / name
            files.append(
                {
                    "path": f"{dataset}/{name}",
                    "dataset": dataset,
                    "subset": subset,
                    "sessions": len(rows),
                    "bytes": path.stat().st_size,
                    "sha256": _sha256(path),
                }
            )
    manifest = {
        "format": FORMAT,
        "version": 1,
        "study": study.name,
        "created_at": timezone.now().isoformat(),
        "settings": study.interactive,
        "query_format": "circled",
        "sessions": sum(len(v) for v in grouped.values()),
        "files": files,
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return move_into_place(tmp, final, auto)
