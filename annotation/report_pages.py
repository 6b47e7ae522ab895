"""Researcher and staff pages: agreement reports (inline SVG heatmaps, CSV/JSON downloads),
the adjudication queue and decision page, and validated exports with their progress.

Access: reports for researchers and staff (annotators get 403; researchers who are not
staff see annotators as ``annotator_NN``); adjudication and exports for staff only (403 for
everyone else, also on the status and download URLs).
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from typing import Any

from django.contrib import messages
from django.core.cache import cache
from django.http import Http404, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import mark_safe
from django.utils.text import slugify
from django.views.decorators.http import require_POST

from annotation import roles
from annotation.agreement.intervals import attach_intervals, interval_options
from annotation.agreement.maths import CONSTANT_PAIR_CONVENTIONS
from annotation.agreement.reports import ReportError, default_bootstrap, report_csv_rows, safe_rows, study_report
from annotation.core.consensus import POLICIES
from annotation.export.downloads import job_file_response
from annotation.judging.payloads import image_ref
from annotation.models import Adjudication, ExportJob, Study, StudyItem
from annotation.studies.suspicion_scores import part_rows
from annotation.verdicts.adjudication import adjudicate, adjudication_queue
from annotation.verdicts.readmodel import Verdicts, decide_row, has_verdicts, item_row
from annotation.verdicts.state import study_counts, study_version
from audit.charts import heatmap_svg
from config.figures import fixed
from config.parsing import query_int
from config.roles import researcher_required, staff_required
from retrieval.jobs.sending import QUEUE_DOWN, enqueue
from retrieval.models import Image

# --------------------------------------------------------------------------- access


# --------------------------------------------------------------------------- table cells


def fmt(value: Any, digits: int = 3) -> str:
    """A number for a table cell; ``undefined`` for a null coefficient."""
    if value is None:
        return "undefined"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


# --------------------------------------------------------------------------- reports


def _policy(request, study: Study) -> tuple[str, str | None]:
    policy = request.GET.get("policy") or study.consensus  # default: the study's consensus option
    if policy not in POLICIES:
        raise Http404("unknown consensus policy")
    primary = (request.GET.get("primary") or None) if roles.is_admin(request.user) else None
    return policy, primary


def _bootstrap(request, study: Study) -> tuple[int, int]:
    """(replicates, seed) of the report's intervals: ``?bootstrap=N&seed=S``, default
    :func:`default_bootstrap` (1000 but for very large studies) and 0."""
    # whole numbers of ASCII digits (config.parsing.query_int): ?seed=-1 or a 5,000-digit
    # seed is a 400 naming the parameter (numpy refuses negative seeds)
    n_boot = query_int(request, "bootstrap")
    n_boot = default_bootstrap(study) if n_boot is None else n_boot
    seed = query_int(request, "seed") or 0
    if not 0 <= n_boot <= 10_000:
        raise Http404("bootstrap must lie between 0 and 10000")
    return n_boot, seed


REPORT_CACHE_SECONDS = 7 * 24 * 3600  # keyed by the study's version: a change makes a new key


def _report(request, study: Study) -> dict[str, Any]:
    """The one report behind the page, report.json and report.csv (same query, same numbers).

    The point figures are computed here (no bootstrap) and cached under the request's options
    and :func:`annotation.verdicts.state.study_version`, which changes with every judgement,
    adjudication or setting: a cached report is never stale. The bootstrap intervals are a
    worker's (:mod:`annotation.agreement.intervals`): shown only when computed for this very
    version, else the report says they are being updated and a worker is asked for them."""
    policy, primary = _policy(request, study)
    n_boot, seed = _bootstrap(request, study)
    options = {
        "policy": policy,
        "primary": primary,
        "pseudonymise": not roles.is_admin(request.user),
        "dimension": request.GET.get("dimension") or None,
        "n_boot": 0,
        "seed": seed,
        "constant_pairs": request.GET.get("constant_pairs") or "undefined",
    }
    version = study_version(study)
    digest = hashlib.sha256(json.dumps([version, options], sort_keys=True).encode()).hexdigest()
    key = f"cirval:report:{study.pk}:{digest}"
    report = cache.get(key)
    try:
        if report is None:
            report = study_report(study, **options)
            report["alternatives"] = _alternatives(request, study)
            cache.set(key, report, REPORT_CACHE_SECONDS)
        wanted = interval_options(
            study, dimension=options["dimension"], n_boot=n_boot, seed=seed, constant_pairs=options["constant_pairs"]
        )
    except ReportError as exc:
        raise Http404(str(exc)) from None
    return attach_intervals(report, study, wanted, version)


def _alternatives(request, study: Study) -> dict[str, Any] | None:
    """Per-candidate agreement and accepted alternatives, for studies with candidate panels."""
    from annotation.agreement.reports import annotator_pseudonyms
    from annotation.alternatives.study import alternatives_report

    if study.rubric.rubric.kind == "session" or not study.items.exclude(candidates=[]).exists():
        return None
    names = {} if roles.is_admin(request.user) else annotator_pseudonyms(study)
    return alternatives_report(study, names)


@researcher_required
def report_list(request):
    studies = Study.objects.select_related("rubric").order_by("-created_at")
    rows = [(s, s.n_items) for s in studies]
    return render(request, "annotation/report_list.html", {"rows": rows})


def _ci(a: dict[str, Any], key: str) -> str:
    """``[low, high]`` of a coefficient's bootstrap interval, or '' (none / undefined)."""
    iv = a["confidence_intervals"]["intervals"].get(key)
    return f"[{fixed(iv['low'], 3)}, {fixed(iv['high'], 3)}]" if iv else ""


