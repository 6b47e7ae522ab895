"""API throttles that hold under concurrency: one atomic counter per client and window.

DRF's ``SimpleRateThrottle`` keeps a list of request times per client in the cache and
reads, appends and writes it back: two requests at once both read the same list, so 16
threads got 1,836 of 2,000 requests accepted in 9 s against 600 a minute. These classes
keep DRF's scopes, rates (``DEFAULT_THROTTLE_RATES``) and cache keys but count with the
cache's ``add`` + ``incr``, which on Redis is ``SET NX EX`` + ``INCR``: atomic, with an
expiry, shared by every gunicorn worker (and atomic under the lock of the local memory
cache in one process). The window is fixed (the rate's duration, aligned on the clock), so
a client gets at most the rate in any one window; ``Retry-After`` says when it ends.

The client's address, for these throttles and for the login lockout (django-axes'
``AXES_CLIENT_IP_CALLABLE``), is :func:`client_address`: the connection's peer unless
``CIRVAL_PROXY_COUNT`` trusted proxies stand in front of the app, and then the address the
outermost of them saw. Without it DRF used the whole ``X-Forwarded-For`` header, which any
client writes: a new made-up header per request escaped the anonymous rate.
"""

from __future__ import annotations

import ipaddress
import time

from django.conf import settings
from rest_framework import throttling


def client_address(request) -> str | None:
    """The address of the client that sent ``request``, as far as it can be trusted.

    With ``CIRVAL_PROXY_COUNT`` = 0 (no proxy, the default) it is the connection's peer
    (``REMOTE_ADDR``) and ``X-Forwarded-For`` is ignored: a client writes that header itself.
    With N trusted proxies, each appending the address it received the request from
    (nginx's ``$proxy_add_x_forwarded_for``), it is the N-th address from the right of
    ``X-Forwarded-For``: what the outermost trusted proxy saw. Entries further left were
    written by the client and are never read. A header with fewer than N addresses (the
    request did not come through every proxy) or an entry that is not an IP address falls
    back to the peer. The one place that answers "which address is this?".
    """
    peer = request.META.get("REMOTE_ADDR") or None
    count = settings.CIRVAL_PROXY_COUNT
    if count <= 0:
        return peer
    hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    hops = [h for h in hops if h]
    if len(hops) < count:
        return peer
    try:
        return str(ipaddress.ip_address(hops[-count]))
    except ValueError:
        return peer


class AtomicRateMixin:
    """``allow_request`` of a DRF ``SimpleRateThrottle`` with an atomic counter."""

    def allow_request(self, request, view) -> bool:
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        now = time.time()
        window = int(now // self.duration)
        key = f"{self.key}:w{window}"
        self.cache.add(key, 0, self.duration + 1)  # creates it with its expiry; no-op when it exists
        try:
            count = self.cache.incr(key)
        except ValueError:  # expired between add and incr: this request opens the next count
            self.cache.add(key, 1, self.duration + 1)
            count = 1
        self.retry_after = (window + 1) * self.duration - now
        return count <= self.num_requests

    def wait(self) -> float | None:
        return max(0.0, getattr(self, "retry_after", 0.0))

    def get_ident(self, request) -> str:
        """The client's address (:func:`client_address`), for clients that are not signed in."""
        return client_address(request) or ""


class UserRateThrottle(AtomicRateMixin, throttling.UserRateThrottle):
    """Per account (per address when signed out), scope ``user``."""


class AnonRateThrottle(AtomicRateMixin, throttling.AnonRateThrottle):
    """Per address for clients that are not signed in, scope ``anon``."""
