"""systemd itself accepts the production units in deploy/systemd/ (``systemd-analyze verify``,
where installed, on copies pointed at this checkout; their contents: tests/unit/test_systemd_units.py)."""

from __future__ import annotations

import getpass
import shutil
import subprocess

import pytest

from tests.conftest import ROOT
from tests.unit.test_systemd_units import UNITS, WEB, WORKER


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
    out = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / t) for t in names.values())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    complaints = [line for line in (out.stdout + out.stderr).splitlines() if str(tmp_path) in line or "cirval" in line]
    assert out.returncode == 0 and not complaints, out.stdout + out.stderr
