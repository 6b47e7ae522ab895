"""A study without an audit gets its candidate panels from one retriever run on demand."""

from __future__ import annotations

import re

import pytest

from annotation.judging import candidates
from annotation.judging.candidates import item_candidates, panels_after_audit
from annotation.judging.panel_fill import fill_candidates, fill_study_candidates
from annotation.models import StudyItem
from annotation.studies.building import StudySpec, create_study
from audit.models import AuditRank
from audit.runs import dispatch, planning
from audit.runs.encoding import clear_memos
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
    assert fill_candidates(items) == 8  # the worker's part
    for item in items:
        item.refresh_from_db()
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
    monkeypatch.setattr(
        tasks.fill_candidates, "apply_async", lambda args, **kwargs: queued.append(*args)
    )  # sent by name
    with django_capture_on_commit_callbacks(execute=True):
        study, _ = create_study(StudySpec(name="queued", datasets=["demo"], candidates=5))
    assert queued == [study.pk]
    assert tasks.fill_candidates(study.pk) == 8  # what the worker does: every item's panel, once
    assert tasks.fill_candidates(study.pk) == 0


def test_the_web_tier_serves_a_missing_panel_empty_and_asks_a_worker_once(world, settings):
    """item_candidates never ranks (that loads a model): a missing panel is [] and the study's
    panels are requested from a worker, once per REQUEST_EVERY_SECONDS."""
    from django.core.cache import cache

    study, _ = create_study(StudySpec(name="lazy", datasets=["demo"], candidates=6))
    cache.delete(candidates._requested_key(study.pk))
    item = StudyItem.objects.filter(study=study).select_related("query").first()
    assert item_candidates(item) == [] and not StudyItem.objects.get(pk=item.pk).candidates_source
    assert cache.get(candidates._requested_key(study.pk)) == 1  # asked (the broker got the task)
    assert candidates.request_panels(study.pk) is False  # asked again within the window: not sent twice
    assert fill_study_candidates(study.pk) == 8  # what that task does, on a worker
    item.refresh_from_db()
    assert len(item_candidates(item)) == 6


def test_a_finished_audit_asks_for_the_missing_panels(world, settings, django_capture_on_commit_callbacks):
    """An audit of the dataset finishing sends the fill task for every open study with items
    whose panel is missing; the worker then fills them from the audit's top lists."""
    from celery import current_app

    settings.AUDIT_CANDIDATES_N = 30
    study, _ = create_study(StudySpec(name="before-audit", datasets=["demo"], candidates=6))
    done_study, _ = create_study(StudySpec(name="filled", datasets=["demo"], candidates=6))
    fill_study_candidates(done_study.pk)
    received = []
    keep = current_app.conf.task_always_eager
    current_app.conf.task_always_eager = True  # the sent task runs here, as a worker would run it
    try:
        from audit.runs.aggregation import audit_finished

        audit_finished.connect(lambda sender, run, **kw: received.append(run.pk), weak=False, dispatch_uid="t-received")
        with django_capture_on_commit_callbacks(execute=True):
            run = dispatch.run_inline(planning.create_run("demo", [SPEC]))
    finally:
        current_app.conf.task_always_eager = keep
        audit_finished.disconnect(dispatch_uid="t-received")
    assert run.status == "done" and received == [run.pk]
    sources = set(StudyItem.objects.filter(study=study).values_list("candidates_source", flat=True))
    assert sources and all(s.startswith(f"audit {run.pk}: RRF") for s in sources)
    assert panels_after_audit(None, run) == []  # nothing missing any more
