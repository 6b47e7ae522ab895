"""The site's own 403 and 404 pages: they say what happened and what to do, and never
show Django's URL list, not even with DJANGO_DEBUG=1."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import render

GENERIC_404 = "There is no page at this address."
GENERIC_403 = "Your account may not open this page."


def _reason(exception, generic: str) -> str:
    text = str(exception.args[0]) if exception is not None and exception.args else ""
    if not text or not isinstance(exception.args[0], str) or "Resolver404" in type(exception).__name__:
        return generic
    return text[:1].upper() + text[1:]


def page_not_found(request, exception=None, template_name="404.html"):
    reason = (
        GENERIC_404
        if exception is None or type(exception).__name__ == "Resolver404"
        else _reason(exception, GENERIC_404)
    )
    response = render(request, template_name, {"reason": reason, "path": request.path}, status=404)
    response.cirval_error_page = True
    return response


def permission_denied(request, exception=None, template_name="403.html"):
    response = render(request, template_name, {"reason": _reason(exception, GENERIC_403)}, status=403)
    response.cirval_error_page = True
    return response


class FriendlyErrorsMiddleware:
    """Views' Http404 / PermissionDenied become the site's pages in every mode; with DEBUG on,
    the technical 404 (the URL list) of an unknown address is replaced as well."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            response.status_code == 404
            and settings.DEBUG
            and not getattr(response, "cirval_error_page", False)
            and response.get("Content-Type", "").startswith("text/html")
        ):
            return page_not_found(request)
        return response

    def process_exception(self, request, exception):
        if isinstance(exception, Http404):
            return page_not_found(request, exception)
        if isinstance(exception, PermissionDenied):
            return permission_denied(request, exception)
        return None
