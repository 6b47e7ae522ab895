"""Annotator pages (queue, item, history) and the admin's study pages."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.views.decorators.cache import never_cache

from annotation import roles
from annotation.access import grant_images
from annotation.assignment import queue as engine
from annotation.assignment.progress import study_progress
from annotation.core.rounds import hides_target
from annotation.judging.candidates import PAGE_SIZE
from annotation.judging.guidelines import current_guidelines, render_markdown
from annotation.judging.payloads import image_ref, item_payload, lease_config
from annotation.models import Assignment, Study, StudyItem
from annotation.permissions import member_study, own_assignment
from annotation.studies.truth import defects_found
from annotation.verdicts.readmodel import has_verdicts, session_rule_of, study_reliability
from annotation.verdicts.refit import retry_after_seconds, serving_lag
from annotation.verdicts.state import annotator_share, free_slot_q, study_counts
from config.roles import staff_required
from retrieval.models import Image


def _annotator_study(request, study_id: int) -> Study:
    study = member_study(request.user, study_id)
    if not study.annotators.filter(pk=request.user.pk).exists():
        raise Http404("you are not an annotator of this study")
    return study


def my_studies(request):
    studies = Study.objects.filter(annotators=request.user, status__in=[Study.Status.OPEN, Study.Status.PAUSED])
    rows = [(s, annotator_share(s, request.user)) for s in studies.select_related("rubric")]
    for s, _ in rows:
        s.guidelines_html = render_markdown(s.guidelines)
    return render(request, "annotation/my_studies.html", {"rows": rows})


@never_cache
def work(request, study_id: int):
    """POST reserves the next item (resuming a held one) and opens it. GET changes nothing:
    it opens the item already held, shows why nothing is left (``?empty=<rule>``), or
    answers a page that posts on load."""
    study = _annotator_study(request, study_id)
    if request.method == "POST":
        served = engine.next_assignment(study, request.user)
        if served.assignment is None:
            return redirect(f"{reverse('annotation:work', args=[study.pk])}?empty={served.rule}")
        return redirect(_item_url(study, served.assignment))
    held = engine.held_assignment(study, request.user)
    if held is not None:
        return redirect(_item_url(study, held))
    rule = request.GET.get("empty")
    if rule:
        return render(
            request,
            "annotation/queue_done.html",
            {
                "study": study,
                "rule": rule,
                "check_after": retry_after_seconds(),
                "progress": annotator_share(study, request.user),
            },
        )
    return render(request, "annotation/work_start.html", {"study": study})


def _item_url(study: Study, assignment: Assignment) -> str:
    """The item page (the serving rule is not put in the URL: annotators never see it)."""
    return reverse("annotation:item", args=[study.pk, assignment.pk])


@never_cache  # Back/Forward must fetch the item's current state, not replay a stale page
def item(request, study_id: int, assignment_id: int):
    study = _annotator_study(request, study_id)
    assignment = own_assignment(request.user, assignment_id)
    if assignment.study_id != study.pk:
        raise Http404("no such item in this study")
    previous = (
        Assignment.objects.filter(
            study=study, annotator=request.user, status=Assignment.Status.DONE, position__lt=assignment.position
        )
        .order_by("-position")
        .values_list("pk", flat=True)
        .first()
    )
    if study.interactive:
        from annotation.interactive.views import interactive_item

        return interactive_item(request, study, assignment, previous)
    payload = item_payload(assignment, staff=roles.is_admin(request.user))
    return render(
        request,
        "annotation/item.html",
        {
            "study": study,
            "assignment": assignment,
            "payload": payload,
            "rubric": study.rubric.rubric,
            "previous": previous,
            "urls": item_urls(study, assignment, previous),
            "guidelines": current_guidelines(study),
            "lease_config": lease_config(study),
        },
    )


def item_urls(study: Study, assignment: Assignment, previous: int | None) -> dict:
    """The endpoints the item page's script calls (given to it with ``json_script``)."""
    urls = {
        "draft": reverse("annotation:api_draft", args=[assignment.pk]),
        "submit": reverse("annotation:api_judgements", args=[assignment.pk]),
        "skip": reverse("annotation:api_skip", args=[assignment.pk]),
        "lease": reverse("annotation:api_lease", args=[assignment.pk]),
        "next": reverse("annotation:work", args=[study.pk]),
        "upcoming": reverse("annotation:upcoming", args=[study.pk]),
    }
    if previous:
        urls["back"] = reverse("annotation:item", args=[study.pk, previous])
    return urls


@never_cache
def history(request, study_id: int):
    study = _annotator_study(request, study_id)
    rows = (
        Assignment.objects.filter(study=study, annotator=request.user)
        .exclude(status=Assignment.Status.RELEASED)
        .select_related("item__query")
        .prefetch_related("revisions")
        .order_by("-position")
    )
    rubric = study.rubric.rubric
    rows = list(rows)
    for a in rows:  # the current answer, worded as the rubric words it (the annotator never reads keys)
        a.current = j = next((r for r in a.revisions.all() if r.is_current), None)
        if j is None:
            a.answer_label = ""
        elif j.category:
            a.answer_label = rubric.verdict_label(j.category, j.sub_reason)
        else:
            a.answer_label = rubric.session_answer_label(j.scales or {}, j.per_turn or [], j.reject_flags or [])
    return render(request, "annotation/history.html", {"study": study, "rows": rows})


