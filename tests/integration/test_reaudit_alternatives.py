"""Alternatives accepted in a study become extra targets; a re-audit shows Recall@K before and after."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from annotation.alternatives.study import decide_candidate
from annotation.assignment import queue as engine
from annotation.judging.panel_fill import fill_study_candidates
from annotation.models import StudyItem
from annotation.studies.building import StudySpec, create_study
from audit.alternatives import ALTERNATIVE_ROLE
from audit.models import AuditLabel, AuditRank
from audit.report import build_report
from audit.runs import dispatch, planning
from audit.runs.encoding import clear_memos
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from retrieval.models import Target
from tests.conftest import make_annotator

pytestmark = pytest.mark.django_db
SPEC = "openclip:cirval-tiny-vit"
K = 10  # the audit's default K (AUDIT_K)


def test_alternatives_turn_failures_into_hits_in_the_reaudit(tmp_path, settings, client):
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=60, n_single=12, n_sessions=1), "demo", images_root=root)
    clear_memos()
    first = dispatch.run_inline(planning.create_run("demo", [SPEC]))
    assert first.status == "done", first.error
    unresolved = set(AuditLabel.objects.filter(run=first, label="unresolved").values_list("query_id", flat=True))
    assert len(unresolved) >= 2
    user = make_annotator("solo")
    study, _ = create_study(
        StudySpec(
            name="alts",
            datasets=["demo"],
            overlap=1,
            annotators=["solo"],
            hidden_categories=["unresolved"],
            candidates=40,
        )
    )
    fill_study_candidates(study.pk)
    items = list(StudyItem.objects.filter(study=study))
    assert {i.query_id for i in items} == unresolved
    # The panel fuses every list of the pool (multimodal, text, image, near the target), so
    # the candidates that become hits are those the multimodal ranking puts within K: the
    # annotator ticks the first such candidate of every item whose panel has one, but one item;
    # an adjudicator accepts the second such candidate of that one. (With the demo's
    # random-weight model some panels hold none: those items stay misses.)
    top_k = {q: set(top[:K]) for q, top in AuditRank.objects.filter(run=first).values_list("query_id", "top_mm")}

    def within_k(item):
        return [c for c in item.candidates if c in top_k[item.query_id]]

    adjudicated = next(i for i in items if len(within_k(i)) >= 2)
    hits = [i for i in items if within_k(i)]
    assert len(hits) >= 2

    while (a := engine.next_assignment(study, user).assignment) is not None:
        ticks = within_k(a.item)[:1] if a.item_id != adjudicated.pk else []
        engine.submit(a, {"category": "VALIDATED", "time_spent_ms": 5, "alternatives": ticks})
    decide_candidate(study, adjudicated, within_k(adjudicated)[1], True, None)
    out = StringIO()
    call_command("apply_alternatives", "--study", str(study.pk), stdout=out)
    assert f"{len(hits)} alternatives added" in out.getvalue()
    alts = Target.objects.filter(role=ALTERNATIVE_ROLE)
    assert alts.count() == len(hits) and not alts.filter(is_primary=True).exists()
    assert "adjudicated" in alts.get(query_id=adjudicated.query_id).source_field

    second = dispatch.run_inline(planning.create_run("demo", [SPEC]))
    report = build_report(second)["alternatives"]
    # the queries that gained alternatives are compared
    assert report["earlier_run"] == first.pk and report["n_queries"] == len(hits)
    row = report["rows"][0]
    # unresolved before: no target within K; after: each gained a candidate from the top of the ranking
    assert row["recall_at_k_before"] == 0.0 and row["recall_at_k_after"] == 1.0
    assert build_report(first)["alternatives"] is None  # no earlier audit to compare with
    get_user_model().objects.create_superuser("boss", password="pw")
    client.login(username="boss", password="pw")
    html = client.get(f"/audits/{second.pk}/").content.decode()
    assert "Before and after annotators" in html and "1.000" in html
    clear_memos()
