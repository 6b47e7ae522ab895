"""Load test: 50 simulated annotators against CIRVal as it runs in production.

    python bench/load.py [--annotators 50] [--duration 60] [--quick] [--json] [--no-background]
                         [--cache-down] [--cold-panels] [--timeline]
                         [--server-url postgres://postgres@127.0.0.1:5432] [--keep-database]
                         [--broker redis://127.0.0.1:6379/5] [--cache-url redis://127.0.0.1:6379/6]

Starts gunicorn (gthread workers) and a Celery worker on 127.0.0.1 against PostgreSQL and
Redis, creates a database of its own with a unique name (``cirval_load_<random>``; it never
drops a database it did not create, and drops its own at the end unless --keep-database),
fills it (demo world + a large study), then drives the annotators
over HTTP for a bounded time: log in, ask for the next item, submit (with a client token),
now and then revise an earlier judgement or reload the item page.

**Background work for the whole window.** The demo's admin, already logged in, keeps an
audit (of the demo dataset, from the audit form) and an export (of the load study, from
the study page's export button) running on the Celery worker (two pool processes, so both
run at once) from the first second to the deadline: each job is started again as soon as
the previous one ends. The first audit starts with an empty embedding cache. The worker
lowers its own priority and torch threads (config/worker_tuning.py). When each job ran is
read back from the database (its worker's ``started_at`` .. ``finished_at``), so the
report can say which annotation requests had background work running beside them: it
prints the p95 with background work and the p95 without, and the share of the window
that had background work. ``--no-background`` runs no job.

``--cache-down`` points the web tier and the worker at a private ``redis-server`` of the
bench's own (``tests/brokers.py``'s ``PrivateRedis``, on a free port) as ``CACHE_URL`` and
stops it when the clock starts: the annotators must keep working without the cache. The
machine's Redis is never stopped. ``--cold-panels`` leaves the study's candidate panels to
the worker (as after creating a study whose fill task has not run yet): the web tier
serves items without a panel and asks the worker for them; the report says how many were
served without one and whether any web process loaded torch (read from
``/proc/<pid>/maps``: the web tier never loads a model).

The clock starts once the web server and the worker have finished starting up. It prints
requests served, errors, p50/p95/p99 latency per endpoint (--timeline: also by second of
the run) and the lost-write check: every successful submit is in the database exactly once.
With --quick --json it runs for under a minute and its last line is one JSON object.
Every request goes to 127.0.0.1 only, and the loops stop at the deadline.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import defaultdict
from pathlib import Path

from pgdb import create_own_database, drop_own_database

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
DB_PREFIX = "cirval_load"


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else 0.0


SETUP = r"""
import django, sys
django.setup()
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from annotation.models import RubricVersion, Study, StudyItem
from annotation.sizes import add_items
from retrieval.models import Dataset, Image, Query, Turn, Target
n_items, n_users, fill_panels = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "fill"
demo = Dataset.objects.get(name="demo")
images = list(Image.objects.filter(dataset=demo).order_by("id")[:400])
ds = Dataset.objects.create(name="load", format="demo", images_root=demo.images_root)
copies = Image.objects.bulk_create([Image(dataset=ds, external_id=i.external_id, path=i.path, sha256=i.sha256,
                                          width=i.width, height=i.height) for i in images])
qs = Query.objects.bulk_create([Query(dataset=ds, external_id=f"load-{n:06d}", split="val", ordinal=n) for n in range(n_items)])
Turn.objects.bulk_create([Turn(query=q, index=1, reference_image=copies[n % len(copies)], texts=[{"text": "make the circle red"}])
                          for n, q in enumerate(qs)], batch_size=5000)
Target.objects.bulk_create([Target(query=q, image=copies[(n + 7) % len(copies)], is_primary=True) for n, q in enumerate(qs)],
                           batch_size=5000)
