"""CIRVal settings.

Everything comes from environment variables with working defaults. With none set the
app runs on SQLite under ``var/`` and a Celery broker that needs no server (kombu's
filesystem transport); ``DATABASE_URL`` and ``CELERY_BROKER_URL`` switch to
PostgreSQL and Redis/RabbitMQ.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

from .defaults import MAX_PIXELS, SESSION_EPSILON, SESSION_TAU
from .env import cache_settings, env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("CIRVAL_VAR_DIR", str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

# Debug is off unless asked for (``./cirval up`` asks for it for its runserver). Even then
# the 404 and 403 pages are the site's own (config/errors.py), never Django's URL list.
DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if os.environ.get("DJANGO_DEBUG", "").strip() in ("0", "false", "no", "off"):
        raise RuntimeError("DJANGO_SECRET_KEY must be set when DJANGO_DEBUG is off")
    # A local install: a random key kept under var/ (made once, readable by this user only).
    _key_file = VAR_DIR / "secret_key"
    if not _key_file.exists():
        import secrets

        _key_file.touch(mode=0o600)
        _key_file.write_text(secrets.token_urlsafe(50))
    SECRET_KEY = _key_file.read_text().strip()

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "axes",
    "retrieval",
    "audit",
    "annotation",
]

MIDDLEWARE = [
    # The security headers first, so that even the guard's 413/400 carry them; none reads a body.
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "config.security.ContentSecurityPolicyMiddleware",
    "config.middleware.RequestGuardMiddleware",  # then: refuses oversized bodies unread
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "axes.middleware.AxesMiddleware",
    "config.errors.FriendlyErrorsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "config.roles.roles_context",
            ],
        },
    },
]

# --- database --------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'cirval.sqlite3'}")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 60))}
# One cache per process by default. With several gunicorn workers set CACHE_URL (or
# REDIS_CACHE_URL) to a Redis database so that throttles and image grants are shared.
CACHE_URL = env_str("CACHE_URL", "") or env_str("REDIS_CACHE_URL", "")
# While the cache's Redis is down every process falls back to its own memory (config/cache.py)
# and tries Redis again after this many seconds.
CACHE_RETRY_SECONDS = env_float("CACHE_RETRY_SECONDS", 5)
CACHES = cache_settings(CACHE_URL, CACHE_RETRY_SECONDS)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web process and the worker share the file: WAL lets readers run beside a
    # writer, IMMEDIATE transactions make writers queue instead of failing.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file (not :memory:) so that a real worker process can see the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-cirval.sqlite3")}
else:
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- auth ------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
AUTHENTICATION_BACKENDS = [
    "config.security.LoginThrottleBackend",  # django-axes: refuses logins while an account or address is locked out
    "django.contrib.auth.backends.ModelBackend",
]
# Login throttling (django-axes): after AXES_FAILURE_LIMIT wrong passwords for one account
# from one address, that account is refused at that address for AXES_COOLOFF_MINUTES after
# the last wrong one. Per account AND address: the owner of a locked account still gets in
# from their own address, guesses from another address neither lock nor extend it, and a
# login to another account resets nothing but its own pair. Staff unlock on the users page.
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = env_int("AXES_COOLOFF_MINUTES", 15) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "config.security.lockout_response"  # says for how long
# Behind a reverse proxy: how many trusted proxies append to X-Forwarded-For in front of the
# app (nginx alone: 1; a load balancer, then nginx: 2). 0, the default, trusts no forwarded
# header: every address is the connection's peer. config.throttling.client_address reads it,
# for the login lockout and the API throttles alike (AXES_PROXY_COUNT: its former name).
CIRVAL_PROXY_COUNT = env_int("CIRVAL_PROXY_COUNT", env_int("AXES_PROXY_COUNT", 0))
if CIRVAL_PROXY_COUNT < 0:
    raise ValueError(f"CIRVAL_PROXY_COUNT={CIRVAL_PROXY_COUNT} is negative (the number of trusted proxies)")
AXES_CLIENT_IP_CALLABLE = "config.throttling.client_address"
AXES_ENABLED = env_bool("AXES_ENABLED", True)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# --- HTTPS (set DJANGO_HTTPS=1 behind TLS) ------------------------------------------
HTTPS = env_bool("DJANGO_HTTPS", False)
# Django's database sessions, their row read by one explicit SQL statement (config/sessions.py).
SESSION_ENGINE = "config.sessions"
SESSION_COOKIE_HTTPONLY = True
# No script reads the CSRF cookie: the pages put the token in <meta name="csrf-token"> or a
# form field, so the cookie can be HttpOnly too (SECURITY.md says so; a test checks it).
CSRF_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS and env_bool("DJANGO_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 0) if HTTPS else 0
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Serve static/ straight from the source folders: no collectstatic step is needed.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Uploaded import files and exports live under var/ (no model has a FileField: no MEDIA_ROOT).
UPLOAD_DIR = VAR_DIR / "uploads"
EXPORT_DIR = VAR_DIR / "exports"
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
CIRVAL_MAX_UPLOAD_BYTES = env_int("CIRVAL_MAX_UPLOAD_BYTES", 512 * 1024 * 1024)

# The item page renews its lease every HEARTBEAT seconds while the annotator is active,
# stops after IDLE seconds without a key, click or mouse move, and warns WARN seconds
# before the lease runs out.
CIRVAL_LEASE_HEARTBEAT_SECONDS = env_int("CIRVAL_LEASE_HEARTBEAT_SECONDS", 60)
CIRVAL_LEASE_IDLE_SECONDS = env_int("CIRVAL_LEASE_IDLE_SECONDS", 300)
CIRVAL_LEASE_WARN_SECONDS = env_int("CIRVAL_LEASE_WARN_SECONDS", 60)

# --- Content-Security-Policy (config/security.py sends it) ------------------------------
# Scripts only from our static files: no inline script, no inline handler, no eval. Styles
# allow inline attributes (charts and a few layouts set them); images may be data: URIs.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

# --- images --------------------------------------------------------------------------
# Folders images may be served from (os.pathsep or comma separated).
_IMAGE_ROOTS = env_str("IMAGE_ROOTS").strip() or str(VAR_DIR / "images")
IMAGE_ROOTS = [
    Path(p.strip()).resolve()
    for p in _IMAGE_ROOTS.split(os.pathsep if os.pathsep in _IMAGE_ROOTS else ",")
    if p.strip()
]
IMAGE_MAX_PIXELS = env_int("IMAGE_MAX_PIXELS", MAX_PIXELS)
THUMBNAIL_DIR = VAR_DIR / "thumbs"
# The most memory one image's decode may take (bytes, after a JPEG's draft reduction); an
# image needing more is refused. Decodes of one image run one at a time (retrieval/imageserve.py).
IMAGE_DECODE_MAX_BYTES = env_int("IMAGE_DECODE_MAX_BYTES", 512 * 1024 * 1024)
EMBEDDING_CACHE_DIR = Path(env_str("EMBEDDING_CACHE_DIR", str(VAR_DIR / "embeddings")))
# Hosted embedders (api: retrievers, retrieval/retrievers/api): the keys, the API roots (tests
# point them at a local server), one process's limits (0: the model's own, from its catalogue),
# retries, and the ledger of paid inputs (an input paid for is never sent again).
API_KEYS = {"voyage": env_str("VOYAGE_API_KEY"), "gemini": env_str("GEMINI_API_KEY")}
API_BASE_URLS = {"voyage": env_str("VOYAGE_BASE_URL"), "gemini": env_str("GEMINI_BASE_URL")}
API_RPM = env_int("CIRVAL_API_RPM", 0)
API_TPM = env_int("CIRVAL_API_TPM", 0)
API_BATCH = env_int("CIRVAL_API_BATCH", 0)
API_MAX_TRIES = env_int("CIRVAL_API_MAX_TRIES", 6)
API_TIMEOUT_S = env_float("CIRVAL_API_TIMEOUT_S", 60.0)
API_MAX_REQUEST_MB = env_float("CIRVAL_API_MAX_REQUEST_MB", 8.0)
API_LEDGER_DIR = Path(env_str("CIRVAL_API_LEDGER_DIR", str(VAR_DIR / "api-ledger")))

# --- Celery ----------------------------------------------------------------------------
BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    for sub in ("queue", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
        "polling_interval": 0.1,
    }
else:
    # Redelivery of an unacknowledged task after a worker dies: long enough for one
    # audit chunk, far shorter than a day.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 3600)}
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", "") or None
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "celery"
# Audit chunks run on ``gpu``; interactive rounds on their own queue, ``interactive`` (a person
# waits on each: a worker may consume it alone, so a round never queues behind audit chunks,
# imports or exports). Every worker launcher consumes all three (./cirval, README).
CELERY_TASK_ROUTES = {
    "audit.tasks.*": {"queue": "gpu"},
    "annotation.rank_interactive_round": {"queue": "interactive"},
    "annotation.warm_interactive": {"queue": "interactive"},
}
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# config/celery.py: a consumer without gossip and mingle (they crash on a Redis restart).
CELERY_WORKER_CONSUMER = "config.celery:Consumer"
# On SIGTERM a running task gets this long to finish, then it is cancelled and its work is
# released and sent again at once (config/celery.py); Celery's warm shutdown waits forever.
WORKER_STOP_SECONDS = env_float("WORKER_STOP_SECONDS", 3)
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = WORKER_STOP_SECONDS

# --- background jobs (imports, audit chunks, exports: retrieval/jobs) ----------------------
# A running job beats every JOB_HEARTBEAT_SECONDS; one silent for JOB_STALE_SECONDS has lost
# its worker and is sent again by the next sweep (every JOB_SWEEP_SECONDS, in every worker):
# a dead worker's job is resent within JOB_STALE_SECONDS + JOB_SWEEP_SECONDS (30 s).
JOB_HEARTBEAT_SECONDS = env_float("JOB_HEARTBEAT_SECONDS", 5)
JOB_STALE_SECONDS = env_float("JOB_STALE_SECONDS", 25)
JOB_SWEEP_SECONDS = env_float("JOB_SWEEP_SECONDS", 5)
# A waiting job sent this long ago and not started is sent again (its message was lost).
JOB_RESEND_SECONDS = env_float("JOB_RESEND_SECONDS", 120)
# Starts of one import or export (lost workers count) before it is marked failed.
JOB_MAX_ATTEMPTS = env_int("JOB_MAX_ATTEMPTS", 3)
# Reliability-weighted adaptive overlap: a submit reads the study's stored Dawid-Skene fit; a
# worker refits it once it is this many judgements behind or this many seconds old
# (annotation/verdicts/refit.py), never inside a request.
RELIABILITY_REFIT_JUDGEMENTS = env_int("CIRVAL_RELIABILITY_REFIT_JUDGEMENTS", 100)
RELIABILITY_REFIT_SECONDS = env_int("CIRVAL_RELIABILITY_REFIT_SECONDS", 30)

# --- shortcut audits ---------------------------------------------------------------------
# Queries and gallery images per chunk (one chunk = one task for one retriever).
AUDIT_CHUNK_QUERIES = env_int("AUDIT_CHUNK_QUERIES", 512)
# Session conflict check (issue 26): a turn's requested change read from its text embedding
# ("text": centred text embeddings, cosine <= -0.3) or from its image change ("image": target
# minus effective reference, cosine <= -0.9). See README, "Sessions, turn by turn".
SESSION_CONFLICT_DIRECTIONS = env_str("SESSION_CONFLICT_DIRECTIONS", "text")
AUDIT_CHUNK_GALLERY = env_int("AUDIT_CHUNK_GALLERY", 4096)
# The demo retrievers (manage.py train_demo_retriever): where their checkpoints live, and the
# training steps when make_demo must train them (0: the trainer's default).
DEMO_MODELS_DIR = Path(env_str("CIRVAL_DEMO_MODELS_DIR", str(VAR_DIR / "models"))).resolve()
DEMO_TRAIN_STEPS = env_int("CIRVAL_DEMO_TRAIN_STEPS", 0)
# The coordinator is restarted after this long without a tick. Lost chunk messages are
# resent by JOB_RESEND_SECONDS (at once after a broker reconnect), dead workers' chunks by
# their heartbeat (JOB_STALE_SECONDS).
AUDIT_LEASE_SECONDS = env_int("AUDIT_LEASE_SECONDS", 300)
# How often the coordinating task re-checks a run (and resends stale chunks).
AUDIT_COORDINATOR_SECONDS = env_int("AUDIT_COORDINATOR_SECONDS", 15)
# Runs of one chunk (workers lost mid-chunk count) before the run is marked failed.
AUDIT_MAX_ATTEMPTS = env_int("AUDIT_MAX_ATTEMPTS", 3)
AUDIT_DEVICE = env_str("AUDIT_DEVICE", "")  # "" = cuda when available, else cpu
AUDIT_BATCH_SIZE = env_int("AUDIT_BATCH_SIZE", 64)
# A worker runs the chunks of every retriever over the same gallery images or the same queries
# together: each gallery file decoded once for all of them, each query chunk's queries, turns and
# targets read once (off: one chunk per task, the retrievers' chunks in parallel).
AUDIT_RETRIEVERS_TOGETHER = env_bool("AUDIT_RETRIEVERS_TOGETHER", True)
AUDIT_PRECISION = env_str("AUDIT_PRECISION", "amp")  # amp (fp16 autocast on CUDA; fp32 on CPU) | fp32
# How a retriever's text-only and image-only queries are formed: "family" (each family's own rule)
# or "circus" (CIRCUS's: the text with a black image of the reference's size, the image with the
# empty text); see retrieval.retrievers.base
AUDIT_MODALITY_RULE = env_str("AUDIT_MODALITY_RULE", "family")
AUDIT_PANEL_K = 10  # multimodal results kept per (query, retriever) for the annotator panel
AUDIT_CANDIDATES_N = env_int("AUDIT_CANDIDATES_N", 64)  # multimodal top list stored per rank row (targets included)
# Session filters (CIRCLED): a session is kept when its ranks stay within epsilon and its turn
# texts are diverse (largest text-text cosine below tau); the published values by default.
AUDIT_SESSION_EPSILON = env_float("AUDIT_SESSION_EPSILON", SESSION_EPSILON)
AUDIT_SESSION_TAU = env_float("AUDIT_SESSION_TAU", SESSION_TAU)
# The retriever that ranks candidates for a study whose dataset no audit ranked (audit/runs/ondemand.py).
CANDIDATE_RETRIEVER = env_str("CANDIDATE_RETRIEVER", "openclip:cirval-tiny-vit")
# A single-turn item is served only once its candidate panel is stored (a worker, or
# create_study on the command line, fills them): ticks on an item served without one are lost.
CIRVAL_SERVE_AFTER_PANEL = env_bool("CIRVAL_SERVE_AFTER_PANEL", True)

# --- workers (config/worker_tuning.py) --------------------------------------------------------
# A worker's CPU priority: idle (Linux's idle scheduling class, nice 19 where there is none) or a
# nice value; the cores it leaves to the web tier; torch's threads per pool process (0: from the
# cores left); image loader processes per pool process (-1: from the cores left).
WORKER_NICE = env_str("WORKER_NICE", "idle")
WORKER_RESERVED_CORES = env_int("WORKER_RESERVED_CORES", 1)
WORKER_TORCH_THREADS = env_int("WORKER_TORCH_THREADS", 0)
AUDIT_LOADER_WORKERS = env_int("AUDIT_LOADER_WORKERS", -1)
# The web application imports every view and template at start (config/wsgi.py); 0 skips it.
WSGI_WARM_UP = env_bool("WSGI_WARM_UP", True)

# --- validated exports ----------------------------------------------------------------------
EXPORT_CHUNK_SIZE = env_int("EXPORT_CHUNK_SIZE", 2000)  # items read per batch
# Pause after every batch (the CPU is given up, then this long a sleep) so that an export
# running beside the web tier does not starve it; 0 = only sched_yield.
EXPORT_YIELD_SECONDS = env_float("EXPORT_YIELD_SECONDS", 0.005)

# --- REST framework --------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": [
        "config.parsing.SafeJSONParser",  # refuses hostile JSON with 400 naming the field
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    # Per account (user) and per address (anon). Generous: 50 annotators behind one NAT
    # address submit, autosave and fetch items many times a minute.
    "DEFAULT_THROTTLE_CLASSES": [
        "config.throttling.UserRateThrottle",  # atomic counters (Redis INCR), see config/throttling.py
        "config.throttling.AnonRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "user": env_str("API_THROTTLE_USER", "600/min"),
        "anon": env_str("API_THROTTLE_ANON", "60/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "CIRVal API",
    "DESCRIPTION": "Composed image retrieval audits, human validation and agreement.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["annotation.permissions.IsResearcher"],  # staff and researchers only
}

LOG_LEVEL = env_str("LOG_LEVEL", "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # runserver's access line of a 5xx: django.request logs that request (with its traceback)
    "filters": {
        "below_500": {
            "()": "django.utils.log.CallbackFilter",
            "callback": lambda record: getattr(record, "status_code", 0) < 500,
        }
    },
    # Libraries such as open_clip log chatty INFO lines on the root logger: keep it at
    # WARNING and let the project's own loggers (and Celery's) speak at LOG_LEVEL.
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        **{name: {"level": LOG_LEVEL} for name in ("retrieval", "audit", "annotation", "config", "celery")},
        # Each request is logged once. Under runserver its access line (django.server) says
        # every request but a 5xx, which is django.request's error with its traceback; a 4xx
        # is the access line alone (django.request's warning and Django's own console
        # handler repeated it: three lines). In production nginx's access log is the line.
        "django": {"handlers": [], "level": "INFO"},  # Django's console handler: the root's again
        "django.server": {"handlers": ["console"], "level": LOG_LEVEL, "filters": ["below_500"], "propagate": False},
        "django.request": {"level": "ERROR"},
        "django.db.backends": {"level": "WARNING"},
    },
}
