"""REST API for everything the annotation pages do (session or token authentication)."""

from __future__ import annotations

from django.contrib import messages
from django.db.models import Exists, OuterRef
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.response import Response

from annotation import roles
from annotation.assignment import queue as engine
from annotation.core.rubric import JudgementError
from annotation.core.serving import PANELS_PENDING, REFIT_PENDING
from annotation.core.study_settings import (
    CONSENSUS_POLICIES,
    MAX_LEASE_MINUTES,
    MAX_OVERLAP,
    QuorumSettings,
    ServingSettings,
)
from annotation.judging.payloads import item_payload, judgement_dict, lease_seconds
from annotation.models import Assignment, Study
from annotation.permissions import (
    member_study,
    membership,
    own_assignment,
    readable_study,
    refuse_non_annotator,
    visible_studies,
    writable_assignment,
)
from annotation.quality.gold import feedback_message, training_feedback
from annotation.studies.building import StudyError, StudySpec, create_study
from annotation.verdicts.refit import retry_after_seconds
from annotation.verdicts.state import annotator_share
from config.parsing import query_int
from retrieval.fusion import MAX_CANDIDATES


def study_dict(study, user) -> dict:
    data = {
        "id": study.pk,
        "name": study.name,
        "rubric": {"key": study.rubric.key, "version": study.rubric.version},
        "kind": study.kind,
        "guidelines": study.guidelines,
        "status": study.status,
    }
    is_annotator = getattr(study, "is_annotator", None)
    if is_annotator if is_annotator is not None else study.annotators.filter(pk=user.pk).exists():
        data["progress"] = annotator_share(study, user)
    if roles.is_admin(user) or roles.is_researcher(user):
        data.update(
            overlap=study.overlap,
            quorum=study.decision_quorum,
            blind=study.blind,
            adaptive_max=study.adaptive_max,
            adaptive_confidence=study.adaptive_confidence,
            consensus=study.consensus,
            serve_order=study.serve_order,
            items=study.n_items,
            pool=study.pool,
            candidates=study.candidates,
            interactive=study.interactive,
        )
    return data


class StudyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    datasets = serializers.ListField(child=serializers.CharField(), min_length=1)
    rubric = serializers.CharField(default="validity")
    overlap = serializers.IntegerField(min_value=1, max_value=MAX_OVERLAP, default=3)
    quorum = serializers.IntegerField(min_value=1, max_value=MAX_OVERLAP, required=False, allow_null=True, default=None)
    session_rule = serializers.DictField(required=False, allow_null=True, default=None)
    hidden_categories = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    quotas = serializers.DictField(
        child=serializers.IntegerField(min_value=0), required=False, allow_null=True, default=None
    )
    total = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    seed = serializers.IntegerField(default=0, min_value=-(2**31), max_value=2**31 - 1)
    agreement_size = serializers.IntegerField(min_value=0, default=0)
    blind = serializers.BooleanField(default=True)
    guidelines = serializers.CharField(allow_blank=True, default="")
    lease_minutes = serializers.IntegerField(min_value=1, max_value=MAX_LEASE_MINUTES, default=10)
    annotators = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    candidates = serializers.IntegerField(min_value=0, max_value=MAX_CANDIDATES, default=20)
    interactive = serializers.DictField(
        required=False,
        allow_null=True,
        default=None,
        help_text="An interactive study: retriever, top_n, max_rounds, strategy, "
        "alpha, target_view (annotation.core.rounds).",
    )
    adaptive_max = serializers.IntegerField(
        min_value=2, max_value=MAX_OVERLAP, required=False, allow_null=True, default=None
    )
    consensus = serializers.ChoiceField(choices=CONSENSUS_POLICIES, default="majority")
    serve_order = serializers.ChoiceField(
        choices=Study.ServeOrder.values,
        default=Study.ServeOrder.RANDOM,
        help_text="random, or suspicion: the most suspicious fresh item first.",
    )

    def validate(self, attrs):
        """The quorum and serving settings' rules together (annotation.core.study_settings)."""
        problems = {}
        for group in (QuorumSettings, ServingSettings):
            problems.update(group.from_values(attrs).problems())
        if problems:
            raise serializers.ValidationError(problems)
        return attrs


