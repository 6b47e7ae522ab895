"""Issue 17: CACHE_URL switches Django's cache to Redis (shared by gunicorn workers);
the default stays the per-process local memory cache."""

from __future__ import annotations

import pytest

from config.env import cache_settings

LOCMEM = "django.core.cache.backends.locmem.LocMemCache"
REDIS = "config.cache.FallbackRedisCache"  # Django's RedisCache, with a local fallback


@pytest.mark.parametrize("url", ["", "  ", "locmem://"])
def test_no_url_keeps_local_memory(url):
    assert cache_settings(url) == {"default": {"BACKEND": LOCMEM}}


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/11", "rediss://cache.example:6380/0", "unix:///run/redis.sock"]
)
def test_a_redis_url_selects_the_shared_redis_cache(url):
    default = cache_settings(url)["default"]
    assert default["BACKEND"] == REDIS and default["LOCATION"] == url


@pytest.mark.parametrize("url", ["memcached://x:11211", "127.0.0.1:6379"])
def test_an_unknown_scheme_is_refused_by_name(url):
    with pytest.raises(ValueError, match="CACHE_URL"):
        cache_settings(url)
