"""Issue 39, item 8: the item page beats well inside the lease (a third of it at most), so a
lease never lapses while its page is open, even a one-minute one."""

from __future__ import annotations

from types import SimpleNamespace

from annotation.judging.payloads import lease_config


def test_heartbeat_is_a_third_of_a_short_lease(settings):
    settings.CIRVAL_LEASE_HEARTBEAT_SECONDS = 60
    one_minute = lease_config(SimpleNamespace(lease_minutes=1))
    assert one_minute["lease_seconds"] == 60 and one_minute["heartbeat_seconds"] == 20
    assert lease_config(SimpleNamespace(lease_minutes=10))["heartbeat_seconds"] == 60  # the setting, well inside
    settings.CIRVAL_LEASE_HEARTBEAT_SECONDS = 1
    assert lease_config(SimpleNamespace(lease_minutes=1))["heartbeat_seconds"] == 1


def test_heartbeat_never_reaches_the_lease(settings):
    for beat in (1, 30, 60, 600, 6000):
        settings.CIRVAL_LEASE_HEARTBEAT_SECONDS = beat
        for minutes in (1, 2, 10, 240):
            c = lease_config(SimpleNamespace(lease_minutes=minutes))
            assert 1 <= c["heartbeat_seconds"] <= c["lease_seconds"] / 3
