"""Warm re-audits (nothing built, nothing encoded), gallery progress, and the bulk rank writer."""
from __future__ import annotations

import pytest
from django.db import connection, transaction

from audit.engine import clear_memos, get_retriever
from audit.models import AuditChunk, AuditLabel, AuditRank, AuditRun
from audit.runs import dispatch, execution, planning
from audit.runs.bulkwrite import insert_rows
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from retrieval.models import Dataset, Query

pytestmark = pytest.mark.django_db

SPECS = ["openclip:cirval-tiny-vit", "openclip:cirval-tiny-vit-b"]


@pytest.fixture
def demo(tmp_path, settings) -> Dataset:
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=50, n_single=16, n_sessions=3), "demo", images_root=root)
    clear_memos()
    return Dataset.objects.get(name="demo")


def _ranks(run: AuditRun) -> list[tuple]:
    return sorted(AuditRank.objects.filter(run=run).values_list(
        "query_id", "retriever", "mm", "text", "image", "mm_all", "top_mm", "graded", "subset"))


def test_warm_reaudit_builds_no_model_and_gives_the_same_rows(demo, settings):
    cold = dispatch.run_inline(planning.create_run(demo, SPECS, chunk_gallery=20, chunk_queries=8))
    assert cold.status == "done", cold.error
    assert cold.timings["cache"]["encoded"] > 0
    clear_memos()  # a fresh worker process
    warm = dispatch.run_inline(planning.create_run(demo, SPECS, chunk_gallery=20, chunk_queries=8))
    assert warm.status == "done", warm.error
    assert warm.timings["cache"]["encoded"] == 0
    for spec in SPECS:
        r = get_retriever(spec, device=settings.AUDIT_DEVICE or None, batch_size=settings.AUDIT_BATCH_SIZE,
                          precision=settings.AUDIT_PRECISION)
        assert not r.is_built, spec
    assert not any(c["model_built"] for c in AuditChunk.objects.filter(run=warm, kind="gallery").values_list(
        "stats", flat=True))
    assert [r[1:] for r in _ranks(warm)] == [r[1:] for r in _ranks(cold)]
    assert (dict(AuditLabel.objects.filter(run=warm).values_list("query_id", "label"))
            == dict(AuditLabel.objects.filter(run=cold).values_list("query_id", "label")))
    assert warm.summary["counts"] == cold.summary["counts"]


def test_gallery_progress_shows_images_per_second_and_eta(demo):
    run = planning.create_run(demo, SPECS[:1], chunk_gallery=20)
    planning.plan_run(run)
    first = AuditChunk.objects.filter(run=run, kind="gallery").order_by("index").first()
    assert execution.process_chunk(first.pk, heartbeat=False) == "ok"
    run.refresh_from_db()
    total = sum(AuditChunk.objects.filter(run=run, kind="gallery").values_list("n_items", flat=True))
    assert run.stage.startswith(f"encoding gallery: {first.n_items}/{total} images · ")
    assert "images/s · ETA " in run.stage
    # within a chunk, the callback reports this chunk's images on top of the done chunks
    progress = execution.GalleryProgress(run.pk, every_s=0.0)
    progress(5, 20)
    run.refresh_from_db()
    assert run.stage.startswith(f"encoding gallery: {first.n_items + 5}/{total} images · ")


def test_bulk_writer_keeps_existing_rows(demo):
    run = dispatch.run_inline(planning.create_run(demo, SPECS[:1]))
    rows = list(AuditRank.objects.filter(run=run).order_by("pk"))
    before = _ranks(run)
    fresh = planning.create_run(demo, SPECS[:1])
    for r in rows:
        r.pk, r.run_id = None, fresh.pk
    with transaction.atomic():
        insert_rows(AuditRank, rows[:3])
        insert_rows(AuditRank, rows)  # the first three exist already: kept, not duplicated
    assert [x[1:] for x in _ranks(fresh)] == [x[1:] for x in before]
    assert AuditRank.objects.filter(run=fresh).count() == len(rows) == Query.objects.filter(
        dataset=demo, n_turns=1).count()
    assert connection.vendor in ("sqlite", "postgresql")  # COPY on PostgreSQL, executemany on SQLite
