"""Isolation of pytest-xdist's workers (``./cirval test`` runs the suite on two), loaded with
``-p tests.xdist_worker`` (pytest.ini) before pytest-django reads Django's settings.

Each worker ``gwN`` gets a var folder of its own (its SQLite test database, media, uploads,
exports, the filesystem broker's folders, embedding cache and demo models all live there) and,
with a Redis broker, the Redis database N after the run's, so that a real Celery worker started
by one xdist worker never takes another's tasks (CI's broker is database 0: the workers use 0
and 1). A CACHE_URL is left shared: the tests' caches are per process unless one is set. pytest-django suffixes the test database's name
with the worker's id itself; live servers and private Redis servers take free ports.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Test files whose tests run on one worker, one after another: the load runs (a fixed port,
#: var/load and one broker database) and the tests that train the demo retrievers (once per
#: worker). pytest-xdist's own xdist_group marks do nothing under pytest 9 (xdist 3.8 renames
#: the items through ``_nodeid``, which pytest 9 no longer reads), so the scheduler groups by file.
GROUPS = {
    "tests/integration/test_load_quick.py": "load",
    "tests/integration/test_blind_panel.py": "trained-demo",
    "tests/integration/test_suspicion.py": "trained-demo",
}


def shifted_redis_url(url: str, by: int) -> str:
    """``redis://host:port/3`` -> ``redis://host:port/<3 + by>`` (no database named: 0 + by)."""
    m = re.fullmatch(r"(rediss?://[^/]*)(?:/(\d*))?(\?.*)?", url)
    if not m:
        return url
    return f"{m.group(1)}/{int(m.group(2) or 0) + by}{m.group(3) or ''}"


def isolate(worker: str, environ=os.environ) -> None:
    """Point this process's settings at worker ``worker``'s own folder and broker database."""
    n = int(worker.removeprefix("gw"))
    var = Path(environ.get("CIRVAL_VAR_DIR") or ROOT / "var") / "xdist" / worker
    environ["CIRVAL_VAR_DIR"] = str(var)
    for folder in ("EMBEDDING_CACHE_DIR", "CIRVAL_DEMO_MODELS_DIR"):
        if environ.get(folder):  # otherwise they default to folders under the var folder
            environ[folder] = str(Path(environ[folder]) / worker)
    if environ.get("CELERY_BROKER_URL", "").startswith("redis"):
        environ["CELERY_BROKER_URL"] = shifted_redis_url(environ["CELERY_BROKER_URL"], n)


def scope(nodeid: str) -> str:
    """The unit the scheduler hands to one worker: a test, or its file's group."""
    return GROUPS.get(nodeid.split("::", 1)[0], nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``-n N`` (plain load distribution): single tests, except GROUPS, each on one worker."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return Grouped(config, log)


if os.environ.get("PYTEST_XDIST_WORKER"):
    isolate(os.environ["PYTEST_XDIST_WORKER"])
