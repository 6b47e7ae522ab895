"""Content-Security-Policy and the login throttle's backend."""

from __future__ import annotations

import math
from datetime import timedelta

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_cool_off
from axes.models import AccessAttempt
from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm
from django.shortcuts import render
from django.utils import timezone


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


def lockout_response(request, original_response=None, credentials=None):
    """django-axes' refusal of a locked login (429): the page says for how long."""
    minutes = max(1, math.ceil((get_cool_off(request) or timedelta()).total_seconds() / 60))
    return render(request, "registration/locked_out.html", {"minutes": minutes}, status=429)


def locked_usernames(usernames) -> set[str]:
    """Which of ``usernames`` are locked out at some address now (for the staff users page)."""
    since = timezone.now() - (get_cool_off() or timedelta())
    return set(
        AccessAttempt.objects.filter(
            username__in=list(usernames), attempt_time__gte=since, failures_since_start__gte=settings.AXES_FAILURE_LIMIT
        ).values_list("username", flat=True)
    )


class LoginForm(AuthenticationForm):
    """Django's login form, refusing a user name longer than any account's before it reaches
    authentication (Django sets the field's ``max_length`` without its validator, and
    django-axes would then try to store a 256-character name in a 255-character column)."""

    def clean_username(self):
        name = self.cleaned_data.get("username") or ""
        limit = get_user_model()._meta.get_field(get_user_model().USERNAME_FIELD).max_length
        if len(name) > limit:
            raise forms.ValidationError(f"A user name has at most {limit} characters.")
        return name
