"""The project room (staff only): users and roles, a study's team, status and settings,
gold items, and every job in one list. No Django admin needed."""

from __future__ import annotations

from axes.utils import reset as axes_reset
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.tokens import default_token_generator
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from django.views.decorators.http import require_POST

from annotation import roles
from annotation.judging.guidelines import current_guidelines, save_guidelines
from annotation.models import GuidelinesVersion, Study, StudyItem
from annotation.quality import gold as goldsvc
from annotation.room.forms import GoldForm, RolesForm, StudySettingsForm, UserForm
from annotation.room.jobs import all_jobs, jobs_status
from annotation.studies.building import StudyError, add_annotators
from annotation.verdicts.readmodel import QUORUM_FIELDS
from annotation.verdicts.refit import request_refit
from annotation.verdicts.state import refresh_slots
from config.roles import staff_required
from config.security import locked_usernames

User = get_user_model()


def user_roles(user) -> list[str]:
    names = set(user.groups.values_list("name", flat=True))
    return [r for r in (roles.ANNOTATOR, roles.RESEARCHER) if r in names] + ([roles.ADMIN] if user.is_staff else [])


def set_roles(user, wanted) -> None:
    """Group membership for annotator / researcher; admin is the staff flag."""
    for role in (roles.ANNOTATOR, roles.RESEARCHER):
        group, _ = Group.objects.get_or_create(name=role)
        (user.groups.add if role in wanted else user.groups.remove)(group)
    user.is_staff = roles.ADMIN in wanted
    user.save(update_fields=["is_staff"])


def invite_link(request, user) -> str:
    """A one-time link where an invited user chooses a password (Django's reset token)."""
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    token = default_token_generator.make_token(user)
    return request.build_absolute_uri(reverse("room:invite", args=[uid, token]))


@staff_required
def users(request):
    form = UserForm(request.POST or None)
    invite = None
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        user = User.objects.create_user(d["username"], d["email"] or "", d["password"] or None)
        set_roles(user, d["roles"])
        if d["password"]:
            messages.success(request, f"User {user.username} created.")
        else:
            invite = {"user": user.username, "link": invite_link(request, user)}
            messages.success(request, f"{user.username} invited: send them the link below.")
        form = UserForm()
    people = list(User.objects.order_by("username").prefetch_related("groups"))
    locked = locked_usernames(u.username for u in people)
    rows = [(u, user_roles(u), u.username in locked) for u in people]
    return render(
        request,
        "room/users.html",
        {"form": form, "rows": rows, "invite": invite, "role_choices": RolesForm().fields["roles"].choices},
    )


@staff_required
@require_POST
def user_update(request, user_id: int):
    user = get_object_or_404(User, pk=user_id)
    if request.POST.get("unlock"):
        axes_reset(username=user.username)  # every address's failed logins of this account
        messages.success(request, f"{user.username} is unlocked: they can log in again now.")
        return redirect("room:users")
    form = RolesForm(request.POST)
    if form.is_valid():
        if user == request.user and roles.ADMIN not in form.cleaned_data["roles"]:
            messages.error(request, "You cannot take the admin role from yourself.")
        else:
            set_roles(user, form.cleaned_data["roles"])
            messages.success(request, f"Roles of {user.username}: {', '.join(user_roles(user)) or 'none'}.")
    if request.POST.get("invite"):
        messages.info(request, f"New invite link for {user.username}: {invite_link(request, user)}")
    return redirect("room:users")


def _study(study_id: int) -> Study:
    return get_object_or_404(Study.objects.select_related("rubric"), pk=study_id)


@staff_required
def study_room(request, study_id: int):
    study = _study(study_id)
    form = StudySettingsForm(instance=study)
    return _render_study(request, study, form)


def _render_study(request, study, form):
    members = study.annotators.order_by("username")
    candidates = (
        User.objects.filter(groups__name=roles.ANNOTATOR, is_active=True)
        .exclude(pk__in=members.values("pk"))
        .order_by("username")
    )
    gold = StudyItem.objects.filter(study=study, gold=True).select_related("query").order_by("id")
    return render(
        request,
        "room/study.html",
        {
            "study": study,
            "form": form,
            "members": members,
            "candidates": candidates,
            "gold": gold[:200],
            "n_gold": gold.count(),
            "gold_form": GoldForm(rubric=study.rubric.rubric),
            "versions": GuidelinesVersion.objects.filter(study=study).select_related("created_by", "rubric")[:20],
            "statuses": Study.Status,
        },
    )


@staff_required
@require_POST
def study_settings(request, study_id: int):
    study = _study(study_id)
    guidelines_before = study.guidelines
    form = StudySettingsForm(request.POST, instance=study)
    if not form.is_valid():
        return _render_study(request, study, form)
    study = form.save(commit=False)
    text = study.guidelines
    study.guidelines = guidelines_before
    study.save()
    if set(QUORUM_FIELDS) & set(form.changed_data):
        refresh_slots(study)  # the items' extra slots follow the new quorum rule
        request_refit(study)  # now reliability-weighted: its stored fit, in a worker
    version = save_guidelines(study, text, request.user)
    changed = {f.replace("_", " ") for f in form.changed_data if f != "guidelines"}
    messages.success(request, _settings_saved(study, changed, version))
    return redirect("room:study", study_id=study.pk)


