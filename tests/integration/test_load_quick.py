"""The short load run in CI: 50 annotators against gunicorn + PostgreSQL + Redis + a worker.

Only correctness is asserted (no errors, every submit stored exactly once); the latency
figures are printed by the script and reported, never asserted.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_quick_load_run_loses_nothing():
    db, broker = os.environ.get("DATABASE_URL", ""), os.environ.get("CELERY_BROKER_URL", "")
    if not db.startswith("postgres") or not broker.startswith("redis"):
        pytest.skip("runs against PostgreSQL and Redis: set DATABASE_URL and CELERY_BROKER_URL (CI does)")
    base = db.rsplit("/", 1)[0]
    proc = subprocess.run(
        [sys.executable, "bench/load.py", "--quick", "--json", "--database-url", f"{base}/cirval_load_ci",
         "--broker", broker.rsplit("/", 1)[0] + "/7"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(proc.stderr[-2500:])  # the per-endpoint table, for the CI log
    assert result["requests"] > 300 and result["submits"] > 100
    assert result["errors"] == 0 and result["lost_writes"] == 0 and result["duplicate_writes"] == 0
    assert result["background"] == {"run_audit": "ok", "export_validated": "ok"}
