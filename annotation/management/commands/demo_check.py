"""python manage.py demo_check: the demo's audit and human judgements against its truth file.

Prints precision and recall per planted kind: for the newest finished audit of the demo
dataset (:data:`audit.democheck.AUDIT_EXPECTED`) and, where any exist, for the current
judgements of finished assignments (:data:`retrieval.demo.HUMAN_EXPECTED`; a query
counts as flagged when more than half of its judgements raise the flag). The suspicion
section: precision and recall of the top 20 % of the validity study's suspicion queue
(the scores stored on its items) against the planted defects
(:func:`audit.democheck.check_suspicion`).

Also the candidate pool's recall (:func:`pool_report`): of the gallery images that fit a
query (:func:`retrieval.demofit.other_fitting_images`, from the demo's scene truth), the
share its candidate panel holds; and beside it the reachable recall, the share an annotator
reaches who follows the page's rules and ticks every fitting image shown
(:func:`annotation.alternatives.paging.reachable`).
"""

from __future__ import annotations

import json
from collections import defaultdict

from django.core.management.base import BaseCommand, CommandError

from annotation.alternatives.paging import reachable
from annotation.models import Study, StudyItem
from annotation.studies.truth import truth_path
from annotation.verdicts.crowd import compare, demo_truth_validity, labour_table
from annotation.verdicts.readmodel import iter_rows
from annotation.verdicts.state import study_counts
from audit.democheck import check_audit, check_suspicion, circus_lines, circus_tables
from audit.management.commands.audit_report import finished_run
from audit.models import AuditLabel
from audit.report import build_report
from retrieval.demo import check_judgements, check_reference_turns, check_session_flags
from retrieval.demofit import other_fitting_images, pool_recall
from retrieval.models import Image, Query, Turn


def majority_flags(dataset: str) -> dict[str, set[str]]:
    """Query external id -> flags raised by more than half of its counted judgements in the
    studies that hold it (the read model's: late judgements never count)."""
    votes: dict[str, list[dict]] = defaultdict(list)
    for study in Study.objects.filter(items__query__dataset__name=dataset).distinct().order_by("pk"):
        for row in iter_rows(study):
            if row.dataset == dataset and row.votes:
                votes[row.external_id].extend(v.flags for v in row.votes)
    return {q: {f for f in set().union(*v) if 2 * sum(bool(x.get(f)) for x in v) > len(v)} for q, v in votes.items()}


def session_checks_report(run, truth: dict) -> dict | None:
    """The automatic session checks of ``run`` against the demo's planted session flaws: per
    consistency check, precision and recall over the flawed turns; the reference checks' flags
    (none is planted: every flag is a false alarm); the retrospective turns read from the texts.
    None when the run scored no session."""
    from audit.runs.aggregation import turn_flags

    flags, _ = turn_flags(run)
    sessions = {q for q, _ in flags}
    if not sessions:
        return None
    ext = dict(Turn.objects.filter(query_id__in=sessions).values_list("query_id", "query__external_id").distinct())
    named = {(ext[q], n): f for (q, n), f in flags.items()}
    checked = {ext[q]: truth[ext[q]] for q in sessions if ext[q] in truth}
    stored: dict[str, list] = {}
    for q, refs in (
        Turn.objects.filter(query_id__in=sessions)
        .order_by("query_id", "index")
        .values_list("query__external_id", "reference_turns")
    ):
        stored.setdefault(q, []).append(refs or [])
    from retrieval.sessions import REFERENCE_CHECKS

    return {
        "consistency": check_session_flags(checked, named),
        "reference_flags": {c: sum(1 for f in named.values() if c in f) for c in REFERENCE_CHECKS},
        "retrospective": check_reference_turns(checked, stored),
        "sessions": len(checked),
    }


def _write_sessions(out, report: dict | None) -> None:
    """The session section of the text report."""
    if report is None:
        out.write("sessions: the audit scored no session")
        return
    out.write(f"sessions ({report['sessions']} scored; automatic checks per flawed turn)")
    out.write(f"  {'check':<14}{'planted':>8}{'found':>7}{'hits':>6}{'precision':>11}{'recall':>8}")
    for check, s in report["consistency"].items():
        out.write(
            f"  {check:<14}{s['planted']:>8}{s['found']:>7}{s['hits']:>6}"
            f"{_fmt(s['precision']):>11}{_fmt(s['recall']):>8}"
        )
    r = report["retrospective"]
    out.write(
        f"  retrospective turns: {r['read']} of {r['planted']} read with their planted reference, "
        f"{r['spurious']} spurious"
    )
    out.write(
        "  reference check flags (none planted): " + ", ".join(f"{c} {n}" for c, n in report["reference_flags"].items())
    )


def suspicion_report(name: str, kinds: dict[str, str]) -> dict | None:
    """:func:`audit.democheck.check_suspicion` of the demo's validity study (None without one)."""
    study = Study.objects.filter(name=f"{name}-validity").first()
    if study is None:
        return None
    scores = dict(study.items.filter(query__n_turns=1).values_list("query__external_id", "suspicion"))
    return {
        "study": study.name,
        "served_by_suspicion": study.serve_order == Study.ServeOrder.SUSPICION,
        **check_suspicion(kinds, scores),
    }


