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
    import psycopg

    base = db.rsplit("/", 1)[0]
    databases = "SELECT datname FROM pg_database WHERE datname LIKE 'cirval_load%'"
    with psycopg.connect(base + "/postgres", autocommit=True) as conn:
        conn.execute('DROP DATABASE IF EXISTS "cirval_load" WITH (FORCE)')
        conn.execute('CREATE DATABASE "cirval_load"')  # someone else's, with the old fixed name
        before = {r[0] for r in conn.execute(databases)}
    try:
        proc = subprocess.run(
            [sys.executable, "bench/load.py", "--quick", "--json", "--server-url", base,
             "--broker", broker.rsplit("/", 1)[0] + "/7"],
            cwd=ROOT, capture_output=True, text=True, timeout=240,
        )
        with psycopg.connect(base + "/postgres", autocommit=True) as conn:
            after = {r[0] for r in conn.execute(databases)}
    finally:
        with psycopg.connect(base + "/postgres", autocommit=True) as conn:
            conn.execute('DROP DATABASE IF EXISTS "cirval_load" WITH (FORCE)')
    assert after == before, "the load script must drop its own database and no other"
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(proc.stderr[-2500:])  # the per-endpoint table, for the CI log
    assert result["requests"] > 300 and result["submits"] > 100
    assert result["errors"] == 0 and result["lost_writes"] == 0 and result["duplicate_writes"] == 0
    # The admin started the audit and the export from the web pages (an error there counts in
    # "errors") and neither failed on the worker (on a loaded machine the idle-class worker may
    # not have finished them when the load ends).
    assert set(result["background"]) == {"audit", "export"}, result["background"]
    assert not any(s.startswith(("not started", "failed", "not found")) for s in result["background"].values()), \
        result["background"]
