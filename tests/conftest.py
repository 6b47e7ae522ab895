"""Shared fixtures: demo accounts, a real Celery worker process, paths."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
SHARED = ROOT.parent / "shared"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


def database_url_for_subprocess() -> str:
    """A DATABASE_URL that points another process at the database the tests use."""
    from django.db import connection

    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    if "postgresql" in s["ENGINE"]:
        user = s.get("USER") or ""
        password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
        auth = f"{user}{password}@" if user else ""
        return f"postgres://{auth}{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"
    raise RuntimeError(f"no subprocess URL for {s['ENGINE']}")


class WorkerProcess:
    """A real ``celery -A config worker`` running against the test database and broker."""

    def __init__(
        self,
        queues: str = "celery,gpu,interactive",
        concurrency: int = 1,
        extra_env: dict | None = None,
        plain: bool = False,
    ):
        """``plain``: started as the README says (``celery -A config worker``), without the
        test's ``--without-gossip --without-mingle --without-heartbeat``."""
        self.plain = plain
        self.queues = queues
        self.concurrency = concurrency
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    def start(self, name: str = "w1") -> WorkerProcess:
        from django.conf import settings

        env = dict(os.environ)
        env.update(
            DATABASE_URL=database_url_for_subprocess(),
            CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
            CIRVAL_VAR_DIR=str(settings.VAR_DIR),
            CELERY_TASK_ALWAYS_EAGER="0",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        log_dir = Path(settings.VAR_DIR) / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"test-worker-{name}-{os.getpid()}.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-Q",
                self.queues,
                "-n",
                f"{name}@%h",
                "--concurrency",
                str(self.concurrency),
                "--pool",
                "prefork",
                "--loglevel",
                "INFO",
                *([] if self.plain else ["--without-gossip", "--without-mingle", "--without-heartbeat"]),
            ],
            cwd=ROOT,
            env=env,
            stdout=open(self.log_path, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the worker and its pool children (SIGKILL: no chance to ack or clean up)."""
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Warm shutdown: SIGTERM to the main process only (it stops its pool children);
        a whole-group SIGTERM can leave the main process waiting on a torch-loaded child."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def worker_factory():
    """Start real worker processes; all are stopped after the test."""
    started: list[WorkerProcess] = []

    def make(**kwargs) -> WorkerProcess:
        w = WorkerProcess(**kwargs)
        started.append(w)
        return w

    yield make
    for w in started:
        w.stop()


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def demo_accounts(db):
    from annotation.demo_accounts import ensure_demo_accounts

    return {u: p for u, p, _ in ensure_demo_accounts()}


def make_annotator(username: str, password: str = "pw", **extra):
    """A user with the annotator role (studies refuse annotators without it)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from annotation.roles import ANNOTATOR

    user = get_user_model().objects.create_user(username, password=password, **extra)
    user.groups.add(Group.objects.get_or_create(name=ANNOTATOR)[0])
    return user


def bench_module(name: str):
    """Load ``bench/<name>.py`` as a module (its sibling modules, e.g. ``pgdb``, importable)."""
    import importlib.util

    bench = str(ROOT / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def demo_models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("demo-models")


#: Steps of the demo retrievers that tests needing a working audit train (2-step models leave
#: almost every query unresolved): trained once per test session (:func:`trained_demo_models`).
TRAINED_STEPS = 150


@pytest.fixture(scope="session")
def trained_demo_models(tmp_path_factory) -> Path:
    """Where the demo retrievers trained for :data:`TRAINED_STEPS` go: the first make_demo
    that points DEMO_MODELS_DIR here (with DEMO_TRAIN_STEPS = TRAINED_STEPS) trains them, the
    later ones reuse them (test_blind_panel, test_suspicion)."""
    return tmp_path_factory.mktemp("trained-demo-models")


#: Tests hash passwords with a fast hasher (Django's advice for test suites): PBKDF2's million
#: rounds cost about 0.3 s a hash on a quiet core, and the suite hashes hundreds (demo accounts,
#: logins). PBKDF2 stays listed, so hashes made before (a session-wide demo_db) still verify.
TEST_PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.MD5PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings) -> None:
    settings.PASSWORD_HASHERS = TEST_PASSWORD_HASHERS


@pytest.fixture(scope="session")
def demo_images(tmp_path_factory) -> Path:
    """One folder for the demo world's images for the whole test session: the first make_demo
    draws them, the later ones find them drawn (retrieval.demo.STAMP_FILE). Tests that change
    image files use a folder of their own."""
    return tmp_path_factory.mktemp("demo-world")


@pytest.fixture(scope="session")
def demo_embeddings(tmp_path_factory) -> Path:
    """One embedding cache for the demo world (keyed by retriever spec and image bytes), so the
    demo's audit encodes its gallery once per session."""
    return tmp_path_factory.mktemp("demo-embeddings")


def _last_pks() -> dict:
    from django.apps import apps

    return {
        m: m.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        for m in apps.get_models()
        if m._meta.pk.get_internal_type() in ("AutoField", "BigAutoField")
    }


def _delete_added(before: dict) -> None:
    """Delete every row added since ``before`` (children first where a foreign key protects them)."""
    from django.db.models import ProtectedError, RestrictedError

    left = list(reversed(list(before)))
    for _ in range(len(left) + 1):
        blocked = []
        for model in left:
            try:
                model.objects.filter(pk__gt=before[model]).delete()
            except (ProtectedError, RestrictedError):
                blocked.append(model)
        if not blocked:
            return
        left = blocked
    raise RuntimeError(f"could not remove the demo's rows of {left}")


@pytest.fixture(scope="module")
def demo_db(django_db_setup, django_db_blocker, demo_images, demo_embeddings, demo_models_dir):
    """``make_demo`` (world, audit, studies, accounts) committed once for a module whose tests only
    read it: each test's own writes roll back with its transaction as usual. Afterwards every row
    it added is deleted, so other modules find the database as before. Tests that run workers or
    a live server (which need committed data of their own) keep their per-test make_demo."""
    from io import StringIO

    from django.core.cache import cache
    from django.core.management import call_command
    from django.test import override_settings

    overrides = override_settings(
        IMAGE_ROOTS=[demo_images.resolve()],
        EMBEDDING_CACHE_DIR=demo_embeddings,
        DEMO_MODELS_DIR=demo_models_dir,
        DEMO_TRAIN_STEPS=2,
        PASSWORD_HASHERS=TEST_PASSWORD_HASHERS,
    )
    with django_db_blocker.unblock(), overrides:
        before = _last_pks()
        try:
            call_command("make_demo", "--images-dir", str(demo_images), stdout=StringIO())
            yield demo_images
        finally:
            _delete_added(before)
            cache.clear()


@pytest.fixture(autouse=True)
def _serve_before_panels(settings) -> None:
    """Most tests build a study with create_study() and serve its items with no worker and no
    model to fill their candidate panels; they run with the panel gate off (issue 39, item 2:
    an item is served only once its panel is stored). test_panel_gate turns it on."""
    settings.CIRVAL_SERVE_AFTER_PANEL = False


@pytest.fixture(autouse=True)
def _tiny_demo_retrievers(settings, demo_models_dir) -> None:
    """make_demo in tests trains 2-step demo retrievers once, away from the real var/models."""
    settings.DEMO_MODELS_DIR = demo_models_dir
    settings.DEMO_TRAIN_STEPS = 2


@pytest.fixture
def eager_celery():
    """Celery tasks run in the test's process as they are sent, as a worker would run them.
    Browser uploads are always imported by a worker (issue 29: nothing is parsed in the web
    process); tests of what an import or an export shows, without a real worker, use this."""
    from celery import current_app

    before = current_app.conf.task_always_eager
    current_app.conf.task_always_eager = True
    yield
    current_app.conf.task_always_eager = before
