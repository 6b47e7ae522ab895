"""The guard that runs before every middleware that may read a body.

* Oversized bodies are refused by their ``Content-Length`` before a byte is read: before
  CSRF (which reads POST bodies), sessions and authentication. Multipart uploads by a
  signed-in client may reach ``CIRVAL_MAX_UPLOAD_BYTES``; every other body, and any body
  from a client that is not signed in, ``DATA_UPLOAD_MAX_MEMORY_SIZE``. "Signed in" is
  verified, and only when a body claims more than the small limit: the session cookie must
  name a live session of an active user whose password has not changed since (Django's own
  :func:`django.contrib.auth.get_user` check), or the ``Authorization`` header a valid API
  token; a made-up cookie or header lifts nothing.
* Only the security headers' middlewares run before it, so its 413 and 400 carry them.
* A NUL or another control character (:func:`config.parsing.check_text`) in any query
  parameter, or in any text field of a form body, URL-encoded or multipart, whatever the
  method, is a 400 naming it, before any view passes it to the database (PostgreSQL refuses
  NUL in text: a note, a user name or an export's ``primary`` was a 500). A multipart body's
  files are bytes and may hold anything (Django keeps the printable characters of their
  names). JSON bodies meet
  the same check in the API's only JSON parser (:class:`config.parsing.SafeJSONParser`).
* Hostile query parameters (:class:`config.parsing.HostileInput`) raised anywhere below
  become a 400 that names the parameter.
"""

from __future__ import annotations

from importlib import import_module
from types import SimpleNamespace

from django.conf import settings
from django.contrib.auth import get_user
from django.http import JsonResponse
from django.http.multipartparser import MultiPartParserError

from config.parsing import HostileInput, check_text


def body_limit(request) -> int:
    """The largest body ``request`` may send (checked against its claimed length)."""
    multipart = (request.META.get("CONTENT_TYPE") or "").startswith("multipart/form-data")
    if multipart and verified_client(request):
        return settings.CIRVAL_MAX_UPLOAD_BYTES
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def verified_client(request) -> bool:
    """Whether the request comes from an active user: a valid session, or a valid API token."""
    key = request.COOKIES.get(settings.SESSION_COOKIE_NAME)
    if key:
        store = import_module(settings.SESSION_ENGINE).SessionStore(key)
        user = get_user(SimpleNamespace(session=store))  # verifies the session's password hash
        if user.is_authenticated and user.is_active:
            return True
    auth = request.META.get("HTTP_AUTHORIZATION", "").split()
    if len(auth) == 2 and auth[0].lower() == "token":
        from rest_framework.authtoken.models import Token

        return Token.objects.filter(key=auth[1][:40], user__is_active=True).exists()
    return False


FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def form_body(request):
    """The text fields and the files of a form body (``FORM_TYPES``), parsed as Django parses a
    POST's, whatever the method; ``None`` for another body. Django parses the form bodies of
    POST only: a PUT's or PATCH's is parsed here the same way, and DRF then takes these
    (its ``Request`` reads ``request.POST`` and ``request.FILES`` once the stream is read)."""
    ctype = (request.META.get("CONTENT_TYPE") or "").split(";")[0].strip().lower()
    if ctype not in FORM_TYPES:
        return None
    if request.method != "POST":
        method, request.method = request.method, "POST"
        try:
            request._load_post_and_files()
        finally:
            request.method = method
    return request.POST, request.FILES  # within the body limits, checked above


def check_fields(request) -> None:
    """Refuse a hostile character (:func:`config.parsing.check_text`) in the query string or in
    a form body's field names and text values (:class:`HostileInput`)."""
    sources = [request.GET]
    body = form_body(request)
    if body is not None:
        fields, files = body
        sources.append(fields)
        for name in files:  # the files' names: Django keeps their printable characters only
            check_text(name, "a field name")
    for source in sources:
        for name, values in source.lists():
            check_text(name, "a field name")
            for value in values:
                check_text(value, name[:40])


def refuse(status: int, field: str, detail: str) -> JsonResponse:
    return JsonResponse({"field": field, "detail": detail}, status=status)


class RequestGuardMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        claimed = request.META.get("CONTENT_LENGTH") or "0"
        if not claimed.isascii() or not claimed.isdigit():
            return refuse(400, "Content-Length", "Content-Length must be a whole number of bytes.")
        small = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        limit = small if int(claimed) <= small else body_limit(request)  # verify only when it matters
        if int(claimed) > limit:
            return refuse(413, "Content-Length", f"Request refused: {claimed} bytes claimed; the limit is {limit}.")
        try:
            check_fields(request)
        except HostileInput as exc:
            return refuse(400, exc.field, str(exc))
        except MultiPartParserError as exc:
            return refuse(400, "", f"The multipart body cannot be read: {exc}")
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, HostileInput):
            return refuse(400, exception.field, str(exception))
        return None
