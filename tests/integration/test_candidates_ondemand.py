"""A study without an audit gets its candidate panels from one retriever run on demand."""
from __future__ import annotations

import re

import pytest

from annotation.judging.candidates import item_candidates
from annotation.models import StudyItem
from annotation.studies.building import StudySpec, create_study
from audit.runs.encoding import clear_memos
from audit.models import AuditRank
from audit.runs import dispatch, planning
from audit.runs.ondemand import retrieve_top_lists
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from retrieval.models import Query, Target, Turn

pytestmark = pytest.mark.django_db
SPEC = "openclip:cirval-tiny-vit"


@pytest.fixture
def world(tmp_path, settings):
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    settings.CANDIDATE_RETRIEVER = SPEC
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=60, n_single=8, n_sessions=2), "demo", images_root=root)
    clear_memos()
    yield
    clear_memos()


def test_on_demand_ranking_is_the_audit_ranking(world, settings):
    queries = list(Query.objects.filter(dataset__name="demo", n_turns=1).select_related("dataset"))
    tops = retrieve_top_lists(queries, 30)
    assert set(tops) == {q.pk for q in queries} and all(len(t) == 30 for t in tops.values())
    settings.AUDIT_PANEL_K = settings.AUDIT_CANDIDATES_N = 30
    run = dispatch.run_inline(planning.create_run("demo", [SPEC]))
    assert run.status == "done", run.error
    audited = dict(AuditRank.objects.filter(run=run).values_list("query_id", "top_mm"))
    assert audited == tops


def test_a_study_without_audit_gets_fixed_blind_panels_once(world, django_assert_max_num_queries):
    study, _ = create_study(StudySpec(name="no-audit", datasets=["demo"], candidates=12))
    items = list(StudyItem.objects.filter(study=study).select_related("query", "study"))
    assert len(items) == 8
    for item in items:
        ids = item_candidates(item)
        targets = set(Target.objects.filter(query=item.query).values_list("image_id", flat=True))
        ref = Turn.objects.get(query=item.query).reference_image_id
        assert len(ids) == len(set(ids)) == 12 and not targets & set(ids) and ref not in ids
        item.refresh_from_db()
        # ranked as deep as the audit's top lists (AUDIT_CANDIDATES_N), at least the panel + 10, capped by the gallery
        ranked = re.fullmatch(r"retriever on demand: (\d+) ranked, 0 padded", item.candidates_source)
        assert item.candidates == ids and ranked and int(ranked.group(1)) >= 12 + 10
    # stored: asked again, nothing is ranked
    with django_assert_max_num_queries(2):
        assert item_candidates(items[0]) == StudyItem.objects.get(pk=items[0].pk).candidates


def test_creating_a_study_queues_its_panels(world, monkeypatch, django_capture_on_commit_callbacks):
    from annotation import tasks

    queued = []
    monkeypatch.setattr(tasks.fill_candidates, "delay", lambda pk: queued.append(pk))
    with django_capture_on_commit_callbacks(execute=True):
        study, _ = create_study(StudySpec(name="queued", datasets=["demo"], candidates=5))
    assert queued == [study.pk]
    assert tasks.fill_candidates(study.pk) == 8  # what the worker does: every item's panel, once
    assert tasks.fill_candidates(study.pk) == 0
