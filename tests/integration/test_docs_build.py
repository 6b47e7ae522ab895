"""The documentation site builds strictly (issue 38, item 3): ``mkdocs build --strict`` with
mkdocs.yml's validation turns a broken link or anchor, a nav entry without its page, and a page
left out of the nav into failures. It runs MkDocs as a process, hence an integration test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner is not a docs problem
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "architecture" / "index.html").exists()
