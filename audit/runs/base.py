"""Shared names of an audit run: settings, errors, subset names and skip reasons."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.db import connection

from retrieval.jobs import leases as jobs

from ..labels import LABELS, SHORTCUT_FREE_NAME
from ..models import AuditChunk, AuditRun

logger = logging.getLogger(__name__)


SKIP_REASONS: tuple[str, ...] = (
    "no_reference",
    "empty_text",
    "reference_missing",
    "reference_unreadable",
    "no_target",
)


SESSION_SKIP_REASONS: tuple[str, ...] = (
    "missing_turn",
    "no_reference",
    "empty_text",
    "reference_missing",
    "reference_unreadable",
    "no_target",
)


SUBSET_NAMES: tuple[str, ...] = (SHORTCUT_FREE_NAME, *LABELS)


LATEST_SUBSET = SHORTCUT_FREE_NAME


SESSIONS_KEPT = "sessions_kept"


#: The ranks the session filters read: the first retriever of the pool, this strategy and modality.
SESSION_FILTER_BASIS: dict[str, str] = {"strategy": "latest", "modality": "multimodal"}


SESSION_CHUNK_KINDS = (AuditChunk.Kind.QUERIES, AuditChunk.Kind.SESSIONS)  # need the gallery first


Progress = Callable[[AuditRun], None]


class AuditError(ValueError):
    """An audit cannot be created or run as asked (the message says why)."""


LeaseLost = jobs.LeaseLost  # another worker took over this chunk; stop without writing


def lease_seconds() -> float:
    """How long the coordinating task may stay silent before it is restarted (lost chunk
    messages are the job framework's ``JOB_RESEND_SECONDS``; dead workers its heartbeat)."""
    return float(settings.AUDIT_LEASE_SECONDS)


def coordinator_seconds() -> float:
    return float(settings.AUDIT_COORDINATOR_SECONDS)


def max_attempts() -> int:
    return int(settings.AUDIT_MAX_ATTEMPTS)


def panel_k() -> int:
    return int(settings.AUDIT_PANEL_K)


def candidates_n() -> int:
    """Length of the multimodal top list stored on each rank row (``AuditRank.top_mm``)."""
    return int(settings.AUDIT_CANDIDATES_N)


default_owner = jobs.default_owner


def subset_name(run: AuditRun, label: str) -> str:
    """Name of a run's query subset, e.g. ``audit3:shortcut_free``."""
    return f"audit{run.pk}:{label}"


def plain_rows(qs: Any, fields: Sequence[str], json_at: Sequence[int] = ()) -> list[list[Any]]:
    """``qs.values_list(*fields)`` as lists, for integer, text and JSON fields, the JSON values at
    positions ``json_at`` decoded here: the ORM's per-value converters cost about 2 us a value
    (a warm audit reads 5 JSON values for each of its rank rows). Other values come as the
    database gives them (SQLite: a boolean as 0 or 1)."""
    sql, params = qs.values_list(*fields).query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = [list(row) for row in cursor.fetchall()]
    for row in rows:
        for i in json_at:
            if isinstance(row[i], (str, bytes)):  # the database's JSON text (already decoded by some drivers)
                row[i] = json.loads(row[i])
    return rows


def conflict_source() -> str:
    """Where the conflict check reads a turn's requested change (``settings.SESSION_CONFLICT_DIRECTIONS``)."""
    from retrieval.sessions import CONFLICT_DIRECTIONS

    source = str(settings.SESSION_CONFLICT_DIRECTIONS)
    if source not in CONFLICT_DIRECTIONS:
        raise ValueError(f"SESSION_CONFLICT_DIRECTIONS must be one of {CONFLICT_DIRECTIONS}, not {source!r}")
    return source


def consistency_thresholds() -> Any:
    """The consistency thresholds the audit uses: the constants of :mod:`retrieval.sessions`, the
    conflict one for the directions :func:`conflict_source` names."""
    from retrieval.sessions import CONFLICT_IMAGE_COSINE, ConsistencyThresholds

    return (
        ConsistencyThresholds()
        if conflict_source() == "text"
        else ConsistencyThresholds(conflict=CONFLICT_IMAGE_COSINE)
    )
