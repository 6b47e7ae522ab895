"""Import entry points shared by the command, the upload page and the worker task."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from . import importers
from .importers.jsonstream import METER, Meter, file_start
from .jobs.leases import run_job
from .loader import LoadReport, Progress, load_stream
from .models import ImportJob
from .records import LINE_FILES, ParsedDataset, ParseError


def import_files(
    fmt: str,
    name: str,
    paths: list[Path],
    split: str | None = None,
    images_root: Path | None = None,
    progress: Progress | None = None,
    subset: str | None = None,
    delete_removed: bool = False,
    attribute_images: bool = False,
) -> LoadReport:
    """Parse ``paths`` as ``fmt`` and load them as dataset ``name`` (all or nothing), streaming.

    Records are read and written in batches, so memory does not grow with the files;
    ``progress("importing", bytes_read, bytes_total)`` follows the reading. A re-import that
    no longer holds stored records is refused, naming them, unless ``delete_removed``
    (:mod:`retrieval.loader`). ``attribute_images``: Multi-turn FashionIQ attribute files also
    create an image for every ASIN they describe (:mod:`retrieval.importers.mtfiq`).
    """
    paths = [Path(p) for p in paths]
    notices = check_starts(paths)
    total = sum(p.stat().st_size for p in paths if p.is_file())
    meter = Meter()
    token = METER.set(meter)
    try:
        parsed = ParsedDataset(format=fmt, attribute_images=attribute_images)
        queries = importers.stream(fmt, paths, parsed, split=split, subset=subset)
        on_batch = (lambda _n: progress("importing", min(meter.done, total), total)) if progress is not None else None
        report = load_stream(
            parsed,
            queries,
            name,
            images_root=images_root,
            on_batch=on_batch,
            on_removed="delete" if delete_removed else "refuse",
        )
    finally:
        METER.reset(token)
    if progress is not None:
        progress("importing", total, total)
    report.warnings[:0] = notices
    return report


def check_starts(paths: list[Path]) -> list[str]:
    """Refuse a file that holds nothing (an empty list or object, or a JSON Lines / qrels file
    without a line: importing it would do nothing, silently); return a warning for each file
    that starts with a UTF-8 byte order mark (read past here, but ``json.load`` and the
    benchmarks' own scripts refuse such a file)."""
    notices = []
    for path in paths:
        if not path.is_file():
            continue
        start = file_start(path, path.name.lower().endswith(LINE_FILES))
        if start.empty:
            raise ParseError(
                str(path),
                None,
                None,
                "the file holds no record (an empty list, object or file); "
                "nothing to import: leave it out of the import",
            )
        if start.bom:
            notices.append(
                f"{path.name}: starts with a UTF-8 byte order mark (BOM); CIRVal read past it, but "
                "Python's json.load and the benchmarks' own scripts refuse such a file: save it without one"
            )
    return notices


def run_import_job(job: ImportJob) -> ImportJob:
    """Run one ImportJob under :func:`retrieval.jobs.leases.run_job`: claimed once, beating
    with its progress, one transaction with its ``done`` mark (a failure or a killed
    worker writes nothing), any error shown on the job as a readable message."""

    def work(report) -> dict:
        result = import_files(
            job.format,
            job.dataset_name,
            [Path(p) for p in job.files],
            split=job.split or None,
            images_root=Path(job.images_root) if job.images_root else None,
            progress=report,
            delete_removed=job.delete_removed,
        )
        return {"report": result.as_dict()}

    if run_job(ImportJob, job.pk, work, atomic=True) in ("done", "failed"):
        discard_uploads(job.files)  # the job keeps its report (or error) and the files' names
    job.refresh_from_db()
    return job


def discard_uploads(paths: list[str]) -> int:
    """Delete the uploaded files of a finished or failed import (the job keeps its report
    and the files' names); only files under UPLOAD_DIR are touched. Returns how many."""
    root = Path(settings.UPLOAD_DIR).resolve()
    removed = 0
    folders = set()
    for p in paths:
        path = Path(p).resolve()
        if root not in path.parents or not path.is_file():
            continue
        path.unlink()
        removed += 1
        folders.add(path.parent)
    for folder in folders:
        if folder != root and not any(folder.iterdir()):
            folder.rmdir()
    return removed
