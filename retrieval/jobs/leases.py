"""The one claim / heartbeat / resume helper of every job kind.

* :func:`claim`: one conditional update takes a waiting row, or a running row whose
  heartbeat is stale (its worker died); a second message for the same work finds
  nothing to take and returns at once (tasks are idempotent, acks late).
* :class:`Heartbeat`: a thread beats every ``JOB_HEARTBEAT_SECONDS`` (default 5 s) on its
  own database connection, with the progress the work reported, and notices a takeover.
* :func:`resend_stale`: a running row with no beat for ``JOB_STALE_SECONDS`` (default
  25 s) is put back and sent again (or failed after too many attempts). Together with the
  sweep period (``JOB_SWEEP_SECONDS``, default 5 s) a dead worker's work is resent within
  :func:`detection_bound_seconds` (30 s by default), whatever the job's own length.
* :func:`resend_lost`: a waiting row never sent (broker down) or sent longer ago than
  ``JOB_RESEND_SECONDS`` is sent again (its message was lost). A worker whose broker
  connection came back (:func:`messages_lost`, a broker restart may have lost every queued
  message) resends at once every waiting row sent before that moment, not 120 s later.
* :func:`release`: a worker that stops puts its running rows back, never sent, so the next
  sweep of any worker (or the worker's own last sweep) sends them again at once.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Q, QuerySet, When
from django.utils import timezone

from .models import Status

logger = logging.getLogger(__name__)


class LeaseLost(RuntimeError):
    """Another worker took this work over; stop without writing."""


def heartbeat_seconds() -> float:
    return float(settings.JOB_HEARTBEAT_SECONDS)


def stale_seconds() -> float:
    return float(settings.JOB_STALE_SECONDS)


def sweep_seconds() -> float:
    return float(settings.JOB_SWEEP_SECONDS)


def resend_seconds() -> float:
    return float(settings.JOB_RESEND_SECONDS)


def max_attempts() -> int:
    return int(settings.JOB_MAX_ATTEMPTS)


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def stale_q(now=None) -> Q:
    """Running rows whose worker has not beaten for :func:`stale_seconds`."""
    before = (now or timezone.now()) - timedelta(seconds=stale_seconds())
    return Q(status=Status.RUNNING, heartbeat_at__lt=before) | Q(status=Status.RUNNING, heartbeat_at__isnull=True)


def claimable(model) -> QuerySet:
    """Rows a worker may take: waiting, or running with a stale heartbeat."""
    return model.objects.filter(Q(status=model.WAITING) | stale_q())


def claim(model, pk: int, owner: str, attempts: int | None = None, **fields: Any) -> bool:
    """Take the lease of row ``pk`` for ``owner`` (one conditional update)."""
    now = timezone.now()
    limit = max_attempts() if attempts is None else attempts
    return bool(
        claimable(model)
        .filter(pk=pk, attempts__lt=limit)
        .update(
            status=Status.RUNNING,
            owner=owner,
            started_at=now,
            heartbeat_at=now,
            attempts=F("attempts") + 1,
            error="",
            **fields,
        )
    )


def finish(model, pk: int, owner: str, **fields: Any) -> bool:
    """Mark ``owner``'s running row done; ``False`` when the lease was lost meanwhile."""
    now = timezone.now()
    return bool(
        model.objects.filter(pk=pk, owner=owner, status=Status.RUNNING).update(
            status=Status.DONE, finished_at=now, heartbeat_at=now, **fields
        )
    )


def fail(model, pk: int, message: str, owner: str | None = None, **fields: Any) -> bool:
    """Mark a row failed with a readable message (a done row stays done; with ``owner``,
    only while that owner holds it)."""
    rows = model.objects.filter(pk=pk) if owner is None else model.objects.filter(pk=pk, owner=owner)
    return bool(
        rows.exclude(status=Status.DONE).update(
            status=Status.FAILED, error=message[:20000], finished_at=timezone.now(), **fields
        )
    )


