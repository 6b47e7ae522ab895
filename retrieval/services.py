"""Import entry points shared by the command, the upload page and the worker task."""
from __future__ import annotations

from pathlib import Path

from . import importers
from .jobs.leases import run_job
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
    """Run one ImportJob under :func:`retrieval.jobs.leases.run_job`: claimed once, beating
    with its progress, one transaction with its ``done`` mark (a failure or a killed
    worker writes nothing), any error shown on the job as a readable message."""

    def work(report) -> dict:
        result = import_files(
            job.format, job.dataset_name, [Path(p) for p in job.files], split=job.split or None,
            images_root=Path(job.images_root) if job.images_root else None, progress=report,
        )
        return {"report": result.as_dict()}

    run_job(ImportJob, job.pk, work, atomic=True)
    job.refresh_from_db()
    return job
