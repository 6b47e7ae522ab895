"""Small, dependency-free readers for settings taken from environment variables."""

from __future__ import annotations

import os


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def env_list(name: str, default: list[str], sep: str = ",") -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return list(default)
    return [part.strip() for part in raw.split(sep) if part.strip()]


def cache_settings(url: str, retry_seconds: float = 5.0) -> dict:
    """Django's ``CACHES`` from a URL: empty (or ``locmem://``) keeps the per-process local
    memory cache; ``redis://`` / ``rediss://`` / ``unix://`` use Django's Redis backend, one
    cache shared by every gunicorn worker (throttles, image grants, cached reports),
    through :class:`config.cache.FallbackRedisCache`: while Redis is down, each process serves
    the cache from its own memory (retrying Redis every ``retry_seconds``), short socket
    timeouts so that a dead server costs a request at most half a second."""
    url = (url or "").strip()
    if url in ("", "locmem://"):
        return {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    if url.split("://", 1)[0] in ("redis", "rediss", "unix"):
        return {
            "default": {
                "BACKEND": "config.cache.FallbackRedisCache",
                "LOCATION": url,
                "KEY_PREFIX": "cirval",
                "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5, "retry_seconds": retry_seconds},
            }
        }
    raise ValueError(f"CACHE_URL={url!r}: use redis://host:port/db, rediss://..., unix://... or leave it empty")