#: An absolute path (two parts or more): shown by its last part only.
_ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])/(?:[^\s:'\",/()]+/)+([^\s:'\",/()]+)")


def redact_paths(text: str) -> str:
    """``text`` with every absolute server path cut to its file name (pages never show paths)."""
    return _ABSOLUTE_PATH.sub(r"\1", text)


def readable(exc: BaseException) -> str:
    """A one-line message for any exception, never a traceback or a server path: the text of
    the errors we raise on purpose (``ValueError``, ``OSError``); otherwise the exception's
    type and text and a reference number, logged with the traceback (``error reference N``)."""
    text = redact_paths(str(exc).strip())
    if isinstance(exc, (ValueError, OSError)) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def error_reference(exc: BaseException, what: str) -> str:
    """Log ``exc`` with its traceback under a fresh reference number and return the message a
    page may show: :func:`readable`'s, plus the reference to find the details in the log."""
    ref = secrets.token_hex(4)
    logger.error("error reference %s: %s failed", ref, what, exc_info=exc)
    return f"{readable(exc)} (reference {ref}: the details are in the server log)"


class Heartbeat:
    """Beats a leased row from a background thread while its work runs.

    ``report(stage, done, total)`` records progress; the thread writes it with the beat,
    on its own connection (so progress shows while the work holds a long transaction).
    ``lost`` turns true when another owner took the row; :meth:`check` then raises."""

    def __init__(
        self, model, pk: int, owner: str, interval: float | None = None, progress: bool = False, thread: bool = True
    ) -> None:
        self.model = model
        self.pk = pk
        self.owner = owner
        self.interval = max(0.05, heartbeat_seconds() if interval is None else interval)
        self.lost = False
        self.last: dict[str, Any] = {}
        self._progress = progress
        self._pending: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if thread:
            self._thread = threading.Thread(target=self._run, name=f"heartbeat-{model.__name__}-{pk}", daemon=True)
            self._thread.start()

    def report(self, stage: str, done: int, total: int) -> None:
        """Record progress; without a thread (the claim is not committed yet, e.g. inside a
        test's transaction, where no other worker could see it) it is written at once."""
        with self._lock:
            self.last = self._pending = {"stage": stage[:100], "done": done, "total": total}
        if self._thread is None:
            self._beat()

    def _beat(self) -> bool:
        with self._lock:
            fields, self._pending = self._pending, {}
        n = self.model.objects.filter(pk=self.pk, owner=self.owner, status=Status.RUNNING).update(
            heartbeat_at=timezone.now(), **(fields if self._progress else {})
        )
        return n > 0

    def _run(self) -> None:
        """Beat every ``interval``; reported progress is written within a second."""
        tick = min(self.interval, 1.0)
        last = time.monotonic()
        try:
            while not self._stop.wait(tick):
                if not self._pending and time.monotonic() - last < self.interval:
                    continue
                last = time.monotonic()
                try:
                    alive = self._beat()
                except Exception as exc:  # a DB hiccup (or SQLite busy): try again at the next beat
                    logger.warning("heartbeat of %s %s failed: %s", self.model.__name__, self.pk, exc)
                    continue
                if not alive:
                    self.lost = True
                    return
        finally:
            connection.close()

    def check(self) -> None:
        if self.lost:
            raise LeaseLost(f"{self.model.__name__} {self.pk} was taken over by another worker")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> Heartbeat:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def run_job(
    model,
    pk: int,
    work: Callable[[Callable[[str, int, int], None]], dict[str, Any]],
    owner: str | None = None,
    atomic: bool = False,
) -> str:
    """Claim row ``pk``, run ``work(report)`` under a heartbeat and finish the row with the
    fields ``work`` returns. Returns ``"done"``, ``"failed"``, ``"lost"`` or ``"skipped"``
    (done, failed, or alive in another worker: a redelivered message does nothing).

    Any exception ends the row ``failed`` with :func:`readable`'s message. With ``atomic``
    the work and the ``done`` mark are one transaction: a failure or a killed worker
    leaves nothing partial written, and a lease lost meanwhile writes nothing."""
    owner = owner or default_owner()
    if not claim(model, pk, owner, stage="starting", done=0):
        return "skipped"
    # Inside an outer transaction the claim is invisible to other connections: no thread.
    with Heartbeat(model, pk, owner, progress=True, thread=not connection.in_atomic_block) as beat:
        try:
            with transaction.atomic() if atomic else nullcontext():
                fields = work(beat.report)
                beat.check()
                if not finish(model, pk, owner, **{**beat.last, "stage": "done", **fields}):
                    raise LeaseLost(f"{model.__name__} {pk} was taken over by another worker")
        except LeaseLost:
            logger.warning("%s %s: lease lost, leaving it to its new owner", model.__name__, pk)
            return "lost"
        except Exception as exc:  # noqa: BLE001 - any failure is shown on the job's page
            expected = isinstance(exc, (ValueError, OSError))  # said in words; anything else gets a reference
            message = readable(exc) if expected else error_reference(exc, f"{model.__name__} {pk}")
            logger.warning("%s %s failed: %s", model.__name__, pk, message, exc_info=expected)
            fail(model, pk, message, owner=owner, stage="failed")
            return "failed"
    return "done"


Send = Callable[[int], bool]


def resend_stale(qs: QuerySet, send: Send, give_up: Callable[[Any], None], limit: int | None = None) -> dict[str, int]:
    """Put back and resend the rows of ``qs`` whose worker stopped beating.

    A row that has used up its attempts is handed to ``give_up`` instead. The reset is a
    conditional update on the beat that was seen, so two sweeps never both resend it."""
    out = {"resent_stale": 0, "failed": 0}
    limit = max_attempts() if limit is None else limit
    model = qs.model
    for row in qs.filter(stale_q()).only("pk", "attempts", "heartbeat_at"):
        if row.attempts >= limit:
            give_up(row)
            out["failed"] += 1
            continue
        now = timezone.now()
        if model.objects.filter(pk=row.pk, status=Status.RUNNING, heartbeat_at=row.heartbeat_at).update(
            status=model.WAITING, owner="", enqueued_at=now
        ):
            logger.warning("%s %s: its worker stopped beating; sent again", model.__name__, row.pk)
            _send(model, row.pk, send, now)
            out["resent_stale"] += 1
    return out


_lost_before = None


def messages_lost(at=None) -> None:
    """Messages sent before ``at`` (now) may be lost: this worker's broker connection was
    lost and came back (a broker restart without persistence drops every message)."""
    global _lost_before
    _lost_before = at or timezone.now()
    logger.warning("the broker connection came back: work sent before %s is sent again", _lost_before)


def reconnected_at():
    """When this worker's broker connection last came back (``None``: never lost)."""
    return _lost_before


def lost_before(after_reconnect_only: bool = False):
    """A waiting row sent before this moment has lost its message: :func:`resend_seconds`
    ago, or the last broker reconnect of this worker (:func:`messages_lost`) if later
    (with ``after_reconnect_only``, only the reconnect; ``None`` when there was none)."""
    if after_reconnect_only:
        return _lost_before
    before = timezone.now() - timedelta(seconds=resend_seconds())
    return max(before, _lost_before) if _lost_before is not None else before


def release(owners: list[str]) -> dict[str, int]:
    """Put back the running rows of every leased kind held by ``owners`` (a worker's
    processes, when it stops): waiting and never sent, so that the next sweep sends them
    again at once; the attempt is not counted (the worker was stopped, not lost)."""
    from django.apps import apps

    from .models import Leased

    out = {}
    if not owners:
        return out
    for model in apps.get_models():
        if issubclass(model, Leased):
            n = model.objects.filter(status=Status.RUNNING, owner__in=owners).update(
                status=model.WAITING,
                owner="",
                enqueued_at=None,
                heartbeat_at=None,
                attempts=Case(When(attempts__gt=0, then=F("attempts") - 1), default=0),
            )
            if n:
                out[model._meta.label] = n
    return out


def resend_lost(qs: QuerySet, send: Send, never_sent: bool = True, after_reconnect_only: bool = False) -> int:
    """Send again the waiting rows of ``qs`` whose message was never sent (``never_sent``)
    or was sent before :func:`lost_before`. Returns how many were sent."""
    model = qs.model
    before = lost_before(after_reconnect_only)
    lost = Q(enqueued_at__lt=before) if before is not None else Q(pk__in=[])
    if never_sent:
        lost |= Q(enqueued_at__isnull=True)
    sent = 0
    for pk, enqueued in qs.filter(status=model.WAITING).filter(lost).values_list("pk", "enqueued_at"):
        now = timezone.now()
        if model.objects.filter(pk=pk, status=model.WAITING, enqueued_at=enqueued).update(enqueued_at=now):
            sent += int(_send(model, pk, send, now))
    return sent


def _send(model, pk: int, send: Send, now) -> bool:
    """Send; when the broker is down, mark the row never sent so a later sweep sends it."""
    if send(pk):
        return True
    model.objects.filter(pk=pk, status=model.WAITING, enqueued_at=now).update(enqueued_at=None)
    return False