def _kappa_label(pc: dict[str, Any]) -> str:
    weights = "unweighted" if pc["weights"] == "none" else f"{pc['weights']} weights"
    return f"Mean Cohen's kappa ({weights}; {pc['count']} of {pc['n_pairs']} pairs)"


#: What each headline figure measures, shown beside it (the formulas: the report's conventions,
#: :data:`annotation.agreement.maths.CONVENTIONS`, listed under the figures).
FIGURE_HELP: dict[str, str] = {
    "items": "items with two or more counted judgements: the only ones agreement is measured on",
    "annotators": "annotators with a counted judgement on one of those items",
    "judgements": "counted judgements on those items (revisions count once: the current one)",
    "percent": "per item, the share of pairs of judgements that agree, averaged over items; no allowance for chance",
    "alpha": "Krippendorff's alpha: 1 − observed / expected disagreement; 1 perfect, 0 chance, missing judgements allowed",
    "fleiss": "Fleiss' kappa: chance-corrected agreement of many raters; defined only when every item has as many judgements",
    "ac1": "Gwet's AC1: chance-corrected like kappa, but not dragged down when one label dominates; Q = the labels "
    "possible (for validity, the 17 signatures: valid, or a combination of the four flags, or unspecified)",
    "cohen": "Cohen's kappa of every pair of annotators on the items both judged, averaged over pairs",
    "valid_rate": "share of all judgements that validate the item",
    "binary_alpha": "Krippendorff's alpha on valid / invalid only (every invalid signature one label)",
    "binary_fleiss": "Fleiss' kappa on valid / invalid only",
    "signature_alpha": "Krippendorff's alpha on the full signature: the same figure as the alpha above (its interval is "
    "that one's), named for comparison with CIRCUS",
}

#: How to read a chance-corrected coefficient, shown under the figures.
READING = (
    "1 is perfect agreement, 0 what chance alone gives, below 0 worse than chance. Krippendorff (2004) asks "
    "for alpha ≥ 0.800 before relying on the data and ≥ 0.667 for tentative conclusions; Landis and Koch's "
    "(1977) bands for kappa: 0.41–0.60 moderate, 0.61–0.80 substantial, 0.81–1 almost perfect."
)