study = Study.objects.create(name="load", rubric=RubricVersion.builtin("validity"), overlap=3, lease_minutes=5)
add_items(study, [StudyItem(study=study, query=q, order_key=n) for n, q in enumerate(qs)], batch_size=5000)
# Rows bulk-created here bypass create_study, which refreshes the planner's statistics.
from retrieval.dbstats import refresh_statistics
refresh_statistics(Image, Query, Turn, Target, StudyItem)
# The candidate panels, fixed ahead as the worker does after a study is created
# (--cold-panels: left to the worker, which the web tier asks when it serves an item without one).
from annotation.judging.panel_fill import fill_study_candidates
if fill_panels:
    fill_study_candidates(study.pk, batch=1000)
group = Group.objects.get(name="annotator")
User = get_user_model()
users = []
for n in range(n_users):
    u = User.objects.create_user(f"load{n:02d}", password="load-pass")
    u.groups.add(group)
    users.append(u)
study.annotators.set(users)
# Sessions made ahead, as after a morning's logins: the run measures annotation work,
# not a storm of 50 simultaneous password hashes (a few annotators still log in for real).
from django.contrib.sessions.backends.db import SessionStore
import json as _json
keys = {}
for u in users:
    s = SessionStore()
    s["_auth_user_id"] = str(u.pk)
    s["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    s["_auth_user_hash"] = u.get_session_auth_hash()
    s.create()
    keys[u.username] = s.session_key
admin = User.objects.filter(is_staff=True).order_by("pk").first()  # the demo's admin queues the background work
s = SessionStore()
s["_auth_user_id"] = str(admin.pk)
s["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
s["_auth_user_hash"] = admin.get_session_auth_hash()
s.create()
print(_json.dumps({"study": study.pk, "sessions": keys, "admin_session": s.session_key}))
"""


class HttpUser(threading.Thread):
    """A browser-like client: a cookie jar, the CSRF header, and every request timed into ``stats``."""

    def __init__(self, base, stats, session=None):
        super().__init__(daemon=True)
        self.base, self.stats, self.session = base, stats, session
        self.last_url = ""  # the path the last request landed on, after redirects
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def csrf(self):
        return next((c.value for c in self.jar if c.name == "csrftoken"), "")

    def use_session(self, key):
        host = urllib.parse.urlparse(self.base).hostname
        self.jar.set_cookie(
            http.cookiejar.Cookie(
                0, "sessionid", key, None, False, host, False, False, "/", True, False, None, False, None, None, {}
            )
        )

    def call(self, endpoint, method, path, body=None, form=False):
        data, headers = None, {"X-CSRFToken": self.csrf(), "Referer": self.base + "/"}
        if body is not None:
            if form:
                data = urllib.parse.urlencode(body).encode()
                headers["Content-Type"] = "application/x-www-form-urlencoded"
            else:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        t = time.perf_counter()
        self.last_url = ""
        try:
            with self.opener.open(req, timeout=30) as resp:
                payload = resp.read()
                status = resp.status
                self.last_url = urllib.parse.urlparse(resp.geturl()).path  # after any redirect
        except urllib.error.HTTPError as exc:
            payload, status = exc.read(), exc.code
        except Exception as exc:  # connection refused, reset, timeout
            self.stats.record(endpoint, (time.perf_counter() - t) * 1000, error=f"{type(exc).__name__}: {exc}")
            return None, None
        ms = (time.perf_counter() - t) * 1000
        self.stats.record(endpoint, ms, error=None if status < 400 else f"HTTP {status} {payload[:120]!r}")
        return status, payload


#: The background jobs: how the admin starts each from a page, and its table.
JOBS = {
    "audit": {
        "path": "/audits/new/",
        "lands_on": r"/audits/(\d+)/",
        "table": "audit_auditrun",
        "form": {
            "dataset": "demo",
            "split": "",
            "retrievers": "openclip:cirval-tiny-vit",
            "k": 10,
            "min_mm_retrievers": 1,
            "exclude_reference": "on",
        },
        # when a worker first took one of its chunks, and when the run was finished
        "when": "SELECT (SELECT min(c.started_at) FROM audit_auditchunk c WHERE c.run_id = r.id), "
        "r.finished_at, r.status FROM audit_auditrun r WHERE r.id = %s",
    },
    "export": {
        "path": "/studies/{study}/export/",
        "lands_on": r"/exports/(\d+)/",
        "table": "annotation_exportjob",
        "form": {"policy": "majority"},
        "when": "SELECT started_at, finished_at, status FROM annotation_exportjob WHERE id = %s",
    },
}
ENDED = ("done", "failed")


class Admin(HttpUser):
    """The admin, already logged in, who keeps an audit and an export running from the web
    pages (the audit form and the study page's export button) for the whole window: each is
    started again as soon as the previous one has ended (read from the database)."""

    def __init__(self, base, stats, session, study, database_url, deadline):
        super().__init__(base, stats, session)
        self.study, self.database_url, self.deadline = study, database_url, deadline
        self.started: dict[str, list[int]] = {name: [] for name in JOBS}  # job ids, in start order
        self.refused: dict[str, str] = {}  # name -> why the last start failed
        self.use_session(session)
        self.call("admin: audit form", "GET", "/audits/new/")  # the page is open before the clock starts

    def start_job(self, name) -> int | None:
        """POST the job's form; it started when the page redirects to the job's own page."""
        job = JOBS[name]
        status, _ = self.call(
            f"admin: start {name}",
            "POST",
            job["path"].format(study=self.study),
            {**job["form"], "csrfmiddlewaretoken": self.csrf()},
            form=True,
        )
        m = re.fullmatch(job["lands_on"], self.last_url or "")
        if m is None:
            self.refused[name] = f"not started (HTTP {status}, landed on {self.last_url!r})"
            return None
        self.started[name].append(int(m.group(1)))
        return int(m.group(1))

    def run(self):
        import psycopg

        running: dict[str, int | None] = dict.fromkeys(JOBS)
        retry_at = dict.fromkeys(JOBS, 0.0)  # a refused start is tried again 2 s later
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            while time.monotonic() < self.deadline - 1.0:
                for name, job_id in running.items():
                    ended = (
                        job_id is None
                        or conn.execute(f"SELECT status FROM {JOBS[name]['table']} WHERE id = %s", [job_id]).fetchone()[
                            0
                        ]
                        in ENDED
                    )
                    if ended and time.monotonic() >= retry_at[name]:
                        running[name] = self.start_job(name)
                        retry_at[name] = time.monotonic() + (2.0 if running[name] is None else 0.0)
                time.sleep(0.05)  # a job ended is started again within 50 ms

    def intervals(self, conn, window: tuple[float, float]) -> tuple[list[tuple[float, float]], dict[str, str]]:
        """When each started job ran on the worker (epoch seconds, clipped to ``window``; one
        still running at the end runs to it) and a summary per kind (how many, in which status)."""
        spans, summary = [], {}
        for name, ids in self.started.items():
            states = defaultdict(int)
            for job_id in ids:
                row = conn.execute(JOBS[name]["when"], [job_id]).fetchone()
                if row is None:
                    states["not found"] += 1
                    continue
                began, ended, status = row
                states[status] += 1
                if began is not None:
                    start = max(window[0], began.timestamp())
                    end = min(window[1], ended.timestamp() if ended is not None else window[1])
                    if end > start:
                        spans.append((start, end))
            summary[name] = ", ".join(f"{n} {st}" for st, n in sorted(states.items())) or self.refused.get(
                name, "not started"
            )
            if name in self.refused:
                summary[name] += f"; last start {self.refused[name]}"
        return spans, summary


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of the intervals ``spans``."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def covered(at: float, spans: list[tuple[float, float]]) -> bool:
    return any(a <= at <= b for a, b in spans)


class Annotator(HttpUser):
    def __init__(self, base, username, study, deadline, stats, rng_seed, think=(0.05, 0.3), ramp=0.0, session=None):
        super().__init__(base, stats, session)
        self.think, self.ramp = think, ramp
        self.username, self.study, self.deadline = username, study, deadline
        self.rng = random.Random(rng_seed)
        self.done: list[tuple[int, str]] = []
        self.submitted: list[tuple[int, str]] = []
        self.panels: dict[int, list[int]] = {}
        self.without_panel = 0  # single-turn items served before a worker had filled their panel

    def run(self):
        time.sleep(self.rng.uniform(0, self.ramp))  # annotators arrive over the ramp-up
        if self.session:
            self.use_session(self.session)
            self.call("queue page", "GET", "/annotate/")  # sets the CSRF cookie
        else:
            self.call("login page", "GET", "/login/")
            self.call(
                "login",
                "POST",
                "/login/",
                {"username": self.username, "password": "load-pass", "csrfmiddlewaretoken": self.csrf()},
                form=True,
            )
        while time.monotonic() < self.deadline:
            status, body = self.call("next item", "POST", f"/api/studies/{self.study}/next/")
            if status != 200:
                time.sleep(0.2)
                continue
            item = json.loads(body)
            asg = item["assignment"]
            if asg is None:
                if item["served_by"] == "queue_empty":
                    return
                time.sleep(0.2)
                continue
            if self.rng.random() < 0.1:
                self.call("reload item page", "GET", f"/annotate/{self.study}/item/{asg}/")
            time.sleep(self.rng.uniform(*self.think))  # looking at the item
            token = uuid.uuid4().hex
            panel = self.panels[asg] = [p["id"] for p in item.get("panel") or []]
            self.without_panel += not panel
            ticks = self.rng.sample(panel, min(len(panel), self.rng.randint(1, 4)))  # ticks in every judgement
            judgement = {
                "category": self.rng.choice(["VALIDATED", "QUERY_TOO_BROAD"]),
                "time_spent_ms": 900,
                "client_token": token,
                "alternatives": ticks,
            }
            status, _ = self.call("submit", "POST", f"/api/assignments/{asg}/judgements/", judgement)
            if status == 201:
                self.submitted.append((asg, token))
                if self.rng.random() < 0.05:  # a network retry with the same token: must not duplicate
                    status, _ = self.call("submit (retry)", "POST", f"/api/assignments/{asg}/judgements/", judgement)
            if self.submitted and self.rng.random() < 0.05:
                old, _ = self.rng.choice(self.submitted)
                token = uuid.uuid4().hex
                status, _ = self.call(
                    "revise",
                    "POST",
                    f"/api/assignments/{old}/judgements/",
                    {
                        "category": "VALIDATED",
                        "time_spent_ms": 500,
                        "client_token": token,
                        "alternatives": self.panels.get(old, [])[:2],
                    },
                )
                if status == 201:
                    self.submitted.append((old, token))


#: The latency target covers these; logging in (deliberately slow password hashing, once per
#: session), the queue page and the admin's requests are reported on their own rows.
ANNOTATION_ENDPOINTS = frozenset({"next item", "submit", "submit (retry)", "revise", "reload item page"})


def is_annotation_endpoint(endpoint: str) -> bool:
    return endpoint in ANNOTATION_ENDPOINTS


def timeline(started: list[tuple[float, float]], t0: float, step: float = 2.0) -> list[str]:
    """Lines of p50/p95/max of the annotation requests started in each ``step`` seconds of the run."""
    buckets = defaultdict(list)
    for start, ms in started:
        buckets[int((start - t0) // step)].append(ms)
    return [
        f"{k * step:5.0f}-{(k + 1) * step:<4.0f}s {len(v):5d} {pct(v, 0.5):8.1f} {pct(v, 0.95):8.1f} {max(v):8.1f}"
        for k, v in sorted(buckets.items())
    ]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.latency = defaultdict(list)
        self.started: list[tuple[float, float]] = []  # (monotonic start, ms) of annotation requests
        self.started_wall: list[tuple[float, float]] = []  # (epoch start, ms) of the same requests
        self.errors = defaultdict(int)
        self.examples: list[str] = []

    def record(self, endpoint, ms, error=None):
        with self.lock:
            self.latency[endpoint].append(ms)
            if is_annotation_endpoint(endpoint):
                self.started.append((time.monotonic() - ms / 1000, ms))
                self.started_wall.append((time.time() - ms / 1000, ms))
            if error:
                self.errors[endpoint] += 1
                if len(self.examples) < 5:
                    self.examples.append(f"{endpoint}: {error}")


def cpu_seconds_by_group(sessions: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the live processes of each process session
    (the web server and the worker run in sessions of their own), by PostgreSQL's
    processes, and by this process (the simulated annotators), read from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out = dict.fromkeys([*sessions, "postgres", "annotators (this process)"], 0.0)
    by_sid = {sid: name for name, sid in sessions.items()}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        comm, fields = raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2 :].split()
        sid, cpu = int(fields[3]), (int(fields[11]) + int(fields[12])) / tick
        if sid in by_sid:
            out[by_sid[sid]] += cpu
        elif comm.startswith("postgres"):
            out["postgres"] += cpu
        elif int(entry.name) == os.getpid():
            out["annotators (this process)"] += cpu
    return out


def wait_settled(logs: Path, groups: dict[str, int], timeout: float = 90.0) -> str:
    """Wait until the worker says it is ready and the web server and worker have finished
    starting up (under 5% of a core over a second), so that the clock measures the load and
    the background jobs, not process start-up. Returns how long it took."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    log = logs / "worker.log"
    while time.monotonic() < deadline and not (log.exists() and " ready." in log.read_text(errors="replace")):
        time.sleep(0.3)
    before = cpu_seconds_by_group(groups)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = cpu_seconds_by_group(groups)
        if sum(now[g] - before[g] for g in groups) < 0.05:
            break
        before = now
    return f"{time.monotonic() - t0:.1f} s"


def wait_http(url, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except Exception:
            time.sleep(0.3)
    raise SystemExit(f"{url} did not come up within {timeout}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--annotators", type=int, default=50)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--quick", action="store_true", help="a short run (about 20 s of load)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--web-workers", type=int, default=3)
    ap.add_argument(
        "--worker-concurrency",
        type=int,
        default=2,
        help="the Celery worker's pool processes (default 2: the audit and the export run at once)",
    )
    ap.add_argument(
        "--server-url",
        default=os.environ.get("LOAD_SERVER_URL", "postgres://postgres@127.0.0.1:5432"),
        help="PostgreSQL server (no database name): a uniquely named database is created there",
    )
    ap.add_argument(
        "--keep-database", action="store_true", help="keep the load database afterwards (its name is printed)"
    )
    ap.add_argument("--broker", default=os.environ.get("LOAD_BROKER_URL", "redis://127.0.0.1:6379/5"))
    ap.add_argument(
        "--cache-url",
        default=os.environ.get("LOAD_CACHE_URL", os.environ.get("CACHE_URL", "")),
        help="CACHE_URL of the web tier and the worker (default: $LOAD_CACHE_URL, else $CACHE_URL)",
    )
    ap.add_argument("--no-background", action="store_true", help="run no audit or export during the load")
    ap.add_argument(
        "--cache-down",
        action="store_true",
        help="use a private redis-server as CACHE_URL and stop it when the clock starts",
    )
    ap.add_argument(
        "--cold-panels",
        action="store_true",
        help="leave the candidate panels to the worker (served without one until it has filled them)",
    )
    ap.add_argument(
        "--think",
        type=float,
        nargs=2,
        default=(1.0, 3.0),
        metavar=("MIN", "MAX"),
        help="seconds an annotator looks at an item before submitting (real annotators take 30-60 s)",
    )
    ap.add_argument("--ramp", type=float, default=5.0, help="seconds over which the annotators arrive")
    ap.add_argument("--timeline", action="store_true", help="also print latency by second of the run")
    ap.add_argument(
        "--real-logins", type=int, default=5, help="annotators who log in with the form (the rest reuse a session)"
    )
    args = ap.parse_args()
    if args.quick:
        args.duration = min(args.duration, 20.0)
        args.items = min(args.items, 5000)
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))

    args.database_url = create_own_database(args.server_url, DB_PREFIX)
    private_cache = None
    try:
        if args.cache_down:
            private_cache = start_private_cache()
            args.cache_url = private_cache.url
        run_load(args, say, private_cache)
    finally:
        if private_cache is not None:
            private_cache.stop()
        if args.keep_database:
            say(f"kept the load database {args.database_url}")
        else:
            drop_own_database(args.database_url, DB_PREFIX)


def start_private_cache():
    """A redis-server of the bench's own on a free port (tests/brokers.py's PrivateRedis), for
    --cache-down: stopping it never touches the machine's Redis."""
    import tempfile

    sys.path.insert(0, str(ROOT))
    from tests.brokers import PrivateRedis, needs_redis_server

    needs_redis_server()
    return PrivateRedis(tempfile.mkdtemp(prefix="cirval-load-cache-")).start()


def prepare(args, say) -> tuple[dict[str, str], Path, dict]:
    """The load database migrated, the demo and the study made; returns (env, var folder, what SETUP made)."""
    var = ROOT / "var" / "load"
    env = dict(
        os.environ,
        DATABASE_URL=args.database_url,
        CELERY_BROKER_URL=args.broker,
        CIRVAL_VAR_DIR=str(var),
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY="load-test-only",
        DJANGO_SETTINGS_MODULE="config.settings",
        IMAGE_ROOTS=str(var / "images"),
        PYTHONUNBUFFERED="1",
        DB_CONN_MAX_AGE="60",
        CACHE_URL=args.cache_url,
    )
    say(f"setting up the load database {args.database_url} ...")

    def run(*cmd, **kw):
        return subprocess.run(
            [PY, "manage.py", *cmd],
            cwd=ROOT,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL if args.json else None,
            **kw,
        )

    run("migrate", "--noinput", "-v", "0")
    # The demo's images and queries only: its own audit (and the training of its retrievers, minutes
    # on a fresh machine) plays no part in the load; the background audit uses the tiny test model.
    run("make_demo", "--no-audit", "--images-dir", str(var / "images" / "demo"))
    made = json.loads(
        subprocess.run(
            [PY, "-c", SETUP, str(args.items), str(args.annotators), "cold" if args.cold_panels else "fill"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    if not args.no_background:  # the background audit starts cold: every embedding is computed during the load
        shutil.rmtree(var / "embeddings", ignore_errors=True)
    return env, var, made


def start_servers(args, env: dict[str, str], logs: Path) -> list[subprocess.Popen]:
    """gunicorn and a Celery worker, each in its own process group."""
    logs.mkdir(parents=True, exist_ok=True)
    web = subprocess.Popen(
        [
            str(Path(PY).parent / "gunicorn"),
            "config.wsgi",
            "-b",
            f"127.0.0.1:{args.port}",
            "-k",
            "gthread",
            "-w",
            str(args.web_workers),
            "--threads",
            "16",
            "--access-logfile",
            "-",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stdout=open(logs / "gunicorn.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    worker = subprocess.Popen(
        [
            PY,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "-Q",
            "celery,gpu,interactive",
            "-c",
            str(args.worker_concurrency),
            "--loglevel",
            "INFO",
        ],
        cwd=ROOT,
        env=env,
        stdout=open(logs / "worker.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return [web, worker]


def stop_servers(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def drive(args, say, base: str, made: dict, groups: dict[str, int], private_cache=None) -> dict:
    """The annotators (and the admin's background jobs) for ``args.duration`` seconds."""
    study, sessions = made["study"], made["sessions"]
    stats = Stats()
    cpu_before = cpu_seconds_by_group(groups)
    deadline = time.monotonic() + args.duration
    admin = (
        None if args.no_background else Admin(base, stats, made["admin_session"], study, args.database_url, deadline)
    )
    if private_cache is not None:
        private_cache.stop()  # --cache-down: the cache is gone for the whole window
        say("the private cache server is stopped: the window runs without CACHE_URL's Redis")
    say(
        f"driving {args.annotators} annotators for {args.duration:.0f} s against {base} (study {study}) from "
        f"{time.strftime('%H:%M:%S')} ..."
    )
    t0, wall0 = time.monotonic(), time.time()
    users = [
        Annotator(
            base,
            f"load{n:02d}",
            study,
            deadline,
            stats,
            n,
            think=tuple(args.think),
            ramp=args.ramp,
            session=None if n < args.real_logins else sessions[f"load{n:02d}"],
        )
        for n in range(args.annotators)
    ]
    for u in ([admin] if admin else []) + users:
        u.start()
    for u in ([admin] if admin else []) + users:
        u.join(timeout=args.duration + 60)
    elapsed = time.monotonic() - t0
    cpu_after = cpu_seconds_by_group(groups)
    return {
        "stats": stats,
        "admin": admin,
        "users": users,
        "t0": t0,
        "elapsed": elapsed,
        "window": (wall0, wall0 + elapsed),
        "torch": torch_loaded(groups),
        "cpu_used": {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after},
    }


def torch_loaded(groups: dict[str, int]) -> dict[str, list[int]]:
    """Per process session (web, worker): the pids that have torch's libraries mapped
    (``/proc/<pid>/maps``): the web tier must have none."""
    out: dict[str, list[int]] = {name: [] for name in groups}
    by_sid = {sid: name for name, sid in groups.items()}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
            sid = int(raw[raw.rindex(")") + 2 :].split()[3])
            if sid in by_sid and "/torch/" in (entry / "maps").read_text():
                out[by_sid[sid]].append(int(entry.name))
        except (OSError, ValueError):  # the process ended meanwhile
            continue
    return out


def check_database(args, study: int, done: dict) -> dict:
    """Lost and duplicated judgements, ticked alternatives, stored panels and when the
    background jobs ran, straight from the database."""
    import psycopg

    submitted = [pair for u in done["users"] for pair in u.submitted]
    spans, bg_status = [], {}
    with psycopg.connect(args.database_url) as conn:
        rows = conn.execute("SELECT client_token, count(*) FROM annotation_judgement GROUP BY client_token").fetchall()
        currents = conn.execute(
            "SELECT count(*) FROM (SELECT assignment_id FROM annotation_judgement WHERE is_current "
            "GROUP BY assignment_id HAVING count(*) > 1) x"
        ).fetchone()[0]
        with_ticks = conn.execute(
            "SELECT count(*) FILTER (WHERE alternatives::text <> '[]'), count(*) FROM annotation_judgement j "
            "JOIN annotation_assignment a ON a.id = j.assignment_id WHERE a.study_id = %s",
            [study],
        ).fetchone()
        panels = conn.execute(
            "SELECT count(*) FILTER (WHERE candidates_source <> ''), count(*) "
            "FROM annotation_studyitem WHERE study_id = %s",
            [study],
        ).fetchone()
        if done["admin"]:
            spans, bg_status = done["admin"].intervals(conn, done["window"])
    stored = dict(rows)
    return {
        "submitted": submitted,
        "lost": sum(1 for _, token in submitted if token not in stored),
        "duplicates": sum(n - 1 for n in stored.values() if n > 1) + currents,
        "with_ticks": with_ticks,
        "bg_status": bg_status,
        "bg_spans": spans,
        "panels": panels,
    }


def split_by_background(
    started_wall: list[tuple[float, float]], spans: list[tuple[float, float]], window: tuple[float, float]
) -> dict:
    """The annotation requests that started while background work ran and those that did not
    (their p95 each), and the share of the window that had background work."""
    with_bg, without = [], []
    for at, ms in started_wall:
        (with_bg if covered(at, spans) else without).append(ms)
    length = max(window[1] - window[0], 1e-9)
    return {"with": with_bg, "without": without, "share": union_seconds(spans) / length}


def figures(args, done: dict, checked: dict) -> dict:
    """Every figure the report prints, computed once (the text and the JSON line show the same)."""
    stats = done["stats"]
    all_ms = [ms for e, v in stats.latency.items() if is_annotation_endpoint(e) for ms in v]
    split = split_by_background(stats.started_wall, checked["bg_spans"], done["window"])
    requests = sum(len(v) for v in stats.latency.values())
    return {
        "requests": requests,
        "errors": sum(stats.errors.values()),
        "lost_writes": checked["lost"],
        "duplicate_writes": checked["duplicates"],
        "p50_ms": round(pct(all_ms, 0.5), 1),
        "p95_ms": round(pct(all_ms, 0.95), 1),
        "p99_ms": round(pct(all_ms, 0.99), 1),
        # the annotation requests that started while a background job ran on the worker, and the others
        "p95_background_ms": round(pct(split["with"], 0.95), 1) if split["with"] else None,
        "p95_no_background_ms": round(pct(split["without"], 0.95), 1) if split["without"] else None,
        "n_background": len(split["with"]),
        "n_no_background": len(split["without"]),
        "background_share": round(split["share"], 3),
        "submits": len(checked["submitted"]),
        "seconds": round(done["elapsed"], 1),
        "think_s": list(args.think),
        "judgements_with_ticks": list(checked["with_ticks"]),
        "background": checked["bg_status"],
        "served_without_panel": sum(u.without_panel for u in done["users"]),
        "panels_stored": list(checked["panels"]),
        "torch_in_web": done["torch"].get("web", []),
        "torch_in_worker": len(done["torch"].get("worker", [])),
        "cache_down": bool(args.cache_down),
        "cpu_seconds": {k: round(v, 1) for k, v in done["cpu_used"].items()},
    }


def report(args, say, done: dict, checked: dict) -> None:
    """The figures, as text (to stderr with ``--json``) and, with ``--json``, one JSON line."""
    stats, elapsed, cpu_used = done["stats"], done["elapsed"], done["cpu_used"]
    f = figures(args, done, checked)
    say(
        f"\n{f['requests']} requests in {elapsed:.1f} s ({f['requests'] / elapsed:.0f}/s), {f['errors']} errors, "
        f"{f['submits']} successful submits"
    )
    say(f"{'endpoint':20} {'n':>6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'errors':>7}")
    for endpoint, ms in sorted(stats.latency.items()):
        say(
            f"{endpoint:20} {len(ms):6d} {pct(ms, 0.5):8.1f} {pct(ms, 0.95):8.1f} {pct(ms, 0.99):8.1f} {stats.errors[endpoint]:7d}"
        )
    for e in stats.examples:
        say("  e.g. " + e)
    say(f"lost writes: {f['lost_writes']}, duplicated writes: {f['duplicate_writes']}")
    say(
        f"judgements with ticked alternatives: {f['judgements_with_ticks'][0]} of {f['judgements_with_ticks'][1]}; "
        f"single-turn items served without a panel: {f['served_without_panel']}; panels stored at the end: "
        f"{f['panels_stored'][0]} of {f['panels_stored'][1]} items"
    )
    say(
        f"web processes with torch loaded: {f['torch_in_web'] or 'none'} (worker processes: {f['torch_in_worker']})"
        + ("; the cache server was stopped for the whole window" if args.cache_down else "")
    )
    say(
        f"CPU seconds during the load ({os.cpu_count()} cores x {elapsed:.0f} s = {os.cpu_count() * elapsed:.0f}): "
        + ", ".join(f"{name} {sec:.1f}" for name, sec in cpu_used.items())
        + f"; web {1000 * cpu_used['web'] / max(f['requests'], 1):.1f} ms per request; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    say(
        f"annotation endpoints: p50 {f['p50_ms']:.1f} ms, p95 {f['p95_ms']:.1f} ms, p99 {f['p99_ms']:.1f} ms "
        f"(think time {args.think[0]}-{args.think[1]} s per item)"
    )
    if not args.no_background:
        say(f"background jobs: {f['background']}")
        say(
            f"background work ran for {100 * f['background_share']:.1f}% of the window; annotation p95 with it "
            f"{f['p95_background_ms']} ms (n={f['n_background']}), without it {f['p95_no_background_ms']} ms "
            f"(n={f['n_no_background']})"
        )
    say(
        "goal: zero errors, zero lost or duplicated judgements; annotation p95 under 100 ms with background work "
        "running for at least 90% of a 60 s window (50 annotators, 2 cores), under 50 ms with --no-background"
    )
    if args.timeline:
        say(f"annotation requests by start time:\n{'seconds':11} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
        for line in timeline(stats.started, done["t0"]):
            say(line)
    if args.json:
        print(json.dumps(f))


def run_load(args, say, private_cache=None) -> None:
    env, var, made = prepare(args, say)
    logs = var / "log"
    procs = start_servers(args, env, logs)
    base = f"http://127.0.0.1:{args.port}"
    try:
        wait_http(base + "/healthz")
        groups = {"web": procs[0].pid, "worker": procs[1].pid}
        say(f"web ready; waiting for the worker and for start-up work to settle ... {wait_settled(logs, groups)}")
        done = drive(args, say, base, made, groups, private_cache)
    finally:
        stop_servers(procs)
    report(args, say, done, check_database(args, made["study"], done))


if __name__ == "__main__":
    main()
