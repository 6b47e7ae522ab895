"""Playwright driving Debian's chromium against pytest-django's live server."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
# between page actions are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("CIRVAL_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]
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


@pytest.fixture
def page(browser, transactional_db):
    """A fresh browser tab. It asks for the database fixture so that it is closed before the
    database is flushed: a request still in flight (a draft save, a prefetch) must not race
    the flush."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    p.set_default_timeout(15000)
    yield p
    try:
        # Leaving the page fires its pagehide handler (the annotator page saves its draft
        # with a keepalive request that would outlive a closed tab): let that finish now.
        p.goto("about:blank")
        p.wait_for_load_state("networkidle", timeout=5000)
        p.wait_for_timeout(300)
    except Exception:  # a page that keeps polling: close it anyway
        pass
    context.close()


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
def demo_world(db, tmp_path_factory, settings):
    """The demo world drawn into a temporary folder that IMAGE_ROOTS serves."""
    from django.core.management import call_command

    images = tmp_path_factory.mktemp("demo-images")
    settings.IMAGE_ROOTS = [images.resolve()]
    call_command("make_demo", "--images-dir", str(images), "--no-audit", verbosity=0)
    return images
