"""A finished job's files as downloads (exports and releases): only the names the job
recorded, only inside its folder."""

from __future__ import annotations

import mimetypes
from pathlib import Path

from django.http import FileResponse, Http404


def job_file_response(folder: Path, name: str, files: list[str]) -> FileResponse:
    """One file of a finished job's folder as a download: only a name the job recorded, and
    only inside the folder (404 otherwise). Exports and releases serve their files with it."""
    if name not in files:
        raise Http404("no such file in this job's folder")
    root = folder.resolve()
    path = (root / name).resolve()
    if root not in path.parents or not path.is_file():
        raise Http404("no such file in this job's folder")
    content_type = (
        "application/json"
        if name.endswith(".json")
        else ("application/x-ndjson" if name.endswith(".jsonl") else mimetypes.guess_type(name)[0] or "text/plain")
    )
    return FileResponse(open(path, "rb"), as_attachment=True, filename=Path(name).name, content_type=content_type)
