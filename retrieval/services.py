"""Import entry points shared by the command, the upload page and the worker task."""
from __future__ import annotations

from pathlib import Path

from django.utils import timezone

from . import importers
from .importers.jsonstream import METER, Meter
from .loader import LoadReport, Progress, load_stream
from .models import ImportJob
from .records import ParsedDataset


def import_files(
    fmt: str,
    name: str,
    paths: list[Path],
    split: str | None = None,
    images_root: Path | None = None,
    progress: Progress | None = None,
    subset: str | None = None,
) -> LoadReport:
    """Parse ``paths`` as ``fmt`` and load them as dataset ``name`` (all or nothing), streaming.

    Records are read and written in batches, so memory does not grow with the files;
    ``progress("importing", bytes_read, bytes_total)`` follows the reading.
    """
    paths = [Path(p) for p in paths]
    total = sum(p.stat().st_size for p in paths if p.is_file())
    meter = Meter()
    token = METER.set(meter)
    try:
        parsed = ParsedDataset(format=fmt)
        queries = importers.stream(fmt, paths, parsed, split=split, subset=subset)
        on_batch = (lambda _n: progress("importing", min(meter.done, total), total)) if progress is not None else None
        report = load_stream(parsed, queries, name, images_root=images_root, on_batch=on_batch)
    finally:
        METER.reset(token)
    if progress is not None:
        progress("importing", total, total)
    return report


def run_import_job(job: ImportJob) -> ImportJob:
    """Run one ImportJob, recording progress on the row as it goes."""

    def progress(stage: str, done: int, total: int) -> None:
        ImportJob.objects.filter(pk=job.pk).update(stage=stage, done=done, total=total)

    ImportJob.objects.filter(pk=job.pk).update(status=ImportJob.Status.RUNNING, stage="starting", error="")
    try:
        report = import_files(
            job.format, job.dataset_name, [Path(p) for p in job.files], split=job.split or None,
            images_root=Path(job.images_root) if job.images_root else None, progress=progress,
        )
    except (ValueError, OSError) as exc:  # ParseError and LoadError are ValueErrors
        ImportJob.objects.filter(pk=job.pk).update(
            status=ImportJob.Status.FAILED, error=str(exc), finished_at=timezone.now()
        )
    else:
        ImportJob.objects.filter(pk=job.pk).update(
            status=ImportJob.Status.DONE, report=report.as_dict(), stage="done", finished_at=timezone.now()
        )
    job.refresh_from_db()
    return job
