"""Import entry points shared by the command, the upload page and the worker task."""
from __future__ import annotations

from pathlib import Path

from django.utils import timezone

from . import importers
from .loader import LoadReport, Progress, load_parsed
from .models import ImportJob


def import_files(
    fmt: str,
    name: str,
    paths: list[Path],
    split: str | None = None,
    images_root: Path | None = None,
    progress: Progress | None = None,
) -> LoadReport:
    """Parse ``paths`` as ``fmt`` and load them as dataset ``name`` (all or nothing)."""
    if progress is None:
        def progress(stage: str, done: int, total: int) -> None:
            return None
    progress("parsing", 0, len(paths))
    parsed = importers.parse(fmt, [Path(p) for p in paths], split=split)
    return load_parsed(parsed, name, images_root=images_root, progress=progress)


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