@extend_schema(request=StudyCreateSerializer, responses={200: dict, 201: dict})
@api_view(["GET", "POST"])
def studies(request):
    if request.method == "GET":
        return Response([study_dict(s, request.user) for s in visible_studies(request.user).select_related("rubric")])
    if not roles.is_admin(request.user):
        return Response({"detail": "Only staff may create studies."}, status=status.HTTP_403_FORBIDDEN)
    ser = StudyCreateSerializer(data=request.data)
    ser.is_valid(raise_exception=True)
    try:
        study, report = create_study(StudySpec(**ser.validated_data), created_by=request.user)
    except StudyError as exc:
        return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    return Response({**study_dict(study, request.user), "sampling": report}, status=status.HTTP_201_CREATED)


@extend_schema(responses={200: dict})
@api_view(["GET"])
def study_detail(request, pk: int):
    return Response(study_dict(readable_study(request.user, pk), request.user))


@extend_schema(request=None, responses={200: dict, 204: dict})
@api_view(["POST"])
def next_item(request, pk: int):
    """Reserve the next item. Staff also get ``staff.served_by``, the rule that chose it;
    annotators never learn it (nor the audit's label). With nothing to serve: ``served_by``
    says why (``queue_empty``: done; ``all_slots_reserved``: others hold what is left;
    ``refit_pending``: nothing now, but the study's annotator model is being refitted and may
    reopen items; ``panels_pending``: nothing now, but items wait for their candidate panels,
    which a worker is preparing: ask again after ``retry_after`` seconds, also sent as
    ``Retry-After``)."""
    try:
        study = engine.study_for_next(request.user, pk)
    except Http404:
        refuse_non_annotator(request.user, pk)
    if not study.is_annotator:
        return Response({"detail": "You are not an annotator of this study."}, status=status.HTTP_403_FORBIDDEN)
    served = engine.next_assignment(study, request.user)
    if served.assignment is None:
        body = {"assignment": None, "served_by": served.rule, "progress": annotator_share(study, request.user)}
        if served.rule not in (REFIT_PENDING, PANELS_PENDING):
            return Response(body)
        wait = retry_after_seconds()
        return Response({**body, "retry_after": wait}, headers={"Retry-After": str(wait)})
    return Response(
        item_payload(
            served.assignment, served.rule, staff=roles.is_admin(request.user), fresh=served.fresh, mine=served.mine
        )
    )


@extend_schema(responses={200: dict})
@api_view(["GET"])
def study_progress(request, pk: int):
    try:
        study = member_study(request.user, pk)
    except Http404:
        refuse_non_annotator(request.user, pk)
    if roles.is_admin(request.user):
        from annotation.assignment.progress import study_progress as full

        return Response(full(study))
    return Response(annotator_share(study, request.user))


@extend_schema(responses={200: dict})
@api_view(["GET"])
def assignments(request):
    """The caller's own assignments (for reopening earlier judgements)."""
    qs = (
        Assignment.objects.filter(annotator=request.user)
        .select_related("item__query", "study")
        .order_by("study", "position")
    )
    if not roles.is_admin(request.user):  # only the studies they still annotate
        qs = qs.filter(Exists(membership(request.user, OuterRef("study_id"))))
    study = query_int(request, "study")
    if study is not None:
        qs = qs.filter(study_id=study)
    return Response(
        [
            {
                "id": a.pk,
                "study": a.study_id,
                "position": a.position,
                "status": a.status,
                "query": a.item.query.external_id,
                "completed_at": a.completed_at and a.completed_at.isoformat(),
            }
            for a in qs[:2000]
        ]
    )


@extend_schema(responses={200: dict})
@api_view(["GET"])
def assignment_detail(request, pk: int):
    return Response(item_payload(own_assignment(request.user, pk), staff=roles.is_admin(request.user)))


def _json_object(request, what: str) -> Response | None:
    """A 400 unless the body is a JSON object (a form-encoded body is refused too)."""
    if not isinstance(request.data, dict) or hasattr(request.data, "getlist"):
        return Response({"field": "", "detail": f"{what} is a JSON object."}, status=status.HTTP_400_BAD_REQUEST)
    return None


