"""The validated export of a study: M-BEIR query JSONL per dataset and hidden category, a
trace JSONL beside each, and a manifest with counts and SHA-256 of every file.

Streamed: items are read in id order with ``.iterator(chunk_size)``, one batch of items
(with their votes, queries, turns and targets) at a time, and every line is written as soon
as it is made, so memory does not grow with the study. The files go to a temporary folder
next to the destination that is renamed at the end: a reader never sees half an export.

Layout of an export folder::

    manifest.json
    <dataset>/validated_solved/<dataset>_validated_solved.jsonl         hidden category composition_required
    <dataset>/validated_solved/<dataset>_validated_solved.trace.jsonl
    <dataset>/validated_unsolved/...                                     hidden category unresolved
    <dataset>/validated/...                                              no hidden category (no audit)
    <dataset>/validated_<label>/...                                      any other audit label

A subset's files exist only when it has at least one line. Query lines follow the M-BEIR
query layout, keys in this order: ``qid, query_txt, query_img_path, query_modality,
query_src_content, pos_cand_list, neg_cand_list, task_id``. An M-BEIR query keeps its own
values (from the verbatim source record); other formats get ``qid = "<dataset>:<query id>"``,
the turn's text, the reference image path (relative to the dataset's image root),
``query_modality = "image,text"``, ``query_src_content`` = JSON of the dataset, query id
and reference id, positives = targets of relevance 1 (the primary first), negatives = every
other target (graded below 1 or negative, as M-BEIR's CIRR conversion does), ``task_id = 7``.
Each trace line carries the consensus, every vote (category, sub-reason, flags, note, flag
for adjudication, time, revision) and the adjudication behind the query line at the same
position. Annotators appear as ``annotator_NN`` (:func:`annotation.agreement.reports.annotator_pseudonyms`),
adjudicators as ``adjudicator_NN`` (username order).

After the rename, each dataset of the study gets its :class:`retrieval.models.QuerySubset`
named ``validated`` rewritten with the validated queries, so an audit report can score them.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.text import slugify

from retrieval.jobs.leases import run_job
from retrieval.models import Dataset, Query, QuerySubset, Target, Turn, turn_text

from annotation.verdicts.adjudication import DEFAULT_CHUNK, ItemRow, decide_row, iter_item_batches, validity_label
from annotation.agreement.maths import validity_signature
from annotation.verdicts.consensus import POLICIES, REJECTED, UNJUDGED, VALIDATED, Decision
from annotation.models import Adjudication, ExportJob, Study, StudyItem
from annotation.agreement.reports import annotator_pseudonyms


FORMAT = "cirval.validated_export"
FORMAT_VERSION = 1
TASK_ID = 7  # M-BEIR: (image, text) -> image
SUBSETS = {"composition_required": "validated_solved", "unresolved": "validated_unsolved", "": "validated"}
SUBSET_QUERY_NAME = "validated"
MBEIR_KEYS = ("qid", "query_txt", "query_img_path", "query_modality", "query_src_content", "pos_cand_list",
              "neg_cand_list", "task_id")

Progress = Callable[[str, int, int], None]


class ExportError(ValueError):
    """An export that cannot run (wrong rubric, unknown primary annotator, busy destination)."""


def subset_name(hidden_category: str) -> str:
    """validated_solved / validated_unsolved / validated / validated_<label>."""
    if hidden_category in SUBSETS:
        return SUBSETS[hidden_category]
    return "validated_" + (slugify(hidden_category).replace("-", "_") or "other")


class _HashingFile:
    """A binary file written line by line, hashing and counting as it goes."""

    def __init__(self, path: Path):
        self.path = path
        self.handle: IO[bytes] = open(path, "wb")
        self.sha = hashlib.sha256()
        self.lines = 0
        self.bytes = 0

    def write_json(self, obj: Any) -> None:
        data = (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")
        self.handle.write(data)
        self.sha.update(data)
        self.lines += 1
        self.bytes += len(data)

    def close(self) -> None:
        self.handle.close()


@dataclass
class _Subset:
    dataset: str
    subset: str
    hidden_category: str
    queries: _HashingFile
    trace: _HashingFile


@dataclass
class ExportResult:
    path: Path
    manifest: dict[str, Any]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def check_exportable(study: Study, policy: str, primary: str | None) -> None:
    """Raise :class:`ExportError` unless the study can be exported under this policy."""
    rubric = study.rubric.rubric
    if rubric.kind != "category" or rubric.valid_category is None:
        raise ExportError(f"study {study.name!r} uses the {rubric.kind} rubric {rubric.key!r}: only category "
                          "rubrics with a validated category can be exported")
    if policy not in POLICIES:
        raise ExportError(f"unknown consensus policy {policy!r}; expected one of {POLICIES}")
    if primary and policy != "primary":
        raise ExportError("a primary annotator is only used by the primary policy")
    if primary and not study.assignments.filter(annotator__username=primary).exists():
        raise ExportError(f"{primary!r} has no assignment in study {study.name!r}")


def _positive(relevance: float, role: str, is_primary: bool) -> bool:
    return role != "neg" and relevance > 0 and (relevance >= 1.0 or is_primary)


class _QueryData:
    """Query, first turn and targets of one batch of validated queries (a few queries)."""

    def __init__(self, query_ids: list[int]):
        self.queries = {q: (raw, fmt, ext, split) for q, raw, fmt, ext, split in Query.objects.filter(
            id__in=query_ids).values_list("id", "raw", "dataset__format", "external_id", "split")}
        self.turns: dict[int, tuple[str, str | None, str | None]] = {}
        for q, texts, path, ref in Turn.objects.filter(query_id__in=query_ids, index=1).values_list(
                "query_id", "texts", "reference_image__path", "reference_image__external_id"):
            self.turns[q] = (turn_text(texts), path or None, ref)
        self.targets: dict[int, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
        rows = Target.objects.filter(query_id__in=query_ids)
        for q, ext, role, relevance, primary in rows.order_by("query_id", "-is_primary", "id").values_list(
                "query_id", "image__external_id", "role", "relevance", "is_primary"):
            pos, neg = self.targets[q]
            (pos if _positive(relevance, role, primary) else neg).append(ext)

    def mbeir_line(self, row: ItemRow) -> dict[str, Any]:
        raw, fmt, ext, _split = self.queries[row.query_id]
        if fmt == "mbeir" and isinstance(raw, dict) and raw.get("qid"):
            line = {key: raw.get(key) for key in MBEIR_KEYS}
            line["query_modality"] = raw.get("query_modality") or "image,text"
            line["pos_cand_list"] = list(raw.get("pos_cand_list") or [])
            line["neg_cand_list"] = list(raw.get("neg_cand_list") or [])
            line["task_id"] = raw.get("task_id", TASK_ID)
            return line
        text, path, ref = self.turns.get(row.query_id, ("", None, None))
        pos, neg = self.targets.get(row.query_id, ([], []))
        return {
            "qid": f"{row.dataset}:{ext}",
            "query_txt": text,
            "query_img_path": path,
            "query_modality": "image,text",
            "query_src_content": json.dumps({"dataset": row.dataset, "id": ext, "reference": ref}),
            "pos_cand_list": list(pos),
            "neg_cand_list": list(neg),
            "task_id": TASK_ID,
        }


def _vote_dict(vote, names: dict[str, str]) -> dict[str, Any]:
    label = validity_label(vote.validated, vote.flags, vote.category)
    try:
        signature = validity_signature(label) if label is not None else None
    except ValueError:  # a category rubric whose keys are not the CIRCUS flags
        signature = None
    return {
        "annotator": names.get(vote.annotator, vote.annotator),
        "validated": vote.validated,
        "label": label,
        "signature": signature,
        "category": vote.category,
        "sub_reason": vote.sub_reason,
        "flags": vote.flags,
        "note": vote.note,
        "flagged": vote.flagged,
        "time_spent_ms": vote.time_spent_ms,
        "revision": vote.revision,
        "judged_at": _iso(vote.judged_at),
    }


def _trace_line(qid: str, row: ItemRow, decision: Decision, subset: str, policy: str,
                names: dict[str, str], adjudicators: dict[str, str]) -> dict[str, Any]:
    adj = row.adjudication
    return {
        "qid": qid,
        "item": row.item_id,
        "query": row.query_id,
        "dataset": row.dataset,
        "query_external_id": row.external_id,
        "query_ordinal": row.ordinal,
        "hidden_category": row.hidden_category,
        "subset": subset,
        "validated": True,
        "consensus": {
            "policy": policy, "status": decision.status, "provenance": decision.provenance,
            "valid_votes": decision.valid_votes, "invalid_votes": decision.invalid_votes,
            "n_votes": decision.n_votes, "flagged_votes": decision.flagged_votes,
            "decided_by": names.get(decision.decided_by, decision.decided_by) if decision.decided_by else None,
        },
        "votes": [_vote_dict(v, names) for v in row.votes],
        "adjudication": None if adj is None else {
            "decision": adj.decision, "note": adj.note,
            "adjudicator": adjudicators.get(adj.decided_by or "", None), "decided_at": _iso(adj.decided_at),
        },
    }


def _destination(study: Study, out_dir: Path | None) -> tuple[Path, bool]:
    """(final folder, auto-named). An explicit folder must be absent or empty."""
    if out_dir is not None:
        out_dir = Path(out_dir).resolve()
        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            raise ExportError(f"{out_dir} exists and is not an empty folder")
        return out_dir, False
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    base = slugify(study.name) or f"study-{study.pk}"
    return Path(settings.EXPORT_DIR).resolve() / f"{base}-{stamp}", True


def _move_into_place(tmp: Path, final: Path, auto: bool) -> Path:
    if final.is_dir() and not any(final.iterdir()):
        final.rmdir()
    for n in range(1, 1000):
        target = final if n == 1 else final.with_name(f"{final.name}-{n}")
        try:
            os.rename(tmp, target)  # atomic; fails when the target is a non-empty folder
            return target
        except OSError:
            if not auto or not target.exists():
                raise
    raise ExportError(f"cannot find a free folder name next to {final}")


def _refresh_validated_subsets(study: Study, dataset_ids: list[int], id_file: Path) -> None:
    """Rewrite each dataset's 'validated' QuerySubset from the ids written during the export."""
    through = QuerySubset.queries.through
    with transaction.atomic():
        subsets = {}
        for ds in Dataset.objects.filter(id__in=dataset_ids):
            subset, _ = QuerySubset.objects.get_or_create(dataset=ds, name=SUBSET_QUERY_NAME)
            subset.source = f"study {study.pk} export"
            subset.save(update_fields=["source"])
            through.objects.filter(querysubset=subset).delete()
            subsets[ds.pk] = subset.pk
        batch: list = []
        with open(id_file, encoding="ascii") as fh:
            for line in fh:
                dataset_id, query_id = map(int, line.split())
                batch.append(through(querysubset_id=subsets[dataset_id], query_id=query_id))
                if len(batch) >= 5000:
                    through.objects.bulk_create(batch, ignore_conflicts=True)
                    batch = []
        if batch:
            through.objects.bulk_create(batch, ignore_conflicts=True)


