"""The client's address behind a configured number of trusted proxies (issue 41, item 2):
one function (config.throttling.client_address) for the login lockout and the API throttles.
No database, no process: requests are built by Django's RequestFactory."""

from __future__ import annotations

import pytest
from axes.helpers import get_client_ip_address
from django.test import RequestFactory

from config.throttling import AnonRateThrottle, UserRateThrottle, client_address

PEER = "127.0.0.1"  # nginx, as gunicorn sees it


def request(xff: str | None = None, peer: str = PEER):
    extra = {"REMOTE_ADDR": peer}
    if xff is not None:
        extra["HTTP_X_FORWARDED_FOR"] = xff
    return RequestFactory().post("/login/", **extra)


@pytest.mark.parametrize("xff", [None, "203.0.113.9", "198.51.100.7, 203.0.113.9", "garbage"])
def test_without_a_trusted_proxy_x_forwarded_for_is_ignored(settings, xff):
    settings.CIRVAL_PROXY_COUNT = 0
    assert client_address(request(xff, peer="192.0.2.4")) == "192.0.2.4"


@pytest.mark.parametrize(
    "count,xff,want",
    [
        (1, "203.0.113.9", "203.0.113.9"),  # nginx appended the client it saw
        (1, "198.51.100.7, 203.0.113.9", "203.0.113.9"),  # the left entry is the client's own writing
        (1, "1.2.3.4, 5.6.7.8, 203.0.113.9", "203.0.113.9"),
        (2, "198.51.100.7, 10.0.0.5", "198.51.100.7"),  # balancer saw 198.51.100.7, nginx saw the balancer
        (2, "6.6.6.6, 198.51.100.7, 10.0.0.5", "198.51.100.7"),
        (1, " 203.0.113.9 ", "203.0.113.9"),
        (1, "2001:db8::1", "2001:db8::1"),
        (1, "2001:0db8:0000::0001", "2001:db8::1"),  # one spelling per address
    ],
)
def test_with_n_trusted_proxies_the_nth_address_from_the_right_counts(settings, count, xff, want):
    settings.CIRVAL_PROXY_COUNT = count
    assert client_address(request(xff)) == want


@pytest.mark.parametrize(
    "count,xff",
    [
        (1, None),  # the request did not come through the proxy
        (1, ""),
        (2, "203.0.113.9"),  # fewer addresses than proxies: what is there may be the client's own
        (1, "not-an-address"),
        (1, "203.0.113.9:4431"),
        (2, " , 203.0.113.9"),  # empty entries are not addresses
    ],
)
def test_a_header_that_did_not_come_through_every_proxy_falls_back_to_the_peer(settings, count, xff):
    settings.CIRVAL_PROXY_COUNT = count
    assert client_address(request(xff)) == PEER


def test_axes_and_the_api_throttles_ask_the_same_function(settings):
    """django-axes' supported hook (AXES_CLIENT_IP_CALLABLE) and DRF's get_ident give the
    same address; DRF's own get_ident would have used the whole header (any client's writing)."""
    settings.CIRVAL_PROXY_COUNT = 1
    assert settings.AXES_CLIENT_IP_CALLABLE == "config.throttling.client_address"
    r = request("6.6.6.6, 203.0.113.9")
    assert get_client_ip_address(r) == "203.0.113.9"
    assert AnonRateThrottle().get_ident(r) == "203.0.113.9"
    assert UserRateThrottle().get_ident(r) == "203.0.113.9"
    settings.CIRVAL_PROXY_COUNT = 0
    assert get_client_ip_address(r) == PEER and AnonRateThrottle().get_ident(r) == PEER


def settings_from(monkeypatch, **env) -> dict:
    """config/settings.py run afresh (in this process) with ``env`` as the environment."""
    import runpy
    import warnings

    for name in ("CIRVAL_PROXY_COUNT", "AXES_PROXY_COUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with warnings.catch_warnings():  # runpy notes that config.settings is imported already: that one stays
        warnings.simplefilter("ignore", RuntimeWarning)
        return runpy.run_module("config.settings")  # a fresh namespace; django.conf.settings is untouched


def test_the_count_comes_from_the_environment_and_defaults_to_trusting_nothing(monkeypatch):
    assert settings_from(monkeypatch)["CIRVAL_PROXY_COUNT"] == 0
    assert settings_from(monkeypatch, CIRVAL_PROXY_COUNT="1")["CIRVAL_PROXY_COUNT"] == 1
    assert settings_from(monkeypatch, AXES_PROXY_COUNT="2")["CIRVAL_PROXY_COUNT"] == 2  # its former name
    with pytest.raises(ValueError, match="negative"):
        settings_from(monkeypatch, CIRVAL_PROXY_COUNT="-1")