def _settings_saved(study: Study, changed: set[str], version) -> str:
    """What a save of the study's settings did: the settings changed, and the guidelines' new
    version, or that they are unchanged (their version kept)."""
    if version is not None:
        return f"Settings of {study.name} saved. Guidelines saved as version {version.version}."
    current = current_guidelines(study)
    kept = f"the guidelines stay at version {current.version}" if current else "the guidelines stay empty"
    if not changed:
        return f"Nothing changed in the settings of {study.name}: {kept}."
    return f"Settings of {study.name} saved ({', '.join(sorted(changed))}); {kept}."


@staff_required
@require_POST
def study_annotators(request, study_id: int):
    study = _study(study_id)
    names = request.POST.getlist("username")
    if request.POST.get("action") == "remove":
        found = list(User.objects.filter(username__in=names))
        study.annotators.remove(*found)
        verb = "removed from"
    else:
        try:  # the one rule for who may annotate a study (the annotator role)
            found = add_annotators(study, names)
        except StudyError as exc:
            messages.error(request, str(exc))
            return redirect("room:study", study_id=study.pk)
        verb = "added to"
    if found:
        messages.success(request, f"{', '.join(sorted(u.username for u in found))} {verb} {study.name}.")
    return redirect("room:study", study_id=study.pk)


STATUS_ACTIONS = {
    "pause": Study.Status.PAUSED,
    "resume": Study.Status.OPEN,
    "close": Study.Status.CLOSED,
    "reopen": Study.Status.OPEN,
}


@staff_required
@require_POST
def study_status(request, study_id: int):
    study = _study(study_id)
    new = STATUS_ACTIONS.get(request.POST.get("action", ""))
    if new is None:
        messages.error(request, "Unknown action.")
    else:
        study.status = new
        study.save(update_fields=["status"])
        messages.success(request, f"{study.name} is now {new}.")
    return redirect("room:study", study_id=study.pk)


@staff_required
@require_POST
def study_gold(request, study_id: int):
    study = _study(study_id)
    action = request.POST.get("action")
    if action == "promote":
        n = goldsvc.promote_unanimous(study)
        messages.success(request, f"{n} unanimous item{'s' if n != 1 else ''} promoted to gold.")
    elif action == "adjudicated":
        n = goldsvc.gold_from_adjudications(study)
        messages.success(request, f"{n} adjudicated item{'s' if n != 1 else ''} marked gold.")
    else:
        form = GoldForm(request.POST, rubric=study.rubric.rubric)
        item = form.is_valid() and StudyItem.objects.filter(study=study, pk=form.cleaned_data["item"]).first()
        if form.errors:
            messages.error(request, " ".join(e for errs in form.errors.values() for e in errs))
        elif not item:
            messages.error(request, "No such item in this study.")
        elif form.cleaned_data["answer"] == "none":
            goldsvc.unmark_gold(item)
            messages.success(request, f"Item {item.pk} is no longer gold.")
        else:
            goldsvc.mark_gold(item, form.cleaned_data["answer"] == "valid", category=form.cleaned_data["category"])
            messages.success(request, f"Item {item.pk} is gold ({form.cleaned_data['answer']}).")
    return redirect("room:study", study_id=study.pk)


@staff_required
def jobs(request):
    return render(request, "room/jobs.html", {"jobs": all_jobs()})


@staff_required
def jobs_json(request):
    return JsonResponse({"jobs": jobs_status()})


@staff_required
@require_POST
def audit_retry(request, run_id: int):
    from audit.models import AuditRun
    from audit.runs import dispatch

    run = get_object_or_404(AuditRun, pk=run_id)
    if run.status != AuditRun.Status.FAILED:
        messages.error(request, f"Audit {run.pk} has not failed ({run.status}).")
    else:
        n = dispatch.retry_failed(run)
        run.refresh_from_db()
        dispatch.start_run(run)
        messages.success(request, f"Audit {run.pk} sent again ({n} failed chunk{'s' if n != 1 else ''} retried).")
    return redirect("room:jobs")


@staff_required
def imports(request):
    """The forms; a valid post stores the uploads and queues a RoomImportJob (a worker parses
    them, never this request) and goes to the job's page."""
    from annotation.models import RoomImportJob
    from annotation.room.imports import CircusForm, RanksForm, queue_import
    from retrieval.jobs.sending import QUEUE_DOWN

    which = request.POST.get("which") if request.method == "POST" else None
    ranks = RanksForm(
        request.POST if which == "ranks" else None, request.FILES if which == "ranks" else None, prefix="ranks"
    )
    circus = CircusForm(
        request.POST if which == "circus" else None,
        request.FILES if which == "circus" else None,
        prefix="circus",
        initial={"dataset_prefix": "circus", "verify_checksum": True},
    )
    form = {"ranks": (RoomImportJob.RANKS, ranks), "circus": (RoomImportJob.CIRCUS, circus)}.get(which)
    if form and form[1].is_valid():
        job, sent = queue_import(form[0], form[1], request.user)
        if not sent:
            messages.warning(request, QUEUE_DOWN)
        return redirect("room:import_job", pk=job.pk)
    return render(request, "room/imports.html", {"ranks": ranks, "circus": circus})


@staff_required
def import_job(request, pk: int):
    from annotation.models import RoomImportJob

    return render(request, "room/import_job.html", {"job": get_object_or_404(RoomImportJob, pk=pk)})


@staff_required
def import_job_status(request, pk: int):
    from annotation.models import RoomImportJob

    job = get_object_or_404(RoomImportJob, pk=pk)
    return JsonResponse(job.progress_json({"lines": job.lines, "warnings": job.warnings}))