def export_study(
    study: Study,
    out_dir: Path | str | None = None,
    *,
    policy: str = "majority",
    primary: str | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    progress: Progress | None = None,
    tmp_name: str | None = None,
) -> ExportResult:
    """Export a study's validated items (module docstring). ``out_dir``: the export folder
    itself (absent or empty); default ``EXPORT_DIR/<study>-<timestamp>``. ``progress(stage,
    done, total)`` is called after every batch. Returns the final folder and the manifest."""
    check_exportable(study, policy, primary or None)
    primary = primary or None
    report = progress or (lambda stage, done, total: None)
    final, auto = _destination(study, Path(out_dir) if out_dir is not None else None)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / (tmp_name or f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    if tmp.exists():
        shutil.rmtree(tmp)  # a previous attempt of the same job died half way
    tmp.mkdir()
    id_file = final.parent / f"{tmp.name}.ids"
    names = annotator_pseudonyms(study)
    adjudicator_names = sorted({u for u in Adjudication.objects.filter(study=study).order_by()
                                .values_list("decided_by__username", flat=True).distinct() if u})
    adjudicators = {u: f"adjudicator_{i:02d}" for i, u in enumerate(adjudicator_names, start=1)}
    total = StudyItem.objects.filter(study=study).count()
    created_at = timezone.now()
    writers: dict[tuple[str, str], _Subset] = {}
    status_counts = {s: 0 for s in (VALIDATED, REJECTED, "adjudication", UNJUDGED)}
    provenance_counts: dict[str, int] = defaultdict(int)
    per_dataset: dict[str, dict[str, Any]] = {}
    dataset_ids: dict[str, int] = {}
    done = 0
    report("exporting", 0, total)
    try:
        with open(id_file, "w", encoding="ascii") as ids:
            for batch in iter_item_batches(study, chunk_size=chunk_size):
                decided = [(row, decide_row(row, policy, primary)) for row in batch]
                keep = [(row, d) for row, d in decided if d.validated]
                data = _QueryData([row.query_id for row, _ in keep]) if keep else None
                for row, d in decided:
                    status_counts[d.status] += 1
                    if d.decided:
                        provenance_counts[d.provenance] += 1
                    dataset_ids.setdefault(row.dataset, row.dataset_id)
                    entry = per_dataset.setdefault(row.dataset, {"items": 0, "validated": 0, "subsets": {}})
                    entry["items"] += 1
                for row, d in keep:
                    subset = subset_name(row.hidden_category)
                    w = writers.get((row.dataset, subset))
                    if w is None:
                        folder = tmp / row.dataset / subset
                        folder.mkdir(parents=True, exist_ok=True)
                        stem = f"{row.dataset}_{subset}"
                        w = writers[(row.dataset, subset)] = _Subset(
                            row.dataset, subset, row.hidden_category,
                            _HashingFile(folder / f"{stem}.jsonl"), _HashingFile(folder / f"{stem}.trace.jsonl"))
                    line = data.mbeir_line(row)  # type: ignore[union-attr]
                    w.queries.write_json(line)
                    w.trace.write_json(_trace_line(str(line["qid"]), row, d, subset, policy, names, adjudicators))
                    ids.write(f"{row.dataset_id} {row.query_id}\n")
                    entry = per_dataset[row.dataset]
                    entry["validated"] += 1
                    entry["subsets"][subset] = entry["subsets"].get(subset, 0) + 1
                done += len(batch)
                report("exporting", done, total)
                if settings.DEBUG and not connection.force_debug_cursor:
                    connection.queries_log.clear()  # DEBUG keeps every SQL string: memory would grow
        for w in writers.values():
            w.queries.close()
            w.trace.close()

        files = []
        for (dataset, subset), w in sorted(writers.items()):
            for kind, f in (("queries", w.queries), ("trace", w.trace)):
                files.append({"path": f.path.relative_to(tmp).as_posix(), "kind": kind, "dataset": dataset,
                              "subset": subset, "hidden_category": w.hidden_category, "lines": f.lines,
                              "bytes": f.bytes, "sha256": f.sha.hexdigest()})
        rubric = study.rubric
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created_at": created_at.isoformat(),
            "study": {"id": study.pk, "name": study.name, "overlap": study.overlap, "blind": study.blind},
            "rubric": {"key": rubric.key, "version": rubric.version, "title": rubric.title},
            "consensus": {
                "policy": policy,
                "primary": names.get(primary, primary) if primary else None,
                "adjudications_applied": Adjudication.objects.filter(study=study, is_current=True).count(),
                "rule": {
                    "majority": "validated when strictly more than half of the item's annotators chose VALIDATED",
                    "unanimous": "validated when every annotator of the item chose VALIDATED",
                    "primary": "validated when the deciding annotator (the primary one where they judged the "
                               "item, else the first in username order) chose VALIDATED",
                }[policy] + "; flagged items, ties and disagreements wait for an adjudicator, whose decision "
                            "always wins",
            },
            "counts": {
                "items": total,
                "validated": status_counts[VALIDATED],
                "rejected": status_counts[REJECTED],
                "pending_adjudication": status_counts["adjudication"],
                "unjudged": status_counts[UNJUDGED],
                "by_provenance": dict(sorted(provenance_counts.items())),
                "exported_lines": sum(w.queries.lines for w in writers.values()),
            },
            "datasets": {k: per_dataset[k] for k in sorted(per_dataset)},
            "files": files,
            "query_layout": list(MBEIR_KEYS),
            "pseudonyms": "annotators are annotator_NN and adjudicators adjudicator_NN, numbered in username order",
        }
        with open(tmp / "manifest.json", "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
        report("finishing", done, total)
        path = _move_into_place(tmp, final, auto)
        _refresh_validated_subsets(study, sorted(dataset_ids.values()), id_file)
        return ExportResult(path, manifest)
    except BaseException:
        for w in writers.values():
            w.queries.handle.close()
            w.trace.handle.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        id_file.unlink(missing_ok=True)


def run_export_job(job: ExportJob) -> ExportJob:
    """Run one ExportJob under :func:`retrieval.jobs.leases.run_job`: claimed once (a
    redelivered message or a resend never runs it twice at once), beating, and finished
    with the folder and the manifest, or failed with a readable message."""
    def work(report) -> dict[str, Any]:
        study = Study.objects.select_related("rubric").get(pk=job.study_id)
        result = export_study(study, policy=job.policy, primary=job.primary or None, progress=report,
                              tmp_name=f".export-job{job.pk}.tmp",
                              chunk_size=getattr(settings, "EXPORT_CHUNK_SIZE", DEFAULT_CHUNK))
        return {"path": str(result.path), "manifest": result.manifest,
                "files": ["manifest.json"] + [f["path"] for f in result.manifest["files"]]}

    run_job(ExportJob, job.pk, work)
    job.refresh_from_db()
    return job
