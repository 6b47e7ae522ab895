"""Staff pages of a release: the "Make a release" button (a background ReleaseJob on a
worker, never built in the request), its progress page and its files (the zip included)."""

from __future__ import annotations

from pathlib import Path

from django.contrib import messages
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from annotation.export.downloads import job_file_response
from annotation.models import ReleaseJob, Study
from annotation.release.bundle import RUN_RELEASE, ReleaseError, check_release
from config.roles import staff_required
from retrieval.jobs.sending import QUEUE_DOWN, enqueue


@staff_required
@require_POST
def release_start(request, study_id: int):
    """Queue a release of this study in the layouts ticked (default: the study's own)."""
    study = get_object_or_404(Study.objects.select_related("rubric"), pk=study_id)
    layouts = request.POST.getlist("layout")
    try:
        chosen = check_release([study.pk], layouts or None)
    except ReleaseError as exc:
        messages.error(request, str(exc))
        return redirect("annotation:study_progress", study_id=study.pk)
    job = ReleaseJob.objects.create(
        study=study,
        study_ids=[study.pk],
        layouts=chosen[0][1],
        created_by=request.user,
        total=study.n_items,
        stage="queued",
    )
    if not enqueue(ReleaseJob, job.pk, RUN_RELEASE):
        messages.warning(request, QUEUE_DOWN)
    return redirect("annotation:release_job", pk=job.pk)


@staff_required
def release_job_page(request, pk: int):
    job = get_object_or_404(ReleaseJob.objects.select_related("study"), pk=pk)
    return render(request, "annotation/release_job.html", {"job": job})


@staff_required
def release_job_status(request, pk: int):
    job = get_object_or_404(ReleaseJob, pk=pk)
    report = (
        {"folder": job.folder_name, "placeholders": job.placeholders} if job.status == ReleaseJob.Status.DONE else {}
    )
    files = [reverse("annotation:release_file", args=[job.pk, name]) for name in job.files]
    if job.status == ReleaseJob.Status.DONE:
        files.insert(0, reverse("annotation:release_zip", args=[job.pk]))
    return JsonResponse(job.progress_json(report, files=files))


@staff_required
def release_file(request, pk: int, name: str):
    job = get_object_or_404(ReleaseJob, pk=pk, status=ReleaseJob.Status.DONE)
    return job_file_response(Path(job.path), name, job.files)


@staff_required
def release_zip(request, pk: int):
    job = get_object_or_404(ReleaseJob, pk=pk, status=ReleaseJob.Status.DONE)
    folder = Path(job.path)
    return job_file_response(folder.parent, job.zip_name, [job.zip_name])