def write_suspicion(out, report: dict | None) -> None:
    """The suspicion section of the text report."""
    if report is None:
        out.write("suspicion: no validity study")
        return
    first = report["planted"]
    out.write(f"suspicion (study {report['study']}: top {first['share']:.0%} of a queue of {first['queue']})")
    out.write(f"  {'defects':<14}{'planted':>8}{'top':>7}{'hits':>6}{'precision':>11}{'recall':>8}")
    for name in ("planted", "human"):
        s = report[name]
        out.write(
            f"  {name:<14}{s['planted']:>8}{s['found']:>7}{s['hits']:>6}{_fmt(s['precision']):>11}{_fmt(s['recall']):>8}"
        )


def _pool_figures(name: str, truth: dict, pools: dict[str, list[int]]) -> dict:
    """:func:`retrieval.demofit.pool_recall` of ``pools`` (query external id -> image pks in
    panel order), and under ``reachable`` the same of what the page's rules reach of them."""
    images = Image.objects.filter(dataset__name=name)
    ext = dict(images.filter(pk__in={i for p in pools.values() for i in p}).values_list("pk", "external_id"))
    scenes = {e: x["scene"] for e, x in images.values_list("external_id", "extra") if x and "scene" in x}
    named = {q: [ext[i] for i in p if i in ext] for q, p in pools.items()}
    report = pool_recall(truth["queries"], scenes, named)
    reached = {
        q: reachable(p, other_fitting_images(truth["queries"][q], scenes))
        for q, p in named.items()
        if q in truth["queries"]
    }
    return {
        **report,
        "panel_size": max((len(p) for p in pools.values()), default=0),
        "reachable": pool_recall(truth["queries"], scenes, reached),
    }


def audited_pools(name: str, depth: int) -> dict[str, list[int]]:
    """The panel (:func:`audit.runs.panels.candidate_panel`, ``depth`` deep, from the newest
    audit that ranked it: :func:`audit.runs.panels.latest_pool_rankings`) of every single-turn
    query of the demo, whether or not a study holds it."""
    from audit.runs.panels import batch_exclusions, candidate_panel, gallery_ids, latest_pool_rankings
    from retrieval.galleries import query_gallery_keys

    queries = {q.pk: q for q in Query.objects.filter(dataset__name=name, n_turns=1).select_related("dataset")}
    ranked = latest_pool_rankings(list(queries))
    excluded, keys, galleries = batch_exclusions(list(ranked)), query_gallery_keys(list(ranked)), {}
    out = {}
    for qid, (_run, lists) in ranked.items():
        key = keys.get(qid)
        if key not in galleries:
            galleries[key] = gallery_ids(queries[qid])
        out[queries[qid].external_id] = candidate_panel(queries[qid], lists, depth, galleries[key], excluded[qid]).ids
    return out


def pool_report(name: str, truth: dict) -> dict | None:
    """Pool recall on the demo's truth (:func:`retrieval.demofit.pool_recall`), found / fitting
    per planted kind and in all: ``panels``, over the stored candidate panels of every study
    item of the demo (what annotators are shown; one pool per query, the union over studies);
    ``audited``, over the panel the same function gives every single-turn query an audit ranked,
    as deep as the studies' panels (a study holds only some of them). None without a panel."""
    pools: dict[str, list[int]] = defaultdict(list)
    for qid, panel in (
        StudyItem.objects.filter(query__dataset__name=name, query__n_turns=1)
        .exclude(candidates_source="")
        .order_by("pk")
        .values_list("query__external_id", "candidates")
    ):
        pools[qid] += [c for c in panel if c not in pools[qid]]  # the first study's order, then the others' new ones
    if not pools:
        return None
    panels = _pool_figures(name, truth, pools)
    return {**panels, "audited": _pool_figures(name, truth, audited_pools(name, panels["panel_size"]))}


def _write_pool(out, pool: dict | None) -> None:
    """The pool section of the text report (issue 25 item 1)."""
    if pool is None:
        out.write("pool recall: no candidate panel stored yet")
        return
    audited = pool["audited"]
    out.write(
        f"pool recall ({pool['queries']} queries with a panel, up to {pool['panel_size']} candidates): "
        f"{pool['found']} of {pool['fitting']} fitting images = {_fmt(pool['recall'])}; "
        f"over all {audited['queries']} audited queries: {audited['found']} of {audited['fitting']} = "
        f"{_fmt(audited['recall'])}"
    )
    out.write(
        f"reachable recall (ticking every fitting image shown, no page opened at will): "
        f"{pool['reachable']['found']} of {pool['fitting']} = {_fmt(pool['reachable']['recall'])}; "
        f"over all audited queries: {audited['reachable']['found']} of {audited['fitting']} = "
        f"{_fmt(audited['reachable']['recall'])}"
    )
    out.write(
        f"  {'kind':<14}{'queries':>8}{'fitting':>8}{'pool':>7}{'reached':>8}{'pool':>7}{'reach':>7}"
        "   all audited queries: pool, reached"
    )
    empty = {"queries": 0, "fitting": 0, "found": 0, "recall": None}
    for kind, a in audited["by_kind"].items():
        s = pool["by_kind"].get(kind, empty)
        r = pool["reachable"]["by_kind"].get(kind, empty)
        ar = audited["reachable"]["by_kind"].get(kind, empty)
        out.write(
            f"  {kind:<14}{s['queries']:>8}{s['fitting']:>8}{s['found']:>7}{r['found']:>8}{_fmt(s['recall']):>7}"
            f"{_fmt(r['recall']):>7}   {a['found']}, {ar['found']} of {a['fitting']} ({a['queries']} queries) "
            f"{_fmt(a['recall'])}, {_fmt(ar['recall'])}"
        )


