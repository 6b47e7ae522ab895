"""Content-Security-Policy and the login throttle's backend."""
from __future__ import annotations

from axes.backends import AxesStandaloneBackend
from django.conf import settings

class ContentSecurityPolicyMiddleware:
    """Adds ``Content-Security-Policy`` to every response that has none (Django 5.2 has no
    built-in CSP; the policy is ``CONTENT_SECURITY_POLICY`` in the settings)."""

    def __init__(self, get_response):
        self.get_response = get_response
        self.policy = settings.CONTENT_SECURITY_POLICY

    def __call__(self, request):
        response = self.get_response(request)
        if self.policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = self.policy
        return response


class LoginThrottleBackend(AxesStandaloneBackend):
    """django-axes' lockout check for logins over HTTP. Logins without a request (the test
    client, a shell) have no address to throttle and are let through to the next backend."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
