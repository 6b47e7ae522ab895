"""The production units in deploy/systemd/ (docs/guides/production.md): every process is
restarted when it dies, stops on SIGTERM within bounds, and systemd itself accepts the files
(tests/integration/test_systemd_units.py)."""

from __future__ import annotations

import configparser

import pytest

from tests.conftest import ROOT

UNITS = ROOT / "deploy" / "systemd"
WEB, WORKER = "cirval-web.service", "cirval-worker@.service"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string((UNITS / name).read_text())
    return parser


@pytest.mark.parametrize("name", [WEB, WORKER])
def test_every_unit_restarts_its_process_and_stops_on_sigterm(name):
    service = unit(name)["Service"]
    assert service["Restart"] == "always" and float(service["RestartSec"]) <= 5
    assert service["KillSignal"] == "SIGTERM" and int(service["TimeoutStopSec"]) <= 30
    assert service["EnvironmentFile"] == "/etc/cirval/cirval.env"
    assert unit(name)["Install"]["WantedBy"] == "multi-user.target"


def test_the_worker_unit_runs_the_queue_of_its_instance_as_the_docs_say():
    service = unit(WORKER)["Service"]
    assert "/.venv/bin/celery -A config worker -Q %i " in service["ExecStart"]
    assert unit(WORKER)["Unit"]["StartLimitIntervalSec"] == "0"  # never gives up restarting
    assert "/.venv/bin/gunicorn config.wsgi " in unit(WEB)["Service"]["ExecStart"]
    production = (ROOT / "docs/guides/production.md").read_text()  # the docs page on running in production
    assert "deploy/systemd/" in production and "cirval-worker@gpu" in production
