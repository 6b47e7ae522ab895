"""The tree is lint-clean and formatted: ``ruff check .`` and ``ruff format --check .`` (the
rules and their reasons are in ruff.toml; ruff is pinned in requirements-dev.txt).

Fix what they report with ``.venv/bin/ruff check --fix .`` and ``.venv/bin/ruff format .``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff_is_clean(command):
    out = subprocess.run(
        [sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, f"ruff {' '.join(command)}:\n{out.stdout[-6000:]}{out.stderr[-2000:]}"