def _fmt(v) -> str:
    return "   -" if v is None else f"{v:.2f}"


class Command(BaseCommand):
    help = "Precision and recall of the demo audit's labels (and human judgements) per planted query kind."

    def add_arguments(self, parser):
        parser.add_argument("--name", default="demo")
        parser.add_argument("--format", choices=["json", "text"], default="text")

    def handle(self, *args, **opts):
        path = truth_path(opts["name"])
        if not path.exists():
            raise CommandError(f"no truth file at {path}: run make_demo first")
        truth = json.loads(path.read_text(encoding="utf-8"))
        kinds = {q: t["kind"] for q, t in truth["queries"].items()}
        run = finished_run(None, opts["name"])
        rows = AuditLabel.objects.filter(run=run).values_list("query__external_id", "label", "detail")
        labels = {q: label for q, label, _ in rows}
        details = {q: detail for q, _, detail in rows}
        report = {
            "run": run.pk,
            "audit": check_audit(kinds, labels, details),
            "sessions": session_checks_report(run, truth["queries"]),
        }
        flags = majority_flags(opts["name"])
        if flags:
            report["human"] = check_judgements(kinds, flags)
        report["labour"] = labour_report(truth, opts["name"])
        report["suspicion"] = suspicion_report(opts["name"], kinds)
        report["pool"] = pool_report(opts["name"], truth)
        report["circus"] = circus_tables(build_report(run)["subsets"], list(run.retrievers))
        if opts["format"] == "json":
            self.stdout.write(json.dumps(report, indent=2))
            return
        for part in ("audit", "human"):
            if part not in report:
                self.stdout.write(f"{part}: no finished judgements yet")
                continue
            self.stdout.write(
                f"{part} (audit {run.pk})" if part == "audit" else f"{part} ({len(flags)} judged queries)"
            )
            self.stdout.write(f"  {'kind':<14}{'planted':>8}{'found':>7}{'hits':>6}{'precision':>11}{'recall':>8}")
            for kind, s in report[part].items():
                self.stdout.write(
                    f"  {kind:<14}{s['planted']:>8}{s['found']:>7}{s['hits']:>6}"
                    f"{_fmt(s['precision']):>11}{_fmt(s['recall']):>8}"
                )
        _write_sessions(self.stdout, report["sessions"])
        self.write_labour(report["labour"])
        write_suspicion(self.stdout, report["suspicion"])
        _write_pool(self.stdout, report["pool"])
        self.stdout.write(f"CIRCUS's tables (audit {run.pk}; the validated subset once a study's export wrote it)")
        for line in circus_lines(report["circus"], run.k):
            self.stdout.write(line)

    def write_labour(self, labour: dict) -> None:
        """Issue 25 item 5: the simulated crowd's labour figures, and the demo studies' own."""
        self.stdout.write(
            f"labour (simulated crowd on the demo truth: {labour['items']} items x {labour['repeats']} crowds; "
            "bench/labour.py)"
        )
        self.stdout.write(f"  {'strategy':<30}{'judgements':>11}{'share':>7}{'val. acc.':>10}{'accuracy':>9}")
        for r in labour["strategies"]:
            self.stdout.write(
                f"  {r['strategy']:<30}{r['judgements']:>11}{r['judgements_share']:>7.0%}"
                f"{r['validated_accuracy']:>10.4f}{r['accuracy']:>9.4f}"
            )
        for name, figures in labour["studies"].items():
            self.stdout.write(
                f"  study {name}: {figures['spent']} judgements spent, "
                + (
                    f"{figures['saved']} saved by adaptive overlap"
                    if figures["adaptive"]
                    else "fixed overlap (nothing saved)"
                )
            )


LABOUR_REPEATS = 20


def labour_report(truth: dict, dataset: str, repeats: int = LABOUR_REPEATS) -> dict:
    """The labour figures: each strategy of :mod:`annotation.verdicts.crowd` on the demo truth
    (the same simulation as bench/labour.py), and the judgements spent and saved by the studies
    of the demo dataset (:func:`annotation.verdicts.state.study_counts`)."""
    validity = demo_truth_validity(truth)
    rows = labour_table(compare(validity, repeats=repeats))
    studies = {
        s.name: study_counts(s)["labour"]
        for s in Study.objects.filter(items__query__dataset__name=dataset).distinct().order_by("name")
    }
    return {"items": len(validity), "repeats": repeats, "strategies": rows, "studies": studies}
