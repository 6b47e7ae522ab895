"""A release of one or more studies: one folder (and a zip of it) a venue accepts.

Layout of a release folder::

    README.md                     the dataset card (:mod:`annotation.release.card`)
    croissant.json                Croissant 1.1 + RAI 1.0 (:mod:`annotation.release.croissant`)
    release.json                  what made it: CIRVal commit, studies, rubric versions, retrievers
                                  (spec + checkpoint file name and sha256), layouts; ``released_at``
                                  is the one field that changes between two runs on the same data
    SHA256SUMS                    ``sha256sum -c`` format, every other file, sorted by path
    study-<id>/rubric.json        the rubric version's full definition
    study-<id>/guidelines.md      the study's guidelines (its latest saved version)
    study-<id>/agreement.json     :func:`annotation.agreement.reports.study_report` (pseudonymised)
    study-<id>/agreement.csv      :func:`annotation.agreement.reports.report_csv_rows` of the same
    study-<id>/alternatives.json  :func:`annotation.alternatives.study.alternatives_report` (category rubrics)
    study-<id>/audit/<dataset>.json  :func:`audit.report.audit_report_json` of the run the pool was drawn from
    leaderboards/<ds>-<split>-<name>.csv|json|tex  the released datasets' leaderboards (:mod:`annotation.release.leaderboards`)
    study-<id>/<layout>/          :func:`annotation.export.validated.export_study` in that layout
                                  (manifest.json, query JSONL / CIRCO / CIRCLED files, traces)

The validated files are written by the one export service (no second export path). Every
number of the card and of croissant.json is read from these files' source dicts, never
computed again. Reproducible: the exports' ``created_at`` is the time of the study's last
judgement or adjudication, the bootstrap seed is fixed (0), JSON is written with sorted
keys where the release writes it, and the zip has fixed dates and sorted entries. No server
path: a checkpoint is named by its file name and sha256 (:mod:`annotation.release.names`),
so a release made from another folder is the same bytes but for ``released_at``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Max
from django.utils import timezone
from django.utils.text import slugify

from annotation.agreement.reports import (
    annotator_pseudonyms,
    default_bootstrap,
    report_csv_rows,
    safe_rows,
    study_report,
)
from annotation.export.validated import ExportError, check_exportable, export_study
from annotation.models import Adjudication, GuidelinesVersion, Judgement, Study
from annotation.release.card import dataset_card
from annotation.release.croissant import croissant, placeholders
from annotation.release.files import RELEASE_JSON, SUMS, TIMESTAMP_FIELD, file_sums, release_files
from annotation.release.leaderboards import write_leaderboards
from annotation.release.names import ServerPaths, checkpoint_path, file_name, public_spec
from annotation.verdicts.readmodel import is_session_rubric
from audit.models import AuditRun
from audit.report import audit_report_json
from retrieval.imagefiles import sha256_file
from retrieval.jobs.leases import run_job
from retrieval.retrievers import spec_facts

LAYOUTS: tuple[str, ...] = ("mbeir", "circo", "circled")
CATEGORY_LAYOUTS = ("mbeir", "circo")
SESSION_LAYOUTS = ("circled",)
SEED = 0  # the bootstrap seed of the agreement intervals (fixed: the same study gives the same bytes)

Progress = Callable[[str, int, int], None]


class ReleaseError(ExportError):
    """A release that cannot be made (unknown study, no layout fits a study, busy destination)."""


@dataclass
class StudyPart:
    """What a release holds for one study (the dicts the card and croissant.json read)."""

    study: Study
    folder: str
    layouts: list[str]
    exports: dict[str, dict[str, Any]] = field(default_factory=dict)  # layout -> manifest
    report: dict[str, Any] = field(default_factory=dict)
    alternatives: dict[str, Any] | None = None
    audits: dict[str, dict[str, Any]] = field(default_factory=dict)  # dataset -> audit report
    runs: dict[str, AuditRun] = field(default_factory=dict)
    guidelines_version: int | None = None
    data_as_of: datetime | None = None

    @property
    def session(self) -> bool:
        return is_session_rubric(self.study.rubric.rubric)


class _Overall:
    """One progress bar over a whole release: each export's items, in turn, add up."""

    def __init__(self, report: Progress, total: int):
        self.report, self.total, self.offset, self.last = report, total, 0, 0

    def __call__(self, stage: str, done: int, total: int) -> None:
        if done < self.last:  # the next export started
            self.offset += self.last
        self.last = done
        self.report(stage, min(self.total, self.offset + done), self.total)


@dataclass
class ReleaseResult:
    path: Path
    zip_path: Path
    placeholders: list[str]
    release: dict[str, Any]
    files: list[str]


