"""Unit tests start no processes: tests/unit/conftest.py refuses every start while a unit test
runs, and no unit test module reaches for the tools that start one."""

from __future__ import annotations

import ast
import asyncio
import os
from pathlib import Path

import pytest

from tests.unit import conftest

UNIT = Path(__file__).resolve().parent
#: the guard itself, and this test of it, name what they refuse
EXEMPT = {"conftest.py", Path(__file__).name}
MODULES = ("subprocess", "multiprocessing", "_posixsubprocess", "pty")
#: fixtures that start a process (tests/conftest.py, pytest-django, tests/browser/conftest.py)
FIXTURES = {"worker_factory", "live_server", "browser", "page", "context"}


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module:
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return []


def _offences(path: Path) -> list[str]:
    imports, found = set(), []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        imports.update(_imported(node))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found += [f"{node.name} uses the fixture {a}" for a in sorted({a.arg for a in node.args.args} & FIXTURES)]
        elif isinstance(node, ast.Name) and node.id == "WorkerProcess":
            found.append("uses WorkerProcess")
    return [
        f"imports {name}"
        for name in sorted(imports)
        if name.split(".")[0] in MODULES or name.endswith(("ProcessPoolExecutor", "WorkerProcess"))
    ] + found


def test_no_unit_module_imports_what_starts_a_process():
    offences = {p.name: _offences(p) for p in sorted(UNIT.glob("*.py")) if p.name not in EXEMPT}
    assert {name: found for name, found in offences.items() if found} == {}


def test_the_static_check_sees_each_kind_of_offence(tmp_path):
    path = tmp_path / "test_x.py"
    path.write_text(
        "import subprocess\nfrom multiprocessing import get_context\n"
        "from concurrent.futures import ProcessPoolExecutor\nfrom tests.conftest import WorkerProcess\n"
        "def test_a(worker_factory, db): WorkerProcess()\n"
    )
    assert _offences(path) == [
        "imports concurrent.futures.ProcessPoolExecutor",
        "imports multiprocessing",
        "imports multiprocessing.get_context",
        "imports subprocess",
        "imports tests.conftest.WorkerProcess",
        "test_a uses the fixture worker_factory",
        "uses WorkerProcess",
    ]


def _expect_refusal(start) -> None:
    with pytest.raises(conftest.ProcessStarted, match="move this test to tests/integration"):
        start()
    assert conftest.attempts
    conftest.attempts.clear()  # expected here: the refusal is what this test checks


def _in_a_thread(call) -> None:
    """``call()`` in a thread of its own, its exception raised here: ``asyncio.run`` refuses to
    start where an event loop already runs (a Playwright test before this one in the same
    xdist worker leaves one in the main thread)."""
    import threading

    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the caller
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if raised:
        raise raised[0]


def test_a_unit_test_that_starts_a_process_is_refused():
    import concurrent.futures
    import multiprocessing
    import subprocess

    _expect_refusal(lambda: subprocess.run(["true"], check=True))
    _expect_refusal(lambda: multiprocessing.get_context("spawn").Process(target=print).start())
    _expect_refusal(lambda: multiprocessing.get_context("fork").Process(target=print).start())
    _expect_refusal(lambda: concurrent.futures.ProcessPoolExecutor(1).submit(print).result())
    _expect_refusal(lambda: os.system("true"))
    _expect_refusal(os.fork)

    async def child():
        await asyncio.create_subprocess_exec("true")

    _expect_refusal(lambda: _in_a_thread(lambda: asyncio.run(child())))
