"""Keep one command running: ``./cirval up``'s worker supervisor.

    python -m config.supervise --name worker --log var/log/worker.log -- celery -A config worker ...

The command's output goes to ``--log``; when it exits for any reason other than our own
stop, the supervisor says so on its terminal (and in the log) and starts it again, after
1 s, doubling up to 30 s while it keeps dying within a minute of its start. SIGTERM or
SIGINT to the supervisor is passed on to the command (a worker's quick stop, see
``config/celery.py``) and the supervisor exits once it has stopped.

In production, systemd does this job (``deploy/systemd/``); this is for the one-machine
``./cirval up``, which has no service manager to rely on.
"""
from __future__ import annotations

import argparse
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


def supervise(command: list[str], name: str, log_path: Path) -> int:
    stopping = False
    child: subprocess.Popen | None = None

    def stop(signum, _frame):
        nonlocal stopping
        stopping = True
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
            child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            if starts > 1:
                say(f"{name} restarted (pid {child.pid}, start {starts})", log)
            while True:
                try:
                    code = child.wait()
                    break
                except InterruptedError:  # pragma: no cover - Python retries wait() itself
                    continue
            if stopping:
                break
            ran = time.monotonic() - started
            pause = 1.0 if ran >= STABLE_SECONDS else min(MAX_PAUSE, pause * 2 if starts > 1 else pause)
            say(f"{name} {describe(code)} after {ran:.0f} s; starting it again in {pause:.0f} s "
                f"(its log: {log_path})", log)
            deadline = time.monotonic() + pause
            while not stopping and time.monotonic() < deadline:
                time.sleep(0.1)
        say(f"{name} stopped", log)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="worker")
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to keep running after --")
    return supervise(command, args.name, args.log)


if __name__ == "__main__":
    sys.exit(main())
