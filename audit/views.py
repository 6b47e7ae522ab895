"""Audit pages: list and 'New audit' form, live progress, and the report (researchers and staff)."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET

from config.roles import is_admin, researcher_required
from retrieval.retrievers import pool_kinds
from retrieval.specs import has_random_weights

from .compare import compare_sessions
from .forms import AuditForm, installed_kinds, pool_preview
from .labels import COUNT_HEADINGS
from .models import AuditRun
from .report import build_report
from .runs import aggregation, dispatch, planning


def _latest_done_per_dataset() -> list[AuditRun]:
    latest: dict[int, AuditRun] = {}
    for run in (
        AuditRun.objects.filter(status=AuditRun.Status.DONE).select_related("dataset").order_by("-finished_at", "-pk")
    ):
        latest.setdefault(run.dataset_id, run)
    return sorted(latest.values(), key=lambda r: r.dataset.name)


@researcher_required
def audit_list(request):
    runs = AuditRun.objects.select_related("dataset", "created_by")[:100]
    form = AuditForm() if is_admin(request.user) else None
    return render(
        request,
        "audit/list.html",
        {
            "runs": runs,
            "form": form,
            "table1": aggregation.label_table(_latest_done_per_dataset()),
            "count_headings": COUNT_HEADINGS,
        },
    )


@researcher_required
def audit_new(request):
    if not is_admin(request.user):
        raise PermissionDenied("Only staff start audits.")
    preview = None
    if request.method == "POST":
        form = AuditForm(request.POST)
        if form.is_valid() and "estimate" in request.POST:  # the passes and costs only: nothing is started
            d = form.cleaned_data
            try:
                preview = pool_preview(d["dataset"], d["split"], d["retriever_specs"])
            except ValueError as exc:
                form.add_error("retrievers", str(exc))
        elif form.is_valid():
            d = form.cleaned_data
            try:
                run = planning.create_run(
                    d["dataset"],
                    d["retriever_specs"],
                    split=d["split"],
                    k=d["k"],
                    min_mm_retrievers=d["min_mm_retrievers"],
                    exclude_reference=d["exclude_reference"],
                    created_by=request.user,
                    epsilon=d.get("epsilon"),
                    tau=d.get("tau"),
                    tau_encoder=d.get("tau_encoder") or None,
                )
            except ValueError as exc:
                form.add_error(None, str(exc))
            else:
                dispatch.start_run(run)
                messages.success(request, f"Audit {run.pk} queued.")
                return redirect("audit:detail", pk=run.pk)
    else:
        form = AuditForm()
    return render(request, "audit/new.html", {"form": form, "kinds": installed_kinds(), "preview": preview})


def _status(run: AuditRun) -> dict:
    counts = run.summary.get("counts", {}) if run.status == AuditRun.Status.DONE else {}
    return run.progress_json({"counts": counts} if counts else {}, counts=counts)


@researcher_required
def audit_detail(request, pk: int):
    run = get_object_or_404(AuditRun.objects.select_related("dataset", "created_by"), pk=pk)
    report = build_report(run) if run.status == AuditRun.Status.DONE else None
    compare = None
    if report is not None and report.get("sessions"):
        asked = request.GET.getlist("compare")
        others = [int(v) for v in asked if v.isdigit()] if "compare" in request.GET else None
        compare = compare_sessions(run, others, request.GET.get("strategy"))
    return render(
        request,
        "audit/detail.html",
        {
            "run": run,
            "report": report,
            "status": _status(run),
            "compare": compare,
            "random_retrievers": [r for r in run.retrievers if has_random_weights(r)],
            "pool": pool_kinds(run.retrievers),
        },
    )


@require_GET
@researcher_required
def audit_status(request, pk: int):
    run = get_object_or_404(AuditRun, pk=pk)
    return JsonResponse(_status(run))
