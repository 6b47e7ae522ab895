"""The guard that runs before every other middleware.

* Oversized bodies are refused by their ``Content-Length`` before a byte is read: before
  CSRF (which reads POST bodies), sessions and authentication. Multipart uploads by a
  signed-in client may reach ``CIRVAL_MAX_UPLOAD_BYTES``; every other body, and any body
  from a client without a session cookie or API token, ``DATA_UPLOAD_MAX_MEMORY_SIZE``.
* Hostile query parameters (:class:`config.parsing.HostileInput`) raised anywhere below
  become a 400 that names the parameter.
"""
from __future__ import annotations

from django.conf import settings
from django.http import JsonResponse

from config.parsing import HostileInput


def body_limit(request) -> int:
    signed_in = settings.SESSION_COOKIE_NAME in request.COOKIES or "HTTP_AUTHORIZATION" in request.META
    multipart = (request.META.get("CONTENT_TYPE") or "").startswith("multipart/form-data")
    if signed_in and multipart:
        return settings.CIRVAL_MAX_UPLOAD_BYTES
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def refuse(status: int, field: str, detail: str) -> JsonResponse:
    return JsonResponse({"field": field, "detail": detail}, status=status)


class RequestGuardMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        claimed = request.META.get("CONTENT_LENGTH") or "0"
        if not claimed.isascii() or not claimed.isdigit():
            return refuse(400, "Content-Length", "Content-Length must be a whole number of bytes.")
        limit = body_limit(request)
        if int(claimed) > limit:
            return refuse(413, "Content-Length", f"Request refused: {claimed} bytes claimed; the limit is {limit}.")
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, HostileInput):
            return refuse(400, exception.field, str(exception))
        return None
