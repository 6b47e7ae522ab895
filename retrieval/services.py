"""Import entry points shared by the command, the upload page and the worker task."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
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
        _finish(job, ImportJob.Status.FAILED, error=str(exc))
    except Exception as exc:  # never leave a job "running": the error is its report
        _finish(job, ImportJob.Status.FAILED, error=f"import failed: {type(exc).__name__}: {exc}")
        raise
    else:
        _finish(job, ImportJob.Status.DONE, report=report.as_dict(), stage="done")
    job.refresh_from_db()
    return job


def _finish(job: ImportJob, status: str, **fields) -> None:
    ImportJob.objects.filter(pk=job.pk).update(status=status, finished_at=timezone.now(), **fields)
    discard_uploads(job.files)


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
