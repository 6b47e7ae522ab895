"""Corpus pages: datasets, queries, images, and browser imports."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.text import get_valid_filename
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

from config.roles import researcher_required, staff_required

from .access import may_fetch
from .forms import ImportForm
from .imageserve import ImageRefused, image_file, parse_size, placeholder_svg, thumbnail, verified
from .jobs.sending import QUEUE_DOWN, enqueue
from .models import Dataset, Image, ImportJob, Query
from .stats import dataset_stats


@researcher_required
def dataset_list(request):
    datasets = list(Dataset.objects.all())
    rows = [(d, dataset_stats(d)) for d in datasets]
    return render(request, "retrieval/dataset_list.html", {"rows": rows})


@researcher_required
def dataset_detail(request, name: str):
    dataset = get_object_or_404(Dataset, name=name)
    queries = (
        Query.objects.filter(dataset=dataset)
        .select_related("dataset")  # its format picks the target rule of each row's positives
        .order_by("split", "ordinal", "id")
        .prefetch_related("turns__reference_image", "targets__image")
    )
    kind = request.GET.get("kind")
    if kind == "single":
        queries = queries.filter(n_turns=1)
    elif kind == "multi":
        queries = queries.filter(n_turns__gt=1)
    page = Paginator(queries, 20).get_page(request.GET.get("page"))
    return render(
        request,
        "retrieval/dataset_detail.html",
        {"dataset": dataset, "stats": dataset_stats(dataset), "page": page, "kind": kind or ""},
    )


@researcher_required
def query_detail(request, name: str, pk: int):
    dataset = get_object_or_404(Dataset, name=name)
    query = get_object_or_404(
        Query.objects.prefetch_related("turns__reference_image", "turns__turn_target", "targets__image"),
        dataset=dataset,
        pk=pk,
    )
    return render(request, "retrieval/query_detail.html", {"dataset": dataset, "query": query})


@require_GET
@cache_control(private=True, max_age=86400)
def image(request, pk: int):
    """An image by id; ``?size=N`` gives a cached thumbnail. Missing files get a placeholder."""
    try:  # the request is parsed before anything is looked up
        size = parse_size(request.GET.get("size"))
    except ValueError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    img = Image.objects.select_related("dataset").filter(pk=pk).first()
    if img is None or not may_fetch(request.user, pk):
        raise Http404("no such image")
    path = image_file(img.dataset.images_root, img.path)
    if path is None:
        if img.missing or not img.path:
            return HttpResponse(placeholder_svg(img.external_id, size or 256), content_type="image/svg+xml")
        raise Http404("image is outside the served roots")
    try:
        if size:
            return FileResponse(
                open(thumbnail(path, size), "rb"), content_type="image/png", filename=f"image-{img.pk}-{size}.png"
            )
        verified(path)  # a truncated or corrupt file is never served (422)
    except ImageRefused as exc:
        return HttpResponse(f"image {img.pk}: {exc}", status=422, content_type="text/plain")
    # The served name is the image's id, never the file's real name or path.
    return FileResponse(open(path, "rb"), filename=f"image-{img.pk}{path.suffix.lower()}")


@staff_required
def import_upload(request):
    if request.method == "POST":
        # Oversized bodies never get here: config.middleware refuses them unread (413).
        form = ImportForm(request.POST, request.FILES)
        if form.is_valid():
            folder = Path(settings.UPLOAD_DIR) / uuid.uuid4().hex
            folder.mkdir(parents=True, exist_ok=True)
            stored = []
            for f in form.cleaned_data["files"]:
                target = folder / get_valid_filename(Path(f.name).name)
                with open(target, "wb") as out:
                    for chunk in f.chunks():
                        out.write(chunk)
                stored.append(str(target))
            job = ImportJob.objects.create(
                dataset_name=form.cleaned_data["name"],
                format=form.cleaned_data["format"],
                split=form.cleaned_data["split"],
                images_root=form.cleaned_data["images_root"],
                files=stored,
                created_by=request.user,
                enqueued_at=timezone.now(),
                delete_removed=form.cleaned_data["delete_removed"],
            )
            # Always on a worker, however small: no uploaded file is parsed in the web process.
            from .tasks import RUN_IMPORT

            if not enqueue(ImportJob, job.pk, RUN_IMPORT):
                messages.warning(request, QUEUE_DOWN)
            return redirect("retrieval:import_job", pk=job.pk)
    else:
        form = ImportForm()
    jobs = ImportJob.objects.all()[:20]
    return render(request, "retrieval/import.html", {"form": form, "jobs": jobs})


@staff_required
def import_job(request, pk: int):
    job = get_object_or_404(ImportJob, pk=pk)
    examples = []
    if job.status == ImportJob.Status.DONE:
        examples = list(
            Query.objects.filter(dataset__name=job.dataset_name)
            .order_by("split", "ordinal", "id")
            .prefetch_related("turns")[:5]
        )
    return render(
        request,
        "retrieval/import_job.html",
        {
            "job": job,
            "file_names": [Path(f).name for f in job.files],
            "report": job.report or {},
            # the raw report, rendered here too so a reloaded page shows it before jobs.js polls
            "report_text": json.dumps(job.report, indent=2) if job.report else "",
            "examples": examples,
        },
    )


@staff_required
def import_job_status(request, pk: int):
    job = get_object_or_404(ImportJob, pk=pk)
    return JsonResponse(job.progress_json(job.report))
