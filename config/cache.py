"""A Redis cache that costs nothing when Redis is down.

Everything CIRVal keeps in the cache can be rebuilt or recounted: API throttles, image grants
(an annotator's fetch falls back to the database check of :mod:`annotation.access`), cached
reports and counts. So when Redis does not answer, :class:`FallbackRedisCache` serves every call from
this process's local memory (Django's ``LocMemCache``) and logs it once per outage; for
``CACHE_RETRY_SECONDS`` after a failure it does not try Redis again (a request never waits on
a dead server more than once per period), then it tries again and logs when Redis is back.
Throttles then count per process (as with the default local cache) instead of failing: the
annotators keep working.

:func:`cache_health` asks the Redis server itself (never the fallback), for ``/healthz``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache

logger = logging.getLogger("config.cache")

#: The cache calls that reach the server; every other method of Django's cache API goes
#: through these (get_or_set, incr_version, the async variants, ...).
_CALLS = ("add", "get", "set", "touch", "delete", "get_many", "has_key", "incr", "set_many", "delete_many", "clear")


def _server_errors() -> tuple[type[BaseException], ...]:
    import redis

    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


class FallbackRedisCache(RedisCache):
    """Django's Redis cache, falling back to local memory while Redis is unreachable.

    ``OPTIONS``: the Redis client's (e.g. ``socket_connect_timeout``), plus ``retry_seconds``
    (how long to stay on local memory after a failure before trying Redis again)."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        options = dict(params.get("OPTIONS") or {})
        self.retry_seconds = float(options.pop("retry_seconds", 5.0))
        super().__init__(server, {**params, "OPTIONS": options})
        self.local = LocMemCache(
            f"cirval-fallback-{id(self)}",
            {k: v for k, v in params.items() if k in ("TIMEOUT", "KEY_PREFIX", "VERSION", "KEY_FUNCTION")},
        )
        self._down_until = 0.0
        self._lock = threading.Lock()

    # -- outage bookkeeping -------------------------------------------------------------
    @property
    def is_down(self) -> bool:
        return time.monotonic() < self._down_until

    def _went_down(self, exc: BaseException) -> None:
        with self._lock:
            first = self._down_until == 0.0
            self._down_until = time.monotonic() + self.retry_seconds
        if first:
            logger.warning(
                "cache (Redis) unavailable: %s; serving throttles, image grants and cached counts "
                "from this process's memory, retrying every %g s",
                exc,
                self.retry_seconds,
            )

    def _came_back(self) -> None:
        if self._down_until:
            with self._lock:
                self._down_until = 0.0
            logger.warning("cache (Redis) is back; the local fallback is no longer used")

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.is_down:
            return getattr(self.local, name)(*args, **kwargs)
        try:
            out = getattr(super(), name)(*args, **kwargs)
        except _server_errors() as exc:
            self._went_down(exc)
            return getattr(self.local, name)(*args, **kwargs)
        self._came_back()
        return out


def _wrap(name: str):
    def method(self, *args, **kwargs):
        return self._call(name, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"``{name}`` on Redis, or on local memory while Redis is down."
    return method


for _name in _CALLS:
    setattr(FallbackRedisCache, _name, _wrap(_name))


def cache_health() -> dict[str, Any]:
    """``{"ok": ..., "backend": ..., "error"?: ...}`` of the default cache, read from the server
    (a Redis cache in fallback is reported down, with what it falls back to)."""
    from django.core.cache import caches

    backend = caches["default"]
    if not isinstance(backend, RedisCache):
        return {"ok": True, "backend": "local memory (one per process)"}
    try:
        backend._cache.get_client(write=True).ping()
    except Exception as exc:  # noqa: BLE001 - any failure means down
        return {
            "ok": False,
            "backend": "redis",
            "error": str(exc) or type(exc).__name__,
            "fallback": "local memory" if isinstance(backend, FallbackRedisCache) else "none",
        }
    return {"ok": True, "backend": "redis"}
