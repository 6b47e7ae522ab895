"""Every job (imports, room imports, audits, exports) in one list, read from the job models.

One row shape for all of them, so the page can move to a unified job model unchanged."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from django.urls import reverse

from annotation.models import ExportJob, RoomImportJob
from audit.models import AuditRun
from retrieval.models import ImportJob

LIMIT = 50


@dataclass(frozen=True)
class JobRow:
    kind: str
    id: int
    title: str
    status: str
    stage: str
    percent: int
    done: int
    total: int
    error: str
    created_at: str
    url: str
    retry_url: str = ""


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0][:300] if (text or "").strip() else ""


def _imports():
    for j in ImportJob.objects.order_by("-created_at")[:LIMIT]:
        yield JobRow(
            "import",
            j.pk,
            f"import {j.dataset_name} ({j.format})",
            j.status,
            j.stage,
            j.percent,
            j.done,
            j.total,
            _first_line(j.error),
            j.created_at.isoformat(),
            reverse("retrieval:import_job", args=[j.pk]),
        )


def _audits():
    for r in AuditRun.objects.select_related("dataset").order_by("-created_at")[:LIMIT]:
        retry = reverse("room:audit_retry", args=[r.pk]) if r.status == AuditRun.Status.FAILED else ""
        yield JobRow(
            "audit",
            r.pk,
            f"audit of {r.dataset.name}" + (f" ({r.split})" if r.split else ""),
            r.status,
            r.stage,
            r.percent,
            r.done,
            r.total,
            _first_line(r.error),
            r.created_at.isoformat(),
            reverse("audit:detail", args=[r.pk]),
            retry,
        )


def _exports():
    for e in ExportJob.objects.select_related("study").order_by("-created_at")[:LIMIT]:
        yield JobRow(
            "export",
            e.pk,
            f"export of {e.study.name} ({e.policy})",
            e.status,
            e.stage,
            e.percent,
            e.done,
            e.total,
            _first_line(e.error),
            e.created_at.isoformat(),
            reverse("annotation:export_job", args=[e.pk]),
        )


def _room_imports():
    for j in RoomImportJob.objects.order_by("-created_at")[:LIMIT]:
        yield JobRow(
            "import",
            j.pk,
            f"{j.command} ({', '.join(j.names)})"[:200],
            j.status,
            j.stage,
            j.percent,
            j.done,
            j.total,
            _first_line(j.error),
            j.created_at.isoformat(),
            reverse("room:import_job", args=[j.pk]),
        )


def all_jobs() -> list[JobRow]:
    """The newest jobs of every kind, newest first."""
    rows = [*_imports(), *_room_imports(), *_audits(), *_exports()]
    return sorted(rows, key=lambda r: r.created_at, reverse=True)[:LIMIT]


def jobs_status() -> list[dict]:
    return [asdict(r) for r in all_jobs()]