def layouts_for(study: Study, asked: list[str] | None) -> list[str]:
    """The layouts of ``asked`` that fit the study (CIRCLED for session rubrics, M-BEIR / CIRCO
    for category rubrics); default M-BEIR or CIRCLED. Raises :class:`ReleaseError` when none fits."""
    fits = SESSION_LAYOUTS if is_session_rubric(study.rubric.rubric) else CATEGORY_LAYOUTS
    if not asked:
        return [fits[0]]
    unknown = sorted(set(asked) - set(LAYOUTS))
    if unknown:
        raise ReleaseError(f"unknown layout(s) {', '.join(unknown)}; expected {', '.join(LAYOUTS)}")
    chosen = [x for x in LAYOUTS if x in asked and x in fits]
    if not chosen:
        raise ReleaseError(
            f"study {study.pk} ({study.name!r}) cannot be written as {', '.join(asked)}: "
            f"its rubric exports {' or '.join(fits)}"
        )
    return chosen


def check_release(study_ids: list[int], layouts: list[str] | None) -> list[tuple[Study, list[str]]]:
    """The studies and the layouts of each; raises :class:`ReleaseError` with a readable message.
    The command and the page both ask this before starting."""
    if not study_ids:
        raise ReleaseError("a release needs at least one study")
    out = []
    for pk in dict.fromkeys(study_ids):
        study = Study.objects.select_related("rubric").filter(pk=pk).first()
        if study is None:
            raise ReleaseError(f"no study with id {pk}")
        chosen = layouts_for(study, layouts)
        for layout in chosen:
            check_exportable(study, "majority", None, "mbeir" if layout == "circled" else layout)
        out.append((study, chosen))
    return out


def cirval_commit() -> str:
    """The CIRVal commit the release was made with (``git rev-parse HEAD``), else ``unknown``."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def data_as_of(study: Study) -> datetime:
    """The time of the study's last judgement or adjudication (its creation when none): the
    exports' ``created_at`` in a release, so that the same data gives the same bytes."""
    times = [
        Judgement.objects.filter(assignment__study=study).aggregate(t=Max("created_at"))["t"],
        Adjudication.objects.filter(study=study).aggregate(t=Max("decided_at"))["t"],
        study.created_at,
    ]
    return max(t for t in times if t is not None)


def retriever_facts(spec: str) -> dict[str, Any]:
    """A retriever of an audit pool: its spec and, for a checkpoint, the file's name and sha256
    (the spec names the checkpoint by its file name: never a server path)."""
    written = checkpoint_path(spec)
    out = {"spec": public_spec(spec), "checkpoint": file_name(written) if written else None}
    try:
        parsed = spec_facts(spec)
    except ValueError:
        return {**out, "kind": "external", "checkpoint_sha256": None}
    path = parsed.get("checkpoint")
    digest = sha256_file(Path(path)) if path and Path(path).is_file() else None
    return {**out, "kind": parsed["kind"], "checkpoint_sha256": digest}


def _dump(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, ensure_ascii=False, sort_keys=True)
        fh.write("\n")


def _write_csv(path: Path, rows) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for row in safe_rows(rows):
        writer.writerow(row)
    path.write_text(buf.getvalue(), encoding="utf-8")


def _audit_runs(study: Study) -> dict[str, AuditRun]:
    """The finished audit run each dataset of the study's pool was drawn from."""
    ids = {name: pk for name, pk in (study.pool or {}).get("audit_runs", {}).items() if pk}
    runs = AuditRun.objects.filter(pk__in=ids.values(), status=AuditRun.Status.DONE).select_related("dataset")
    by_pk = {r.pk: r for r in runs}
    return {name: by_pk[pk] for name, pk in sorted(ids.items()) if pk in by_pk}


def _write_study(part: StudyPart, root: Path, report: Progress, paths: ServerPaths) -> None:
    study, folder = part.study, root / part.folder
    folder.mkdir(parents=True)
    part.data_as_of = data_as_of(study)
    _dump(folder / "rubric.json", study.rubric.definition)
    guide = GuidelinesVersion.objects.filter(study=study).order_by("-version").first()
    part.guidelines_version = guide.version if guide else None
    text = guide.text if guide else study.guidelines
    (folder / "guidelines.md").write_text((text or "").rstrip() + "\n", encoding="utf-8")
    for layout in part.layouts:
        fmt = "mbeir" if layout == "circled" else layout
        result = export_study(
            study,
            folder / layout,
            fmt=fmt,
            created_at=part.data_as_of,
            progress=lambda stage, done, total, name=layout: report(f"study {study.pk}: {name} files", done, total),
            chunk_size=settings.EXPORT_CHUNK_SIZE,
        )
        part.exports[layout] = result.manifest
    report(f"study {study.pk}: reports", 0, 0)
    part.report = study_report(study, pseudonymise=True, n_boot=default_bootstrap(study), seed=SEED)
    _dump(folder / "agreement.json", part.report)
    _write_csv(folder / "agreement.csv", report_csv_rows(part.report))
    if not part.session:
        from annotation.alternatives.study import alternatives_report

        part.alternatives = alternatives_report(
            study, annotator_pseudonyms(study), n_boot=default_bootstrap(study), seed=SEED
        )
        _dump(folder / "alternatives.json", part.alternatives)
    for name, run in part.runs.items():
        part.audits[name] = paths.clean(audit_report_json(run))
        _dump(folder / "audit" / f"{slugify(name) or 'dataset'}.json", part.audits[name])


