"""The interactive page's API: the session's state (polled while a round is ranked), a new
round, and a retry of a round whose ranking failed. The web tier only stores and sends."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import api_view
from rest_framework.response import Response

from annotation.interactive.service import RoundError, retry_round, session_for, submit_round
from annotation.interactive.warm import page_state
from annotation.permissions import own_assignment, writable_assignment


def _not_interactive(a) -> Response | None:
    if not a.study.interactive:
        return Response({"detail": "This study is not interactive."}, status=status.HTTP_400_BAD_REQUEST)
    return None


@extend_schema(responses={200: dict})
@api_view(["GET"])
def state(request, pk: int):
    """The session of this assignment as its annotator sees it (no rank, no label)."""
    a = own_assignment(request.user, pk)
    refused = _not_interactive(a)
    if refused:
        return refused
    return Response(page_state(session_for(a), request.user.pk))


@extend_schema(request=dict, responses={202: dict, 400: dict})
@api_view(["POST"])
def rounds(request, pk: int):
    """Take the next round: ``{"text": ..., "reference": image id (optional: the first
    candidate), "time_spent_ms": ...}``. Answers 202 with the state, the round pending."""
    a = writable_assignment(request.user, pk)
    refused = _not_interactive(a)
    if refused:
        return refused
    data = request.data if isinstance(request.data, dict) else {}
    reference = data.get("reference")
    if reference is not None and (isinstance(reference, bool) or not isinstance(reference, int)):
        return Response(
            {"field": "reference", "detail": "reference is an image id."}, status=status.HTTP_400_BAD_REQUEST
        )
    spent = data.get("time_spent_ms") if isinstance(data.get("time_spent_ms"), int) else 0
    session = session_for(a)
    try:
        submit_round(session, data.get("text"), reference, spent)
    except RoundError as exc:
        return Response({"field": "text", "detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    return Response(page_state(session, request.user.pk), status=status.HTTP_202_ACCEPTED)


@extend_schema(request=None, responses={200: dict})
@api_view(["POST"])
def retry(request, pk: int):
    """Send a failed last round to a worker again."""
    a = writable_assignment(request.user, pk)
    refused = _not_interactive(a)
    if refused:
        return refused
    session = session_for(a)
    retry_round(session)
    return Response(page_state(session, request.user.pk))
