"""Keep one command running: ``./cirval up``'s worker supervisor.

    python -m config.supervise --name worker --log var/log/worker.log -- celery -A config worker ...

The command's output goes to ``--log``; when it exits for any reason other than our own
stop, the supervisor says so on its terminal (and in the log) and starts it again, after
1 s, doubling up to 30 s while it keeps dying within a minute of its start. SIGTERM or
SIGINT to the supervisor is passed on to the command (a worker's quick stop, see
``config/celery.py``) and the supervisor exits once it has stopped; a command still running
``--stop-seconds`` later (default 6: a worker's ``WORKER_STOP_SECONDS`` grace and its
release of its work fit, and ``./cirval up``'s own stop deadline is later) is killed with
every process it started. The command runs in a process group of its own, so that nothing
it started (a Celery worker's pool processes) outlives it: what is left of the group when
it ends is killed too.

In production, systemd does this job (``deploy/systemd/``); this is for the one-machine
``./cirval up``, which has no service manager to rely on.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: A run shorter than this counts as a crash loop (the pause before the next start doubles).
STABLE_SECONDS = 60.0
MAX_PAUSE = 30.0


def say(message: str, log=None) -> None:
    line = f"==> {message}"
    print(line, file=sys.stderr, flush=True)
    if log is not None:
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} supervisor: {message}\n")
        log.flush()


def describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


#: Seconds a command has to stop after the supervisor passed a stop on, before it is killed.
STOP_SECONDS = 6.0


def kill_group(child: subprocess.Popen) -> None:
    """SIGKILL the child's process group (the child, if alive, and whatever it started)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def wait_or_kill(child: subprocess.Popen, stop_requested, stop_seconds: float, killed=None) -> int:
    """Wait for ``child`` to end; once ``stop_requested()`` is a time (the stop's
    ``time.monotonic()``), kill its group ``stop_seconds`` after it (``killed()`` says so).
    Returns its exit code."""
    while True:
        try:
            return child.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            since = stop_requested()
            if since is not None and time.monotonic() - since >= stop_seconds:
                kill_group(child)
                if killed is not None:
                    killed()
                    killed = None


def supervise(command: list[str], name: str, log_path: Path, stop_seconds: float = STOP_SECONDS) -> int:
    stopping = False
    stop_at: float | None = None
    child: subprocess.Popen | None = None

    def stop(signum, _frame):
        nonlocal stopping, stop_at
        stopping = True
        stop_at = stop_at or time.monotonic()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pause = 1.0
    starts = 0
    with open(log_path, "a", buffering=1) as log:
        while not stopping:
            starts += 1
            started = time.monotonic()
            child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            if stopping:  # the stop came while it was starting
                child.send_signal(signal.SIGTERM)
            elif starts > 1:
                say(f"{name} restarted (pid {child.pid}, start {starts})", log)
            code = wait_or_kill(
                child,
                lambda: stop_at,
                stop_seconds,
                killed=lambda: say(f"{name} still running {stop_seconds:g} s after the stop: killed", log),
            )
            kill_group(child)  # nothing it started outlives it
            if stopping:
                break
            ran = time.monotonic() - started
            pause = 1.0 if ran >= STABLE_SECONDS else min(MAX_PAUSE, pause * 2 if starts > 1 else pause)
            say(
                f"{name} {describe(code)} after {ran:.0f} s; starting it again in {pause:.0f} s (its log: {log_path})",
                log,
            )
            deadline = time.monotonic() + pause
            while not stopping and time.monotonic() < deadline:
                time.sleep(0.1)
        say(f"{name} stopped", log)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="worker")
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument(
        "--stop-seconds",
        type=float,
        default=STOP_SECONDS,
        help="after a stop is passed on, kill the command this many seconds later",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to keep running after --")
    return supervise(command, args.name, args.log, args.stop_seconds)


if __name__ == "__main__":
    sys.exit(main())
