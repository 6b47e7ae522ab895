"""Scale-out: two real Celery workers share one audit (gallery encoding and query ranking)
through the database and the broker, and the labels equal those of an in-process run."""

from __future__ import annotations

import pytest

from audit.models import AuditChunk, AuditLabel, AuditRank, AuditRun
from audit.runs import dispatch, planning
from audit.runs.encoding import clear_memos
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from retrieval.models import Dataset
from tests.conftest import wait_for
from tests.integration.test_audit_worker import stop

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SPECS = ["openclip:cirval-tiny-vit", "openclip:cirval-tiny-vit-b"]


def test_two_workers_split_one_audit_and_match_an_in_process_run(tmp_path, settings, worker_factory):
    cache_dir = tmp_path / "embeddings"
    settings.EMBEDDING_CACHE_DIR = cache_dir
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=80, n_single=32, n_sessions=4), "demo", images_root=root)
    dataset = Dataset.objects.get(name="demo")
    env = {"EMBEDDING_CACHE_DIR": str(cache_dir), "AUDIT_COORDINATOR_SECONDS": "1"}
    # one worker decodes images in a loader process (inside its Celery pool process), the other in-process
    workers = [worker_factory(extra_env={**env, "AUDIT_LOADER_WORKERS": str(n)}).start(f"split{n}") for n in (1, 0)]
    for w in workers:
        wait_for(lambda w=w: "ready." in w.log(), timeout=90, what=f"worker start\n{w.log()}")
    run = planning.create_run(dataset, SPECS, chunk_queries=4, chunk_gallery=10)
    dispatch.kick_coordinator(run.pk)
    result = wait_for(
        lambda: (r := AuditRun.objects.get(pk=run.pk)).status in ("done", "failed") and r,
        timeout=180,
        interval=0.2,
        what="the two workers to finish\n" + "\n".join(w.log() for w in workers),
    )
    for w in workers:
        stop(w)
    assert result.status == "done", result.error
    owners = {
        kind: set(AuditChunk.objects.filter(run=run, kind=kind).values_list("owner", flat=True))
        for kind in ("gallery", "queries")
    }
    assert len(owners["gallery"] | owners["queries"]) >= 2, owners  # both workers took chunks
    pairs = list(AuditRank.objects.filter(run=run).values_list("query_id", "retriever"))
    assert len(pairs) == len(set(pairs)) == 2 * 32

    clear_memos()  # the reference: one process, its own cold cache
    settings.EMBEDDING_CACHE_DIR = tmp_path / "eager-embeddings"
    eager = dispatch.run_inline(planning.create_run(dataset, SPECS, chunk_queries=4, chunk_gallery=10))
    assert eager.status == "done", eager.error
    assert eager.timings["cache"]["encoded"] > 0
    labels = {r.pk: dict(AuditLabel.objects.filter(run=r).values_list("query_id", "label")) for r in (result, eager)}
    assert labels[result.pk] == labels[eager.pk]
    ranks = {
        r.pk: sorted(
            AuditRank.objects.filter(run=r).values_list(
                "query_id", "retriever", "mm", "text", "image", "mm_all", "top_mm"
            )
        )
        for r in (result, eager)
    }
    assert ranks[result.pk] == ranks[eager.pk]
    assert result.summary["counts"] == eager.summary["counts"]
    assert result.summary["sessions"]["n_sessions"] == eager.summary["sessions"]["n_sessions"] == 4


def test_two_pool_processes_encode_each_text_once(tmp_path, settings, worker_factory):
    """One worker with two pool processes ranks two query chunks whose texts are the same 32
    texts (encoded one at a time, so that the two chunks encode at the same moment): each text
    is encoded once in all (the embedding cache's claims), counted by the chunks' own stats."""
    from retrieval.models import Turn

    cache_dir = tmp_path / "embeddings"
    settings.EMBEDDING_CACHE_DIR = cache_dir
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=80, n_single=64, n_sessions=0), "demo", images_root=root)
    dataset = Dataset.objects.get(name="demo")
    turns = list(Turn.objects.filter(query__dataset=dataset).order_by("query_id", "index"))
    for n, turn in enumerate(turns):
        turn.texts = [{**(turn.texts[0] if turn.texts else {}), "text": f"make it shade {n % 32}"}]
    Turn.objects.bulk_update(turns, ["texts"])
    worker = worker_factory(
        concurrency=2,
        extra_env={"EMBEDDING_CACHE_DIR": str(cache_dir), "AUDIT_COORDINATOR_SECONDS": "1", "AUDIT_BATCH_SIZE": "1"},
    ).start("pool2")
    wait_for(lambda: "ready." in worker.log(), timeout=90, what=f"worker start\n{worker.log()}")
    run = planning.create_run(dataset, SPECS[:1], chunk_queries=32, chunk_gallery=80)
    dispatch.kick_coordinator(run.pk)
    result = wait_for(
        lambda: (r := AuditRun.objects.get(pk=run.pk)).status in ("done", "failed") and r,
        timeout=180,
        interval=0.2,
        what="the worker to finish\n" + worker.log(),
    )
    stop(worker)
    assert result.status == "done", result.error
    chunks = list(AuditChunk.objects.filter(run=run, kind="queries").values_list("owner", "stats"))
    assert len(chunks) == 2
    assert len({owner for owner, _ in chunks}) == 2, chunks  # both pool processes ranked queries
    encoded = [stats["cache"]["text_encoded"] for _, stats in chunks]
    assert sum(encoded) == 32, encoded  # 32 distinct texts, each encoded once
