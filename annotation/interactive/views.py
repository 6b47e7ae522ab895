"""The interactive item page (the annotator plays the user) and the staff download of the
study's sessions in the CIRCLED layout."""

from __future__ import annotations

import json

from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from annotation.interactive.service import session_for
from annotation.interactive.session_export import session_records
from annotation.interactive.warm import page_state, request_warm
from annotation.judging.payloads import lease_config
from annotation.models import Assignment, Study
from config.roles import staff_required


def interactive_item(request, study: Study, assignment: Assignment, previous: int | None):
    """The page of one interactive item: target, candidates, feedback box (static/cirval/interactive.js)."""
    session = session_for(assignment)
    request_warm(study.pk)  # a worker started before this study opened loads its retriever now
    urls = {
        "state": reverse("annotation:api_interactive", args=[assignment.pk]),
        "rounds": reverse("annotation:api_interactive_rounds", args=[assignment.pk]),
        "retry": reverse("annotation:api_interactive_retry", args=[assignment.pk]),
        "lease": reverse("annotation:api_lease", args=[assignment.pk]),
        "skip": reverse("annotation:api_skip", args=[assignment.pk]),
        "next": reverse("annotation:work", args=[study.pk]),
    }
    return render(
        request,
        "annotation/interactive.html",
        {
            "study": study,
            "assignment": assignment,
            "state": page_state(session, request.user.pk),
            "urls": urls,
            "previous": previous,
            "lease_config": lease_config(study),
        },
    )


@staff_required
def export_sessions(request, study_id: int):
    """The study's ended sessions as one CIRCLED file (``?subset=`` picks one when the study
    spans several); the full export with traces is ``export_interactive``."""
    study = get_object_or_404(Study, pk=study_id)
    if not study.interactive:
        raise Http404("not an interactive study")
    rows = session_records(study)
    subsets = sorted({subset for _, subset, _, _ in rows})
    chosen = request.GET.get("subset") or (subsets[0] if len(subsets) == 1 else "")
    if chosen not in subsets:  # a page that says why, with a link per subset (400 for an unknown one)
        return render(
            request,
            "annotation/interactive_export.html",
            {"study": study, "subsets": subsets, "asked": request.GET.get("subset") or ""},
            status=400 if request.GET.get("subset") else 200,
        )
    body = json.dumps([record for _, subset, record, _ in rows if subset == chosen], indent=1) + "\n"
    response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{chosen}.json"'
    return response
