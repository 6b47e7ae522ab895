"""Annotator pages (queue, item, history) and the admin's study pages."""
from __future__ import annotations

from django.contrib import messages
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from config.roles import staff_required

from annotation.assignment import queue as engine
from annotation.models import Assignment, Study, StudyItem
from annotation.judging.payloads import image_ref, item_payload
from annotation.permissions import member_study, own_assignment
from annotation.assignment.progress import study_progress
from annotation.verdicts.adjudication import has_verdicts, study_verdicts


def _annotator_study(request, study_id: int) -> Study:
    study = member_study(request.user, study_id)
    if not study.annotators.filter(pk=request.user.pk).exists():
        raise Http404("you are not an annotator of this study")
    return study


def my_studies(request):
    studies = Study.objects.filter(annotators=request.user, status=Study.Status.OPEN).select_related("rubric")
    rows = [(s, engine.annotator_progress(s, request.user)) for s in studies]
    return render(request, "annotation/my_studies.html", {"rows": rows})


def work(request, study_id: int):
    """Serve the next item (resuming a held one) and open it."""
    study = _annotator_study(request, study_id)
    served = engine.next_assignment(study, request.user)
    if served.assignment is None:
        return render(request, "annotation/queue_done.html", {
            "study": study, "rule": served.rule, "progress": engine.annotator_progress(study, request.user)})
    url = reverse("annotation:item", args=[study.pk, served.assignment.pk])
    return redirect(f"{url}?served_by={served.rule}")


def item(request, study_id: int, assignment_id: int):
    study = _annotator_study(request, study_id)
    assignment = own_assignment(request.user, assignment_id)
    if assignment.study_id != study.pk:
        raise Http404("no such item in this study")
    payload = item_payload(assignment, request.GET.get("served_by"))
    previous = (
        Assignment.objects.filter(study=study, annotator=request.user, status=Assignment.Status.DONE,
                                  position__lt=assignment.position)
        .order_by("-position").values_list("pk", flat=True).first()
    )
    return render(request, "annotation/item.html", {
        "study": study, "assignment": assignment, "payload": payload, "rubric": study.rubric.rubric,
        "previous": previous,
    })


def history(request, study_id: int):
    study = _annotator_study(request, study_id)
    rows = (
        Assignment.objects.filter(study=study, annotator=request.user)
        .exclude(status=Assignment.Status.RELEASED)
        .select_related("item__query")
        .prefetch_related("revisions")
        .order_by("-position")
    )
    return render(request, "annotation/history.html", {"study": study, "rows": rows})


def upcoming(request, study_id: int):
    """Image URLs of the item most likely served next, for prefetching (nothing is reserved)."""
    study = _annotator_study(request, study_id)
    mine = Assignment.objects.filter(study=study, annotator=request.user).values("item_id")
    nxt = (
        StudyItem.objects.filter(study=study, taken__lt=study.overlap).exclude(id__in=mine)
        .order_by("-agreement", "-taken", "order_key").select_related("query").first()
    )
    urls: list[str] = []
    if nxt is not None:
        for turn in nxt.query.turns.select_related("reference_image"):
            ref = image_ref(turn.reference_image)
            if ref:
                urls.append(ref["thumb"])
        for target in nxt.query.targets.select_related("image"):
            if target.is_positive:
                urls.append(image_ref(target.image)["thumb"])
    return JsonResponse({"images": urls[:12]})


# ---------------------------------------------------------------- staff pages


@staff_required
def study_list(request):
    studies = Study.objects.select_related("rubric").order_by("-created_at")
    return render(request, "annotation/study_list.html", {"rows": [(s, study_progress(s)) for s in studies]})


@staff_required
def study_new(request):
    from annotation.forms import StudyForm
    from annotation.studies.building import StudyError, create_study

    form = StudyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            study, report = create_study(form.spec(), created_by=request.user)
        except StudyError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Study {study.name!r} created with {report['items']} items.")
            return redirect("annotation:study_progress", study_id=study.pk)
    return render(request, "annotation/study_new.html", {"form": form})


@staff_required
def study_progress_page(request, study_id: int):
    study = get_object_or_404(Study.objects.select_related("rubric"), pk=study_id)
    return render(request, "annotation/study_progress.html", {
        "study": study, "progress": study_progress(study), "verdicts": study_verdicts(study),
        "exportable": has_verdicts(study.rubric.rubric)})