@extend_schema(request=dict, responses={200: dict})
@api_view(["PUT"])
def draft(request, pk: int):
    a = writable_assignment(request.user, pk)
    refused = _json_object(request, "A draft")
    if refused:
        return refused
    if len(str(request.data)) > 20000:
        return Response({"field": "", "detail": "The draft is too large."}, status=status.HTTP_400_BAD_REQUEST)
    token = str(request.data.get("client_token") or "")
    if token and a.revisions.filter(client_token=token).exists():
        # A save that arrives after its judgement was submitted is stale: keep nothing.
        return Response({"saved": None, "stale": True})
    try:
        d = engine.save_draft(a, request.data)
    except JudgementError as exc:
        return Response({"field": exc.field, "detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    # edited_at: the page's stamp of the draft the server now holds (maybe a newer one than
    # this request's): the page forgets its local copy of every edit up to it.
    return Response({"saved": d.updated_at.isoformat(), "edited_at": d.payload.get("edited_at")})


@extend_schema(request=None, responses={200: dict})
@api_view(["POST"])
def lease(request, pk: int):
    """The page's heartbeat while its annotator is active: renews the lease if still held."""
    a = writable_assignment(request.user, pk)
    state = engine.renew_lease(a)
    return Response({**state["body"], "lease_seconds": lease_seconds(state["assignment"])})


@extend_schema(request=None, responses={200: dict})
@api_view(["POST"])
def skip(request, pk: int):
    a = writable_assignment(request.user, pk)
    engine.skip(a)
    return Response({"status": Assignment.objects.get(pk=a.pk).status})


def _base_revision(payload: dict) -> int | None:
    raw = payload.pop("base_revision", None)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise JudgementError("base_revision", "base_revision must be a revision number (0: none yet)")
    return raw


@extend_schema(request=dict, responses={200: dict, 201: dict, 400: dict, 409: dict})
@api_view(["GET", "POST"])
def judgements(request, pk: int):
    """GET: the caller's revisions of this item. POST: submit. ``client_token`` (one per page
    load) makes retries of the same answer safe; ``base_revision`` (the revision the page was
    showing, 0 for none) turns a submit over a newer revision into a 409 with both versions."""
    if request.method == "GET":
        a = own_assignment(request.user, pk)
        return Response([judgement_dict(j) for j in a.revisions.order_by("revision")])
    refused = _json_object(request, "A judgement")
    if refused:
        writable_assignment(request.user, pk)  # a 404 or 403 comes first
        return refused
    payload = dict(request.data)
    token = str(payload.pop("client_token", "") or "")[:64]
    held = []  # the row as read under lock (access checked in the same query)

    def fetch():
        held.append(engine.submit_row(request.user, pk, token))
        return held[-1]

    try:
        j = engine.submit(
            Assignment(pk=pk), payload, client_token=token, base_revision=_base_revision(payload), fetch=fetch
        )
    except JudgementError as exc:
        if not held:  # refused before the row was read: a 404 or 403 comes first
            writable_assignment(request.user, pk)
        return Response({"field": exc.field, "detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    except engine.DuplicateSubmission as dup:
        return Response({**judgement_dict(dup.judgement), "duplicate": True}, status=status.HTTP_200_OK)
    except engine.Conflict as conflict:
        return Response(_conflict_body(conflict, payload), status=status.HTTP_409_CONFLICT)
    body = judgement_dict(j)
    feedback = training_feedback(held[-1], j)
    if feedback:  # shown on the next page the annotator opens, with a link back to this item
        messages.info(request._request, feedback_message(feedback))
        body["training"] = feedback
    return Response(body, status=status.HTTP_201_CREATED)


CONFLICT_TEXT = {
    "stale": "This item was judged again elsewhere (another tab?) since this page was opened.",
    "token_reused": "This page's answer differs from the one it already submitted.",
}


def _conflict_body(conflict, payload: dict) -> dict:
    return {
        "conflict": conflict.reason,
        "detail": CONFLICT_TEXT[conflict.reason],
        "stored": judgement_dict(conflict.judgement),
        "yours": payload,
    }