def _release_json(parts: list[StudyPart], released_at: datetime) -> dict[str, Any]:
    retrievers: dict[str, dict[str, Any]] = {}
    for part in parts:
        for run in part.runs.values():
            for spec in run.retrievers:
                retrievers.setdefault(spec, retriever_facts(spec))
    return {
        "format": "cirval.release",
        "format_version": 1,
        TIMESTAMP_FIELD: released_at.isoformat(),
        "cirval_commit": cirval_commit(),
        "studies": [
            {
                "id": p.study.pk,
                "name": p.study.name,
                "folder": p.folder,
                "layouts": p.layouts,
                "rubric": {"key": p.study.rubric.key, "version": p.study.rubric.version},
                "guidelines_version": p.guidelines_version,
                "data_as_of": p.data_as_of.isoformat() if p.data_as_of else None,
                "audit_runs": {
                    name: {"id": run.pk, "k": run.k, "retrievers": list(run.retrievers)} for name, run in p.runs.items()
                },
            }
            for p in parts
        ],
        "retrievers": sorted(retrievers.values(), key=lambda r: (r["spec"], r["checkpoint_sha256"] or "")),
    }


def write_sums(root: Path) -> None:
    """``SHA256SUMS`` of every file of the folder but itself (``sha256sum -c`` reads it)."""
    lines = [f"{digest}  {name}\n" for name, digest in file_sums(root, skip=(SUMS,)).items()]
    (root / SUMS).write_text("".join(lines), encoding="utf-8")


def write_zip(folder: Path, zip_path: Path) -> None:
    """A zip of the folder under its own name: sorted entries, fixed dates, so equal folders give equal zips."""
    tmp = zip_path.with_name(f".{zip_path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in release_files(folder):
            info = zipfile.ZipInfo(f"{folder.name}/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, (folder / name).read_bytes())
    os.replace(tmp, zip_path)


def _destination(studies: list[Study], out_dir: Path | str | None) -> Path:
    if out_dir is not None:
        out = Path(out_dir).resolve()
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ReleaseError(f"{out} exists and is not an empty folder")
        return out
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    base = "-".join(slugify(s.name) or f"study-{s.pk}" for s in studies)[:80]
    out = Path(settings.EXPORT_DIR).resolve() / f"release-{base}-{stamp}"
    n = 1
    while out.exists():
        n += 1
        out = out.with_name(f"release-{base}-{stamp}-{n}")
    return out


def build_release(
    study_ids: list[int],
    out_dir: Path | str | None = None,
    *,
    layouts: list[str] | None = None,
    progress: Progress | None = None,
    tmp_name: str | None = None,
    released_at: datetime | None = None,
) -> ReleaseResult:
    """Write a release (module docstring) of the studies into ``out_dir`` (absent or empty;
    default ``EXPORT_DIR/release-<studies>-<timestamp>``) and ``<out_dir>.zip`` beside it.
    The files appear only once complete (a temporary folder renamed at the end)."""
    chosen = check_release(list(study_ids), layouts)
    report = _Overall(
        progress or (lambda stage, done, total: None), sum(study.n_items * len(lays) for study, lays in chosen)
    )
    final = _destination([s for s, _ in chosen], out_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / (tmp_name or f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    shutil.rmtree(tmp, ignore_errors=True)  # a previous attempt of the same job died half way
    tmp.mkdir()
    try:
        parts = [StudyPart(study, f"study-{study.pk}", lays, runs=_audit_runs(study)) for study, lays in chosen]
        paths = ServerPaths(
            spec for part in parts for run in part.runs.values() for spec in [*run.retrievers, run.tau_encoder]
        )
        for part in parts:
            _write_study(part, tmp, report, paths)
        write_leaderboards(parts, tmp)
        report("croissant.json, README.md, SHA256SUMS", report.last, 0)
        release = paths.clean(_release_json(parts, released_at or timezone.now()))
        _dump(tmp / RELEASE_JSON, release)
        (tmp / "README.md").write_text(paths.clean(dataset_card(parts, release)), encoding="utf-8")
        _dump(tmp / "croissant.json", paths.clean(croissant(parts, release, tmp)))
        write_sums(tmp)
        if final.is_dir():
            final.rmdir()
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    zip_path = final.with_name(final.name + ".zip")
    report("zip", report.last, 0)
    write_zip(final, zip_path)
    return ReleaseResult(final, zip_path, placeholders(parts), release, release_files(final))


#: The worker task that runs a queued release (``annotation.tasks.run_release``).
RUN_RELEASE = "annotation.run_release"


def run_release_job(job) -> Any:
    """Run one :class:`annotation.models.ReleaseJob` under :func:`retrieval.jobs.leases.run_job`
    (claimed once, beating, finished with the folder and its files or failed with a message)."""
    from annotation.models import ReleaseJob

    def work(report) -> dict[str, Any]:
        result = build_release(
            list(job.study_ids),
            layouts=list(job.layouts) or None,
            progress=report,
            tmp_name=f".release-job{job.pk}.tmp",
        )
        return {"path": str(result.path), "files": result.files, "placeholders": result.placeholders}

    run_job(ReleaseJob, job.pk, work)
    job.refresh_from_db()
    return job
