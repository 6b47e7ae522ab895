"""REST API for everything the annotation pages do (session or token authentication)."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.response import Response

from annotation import roles

from annotation.assignment import queue as engine
from annotation.models import Assignment
from annotation.judging.payloads import item_payload, judgement_dict
from annotation.permissions import member_study, own_assignment, visible_studies
from annotation.judging.rubric import JudgementError
from annotation.studies.building import StudyError, StudySpec, create_study


def study_dict(study, user) -> dict:
    data = {
        "id": study.pk, "name": study.name, "rubric": {"key": study.rubric.key, "version": study.rubric.version},
        "kind": study.rubric.rubric.kind, "guidelines": study.guidelines, "status": study.status,
    }
    if study.annotators.filter(pk=user.pk).exists():
        data["progress"] = engine.annotator_progress(study, user)
    if roles.is_admin(user) or roles.is_researcher(user):
        data.update(overlap=study.overlap, quorum=study.decision_quorum, blind=study.blind,
                    items=study.items.count(), pool=study.pool)
    return data


class StudyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    datasets = serializers.ListField(child=serializers.CharField(), min_length=1)
    rubric = serializers.CharField(default="validity")
    overlap = serializers.IntegerField(min_value=1, max_value=50, default=3)
    quorum = serializers.IntegerField(min_value=1, max_value=50, required=False, allow_null=True, default=None)
    session_rule = serializers.DictField(required=False, allow_null=True, default=None)
    hidden_categories = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    quotas = serializers.DictField(child=serializers.IntegerField(min_value=0), required=False, allow_null=True, default=None)
    total = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    seed = serializers.IntegerField(default=0)
    agreement_size = serializers.IntegerField(min_value=0, default=0)
    blind = serializers.BooleanField(default=True)
    guidelines = serializers.CharField(allow_blank=True, default="")
    lease_minutes = serializers.IntegerField(min_value=1, max_value=240, default=10)
    annotators = serializers.ListField(child=serializers.CharField(), required=False, default=list)


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
    return Response(study_dict(member_study(request.user, pk), request.user))


@extend_schema(request=None, responses={200: dict, 204: dict})
@api_view(["POST"])
def next_item(request, pk: int):
    """Reserve the next item; ``served_by`` names the rule that chose it."""
    study = member_study(request.user, pk)
    if not study.annotators.filter(pk=request.user.pk).exists():
        return Response({"detail": "You are not an annotator of this study."}, status=status.HTTP_403_FORBIDDEN)
    served = engine.next_assignment(study, request.user)
    if served.assignment is None:
        return Response({"assignment": None, "served_by": served.rule,
                         "progress": engine.annotator_progress(study, request.user)})
    return Response(item_payload(served.assignment, served.rule))


@extend_schema(responses={200: dict})
@api_view(["GET"])
def study_progress(request, pk: int):
    study = member_study(request.user, pk)
    if roles.is_admin(request.user):
        from annotation.assignment.progress import study_progress as full

        return Response(full(study))
    return Response(engine.annotator_progress(study, request.user))


@extend_schema(responses={200: dict})
@api_view(["GET"])
def assignments(request):
    """The caller's own assignments (for reopening earlier judgements)."""
    qs = Assignment.objects.filter(annotator=request.user).select_related("item__query", "study").order_by("study", "position")
    study = request.query_params.get("study")
    if study:
        qs = qs.filter(study_id=study)
    return Response([
        {"id": a.pk, "study": a.study_id, "position": a.position, "status": a.status,
         "query": a.item.query.external_id, "completed_at": a.completed_at and a.completed_at.isoformat()}
        for a in qs[:2000]
    ])


@extend_schema(responses={200: dict})
@api_view(["GET"])
def assignment_detail(request, pk: int):
    return Response(item_payload(own_assignment(request.user, pk)))


@extend_schema(request=dict, responses={200: dict})
@api_view(["PUT"])
def draft(request, pk: int):
    a = own_assignment(request.user, pk)
    if not isinstance(request.data, dict):
        return Response({"detail": "A draft is a JSON object."}, status=status.HTTP_400_BAD_REQUEST)
    if len(str(request.data)) > 20000:
        return Response({"detail": "The draft is too large."}, status=status.HTTP_400_BAD_REQUEST)
    token = str(request.data.get("client_token") or "")
    if token and a.revisions.filter(client_token=token).exists():
        # A save that arrives after its judgement was submitted is stale: keep nothing.
        return Response({"saved": None, "stale": True})
    d = engine.save_draft(a, request.data)
    return Response({"saved": d.updated_at.isoformat()})


@extend_schema(request=None, responses={200: dict})
@api_view(["POST"])
def skip(request, pk: int):
    a = own_assignment(request.user, pk)
    engine.skip(a)
    return Response({"status": Assignment.objects.get(pk=a.pk).status})


@extend_schema(request=dict, responses={200: dict, 201: dict, 400: dict})
@api_view(["GET", "POST"])
def judgements(request, pk: int):
    """GET: the caller's revisions of this item. POST: submit (``client_token`` makes retries safe)."""
    a = own_assignment(request.user, pk)
    if request.method == "GET":
        return Response([judgement_dict(j) for j in a.revisions.order_by("revision")])
    if not isinstance(request.data, dict):
        return Response({"detail": "A judgement is a JSON object."}, status=status.HTTP_400_BAD_REQUEST)
    payload = dict(request.data)
    token = str(payload.pop("client_token", "") or "")[:64]
    try:
        j = engine.submit(a, payload, client_token=token)
    except JudgementError as exc:
        return Response({"field": exc.field, "detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    except engine.DuplicateSubmission as dup:
        return Response({**judgement_dict(dup.judgement), "duplicate": True}, status=status.HTTP_200_OK)
    return Response(judgement_dict(j), status=status.HTTP_201_CREATED)
