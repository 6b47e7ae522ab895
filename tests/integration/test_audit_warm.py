"""Warm re-audits (nothing built, nothing encoded), gallery progress, and the bulk rank writer."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from audit.models import AuditChunk, AuditLabel, AuditRank, AuditRun
from audit.runs import dispatch, execution, planning
from audit.runs.bulkwrite import insert_rows
from audit.runs.encoding import clear_memos, get_retriever
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
    return sorted(
        AuditRank.objects.filter(run=run).values_list(
            "query_id", "retriever", "mm", "text", "image", "mm_all", "top_mm", "graded", "subset"
        )
    )


def test_warm_reaudit_builds_no_model_and_gives_the_same_rows(demo, settings):
    cold = dispatch.run_inline(planning.create_run(demo, SPECS, chunk_gallery=20, chunk_queries=8))
    assert cold.status == "done", cold.error
    assert cold.timings["cache"]["encoded"] > 0
    clear_memos()  # a fresh worker process
    warm = dispatch.run_inline(planning.create_run(demo, SPECS, chunk_gallery=20, chunk_queries=8))
    assert warm.status == "done", warm.error
    assert warm.timings["cache"]["encoded"] == 0
    for spec in SPECS:
        r = get_retriever(
            spec,
            device=settings.AUDIT_DEVICE or None,
            batch_size=settings.AUDIT_BATCH_SIZE,
            precision=settings.AUDIT_PRECISION,
        )
        assert not r.is_built, spec
    assert not any(
        c["model_built"] for c in AuditChunk.objects.filter(run=warm, kind="gallery").values_list("stats", flat=True)
    )
    assert [r[1:] for r in _ranks(warm)] == [r[1:] for r in _ranks(cold)]
    assert dict(AuditLabel.objects.filter(run=warm).values_list("query_id", "label")) == dict(
        AuditLabel.objects.filter(run=cold).values_list("query_id", "label")
    )
    assert warm.summary["counts"] == cold.summary["counts"]


def test_the_retrievers_chunks_run_together_with_the_same_results(demo, settings, tmp_path):
    """One worker claims the other retrievers' gallery chunks over the same images (each file
    decoded once for all of them) and their query chunks over the same queries (read once);
    the embeddings, ranks and labels are those of chunks run one by one."""
    run = planning.create_run(demo, SPECS, chunk_gallery=20, chunk_queries=8)
    planning.plan_run(run)

    def chunk(kind, spec, n):
        return AuditChunk.objects.filter(run=run, kind=kind, retriever=spec).order_by("index")[n]

    first = chunk("gallery", SPECS[0], 0)
    assert execution.process_chunk(first.pk, owner="w1", heartbeat=False) == "ok"
    together = AuditChunk.objects.filter(run=run, kind="gallery", index=first.index)
    assert sorted(together.values_list("retriever", "status", "owner")) == [(s, "done", "w1") for s in SPECS]
    sibling = together.get(retriever=SPECS[1])
    assert sibling.stats["run_with"] == [first.pk] and sibling.stats["cache"]["gallery_encoded"] == first.n_items
    assert execution.process_chunk(sibling.pk, owner="w2", heartbeat=False) == "done"
    # a sibling another worker holds is left to it
    second, other = chunk("gallery", SPECS[0], 1), chunk("gallery", SPECS[1], 1)
    assert execution.claim_chunk(other.pk, "w2")
    assert execution.process_chunk(second.pk, owner="w1", heartbeat=False) == "ok"
    assert AuditChunk.objects.get(pk=other.pk).status == "running"
    assert execution.process_chunk(other.pk, owner="w2", heartbeat=False) == "busy"
    for c in AuditChunk.objects.filter(run=run, kind="gallery").exclude(status="done").exclude(pk=other.pk):
        assert execution.process_chunk(c.pk, owner="w1", heartbeat=False) in ("ok", "done")
    # a query chunk runs alone while the other retriever's gallery is not encoded ...
    q0 = chunk("queries", SPECS[0], 0)
    assert execution.process_chunk(q0.pk, owner="w1", heartbeat=False) == "ok"
    assert chunk("queries", SPECS[1], 0).status == "pending"
    AuditChunk.objects.filter(pk=other.pk).update(status="pending", owner="")
    assert execution.process_chunk(other.pk, owner="w1", heartbeat=False) == "ok"
    # ... and with it once it is
    q1 = chunk("queries", SPECS[0], 1)
    assert execution.process_chunk(q1.pk, owner="w1", heartbeat=False) == "ok"
    q1b = chunk("queries", SPECS[1], 1)
    assert q1b.status == "done" and q1b.stats["run_with"] == [q1.pk]
    q1.refresh_from_db()
    assert q1.stats["ranked"] > 0 and q1.stats["run_with"] == [q1b.pk]
    assert AuditRank.objects.filter(run=run, query_id__in=q1.items).count() == 2 * q1.stats["ranked"]
    for c in AuditChunk.objects.filter(run=run).exclude(status="done").order_by("pk"):
        assert execution.process_chunk(c.pk, owner="w1", heartbeat=False) in ("ok", "done")
    from audit.runs import aggregation

    assert aggregation.aggregate_run(run.pk) is True
    shared = AuditRun.objects.get(pk=run.pk)

    settings.AUDIT_RETRIEVERS_TOGETHER = False
    settings.EMBEDDING_CACHE_DIR = tmp_path / "one-by-one"
    clear_memos()
    alone = dispatch.run_inline(planning.create_run(demo, SPECS, chunk_gallery=20, chunk_queries=8))
    assert alone.status == "done", alone.error
    assert not any(
        "run_with" in (st or {}) for st in AuditChunk.objects.filter(run=alone).values_list("stats", flat=True)
    )
    assert [r[1:] for r in _ranks(shared)] == [r[1:] for r in _ranks(alone)]
    assert shared.summary["counts"] == alone.summary["counts"]
    assert shared.summary["retriever_stats"] == alone.summary["retriever_stats"]


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
    assert (
        AuditRank.objects.filter(run=fresh).count()
        == len(rows)
        == Query.objects.filter(dataset=demo, n_turns=1).count()
    )
    assert connection.vendor in ("sqlite", "postgresql")  # COPY on PostgreSQL, executemany on SQLite


def test_rows_store_the_json_text_of_json_dumps():
    import json

    from audit.runs.bulkwrite import _json_text

    for value in (
        [],
        {},
        [1, None, 3],
        {"gains": [0.5, 1.0], "mm": [None, 2]},
        {"a": 'é"x\n'},
        {1: [2]},
        [1.5, float("inf"), -0.0, 1e-300],
        {"x": True, "y": False, "z": None},
        "text",
        3,
        2.5,
        [[1, 2], {"k": [3]}],
        list(range(64)),
    ):
        assert _json_text(value) == json.dumps(value)
