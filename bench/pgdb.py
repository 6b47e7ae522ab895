"""PostgreSQL databases for the benchmarks: made on demand, and only their own dropped."""

from __future__ import annotations

import uuid


def _admin(server: str) -> str:
    return server.rstrip("/") + "/postgres"


def ensure_database(url: str) -> None:
    """Create the database named in ``url`` unless it exists (it is reused, never dropped)."""
    import psycopg

    server, name = url.rsplit("/", 1)
    with psycopg.connect(_admin(server), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def create_own_database(server: str, prefix: str) -> str:
    """Create a new database with a unique name ``<prefix>_<random>`` on ``server``; return its URL."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_admin(server), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # fails rather than reuse an existing one
    return f"{server.rstrip('/')}/{name}"


def drop_own_database(url: str, prefix: str) -> None:
    """Drop a database that :func:`create_own_database` made with ``prefix`` (and nothing else)."""
    import psycopg

    server, name = url.rsplit("/", 1)
    if not name.startswith(prefix + "_"):
        raise ValueError(f"refusing to drop {name!r}: not a {prefix}_* database of this script")
    with psycopg.connect(_admin(server), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def setup_django(database_url: str, root) -> None:
    """Point Django at ``database_url`` (a PostgreSQL one is made when missing), with the
    benchmarks' own var folder (``<root>/var/bench``), and set it up."""
    import os

    import django

    if database_url.startswith("postgres"):
        ensure_database(database_url)
    (root / "var" / "bench").mkdir(parents=True, exist_ok=True)
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("CIRVAL_VAR_DIR", str(root / "var" / "bench"))
    django.setup()
