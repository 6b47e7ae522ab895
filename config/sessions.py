"""The session store: Django's database sessions, their row read by one explicit SQL statement.

Every request of a signed-in user reads its session row. Django's store builds and compiles
``Session.objects.get(...)`` for it each time, about 0.5 ms of CPU per request under
``bench/load.py``; this store runs the same lookup (the key, not yet expired) as one SQL
statement over the model's table (:mod:`config.sql_rows`). Everything else (writes, expiry,
``flush`` on logout, the table) is Django's own, so sessions stay where they were and a
logout ends a session at once.
"""

from __future__ import annotations

from functools import cache

from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore
from django.contrib.sessions.models import Session
from django.db import connection
from django.utils import timezone

from .sql_rows import columns, instance, table


@cache
def _statement() -> str:
    q = connection.ops.quote_name
    key, expires = (q(Session._meta.get_field(n).column) for n in ("session_key", "expire_date"))
    return f"SELECT {columns(Session, 's')} FROM {table(Session)} s WHERE s.{key} = %s AND s.{expires} > %s"


def live_session(session_key: str) -> Session | None:
    """The session row of ``session_key`` that has not expired (Django's store reads
    ``Session.objects.get(session_key=..., expire_date__gt=now)``); None when there is none."""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(_statement(), [session_key, now])
        row = cursor.fetchone()
    return None if row is None else instance(Session, row)


class SessionStore(DatabaseSessionStore):
    """``django.contrib.sessions.backends.db`` with the row read by :func:`live_session`."""

    def _get_session_from_db(self):
        found = live_session(self.session_key)
        if found is None:
            self._session_key = None
        return found
