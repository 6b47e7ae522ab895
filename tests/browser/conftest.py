"""Playwright driving Debian's chromium against pytest-django's live server."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
# between page actions are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("CIRVAL_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def open_tab(browser, width: int = 1280, height: int = 900):
    """A fresh browser context and its one tab."""
    context = browser.new_context(viewport={"width": width, "height": height})
    p = context.new_page()
    p.set_default_timeout(15000)
    return p


def close_tab(p) -> None:
    """Leave the page, let what leaving sends finish, then close its context.

    Leaving fires the page's pagehide handler (the annotator page saves its draft with a
    keepalive request that outlives a closed tab): it must finish before the database is
    flushed, or the request and the flush lock each other's tables."""
    try:
        p.goto("about:blank")
        p.wait_for_load_state("networkidle", timeout=5000)
        p.wait_for_timeout(300)
    except Exception:  # a page that keeps polling: close it anyway
        pass
    p.context.close()


@pytest.fixture
def page(browser, transactional_db):
    """A fresh browser tab. It asks for the database fixture so that it is closed before the
    database is flushed."""
    p = open_tab(browser)
    yield p
    close_tab(p)


def _busy_sessions(connection) -> int:
    """How many other sessions on this test database are running a statement or hold a
    transaction open (PostgreSQL only; SQLite has no such view)."""
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND state <> 'idle'"
        )
        return cursor.fetchone()[0]


@pytest.fixture(autouse=True)
def _server_quiet_before_flush(transactional_db):
    """Torn down before the database fixture: wait (at most 10 s) until no live-server
    request is inside the database, seen idle twice in a row, so the flush's TRUNCATE does
    not deadlock with a request a closed tab left behind."""
    yield
    from django.db import connection

    quiet, deadline = 0, time.monotonic() + 10
    while quiet < 2 and time.monotonic() < deadline:
        quiet = quiet + 1 if _busy_sessions(connection) == 0 else 0
        time.sleep(0.1)


@pytest.fixture
def shot():
    SHOTS.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = SHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


def login(page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/")


@pytest.fixture
def demo_world(db, demo_images, settings):
    """The demo world in a folder that IMAGE_ROOTS serves, drawn once per test session
    (tests/conftest.py demo_images); the database part is made for each test."""
    from django.core.management import call_command

    images = demo_images
    settings.IMAGE_ROOTS = [images.resolve()]
    call_command("make_demo", "--images-dir", str(images), "--no-audit", verbosity=0)
    return images


def small_demo(tmp_path_factory, settings, folder: str, **sizes) -> None:
    """A small demo world (build_demo's sizes) in a folder of its own that IMAGE_ROOTS serves,
    imported as dataset "demo", with an annotator "ann" (password "ann-pw")."""
    from audit.runs.encoding import clear_memos
    from retrieval.demo import build_demo
    from retrieval.loader import load_parsed
    from tests.conftest import make_annotator

    images = tmp_path_factory.mktemp(folder)
    settings.IMAGE_ROOTS = [images.resolve()]
    settings.EMBEDDING_CACHE_DIR = images / "embeddings"
    root = images / "demo"
    load_parsed(build_demo(root, **sizes), "demo", images_root=root)
    make_annotator("ann", "ann-pw")
    clear_memos()
