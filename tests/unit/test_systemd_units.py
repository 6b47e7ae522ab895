"""The production units in deploy/systemd/ (README, Running in production): every process is
restarted when it dies, stops on SIGTERM within bounds, and systemd itself accepts the files
(``systemd-analyze verify``, where installed, on copies pointed at this checkout)."""
from __future__ import annotations

import configparser
import getpass
import shutil
import subprocess
from pathlib import Path

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


def test_the_worker_unit_runs_the_queue_of_its_instance_as_the_readme_says():
    service = unit(WORKER)["Service"]
    assert "/.venv/bin/celery -A config worker -Q %i " in service["ExecStart"]
    assert unit(WORKER)["Unit"]["StartLimitIntervalSec"] == "0"  # never gives up restarting
    assert "/.venv/bin/gunicorn config.wsgi " in unit(WEB)["Service"]["ExecStart"]
    readme = (ROOT / "README.md").read_text()
    assert "deploy/systemd/" in readme and "cirval-worker@gpu" in readme


def test_systemd_accepts_the_units(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    env = tmp_path / "cirval.env"
    env.write_text((UNITS / "cirval.env.example").read_text())
    names = {WEB: WEB, WORKER: "cirval-worker@celery.service"}
    for source, target in names.items():
        text = (UNITS / source).read_text().replace("/srv/cirval", str(ROOT))
        text = text.replace("/etc/cirval/cirval.env", str(env))
        text = text.replace("User=cirval", f"User={getpass.getuser()}").replace("Group=cirval", "")
        (tmp_path / target).write_text(text)
    out = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / t) for t in names.values())],
                         capture_output=True, text=True, timeout=60)
    complaints = [line for line in (out.stdout + out.stderr).splitlines() if str(tmp_path) in line or "cirval" in line]
    assert out.returncode == 0 and not complaints, out.stdout + out.stderr