def _headline(a: dict[str, Any]) -> list[tuple[str, Any, str, str, str]]:
    """(label, value, 95% interval, why it is undefined or '', what it measures) of the report's
    headline figures."""
    why = a["undefined"]
    h = FIGURE_HELP
    headline = [
        ("Items (2+ judgements)", a["n_items"], "", "", h["items"]),
        ("Annotators", a["n_annotators"], "", "", h["annotators"]),
        ("Judgements", a["n_judgements"], "", "", h["judgements"]),
        (
            "Percent agreement",
            fmt(a["percent_agreement"]),
            _ci(a, "percent_agreement"),
            why.get("percent_agreement", ""),
            h["percent"],
        ),
        (
            f"Krippendorff's alpha ({a['level']})",
            fmt(a["krippendorff_alpha"]),
            _ci(a, "krippendorff_alpha"),
            why.get("krippendorff_alpha", ""),
            h["alpha"],
        ),
        ("Fleiss' kappa", fmt(a["fleiss_kappa"]), _ci(a, "fleiss_kappa"), why.get("fleiss_kappa", ""), h["fleiss"]),
        (
            f"Gwet's AC1 (Q = {a['n_categories']})",
            fmt(a["gwet_ac1"]),
            _ci(a, "gwet_ac1"),
            why.get("gwet_ac1", ""),
            h["ac1"],
        ),
        (
            _kappa_label(a["pairwise_cohen"]),
            fmt(a["pairwise_cohen"]["mean"]),
            _ci(a, "pairwise_cohen_mean"),
            why.get("pairwise_cohen", ""),
            h["cohen"],
        ),
    ]
    if "binary_valid_invalid" in a:
        headline += _binary_headline(a, why)
    return headline


def _binary_headline(a: dict[str, Any], why: dict[str, str]) -> list[tuple[str, Any, str, str, str]]:
    b, h = a["binary_valid_invalid"], FIGURE_HELP
    return [
        ("Valid rate", fmt(b["valid_rate"]), "", "", h["valid_rate"]),
        (
            "Binary alpha",
            fmt(b["krippendorff_alpha_nominal"]),
            _ci(a, "binary_valid_invalid.krippendorff_alpha_nominal"),
            why.get("binary_valid_invalid.krippendorff_alpha_nominal", ""),
            h["binary_alpha"],
        ),
        (
            "Binary Fleiss' kappa",
            fmt(b["fleiss_kappa"]),
            _ci(a, "binary_valid_invalid.fleiss_kappa"),
            why.get("binary_valid_invalid.fleiss_kappa", ""),
            h["binary_fleiss"],
        ),
        _signature_alpha(a, why),
    ]


def _signature_alpha(a: dict[str, Any], why: dict[str, str]) -> tuple[str, Any, str, str, str]:
    """Krippendorff's alpha on the full signature: the headline alpha itself when that is taken on the
    signature (then its interval too), else a figure of its own."""
    same = a["signature_alpha_nominal"] == a["krippendorff_alpha"]
    what = FIGURE_HELP["signature_alpha"] if same else "Krippendorff's alpha on the full signature as a nominal label"
    return (
        "Signature alpha",
        fmt(a["signature_alpha_nominal"]),
        _ci(a, "krippendorff_alpha") if same else "",
        why.get("signature_alpha_nominal", ""),
        what,
    )


