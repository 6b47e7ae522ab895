"""An import that finds the SQLite database write-locked by another process (an audit, an
import_gallery) tries again with a backoff, then says so in one sentence, never a traceback
(issue 41, item 1). The lock is held by a second connection to the test database, as another
process holds it."""

from __future__ import annotations

import sqlite3
import threading
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection

from retrieval import loader
from retrieval.loader import DatabaseBusy, retry_when_locked
from retrieval.models import Query
from tests.conftest import FIXTURES

VAL = FIXTURES / "datasets" / "cirr" / "cap.rc2.val.sample.json"


def test_retry_when_locked_retries_then_reports_one_sentence() -> None:
    calls, pauses = [], []

    def locked_twice():
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("database is locked")
        return "written"

    assert retry_when_locked(locked_twice, backoff=(1, 2, 3), sleep=pauses.append) == "written"
    assert pauses == [1, 2]

    def always_locked():
        raise OperationalError("database is locked")

    with pytest.raises(DatabaseBusy) as err:
        retry_when_locked(always_locked, backoff=(1, 2), sleep=lambda s: None)
    assert "through 3 tries" in str(err.value) and "nothing was written" in str(err.value)
    assert "\n" not in str(err.value)

    def other_error():
        raise OperationalError("no such table: x")

    with pytest.raises(OperationalError, match="no such table"):  # not a lock: not retried
        retry_when_locked(other_error, sleep=lambda s: pytest.fail("retried"))


@pytest.fixture
def held_lock(transactional_db, monkeypatch):
    """A second connection holding the write lock (BEGIN IMMEDIATE) and this connection's busy
    timeout cut to 0.2 s (the settings' 30 s is the same wait, longer)."""
    if connection.vendor != "sqlite":
        pytest.skip("the write lock of a database file is SQLite's")
    connection.ensure_connection()
    connection.cursor().execute("PRAGMA busy_timeout = 200")
    other = sqlite3.connect(connection.settings_dict["NAME"], timeout=5, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    monkeypatch.setattr(loader, "LOCK_BACKOFF", (0.1, 0.2))
    yield other
    other.rollback()
    other.close()


def test_import_dataset_reports_a_locked_database_in_one_sentence(held_lock, monkeypatch) -> None:
    err = StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("import_dataset", "--format", "cirr", "--name", "cirr", str(VAL), stdout=StringIO(), stderr=err)
    message = str(refused.value)
    assert message.startswith("import failed, nothing written: the database stayed locked by another process")
    assert "Traceback" not in message and "\n" not in message
    assert Query.objects.count() == 0


def test_import_dataset_goes_on_once_the_lock_is_released(held_lock, monkeypatch) -> None:
    monkeypatch.setattr(loader, "LOCK_BACKOFF", (0.5, 1.0, 2.0))
    threading.Timer(0.6, held_lock.rollback).start()  # the other process finishes its write
    out = StringIO()
    call_command("import_dataset", "--format", "cirr", "--name", "cirr", str(VAL), stdout=out, stderr=StringIO())
    assert "Dataset 'cirr' created" in out.getvalue()
    assert Query.objects.filter(dataset__name="cirr").count() > 0
