"""A SIGTERM to ``./cirval up`` (a process manager's stop) stops the server, the worker and
its supervisor within 10 s, and nothing they started is left running (issue 41: 25-45 s on a
loaded machine). ``./cirval serve`` is ``./cirval up`` after its setup: the same processes,
started the same way."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from retrieval.jobs.models import WorkerBeat
from tests.conftest import ROOT, database_url_for_subprocess, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

STOP_BUDGET = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(root: int) -> dict[int, str]:
    """pid -> command line of every live process under ``root`` (through /proc's parent ids;
    the script's children run in sessions of their own, so a session or group does not
    find them)."""
    parent, command = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parent[int(entry.name)], command[int(entry.name)] = int(fields[1]), cmd
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        for child, ppid in parent.items():
            if ppid == pid and child not in found:
                found[child] = command[child]
                frontier.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_sigterm_to_cirval_stops_the_server_the_worker_and_its_supervisor_within_10_s(tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "CIRVAL_VENV": str(Path(sys.executable).parent.parent),
        "CIRVAL_PORT": str(port),
        "CIRVAL_VAR_DIR": str(tmp_path / "var"),
        "DATABASE_URL": database_url_for_subprocess(),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DJANGO_DEBUG", None)  # the script's own (its runserver's)
    out = tmp_path / "cirval.out"
    with open(out, "wb") as fh:
        script = subprocess.Popen(
            [str(ROOT / "cirval"), "serve"],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: serving(port) or script.poll() is not None, timeout=180, what="the server")
        assert script.poll() is None, out.read_text()
        wait_for(
            lambda: WorkerBeat.objects.exists(),
            timeout=180,
            what=f"the worker's beat\n{(tmp_path / 'var/log/worker.log').read_text()}",
        )
        running = descendants(script.pid)
        kinds = " ".join(running.values())
        assert "config.supervise" in kinds and "celery" in kinds and "runserver" in kinds, running

        started = time.monotonic()
        script.send_signal(signal.SIGTERM)
        gone_after: dict[int, float] = {}
        while time.monotonic() - started < 30 and (len(gone_after) < len(running) or script.poll() is None):
            for pid in running:
                if pid not in gone_after and not alive(pid):
                    gone_after[pid] = time.monotonic() - started
            time.sleep(0.05)
        script.wait(timeout=5)
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
        for pid in descendants(script.pid):
            os.kill(pid, signal.SIGKILL)
    timings = "\n".join(f"  {gone_after.get(pid, float('inf')):6.2f} s  {running[pid][:110]}" for pid in running)
    print(f"stopped after SIGTERM:\n{timings}")
    slowest = max(gone_after.values(), default=float("inf"))
    assert len(gone_after) == len(running) and slowest < STOP_BUDGET, f"{timings}\n{out.read_text()[-3000:]}"
    assert script.returncode == 143  # the script's own TERM exit, not a kill
    assert "worker stopped" in out.read_text()
    assert not serving(port)
