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

# The load script serves on a fixed port from var/load with a broker database of its own:
# one load run at a time (tests/xdist_worker.py's GROUPS keeps this module on one worker).


def _servers() -> tuple[str, str]:
    """The PostgreSQL server (no database) and the load run's Redis broker (LOAD_BROKER_URL, or
    database 7 of the test run's Redis), or a skip."""
    db, broker = os.environ.get("DATABASE_URL", ""), os.environ.get("CELERY_BROKER_URL", "")
    if not db.startswith("postgres") or not broker.startswith("redis"):
        pytest.skip("runs against PostgreSQL and Redis: set DATABASE_URL and CELERY_BROKER_URL (CI does)")
    return db.rsplit("/", 1)[0], os.environ.get("LOAD_BROKER_URL") or broker.rsplit("/", 1)[0] + "/7"


def test_quick_load_run_loses_nothing():
    import psycopg

    base, broker = _servers()
    databases = "SELECT datname FROM pg_database WHERE datname LIKE 'cirval_load%'"
    with psycopg.connect(base + "/postgres", autocommit=True) as conn:
        conn.execute('DROP DATABASE IF EXISTS "cirval_load" WITH (FORCE)')
        conn.execute('CREATE DATABASE "cirval_load"')  # someone else's, with the old fixed name
        before = {r[0] for r in conn.execute(databases)}
    try:
        proc = subprocess.run(
            [sys.executable, "bench/load.py", "--quick", "--json", "--server-url", base, "--broker", broker],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=240,
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
    # The admin kept an audit and an export going from the web pages (an error there counts in
    # "errors") and none failed on the worker (on a loaded machine the idle-class worker may
    # not have finished them when the load ends); background work ran in the window.
    assert set(result["background"]) == {"audit", "export"}, result["background"]
    assert not any(("not started" in s or "failed" in s or "not found" in s) for s in result["background"].values()), (
        result["background"]
    )
    assert 0 < result["background_share"] <= 1 and result["n_background"] > 0


def test_the_web_tier_never_loads_torch_during_a_load_run():
    """No model in the web tier: in a load run whose study has no candidate panels yet (gunicorn
    + a real worker + PostgreSQL + Redis) the web tier serves no single-turn item before its
    panel is stored (issue 39 item 2) and asks the worker for them, the worker fills them
    (ranking on demand: torch, in the worker), and no gunicorn process ever maps torch."""
    base, broker = _servers()
    proc = subprocess.run(
        [
            sys.executable,
            "bench/load.py",
            "--json",
            "--duration",
            "15",
            "--items",
            "1500",
            "--annotators",
            "10",
            "--no-background",
            "--cold-panels",
            "--server-url",
            base,
            "--broker",
            broker,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(proc.stderr[-1500:])
    assert result["errors"] == 0 and result["lost_writes"] == 0 and result["duplicate_writes"] == 0
    assert result["served_without_panel"] == 0  # an item waits for its panel; the web tier ranks nothing
    assert result["panels_stored"][0] > 0  # ... the worker did, when the web tier asked
    assert result["torch_in_worker"] > 0  # the check sees torch where it is loaded
    assert result["torch_in_web"] == []
