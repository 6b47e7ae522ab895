"""Querysets compiled once per process and run again with new parameter values.

Building a queryset with a few ``Subquery``/``Exists`` annotations and compiling it to SQL
costs the web tier milliseconds of CPU per request, more than running it (issue 30: the
"next item" and submit requests spent about half their CPU in the ORM's query building).
The hot ones are wrapped in :class:`Prepared`: its ``build`` function makes the queryset
from explicit arguments only, in two kinds:

* **values** (ints, strings, aware datetimes) that reach the SQL as parameters: the first
  call per shape builds the queryset with stand-in values of the same types, compiles it
  once, and records at which parameter positions each stand-in landed; later calls put the
  real values there and run the same SQL through Django's own result machinery (model
  instances, ``select_related`` rows, annotations and converters exactly as the queryset
  would give them);
* **shape** (everything else the SQL depends on: flags, limits, counts computed in Python):
  part of the cache key, so each shape is compiled once.

If a stand-in does not come back as a parameter (a value the ORM inlined or transformed),
that shape is never cached: it is built and compiled every time, as before. ``build`` must
read nothing but its arguments (no clock, no settings, no rows); :data:`CHECK` (on in the
tests) compiles every call afresh as well and raises if the cached SQL or parameters differ.
"""
from __future__ import annotations

import copy
import itertools
import threading
from contextlib import nullcontext
from datetime import datetime, timedelta, timezone

from django.db import connections, transaction

#: Compile each call afresh too and compare with the cached statement (tests turn it on).
CHECK = False

_BASE = datetime(1977, 7, 7, 7, 7, 7, tzinfo=timezone.utc)

#: Ints beyond a 32-bit integer column's range take the ordinary path: the ORM answers a
#: lookup out of the field's range with no rows (EmptyResultSet) without running SQL, which
#: a cached statement cannot do (SQLite overflows on an int beyond 64 bits: the API's fuzz
#: test sent /api/assignments/500398791049434038272/judgements/ and got a 500).
_INT_RANGE = range(-2**31, 2**31)


def _stand_in(value, n: int):
    """A stand-in of ``value``'s type that no real query parameter equals."""
    if isinstance(value, bool):
        raise TypeError("a bool is shape, not a value")
    if isinstance(value, int):
        return 1_987_650_000 + n
    if isinstance(value, str):
        return f"\u2983prepared-{n}\u2984"
    if isinstance(value, datetime) and value.tzinfo is not None:
        return _BASE + timedelta(microseconds=n + 1)
    raise TypeError(f"no stand-in for {type(value).__name__}")


class Prepared:
    """``Prepared(build)(shape, **values)``: the list of rows of ``build(*shape, **values)``,
    from SQL compiled once per ``shape`` (a hashable tuple)."""

    def __init__(self, build):
        self.build = build
        self._cache: dict = {}
        self._lock = threading.Lock()

    def __call__(self, shape: tuple = (), **values) -> list:
        key = (shape, tuple(sorted((k, type(v)) for k, v in values.items())))
        entry = self._cache.get(key)
        if entry is None:
            entry = self._prepare(shape, values)
            with self._lock:
                self._cache[key] = entry
        if entry is False or not all(_in_range(v) for v in values.values()):  # the ordinary path
            return list(self.build(*shape, **values))
        qs, compiler, sql, params, slots = entry
        params = list(params)
        for index, name, adapt in slots:
            params[index] = values[name] if adapt is None else adapt(values[name])
        if CHECK:
            fresh = self.build(*shape, **values)
            want = fresh.query.get_compiler(using=fresh.db).as_sql()
            if (sql, tuple(params)) != (want[0], tuple(want[1])):
                raise AssertionError(f"prepared SQL of {self.build.__qualname__} is stale:\n{sql}\n{params}\n"
                                     f"fresh:\n{want[0]}\n{want[1]}")
        return _run(qs, compiler, sql, tuple(params))

    def _prepare(self, shape: tuple, values: dict):
        counter = itertools.count()
        stand_ins = {name: _stand_in(v, next(counter)) for name, v in values.items()}
        qs = self.build(*shape, **stand_ins)
        compiler = qs.query.get_compiler(using=qs.db)
        # select_for_update compiles only inside a transaction (opened here only when none is:
        # a savepoint would be a statement of its own)
        outside = qs.query.select_for_update and connections[qs.db].get_autocommit()
        with transaction.atomic(using=qs.db) if outside else nullcontext():
            sql, params = compiler.as_sql()
        # A datetime reaches the SQL as the backend adapts it (itself on PostgreSQL, text on SQLite).
        adapt = connections[qs.db].ops.adapt_datetimefield_value
        by_value = {v: (name, None) for name, v in stand_ins.items()}
        by_value.update({adapt(v): (name, adapt) for name, v in stand_ins.items() if isinstance(v, datetime)})
        slots = [(i, *by_value[p]) for i, p in enumerate(params) if _hashable(p) and p in by_value]
        found = {name for _, name, _ in slots}
        inlined = any(str(v) in sql for v in stand_ins.values())
        if found != set(stand_ins) or inlined:
            return False
        return qs, compiler, sql, tuple(params), slots


def _in_range(value) -> bool:
    return not isinstance(value, int) or isinstance(value, bool) or value in _INT_RANGE


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _run(qs, compiler, sql: str, params: tuple) -> list:
    """Evaluate ``qs`` with ``compiler``'s cached statement and new ``params`` on this
    thread's connection."""
    connection = connections[qs.db]
    if qs.query.select_for_update and connection.get_autocommit():
        from django.db.transaction import TransactionManagementError

        raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
    mine = copy.copy(compiler)
    mine.connection = connection
    mine.as_sql = lambda *args, **kwargs: (sql, params)
    # Shallow copies made by hand: copy.copy() of a QuerySet would evaluate it (__getstate__).
    run = _shallow(qs)
    run._result_cache = None
    run._prefetch_done = False
    run.query = _shallow(qs.query)
    run.query.get_compiler = lambda using=None, connection=None, elide_empty=True: mine
    return list(run)


def _shallow(obj):
    twin = object.__new__(type(obj))
    twin.__dict__.update(obj.__dict__)
    return twin
