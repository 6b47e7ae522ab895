"""config.sessions: Django's database sessions with the row read by one explicit SQL statement
(live_session) read live sessions only: unknown, expired and flushed (logged-out) keys give an
empty session, as Django's own store does."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore as DjangoStore
from django.contrib.sessions.models import Session
from django.utils import timezone

from config.sessions import SessionStore, live_session

pytestmark = pytest.mark.django_db


def test_the_session_store_reads_live_sessions_only_as_djangos_does():
    user = get_user_model().objects.create_user("session-store", password="x" * 12)
    store = SessionStore()
    store["_auth_user_id"] = str(user.pk)
    store.create()
    key = store.session_key
    for cls in (SessionStore, DjangoStore):
        assert cls(key).load() == {"_auth_user_id": str(user.pk)}
        assert cls("no-such-session-key-000").load() == {}
    row = live_session(key)
    assert (row.session_key, row.expire_date) == Session.objects.values_list("session_key", "expire_date").get(pk=key)
    Session.objects.filter(pk=key).update(expire_date=timezone.now() - timedelta(seconds=1))
    expired = SessionStore(key)
    assert expired.load() == {} and expired.session_key is None and live_session(key) is None
    Session.objects.filter(pk=key).update(expire_date=timezone.now() + timedelta(hours=1))
    SessionStore(key).flush()  # logout
    assert SessionStore(key).load() == {} and DjangoStore(key).load() == {}