@researcher_required
def report_page(request, study_id: int):
    study = get_object_or_404(Study.objects.select_related("rubric"), pk=study_id)
    report = _report(request, study)
    p = report["pairwise"]
    kappa_svg = heatmap_svg(
        p["annotators"],
        p["cohen_kappa"],
        title=f"Pairwise Cohen's kappa ({p['kappa_of']})",
        vmin=-1.0,
        vmax=1.0,
        shared=p["shared_items"],
        element_id="heatmap-kappa",
    )
    agree_svg = heatmap_svg(
        p["annotators"],
        p["signature_agreement"],
        title="Pairwise agreement on the full signature (share of shared items)",
        vmin=0.0,
        vmax=1.0,
        shared=p["shared_items"],
        element_id="heatmap-signature",
    )
    a = report["agreement"]
    headline = _headline(a)
    columns = [k for k in (report["categories"][0] if report["categories"] else {}) if k != "category"]
    categories = [(row["category"], [fmt(row[k]) for k in columns]) for row in report["categories"]]
    heading = {
        "chosen_share": "Chosen share",
        "prevalence": "Prevalence",
        "krippendorff_alpha": "Alpha",
        "fleiss_kappa": "Fleiss' kappa",
        "gwet_ac1": "Gwet's AC1",
        "pairwise_cohen_mean": "Mean Cohen's kappa",
        "n": "Judgements",
        "mean": "Mean",
        "items": "Items",
        "n_judgements": "Judgements",
        "n_items": "Items (2+)",
        "percent_agreement": "Percent agreement",
        "valid_rate": "Valid rate",
        "binary_alpha": "Binary alpha",
        "binary_fleiss": "Binary Fleiss",
        "kind": "Level and weights",
        "kappa_weights": "Kappa weights",
        "kappa_pairs": "Pairs in the kappa mean",
    }
    breakdown_cols = [
        "items",
        "n_judgements",
        "percent_agreement",
        "krippendorff_alpha",
        "pairwise_cohen_mean",
        "kappa_pairs",
    ]
    if report["study"]["kind"] == "validity":
        breakdown_cols += ["valid_rate", "binary_alpha", "binary_fleiss"]
    breakdowns = []
    for title, key in (("By dataset", "by_dataset"), ("By hidden audit category", "by_hidden_category")):
        rows = []
        for group, entry in report[key].items():
            cells = [fmt(entry.get(c)) for c in breakdown_cols]
            consensus = entry.get("consensus")
            rows.append((group, cells, consensus))
        breakdowns.append((title, key, rows))
    turn_cols = [
        "n_items",
        "n_judgements",
        "valid_rate",
        "percent_agreement",
        "krippendorff_alpha",
        "fleiss_kappa",
        "gwet_ac1",
        "pairwise_cohen_mean",
        "kappa_pairs",
    ]
    turns = None
    if report.get("turns"):
        t = report["turns"]
        turns = [
            (name, [fmt(row.get(c)) for c in turn_cols], row["consensus"])
            for name, row in [
                ("Session (derived verdict)", t["session"]),
                *((f"Turn {p['turn']}", p) for p in t["positions"]),
            ]
        ]
    confusion = None
    if report["confusion"]:
        conf = report["confusion"]
        confusion = {
            "columns": conf["columns"],
            "rows": [
                (name, list(zip(conf["rows"], e["matrix"])), fmt(e["agreement_with_consensus"]), e["n"])
                for name, e in conf["by_annotator"].items()
            ],
        }
    return render(
        request,
        "annotation/report.html",
        {
            "study": study,
            "report": report,
            "headline": headline,
            "reading": READING,
            "kappa_svg": mark_safe(kappa_svg),
            "agree_svg": mark_safe(agree_svg),
            "category_columns": [heading.get(c, c) for c in columns],
            "categories": categories,
            "breakdown_cols": [heading.get(c, c) for c in breakdown_cols],
            "breakdowns": breakdowns,
            "confusion": confusion,
            "turns": turns,
            "turn_cols": [heading.get(c, c) for c in turn_cols],
            "policies": POLICIES,
            "policy": report["consensus"]["policy"] if report["consensus"] else None,
            "query": request.GET.urlencode(),
            "constant_pairs": CONSTANT_PAIR_CONVENTIONS,
            "ci": report["agreement"]["confidence_intervals"],
            "intervals_state": report["agreement"]["intervals_state"]["state"],
        },
    )


def _download_name(study: Study, ext: str) -> str:
    return f"{slugify(study.name) or 'study'}-report.{ext}"


