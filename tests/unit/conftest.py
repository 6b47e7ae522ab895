"""Unit tests start no processes (DESIGN: tests that need processes go to tests/integration).

While a unit test's fixtures are set up and while it runs, every way this process has of
starting another one (``subprocess``, ``multiprocessing`` and ``concurrent.futures``' process
pools, the fork server and resource tracker, ``os.fork``/``os.system``/``os.posix_spawn``, and
so asyncio's subprocesses, a Celery worker, a server or a browser) raises
:class:`ProcessStarted`, and a test that swallowed the error fails all the same.
"""

from __future__ import annotations

import _posixsubprocess
import multiprocessing.process
import os
import subprocess

import pytest

#: (owner, attribute) of each call that starts a process
STARTERS = (
    (subprocess.Popen, "_execute_child"),
    (_posixsubprocess, "fork_exec"),
    (multiprocessing.process.BaseProcess, "start"),
    *((os, name) for name in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp") if hasattr(os, name)),
)

HINT = "unit tests start no processes: move this test to tests/integration (keep its pure parts in tests/unit)"


class ProcessStarted(AssertionError):
    """A unit test tried to start a process."""


#: What the running unit test tried to start (a test that expects a refusal clears it).
attempts: list[str] = []


def _refusal(what: str):
    def refuse(*args, **kwargs):
        attempts.append(what)
        raise ProcessStarted(f"{what}: {HINT}")

    return refuse


def _refused(item: pytest.Item):
    """Run one phase of ``item`` with every process starter refused (a hook wrapper's body)."""
    attempts.clear()
    with pytest.MonkeyPatch.context() as mp:
        for owner, name in STARTERS:
            mp.setattr(owner, name, _refusal(f"{getattr(owner, '__name__', owner)}.{name}"))
        result = yield
    if attempts:  # the refusal was caught and the test went on
        started = ", ".join(dict.fromkeys(attempts))
        attempts.clear()
        pytest.fail(f"{item.nodeid} tried to start a process ({started}); {HINT}", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _refused(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _refused(item))


@pytest.fixture(scope="session")
def built_demo_world(tmp_path_factory: pytest.TempPathFactory):
    """The demo world (:func:`retrieval.demo.build_demo_world`, its default seed) drawn once for
    the unit tests that only read it: ``(folder, dataset, truth)``."""
    from retrieval.demo import build_demo_world

    out = tmp_path_factory.mktemp("demo_world")
    return (out, *build_demo_world(out))
