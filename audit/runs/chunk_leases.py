"""Chunk leases: the claim and heartbeat of :mod:`retrieval.jobs.leases` for audit chunks."""

from __future__ import annotations

from retrieval.jobs import leases as jobs

from ..models import AuditChunk
from .base import max_attempts


def claim_chunk(chunk_id: int, owner: str) -> bool:
    """Take the lease of a pending chunk, or of a running one whose heartbeat is stale."""
    return jobs.claim(AuditChunk, chunk_id, owner, attempts=max_attempts())


class Heartbeat(jobs.Heartbeat):
    """Renews a chunk's lease from a background thread while the chunk is computed."""

    def __init__(self, chunk_id: int, owner: str, interval: float | None = None) -> None:
        super().__init__(AuditChunk, chunk_id, owner, interval)
