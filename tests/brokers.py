"""A private Redis for fault tests, and pointing this process's Celery app at it."""

from __future__ import annotations

import shutil
import socket
import subprocess
from contextlib import contextmanager

import pytest

from tests.conftest import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def needs_redis_server() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("needs the redis-server binary to run a private Redis (apt-get install redis-server)")


class PrivateRedis:
    """``redis-server`` on a free port; ``persist=False`` loses every message on restart."""

    def __init__(self, folder, persist: bool = False) -> None:
        self.port = free_port()
        self.folder = folder
        self.persist = persist
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persist else ["--appendonly", "no"]
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--save",
                "",
                *persistence,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        wait_for(self.ping, timeout=20, what="redis to start")
        return self

    def ping(self) -> bool:
        out = subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True)
        return out.stdout.strip() == "PONG"

    def stop(self) -> None:
        """Shut down without saving: every queued and unacknowledged message is lost."""
        if self.proc and self.proc.poll() is None:
            subprocess.run(["redis-cli", "-p", str(self.port), "shutdown", "nosave"], capture_output=True)
            self.proc.wait(timeout=20)


def _reset_pools(app) -> None:
    app._pool = None
    if "amqp" in app.__dict__:
        app.__dict__["amqp"]._producer_pool = None


@contextmanager
def celery_broker(url: str, transport_options: dict | None = None):
    """Send this process's tasks to ``url`` (the pages and sweeps run in the test process)."""
    from celery import current_app

    app = current_app._get_current_object()
    keys = ("broker_url", "broker_write_url", "broker_read_url", "broker_transport_options")
    old = {k: app.conf[k] for k in keys}
    app.conf.update(
        broker_url=url,
        broker_write_url=url,
        broker_read_url=url,
        broker_transport_options=transport_options or {"visibility_timeout": 5},
    )
    _reset_pools(app)
    try:
        yield
    finally:
        app.conf.update(old)
        _reset_pools(app)