def upcoming(request, study_id: int):
    """Image URLs of the item most likely served next, for prefetching (nothing is reserved)."""
    study = _annotator_study(request, study_id)
    mine = Assignment.objects.filter(study=study, annotator=request.user).values("item_id")
    nxt = (
        StudyItem.objects.filter(free_slot_q(study, None), study=study)
        .exclude(id__in=mine)
        .order_by(*engine.queue_order(study))
        .select_related("query")
        .first()
    )
    refs: list[dict] = []
    if nxt is not None:
        for turn in nxt.query.turns.select_related("reference_image"):
            ref = image_ref(turn.reference_image)
            if ref:
                refs.append(ref)
        if not hides_target(study.interactive):  # a described target is never sent, nor its panel
            for target in nxt.query.positive_targets(nxt.query.targets.select_related("image")):
                refs.append(image_ref(target.image))
            shown = Image.objects.in_bulk(nxt.candidates[:PAGE_SIZE])  # the panel's first page, once fixed
            refs += [image_ref(shown[i], 160) for i in nxt.candidates[:PAGE_SIZE] if i in shown]
    refs = refs[: 12 + PAGE_SIZE]
    grant_images(request.user.pk, [r["id"] for r in refs], study.pk)  # the prefetch may fetch what it is told
    return JsonResponse({"images": [r["thumb"] for r in refs]})


# ---------------------------------------------------------------- staff pages


@staff_required
def study_list(request):
    studies = Study.objects.select_related("rubric").order_by("-created_at")
    return render(request, "annotation/study_list.html", {"rows": [(s, study_counts(s)) for s in studies]})


@staff_required
def study_new(request):
    from annotation.forms import StudyForm
    from annotation.studies.building import StudyError, create_study, preflight

    form = StudyForm(request.POST or None)
    warnings: list[str] = []
    if request.method == "POST" and form.is_valid():
        warnings = preflight(form.spec())
        if warnings and request.POST.get("confirmed") != "1":
            return render(request, "annotation/study_new.html", {"form": form, "warnings": warnings})
        try:
            study, report = create_study(form.spec(), created_by=request.user)
        except StudyError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Study {study.name!r} created with {report['items']} items.")
            for w in warnings:
                messages.warning(request, f"Built despite: {w}")
            return redirect("annotation:study_progress", study_id=study.pk)
    return render(request, "annotation/study_new.html", {"form": form, "warnings": warnings})


@staff_required
def study_progress_page(request, study_id: int):
    from annotation.interactive.service import session_summary
    from annotation.quality.annotator_report import quality_signals

    study = get_object_or_404(Study.objects.select_related("rubric"), pk=study_id)
    counts = study_counts(study)
    progress = study_progress(study, counts)
    quality = quality_signals(study)
    for row in progress["annotators"]:
        row["quality"] = quality.get(row["annotator"])
    exportable = has_verdicts(study.rubric.rubric)
    reliability = (
        study_reliability(study) if exportable and session_rule_of(study) is None and counts["judgements"] else None
    )
    return render(
        request,
        "annotation/study_progress.html",
        {
            "study": study,
            "progress": progress,
            "verdicts": counts,
            "labour": counts["labour"],
            "reliability": reliability,
            "serving": serving_lag(study) if reliability else None,
            "exportable": exportable,
            "defects": defects_found(study) if exportable else None,
            "sessions": session_summary(study) if study.interactive else None,
        },
    )


@staff_required
def study_estimate_page(request, study_id: int):
    """Staff only: an estimate study's running estimate of each defect kind's prevalence, its
    strata and design weights, and the stop rule (:mod:`annotation.studies.estimating`); POST
    re-plans the sample from the decided items now."""
    from annotation.studies.estimating import replan, running_estimate

    study = get_object_or_404(Study.objects.select_related("rubric"), pk=study_id)
    if "bounds" not in (study.estimate or {}):
        raise Http404("this study is not an estimate study")
    if request.method == "POST":
        replan(study)
        messages.success(request, "Sample re-planned from the decided items.")
        return redirect("annotation:study_estimate", study_id=study.pk)
    return render(request, "annotation/estimate.html", {"study": study, "est": running_estimate(study)})


@staff_required
def study_suspicion_page(request, study_id: int):
    """Staff only: the study's items by suspicion score, highest first, with the score's parts
    (:mod:`annotation.studies.suspicion_scores`); POST computes the scores again."""
    from annotation.studies.suspicion_scores import PART_HELP, item_votes, part_rows, refresh_suspicion, staleness

    study = get_object_or_404(Study.objects.select_related("rubric"), pk=study_id)
    if request.method == "POST":
        n = refresh_suspicion(study.pk)
        messages.success(request, f"Suspicion computed again: {n} items scored.")
        return redirect("annotation:study_suspicion", study_id=study.pk)
    single = study.items.filter(query__n_turns=1)
    stored = [{"item": pk, "meta": parts} for pk, parts in single.values_list("pk", "suspicion_parts")]
    items = list(
        single.select_related("query")
        .order_by("-suspicion", "order_key")
        .only("pk", "suspicion", "suspicion_parts", "completed", "query__external_id")[:500]
    )
    votes_now = item_votes(study.pk)
    rows = [
        {
            "item": i,
            "parts": part_rows(i.suspicion_parts),
            "meta": i.suspicion_parts or {},
            "votes_now": len(votes_now.get(i.pk, ())),
        }
        for i in items
    ]
    stale = staleness(stored, votes_now)
    return render(
        request,
        "annotation/suspicion.html",
        {
            "study": study,
            "rows": rows,
            "part_help": PART_HELP,
            "by_suspicion": engine.serves_by_suspicion(study),
            "computed_at": parse_datetime(stale["computed_at"]) if stale["computed_at"] else None,
            "behind": len(stale["behind"]),
            "total": len(stored),
            "exportable": has_verdicts(study.rubric.rubric),
        },
    )
