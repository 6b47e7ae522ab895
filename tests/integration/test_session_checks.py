"""The automatic session checks (issue 26) over the real path: an eager audit of a small demo
world computes them, the run's summary counts them, demo_check's session section measures
them against the planted flaws, the validated export's trace carries them, and annotators
never see them."""

from __future__ import annotations

import json

import pytest

from annotation.assignment import queue as engine
from annotation.export.validated import export_study
from annotation.judging.payloads import item_payload
from annotation.management.commands.demo_check import session_checks_report
from annotation.studies.building import StudySpec, create_study
from audit.runs import dispatch, planning
from audit.runs.aggregation import latest_turn_checks, turn_flags
from audit.runs.encoding import clear_memos
from retrieval.demo import SESSION_CHECK_EXPECTED, build_demo_world
from retrieval.loader import load_parsed
from retrieval.models import Dataset, Query, Turn
from retrieval.sessions import CONSISTENCY_CHECKS, NOOP, REFERENCE_CHECKS
from tests.conftest import make_annotator
from tests.integration.test_official_exports import judge_all, session_payload

pytestmark = pytest.mark.django_db

SPECS = ["openclip:cirval-tiny-vit"]


@pytest.fixture
def audited(tmp_path, settings):
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    root = tmp_path / "demo"
    parsed, truth = build_demo_world(root, n_gallery=110, n_single=4, n_sessions=12)
    load_parsed(parsed, "demo", images_root=root)
    clear_memos()
    run = dispatch.run_inline(
        planning.create_run(Dataset.objects.get(name="demo"), SPECS, chunk_queries=5, chunk_gallery=40)
    )
    yield run, truth["queries"]
    clear_memos()


def test_the_audit_computes_counts_and_measures_the_checks(audited):
    run, truth = audited
    assert run.status == "done", run.error
    checks = run.summary["sessions"]["checks"]
    assert set(checks["consistency"]) == set(CONSISTENCY_CHECKS) and set(checks["reference"]) == set(REFERENCE_CHECKS)
    assert checks["thresholds"] == {"noop": 0.995, "duplicate": 0.995, "circle": 0.995, "conflict": 0.3}
    assert checks["conflict_directions"] == "text"
    flags, retro = turn_flags(run)
    ext = dict(Query.objects.filter(n_turns__gt=1).values_list("pk", "external_id"))
    planted_retro = sum(bool(r) for q in ext.values() for r in truth[q]["reference_turns"])
    assert retro == checks["retrospective_turns"] == planted_retro >= 3
    # every turn of every scored session was checked; the counts are those of the flags
    n_turns = Turn.objects.filter(query_id__in=ext).count()
    assert len(flags) == n_turns
    for check in CONSISTENCY_CHECKS:
        hit = [key for key, f in flags.items() if check in f]
        assert checks["consistency"][check] == {"turns": len(hit), "sessions": len({q for q, _ in hit})}
    assert checks["flagged_turns"] == sum(1 for f in flags.values() if f)
    # the planted no-op turns have the very image of their reference: cosine 1, always found
    report = session_checks_report(run, truth)
    assert report["sessions"] == 12
    noop = report["consistency"][NOOP]
    assert noop["planted"] == sum(1 for q in ext.values() if truth[q]["flaw"] in SESSION_CHECK_EXPECTED[NOOP]) >= 2
    assert noop["recall"] == 1.0
    for check, r in report["consistency"].items():
        planted = {
            (q, truth[q]["flaw_turn"]) for q in ext.values() if truth[q]["flaw"] in SESSION_CHECK_EXPECTED[check]
        }
        found = {(ext[q], n) for (q, n), f in flags.items() if check in f}
        assert (r["planted"], r["found"], r["hits"]) == (len(planted), len(found), len(planted & found)), check
    # the demo's retrospective turns were read from their texts; no reference check fired
    assert report["retrospective"] == {"planted": planted_retro, "read": planted_retro, "spurious": 0}
    assert report["reference_flags"] == {c: 0 for c in REFERENCE_CHECKS}


def test_the_export_trace_carries_the_checks_and_annotators_never_see_them(audited, tmp_path):
    run, truth = audited
    # a reference check flagged at import shows too
    turn = Turn.objects.filter(query__n_turns__gt=1, index=2).order_by("query_id").first()
    Turn.objects.filter(pk=turn.pk).update(reference_checks=["refers_to_later_turn"])
    user = make_annotator("solo")
    study, _ = create_study(
        StudySpec(
            name="sessions", datasets=["demo"], rubric="session", overlap=1, seed=1, annotators=["solo"], total=12
        )
    )
    served = engine.next_assignment(study, user).assignment
    body = json.dumps(item_payload(served))
    assert "turn_checks" not in body and '"staff"' not in body and "reference_checks" not in body
    for check in (*CONSISTENCY_CHECKS, *REFERENCE_CHECKS):
        assert f'"{check}"' not in body, check  # not as a value (the texts may say "circle" as a shape)
    staff = item_payload(served, staff=True)
    assert staff["staff"]["turn_checks"] == [
        list(t.reference_checks) for t in served.item.query.turns.order_by("index")
    ]
    judge_all(study, user, session_payload)
    result = export_study(study, tmp_path / "e")
    traces = [
        json.loads(line)
        for f in result.manifest["files"]
        if f["kind"] == "trace"
        for line in (result.path / f["path"]).open()
    ]
    assert traces and all("turn_checks" in t for t in traces)
    expect = latest_turn_checks([t["query"] for t in traces])
    for t in traces:
        assert t["turn_checks"] == json.loads(json.dumps(expect[t["query"]]))
        assert [c["turn"] for c in t["turn_checks"]] == list(range(1, len(t["turn_checks"]) + 1))
    by_query = {t["query"]: t for t in traces}
    if turn.query_id in by_query:
        assert "refers_to_later_turn" in by_query[turn.query_id]["turn_checks"][1]["checks"]
    flagged = [c for t in traces for c in t["turn_checks"] if c["checks"]]
    assert flagged  # the random tiny encoder finds near images everywhere; the planted no-ops at least
