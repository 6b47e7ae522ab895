"""Who may see what: annotators their own work only, staff everything, researchers reports."""

from __future__ import annotations

from typing import NoReturn

from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef
from django.http import Http404
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission

from annotation import roles
from annotation.models import Assignment, Study


class IsResearcher(BasePermission):
    message = "Only researchers and staff may read reports."

    def has_permission(self, request, view):
        return roles.is_researcher(request.user)


def visible_studies(user):
    if roles.is_admin(user) or roles.is_researcher(user):
        return Study.objects.all()
    return Study.objects.filter(annotators=user)


def membership(user, study_ref):
    """The rows that make ``user`` an annotator of the study ``study_ref`` (an id or an
    ``OuterRef``): a membership of an active account that still holds the annotator role.
    Every access check of annotation work goes through it, so revoking the role, removing the
    annotator from the study or deactivating the account ends reading, next, submit and
    image fetches at once."""
    rows = Study.annotators.through.objects.filter(study_id=study_ref, user_id=user.pk)
    if not user.is_active:
        return rows.none()
    # The role is checked in the same statement (not by reading the user's groups first):
    # "next item" stays within its query budget (tests/integration/test_query_counts.py).
    role = get_user_model().groups.through.objects.filter(user_id=user.pk, group__name=roles.ANNOTATOR)
    return rows.filter(Exists(role))


def member_study_rows(user, study_id: int, annotate: dict | None = None):
    """The query of :func:`member_study` (at most one row)."""
    member = membership(user, OuterRef("pk"))
    qs = Study.objects.select_related("rubric").annotate(is_annotator=Exists(member), **(annotate or {}))
    return qs.filter(pk=study_id).order_by("pk")[:1]


def member_study(user, study_id: int, annotate: dict | None = None) -> Study:
    """A study the user annotates in (staff: any); 404 otherwise, so ids leak nothing.

    One query: the row carries ``is_annotator`` (whether the user annotates in it, see
    :func:`membership`) and any further ``annotate`` expressions the caller needs."""
    rows = list(member_study_rows(user, study_id, annotate))
    study = rows[0] if rows else None
    if study is None:
        raise Http404("no such study")
    if study.is_annotator or roles.is_admin(user):
        return study
    raise Http404("no such study")


def readable_study(user, study_id: int) -> Study:
    """A study the user may read the description of: one they annotate in (staff: any), or for a
    researcher any study, as the study list shows them (:func:`visible_studies`); 404 otherwise."""
    try:
        return member_study(user, study_id)
    except Http404:
        if not roles.is_researcher(user):
            raise
    study = visible_studies(user).select_related("rubric").filter(pk=study_id).first()
    if study is None:
        raise Http404("no such study")
    study.is_annotator = False
    return study


def refuse_non_annotator(user, study_id: int) -> NoReturn:
    """After a member check failed: 403 ("You are not an annotator of this study.") when the user
    may read the study (a researcher: :func:`readable_study`), so that its description and its
    work endpoints do not disagree on whether it exists; else the 404 stands."""
    readable_study(user, study_id)
    raise PermissionDenied("You are not an annotator of this study.")


def own_assignment(user, assignment_id: int) -> Assignment:
    """The user's own assignment in a study they still annotate (staff: any of their own);
    another annotator's, or one of a study they were removed from, gives 404."""
    rows = Assignment.objects.select_related("study__rubric", "item__query__dataset", "annotator")
    admin = roles.is_admin(user)
    if not admin:
        # read in the row's SELECT, not as a WHERE semi-join: with the six joins above, the
        # semi-join made PostgreSQL spend 20-28 ms planning this one-row read
        rows = rows.annotate(is_member=Exists(membership(user, OuterRef("study_id"))))
    a = rows.filter(pk=assignment_id, annotator=user).order_by("pk").first()
    if a is None or not (admin or a.is_member):
        raise Http404("no such assignment")
    return a


# What a paused study still takes: answers to the items its annotators already hold (the
# page they are typing on) or have answered (a revision), so pausing loses no one's work.
# Only new items are refused while paused (``queue.next_assignment`` serves nothing).
WRITABLE_WHILE_PAUSED = (Assignment.Status.RESERVED, Assignment.Status.DONE)


def write_refusal(study: Study, is_member: bool, assignment_status: str | None = None) -> str | None:
    """Why a write (judgement, revision, draft, lease, skip) to this study is refused, or None.
    ``assignment_status``: the status of the assignment written to (a paused study accepts
    writes to the ones in :data:`WRITABLE_WHILE_PAUSED`)."""
    if not is_member:
        return "You are no longer an annotator of this study; nothing was saved."
    if study.status == Study.Status.PAUSED and assignment_status in WRITABLE_WHILE_PAUSED:
        return None
    if study.status == Study.Status.PAUSED:
        return "This study is paused: only the items you hold can still be answered; nothing was saved."
    if study.status != Study.Status.OPEN:
        return f"This study is {study.status}; nothing was saved."
    return None


def writable_rows(user, assignment_id: int, rows=None):
    """The query of :func:`writable_assignment` (at most one row)."""
    member = membership(user, OuterRef("study_id"))
    rows = rows if rows is not None else Assignment.objects.select_related("study__rubric", "item__query")
    return (
        rows.select_related("annotator")
        .annotate(is_member=Exists(member))
        .filter(pk=assignment_id, annotator=user.pk)
        .order_by("pk")[:1]
    )


def writable_assignment(user, assignment_id: int, rows=None) -> Assignment:
    """The user's own assignment in an open study they still annotate (one query);
    404 for someone else's, 403 with the reason once access has ended. ``rows``: the
    queryset to read it from (a submit passes its locked one)."""
    read = list(writable_rows(user, assignment_id, rows))
    return writable(read[0] if read else None)


def writable(a: Assignment | None) -> Assignment:
    """``a`` (read with ``is_member``, as :func:`writable_rows` reads it) if it may be written
    to: 404 for none (not the user's, or no such row), 403 with the reason once access has ended."""
    if a is None:
        raise Http404("no such assignment")
    refusal = write_refusal(a.study, a.is_member, a.status)
    if refusal:
        raise PermissionDenied(refusal)
    return a