@researcher_required
def report_json(request, study_id: int):
    study = get_object_or_404(Study.objects.select_related("rubric"), pk=study_id)
    report = _report(request, study)
    response = HttpResponse(json.dumps(report, indent=2, allow_nan=False), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{_download_name(study, "json")}"'
    return response


class _Echo:
    def write(self, value: str) -> str:
        return value


@researcher_required
def report_csv(request, study_id: int):
    study = get_object_or_404(Study.objects.select_related("rubric"), pk=study_id)
    report = _report(request, study)
    writer = csv.writer(_Echo())
    response = StreamingHttpResponse(
        (writer.writerow(r) for r in safe_rows(report_csv_rows(report))), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{_download_name(study, "csv")}"'
    return response


# --------------------------------------------------------------------------- adjudication


def _adjudicable(study_id: int) -> Study:
    """A study whose items have a validated / rejected verdict: category rubrics with a
    validated category, and session rubrics (decided by their session rule)."""
    study = get_object_or_404(Study.objects.select_related("rubric"), pk=study_id)
    if not has_verdicts(study.rubric.rubric):
        raise Http404("this study's rubric has no validated / rejected verdict to adjudicate")
    return study


@staff_required
def adjudication_queue_page(request, study_id: int):
    study = _adjudicable(study_id)
    entries = adjudication_queue(study)
    waiting = sum(1 for e in entries if not e.adjudicated)
    return render(
        request, "annotation/adjudication_queue.html", {"study": study, "entries": entries, "waiting": waiting}
    )


@staff_required
def adjudication_item_page(request, study_id: int, item_id: int):
    study = _adjudicable(study_id)
    item = get_object_or_404(StudyItem.objects.select_related("query__dataset"), pk=item_id, study=study)
    if request.method == "POST" and request.POST.get("candidate"):
        return _decide_candidate(request, study, item)
    if request.method == "POST":
        decision = request.POST.get("decision")
        if decision not in (Adjudication.Decision.VALIDATED, Adjudication.Decision.REJECTED):
            return HttpResponse("decision must be 'validated' or 'rejected'", status=400, content_type="text/plain")
        note = request.POST.get("note", "")
        adjudicate(study, item, decision == Adjudication.Decision.VALIDATED, note, request.user)
        messages.success(request, f"{item.query.dataset.name}::{item.query.external_id}: {decision}.")
        nxt = next((e for e in adjudication_queue(study) if not e.adjudicated), None)
        if nxt is not None:
            return redirect("annotation:adjudication_item", study_id=study.pk, item_id=nxt.row.item_id)
        return redirect("annotation:adjudication", study_id=study.pk)
    row = item_row(study, item.pk)
    assert row is not None
    verdicts = Verdicts.of(study)
    before = decide_row(row, verdicts, with_adjudication=False)
    history = Adjudication.objects.filter(item=item).select_related("decided_by").order_by("-decided_at", "-id")
    query = item.query
    turns = list(query.turns.select_related("reference_image"))
    targets = query.positive_targets(query.targets.select_related("image"))  # the format's target rule
    return render(
        request,
        "annotation/adjudication_item.html",
        {
            "study": study,
            "item": item,
            "row": row,
            "decision": before,
            "history": history,
            "turns": [(t, image_ref(t.reference_image)) for t in turns],
            "targets": [image_ref(t.image) for t in sorted(targets, key=lambda t: (not t.is_primary, t.pk))],
            "rubric": study.rubric.rubric,
            **_candidate_groups(_candidate_rows(study, item)),
            "session_rule": verdicts.describe_session(),
            "suspicion": part_rows(item.suspicion_parts) if item.suspicion_parts else [],
        },
    )


def _decide_candidate(request, study: Study, item: StudyItem):
    """An adjudicator accepts or refuses one candidate of the item as an extra ground truth."""
    from annotation.alternatives.study import decide_candidate

    try:
        image = int(request.POST["candidate"])
        decide_candidate(
            study, item, image, request.POST.get("accept") == "1", request.user, request.POST.get("note", "")
        )
    except ValueError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    messages.success(request, f"Candidate {image}: {'accepted' if request.POST.get('accept') == '1' else 'refused'}.")
    return redirect("annotation:adjudication_item", study_id=study.pk, item_id=item.pk)


def _candidate_groups(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The page's candidates: those with a tick or a decision first, the rest (nobody ticked them)
    folded, so a panel of 50 does not make the page thousands of pixels tall."""
    return {
        "candidates": rows,
        "candidates_seen": [r for r in rows if r["alt"]],
        "candidates_untouched": [r for r in rows if not r["alt"]],
    }


def _candidate_rows(study: Study, item: StudyItem) -> list[dict[str, Any]]:
    """The item's candidates with votes and outcome under the study's rule (ticked first)."""
    from annotation.alternatives.study import study_alternatives

    outcome = {a.image: a for a in study_alternatives(study, [item.pk]).get(item.pk, [])}
    images = Image.objects.in_bulk(item.candidates)
    rows = [{"ref": image_ref(images[i], 160), "alt": outcome.get(i)} for i in item.candidates if i in images]
    return sorted(rows, key=lambda r: -(r["alt"].votes if r["alt"] else -1))


# --------------------------------------------------------------------------- exports


@staff_required
@require_POST
def export_start(request, study_id: int):
    study = get_object_or_404(Study.objects.select_related("rubric"), pk=study_id)
    from annotation.export.validated import ExportError, check_exportable
    from annotation.tasks import RUN_EXPORT

    policy = request.POST.get("policy") or "majority"
    primary = (request.POST.get("primary") or "").strip() if policy == "primary" else ""
    query_format = request.POST.get("format") or "mbeir"
    sessions = request.POST.get("sessions") or "whole"
    try:
        check_exportable(study, policy, primary or None, query_format, sessions)
    except ExportError as exc:
        messages.error(request, str(exc))
        return redirect(_back(request, study))
    job = ExportJob.objects.create(
        study=study,
        policy=policy,
        primary=primary,
        query_format=query_format,
        sessions=sessions,
        created_by=request.user,
        total=study.n_items,
    )
    if not enqueue(ExportJob, job.pk, RUN_EXPORT):
        messages.warning(request, QUEUE_DOWN)
    return redirect("annotation:export_job", pk=job.pk)


def _back(request, study: Study) -> str:
    """Where a refused export goes: the page the form was on (``back``: a path of this site,
    ``/...``, as the forms send ``request.path``), else the study's exports page. A bare word
    (``progress``) is no path: ``redirect`` would take it for a URL name and raise a 500."""
    back = request.POST.get("back") or ""
    if (
        back.startswith("/")
        and not back.startswith("//")
        and url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()})
    ):
        return back
    return reverse("annotation:export_list", args=[study.pk])


@staff_required
def export_job_page(request, pk: int):
    job = get_object_or_404(ExportJob.objects.select_related("study"), pk=pk)
    return render(request, "annotation/export_job.html", {"job": job})


@staff_required
def export_job_status(request, pk: int):
    job = get_object_or_404(ExportJob, pk=pk)
    report = {}
    if job.status == ExportJob.Status.DONE:
        report = {
            "folder": Path(job.path).name,
            "counts": job.manifest.get("counts", {}),
            "files": {f["path"]: f["sha256"] for f in job.manifest.get("files", [])},
        }
    return JsonResponse(
        job.progress_json(report, files=[reverse("annotation:export_file", args=[job.pk, name]) for name in job.files])
    )


@staff_required
def export_file(request, pk: int, name: str):
    """One file of a finished export; only the names the job recorded are served."""
    job = get_object_or_404(ExportJob, pk=pk, status=ExportJob.Status.DONE)
    return job_file_response(Path(job.path), name, job.files)


@staff_required
def export_list(request, study_id: int):
    study = _adjudicable(study_id)
    return render(
        request,
        "annotation/export_list.html",
        {"study": study, "jobs": study.exports.all()[:50], "policies": POLICIES, "verdicts": study_counts(study)},
    )
