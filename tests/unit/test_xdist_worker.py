"""Each pytest-xdist worker gets its own var folder and Redis broker database (tests/xdist_worker.py)."""

from __future__ import annotations

from pathlib import Path

from tests.xdist_worker import GROUPS, ROOT, isolate, scope, shifted_redis_url


def test_the_broker_database_moves_by_the_worker_number():
    assert shifted_redis_url("redis://127.0.0.1:6379/8", 1) == "redis://127.0.0.1:6379/9"
    assert shifted_redis_url("redis://127.0.0.1:6379", 1) == "redis://127.0.0.1:6379/1"
    assert shifted_redis_url("redis://:pw@host:6379/0?x=1", 2) == "redis://:pw@host:6379/2?x=1"
    assert shifted_redis_url("redis://127.0.0.1:6379/3", 0) == "redis://127.0.0.1:6379/3"


def test_two_workers_share_no_folder_and_no_broker():
    ci = {
        "CIRVAL_VAR_DIR": "/ci/var",
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
        "EMBEDDING_CACHE_DIR": "/ci/emb",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/cirval",
    }
    gw0, gw1 = dict(ci), dict(ci)
    isolate("gw0", gw0)
    isolate("gw1", gw1)
    assert gw0["CIRVAL_VAR_DIR"] == "/ci/var/xdist/gw0" and gw1["CIRVAL_VAR_DIR"] == "/ci/var/xdist/gw1"
    assert gw0["EMBEDDING_CACHE_DIR"] != gw1["EMBEDDING_CACHE_DIR"]
    assert (gw0["CELERY_BROKER_URL"], gw1["CELERY_BROKER_URL"]) == (
        "redis://127.0.0.1:6379/0",
        "redis://127.0.0.1:6379/1",
    )
    assert gw0["DATABASE_URL"] == ci["DATABASE_URL"]  # pytest-django names each worker's test database


def test_by_default_under_the_projects_var_folder():
    env = {"CELERY_BROKER_URL": "filesystem://"}
    isolate("gw1", env)
    assert Path(env["CIRVAL_VAR_DIR"]) == ROOT / "var" / "xdist" / "gw1"
    assert env["CELERY_BROKER_URL"] == "filesystem://"  # its folders are under the var folder
    assert "EMBEDDING_CACHE_DIR" not in env


def test_grouped_files_go_to_one_worker_and_other_tests_alone():
    a, b = "tests/integration/test_load_quick.py::test_a", "tests/integration/test_load_quick.py::test_b"
    assert scope(a) == scope(b) == "load"
    assert scope("tests/integration/test_blind_panel.py::t[10]") == scope("tests/integration/test_suspicion.py::t")
    assert scope("tests/unit/test_demo.py::t") == "tests/unit/test_demo.py::t"
    assert all((ROOT / path).exists() for path in GROUPS)
