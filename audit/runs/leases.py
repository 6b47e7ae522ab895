"""Chunk leases: the atomic claim and the heartbeat thread that renews it."""
from __future__ import annotations

import threading
from datetime import timedelta

from django.db import connection
from django.db.models import F, Q
from django.utils import timezone

from ..models import AuditChunk
from .base import LeaseLost, lease_seconds, logger, max_attempts


def claim_chunk(chunk_id: int, owner: str) -> bool:
    """Take the lease of a pending chunk, or of a running one whose lease is stale."""
    now = timezone.now()
    stale = now - timedelta(seconds=lease_seconds())
    return bool(
        AuditChunk.objects.filter(pk=chunk_id, attempts__lt=max_attempts())
        .filter(
            Q(status=AuditChunk.Status.PENDING)
            | Q(status=AuditChunk.Status.RUNNING, heartbeat_at__lt=stale)
            | Q(status=AuditChunk.Status.RUNNING, heartbeat_at__isnull=True)
        )
        .update(status=AuditChunk.Status.RUNNING, owner=owner, started_at=now, heartbeat_at=now,
                attempts=F("attempts") + 1, error="")
    )


class Heartbeat:
    """Renews a chunk's lease from a background thread while the chunk is computed."""

    def __init__(self, chunk_id: int, owner: str, interval: float) -> None:
        self.chunk_id = chunk_id
        self.owner = owner
        self.interval = max(0.05, interval)
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"audit-heartbeat-{chunk_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    n = AuditChunk.objects.filter(
                        pk=self.chunk_id, owner=self.owner, status=AuditChunk.Status.RUNNING
                    ).update(heartbeat_at=timezone.now())
                except Exception:  # a DB hiccup: try again at the next beat
                    logger.warning("heartbeat of chunk %s failed", self.chunk_id, exc_info=True)
                    continue
                if n == 0:
                    self.lost = True
                    return
        finally:
            connection.close()

    def check(self) -> None:
        if self.lost:
            raise LeaseLost(f"chunk {self.chunk_id} was taken over by another worker")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
