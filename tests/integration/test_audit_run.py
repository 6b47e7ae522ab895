"""In-process (eager) audits of a small demo world with the two tiny retrievers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from audit.models import AuditChunk, AuditLabel, AuditRank, AuditRun
from audit.runs import aggregation, base, chunk_leases, dispatch, execution, panels, planning
from audit.runs.encoding import clear_memos
from retrieval.demo import build_demo
from retrieval.embcache import EmbeddingCache
from retrieval.encoders import build_retriever, load_image
from retrieval.loader import load_parsed
from retrieval.models import Dataset, GalleryEntry, Image, Query, QuerySubset, Target, Turn
from tests.reference_impl import naive_rank

pytestmark = pytest.mark.django_db

SPECS = ["openclip:cirval-tiny-vit", "openclip:cirval-tiny-vit-b"]
N_SINGLE, N_SESSIONS, N_GALLERY = 30, 6, 170  # the queries need 162 images (near misses of shared references)


@pytest.fixture
def demo(tmp_path, settings) -> Dataset:
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    root = tmp_path / "demo"
    parsed = build_demo(root, n_gallery=N_GALLERY, n_single=N_SINGLE, n_sessions=N_SESSIONS)
    load_parsed(parsed, "demo", images_root=root)
    clear_memos()
    yield Dataset.objects.get(name="demo")
    clear_memos()


def audit(dataset: Dataset, **kwargs) -> AuditRun:
    kwargs.setdefault("chunk_queries", 7)
    kwargs.setdefault("chunk_gallery", 25)
    run = planning.create_run(dataset, SPECS, **kwargs)
    return dispatch.run_inline(run)


def single_turn_ids(dataset: Dataset) -> set[int]:
    return set(Query.objects.filter(dataset=dataset, n_turns=1).values_list("pk", flat=True))


def test_eager_audit_labels_every_single_turn_query(demo):
    run = audit(demo)
    assert run.status == "done", run.error
    singles = single_turn_ids(demo)
    assert len(singles) == N_SINGLE
    labels = dict(AuditLabel.objects.filter(run=run).values_list("query_id", "label"))
    assert set(labels) == singles
    assert run.summary["skipped"] == {}  # the sessions are scored turn by turn, not skipped
    assert run.summary["sessions"]["n_sessions"] == N_SESSIONS
    assert run.summary["n_queries"] == N_SINGLE
    assert (
        sum(run.summary["counts"][k] for k in ("composition_required", "unresolved", "shortcut_solvable")) == N_SINGLE
    )
    # 2 retrievers x (ceil(170/25) gallery + ceil(30/7) query + ceil(6/7) session) chunks
    # + ceil(6/7) texts chunk of the tau encoder, all done
    assert AuditChunk.objects.filter(run=run).count() == 2 * (7 + 5 + 1) + 1
    assert not AuditChunk.objects.filter(run=run).exclude(status="done").exists()
    assert run.done == run.total == 2 * (N_GALLERY + N_SINGLE + N_SESSIONS) + N_SESSIONS

    # one rank row per (query, retriever), no duplicates
    pairs = list(AuditRank.objects.filter(run=run).values_list("query_id", "retriever"))
    assert len(pairs) == len(set(pairs)) == 2 * N_SINGLE
    assert {r for _, r in pairs} == set(SPECS)

    # subsets partition the labelled queries; the un-prefixed one is the latest audit's
    def members(name):
        return set(QuerySubset.objects.get(dataset=demo, name=name).queries.values_list("pk", flat=True))

    by_label = {lab: {q for q, v in labels.items() if v == lab} for lab in set(labels.values())}
    for lab in ("composition_required", "unresolved", "shortcut_solvable"):
        assert members(f"audit{run.pk}:{lab}") == by_label.get(lab, set())
    free = by_label.get("composition_required", set()) | by_label.get("unresolved", set())
    assert members(f"audit{run.pk}:shortcut_free") == free == members("shortcut_free")
    assert len(free) == run.summary["counts"]["shortcut_free"]


def test_ranks_match_a_naive_recomputation(demo, settings):
    """Ranks and top lists equal an independent full-sort ranking of the same embeddings."""
    run = audit(demo)
    gallery_ids = list(
        GalleryEntry.objects.filter(dataset=demo, split="val").order_by("ordinal").values_list("image_id", flat=True)
    )
    images = Image.objects.in_bulk(gallery_ids)
    index = {pk: n for n, pk in enumerate(gallery_ids)}
    root = Path(demo.images_root)
    queries = sorted(single_turn_ids(demo))
    turns = {t.query_id: t for t in Turn.objects.filter(query_id__in=queries).select_related("reference_image")}
    for spec in SPECS:
        r = build_retriever(spec, device="cpu")
        cache = EmbeddingCache(settings.EMBEDDING_CACHE_DIR, r.spec, r.dim)
        g = torch.from_numpy(cache.get_many("image", [images[i].sha256 for i in gallery_ids]).matrix)
        # the cached vectors are the retriever's embeddings of those files
        fresh = r.embed_images([load_image(root / images[i].path) for i in gallery_ids[:8]])
        assert torch.allclose(g[:8], fresh, atol=1e-5)
        img = torch.from_numpy(cache.get_many("image", [turns[q].reference_image.sha256 for q in queries]).matrix)
        txt = torch.from_numpy(cache.get_many("text", [turns[q].text for q in queries]).matrix)
        assert not torch.isnan(img).any() and not torch.isnan(txt).any()
        mm = torch.nn.functional.normalize(img + txt, dim=-1)
        positives = [
            [index[t.image_id] for t in Target.objects.filter(query_id=q) if t.relevance > 0 and t.role != "neg"]
            for q in queries
        ]
        exclude = [index[turns[q].reference_image_id] for q in queries]
        check_rows(
            run,
            spec,
            queries,
            gallery_ids,
            settings.AUDIT_CANDIDATES_N,
            {"mm": mm, "text": txt, "image": img},
            g,
            positives,
            exclude,
        )


def check_rows(run, spec, queries, gallery_ids, n_top, embeddings, g, positives, exclude) -> None:
    """Stored best ranks, every positive's rank and top lists equal a full-sort ranking."""
    expect = {
        field: naive_rank(e, g, positives, exclude, top_k=n_top if field == "mm" else 0, return_per_positive=True)
        for field, e in embeddings.items()
    }
    rows = {row.query_id: row for row in AuditRank.objects.filter(run=run, retriever=spec)}
    for n, q in enumerate(queries):
        for field in ("mm", "text", "image"):
            assert getattr(rows[q], field) == expect[field].best_rank[n]
            assert getattr(rows[q], field + "_all") == expect[field].per_positive_ranks[n]
        # the stored top list: the retriever's top AUDIT_CANDIDATES_N, reference and targets included
        top = [j for j in expect["mm"].topk[n].tolist() if j >= 0]
        assert len(rows[q].top_mm) == min(n_top, len(gallery_ids))
        assert set(rows[q].top_mm) == {gallery_ids[j] for j in top}


def test_second_run_hits_the_cache_and_gives_the_same_labels(demo):
    first = audit(demo)
    assert first.timings["cache"]["gallery_encoded"] == 2 * N_GALLERY
    assert 0 < first.timings["cache"]["text_encoded"] <= 2 * N_SINGLE  # equal texts are encoded once
    assert first.timings["cache"]["encoded"] > 0
    for key in ("encode_gallery", "encode_queries", "rank", "aggregate"):
        assert key in first.timings
    clear_memos()
    second = audit(demo)
    cache = second.timings["cache"]
    assert cache["encoded"] == 0
    assert cache["gallery_encoded"] == cache["query_image_encoded"] == cache["text_encoded"] == 0
    assert cache["gallery_hits"] == 2 * N_GALLERY
    assert cache["query_image_hits"] == 2 * N_SINGLE
    labels = [dict(AuditLabel.objects.filter(run=r).values_list("query_id", "label")) for r in (first, second)]
    assert labels[0] == labels[1]


def test_done_chunks_are_not_recomputed_and_stale_ones_are_resent(demo, monkeypatch, settings):
    settings.AUDIT_RETRIEVERS_TOGETHER = False  # one chunk at a time (chunks run together: test_audit_warm)
    sent: list[int] = []
    monkeypatch.setattr(dispatch, "_send_chunk", lambda pk, kind: sent.append(pk) or True)
    monkeypatch.setattr(dispatch, "kick_coordinator", lambda run_id, countdown=0: "token")
    run = planning.create_run(demo, SPECS, chunk_queries=10, chunk_gallery=100)
    assert planning.plan_run(run) is True
    assert planning.plan_run(run) is False  # planned once
    gallery = AuditChunk.objects.filter(run=run, kind="gallery")
    for c in gallery:
        assert execution.process_chunk(c.pk, owner="w1", heartbeat=False) == "ok"
    first = AuditChunk.objects.filter(run=run, kind="queries", retriever=SPECS[0]).order_by("index").first()
    assert execution.process_chunk(first.pk, owner="w1", heartbeat=False) == "ok"
    n_rows = AuditRank.objects.filter(run=run).count()
    assert n_rows == 10
    # a redelivered message for a finished chunk returns at once and writes nothing
    assert execution.process_chunk(first.pk, owner="w2", heartbeat=False) == "done"
    assert AuditRank.objects.filter(run=run).count() == n_rows

    # a chunk leased by a live worker is left alone ...
    second = AuditChunk.objects.filter(run=run, kind="queries", retriever=SPECS[0]).order_by("index")[1]
    assert chunk_leases.claim_chunk(second.pk, "w1")
    assert execution.process_chunk(second.pk, owner="w2", heartbeat=False) == "busy"
    # ... until its lease is stale: reconcile puts it back and sends it again
    from datetime import timedelta

    from django.utils import timezone

    AuditChunk.objects.filter(pk=second.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    sent.clear()
    result = dispatch.reconcile(run)
    assert result["resent_stale"] == 1 and second.pk in sent
    # every query, session and texts chunk is ready (gallery done) and was never sent: dispatched once
    never_sent = AuditChunk.objects.filter(run=run).exclude(kind="gallery").exclude(pk__in=[first.pk, second.pk])
    assert set(sent) == {second.pk} | set(never_sent.values_list("pk", flat=True))
    sent.clear()
    assert dispatch.reconcile(run)["sent"] == 0 and sent == []  # nothing twice
    assert execution.process_chunk(second.pk, owner="w2", heartbeat=False) == "ok"
    assert AuditChunk.objects.get(pk=second.pk).attempts == 2

    for c in AuditChunk.objects.filter(run=run).exclude(status="done"):
        assert execution.process_chunk(c.pk, owner="w3", heartbeat=False) == "ok"
    assert aggregation.aggregate_run(run.pk) is True
    assert aggregation.aggregate_run(run.pk) is False  # already finished
    pairs = list(AuditRank.objects.filter(run=run).values_list("query_id", "retriever"))
    assert len(pairs) == len(set(pairs)) == 2 * N_SINGLE


def test_an_inline_run_waits_for_a_chunk_a_worker_holds_and_finishes_complete(demo, monkeypatch):
    """A live worker's sweep may have taken a chunk of a run that is run in process: the inline
    run leaves it to the worker (its query chunks wait for that gallery), passes again after a
    pause and aggregates only once every chunk is done, never a run left "running"."""
    run = planning.create_run(demo, SPECS, chunk_queries=7, chunk_gallery=25)
    assert planning.plan_run(run) is True
    held = AuditChunk.objects.filter(run=run, kind="gallery").order_by("index").first()
    assert chunk_leases.claim_chunk(held.pk, "worker:1")  # fresh lease: another process runs it
    pauses: list[float] = []

    def worker_finishes(seconds: float) -> None:  # meanwhile, the worker computes its chunk
        pauses.append(seconds)
        chunk = AuditChunk.objects.select_related("run").get(pk=held.pk)
        assert execution._run_claimed([chunk], chunk.run, "worker:1", False) == "ok"  # it holds the lease

    monkeypatch.setattr(dispatch.time, "sleep", worker_finishes)
    run = dispatch.run_inline(run)
    assert run.status == "done", run.error
    assert pauses == [dispatch.INLINE_WAIT_SECONDS]  # one idle pass: everything else waited for that gallery
    assert not AuditChunk.objects.filter(run=run).exclude(status="done").exists()
    assert AuditChunk.objects.get(pk=held.pk).owner in ("worker:1", "")


def test_rank_rows_are_unique_in_the_database(demo):
    from django.db import IntegrityError, transaction

    run = audit(demo)
    row = AuditRank.objects.filter(run=run).first()
    with pytest.raises(IntegrityError), transaction.atomic():
        AuditRank.objects.create(run=run, query_id=row.query_id, retriever=row.retriever, mm=1)


def test_unusable_queries_are_skipped_with_a_reason(demo):
    singles = sorted(single_turn_ids(demo))
    q_text, q_noref, q_missing, q_unreadable, q_target = singles[:5]
    Turn.objects.filter(query_id=q_text).update(texts=[{"text": "  ", "role": "caption"}])
    Turn.objects.filter(query_id=q_noref).update(reference_image=None)
    ref = Turn.objects.get(query_id=q_missing).reference_image
    Image.objects.filter(pk=ref.pk).update(missing=True)
    gone = Turn.objects.get(query_id=q_unreadable).reference_image
    (Path(demo.images_root) / gone.path).unlink()
    Target.objects.filter(query_id=q_target).delete()

    run = audit(demo)
    assert run.status == "done", run.error
    skipped = run.summary["skipped"]
    assert "multi_turn" not in skipped
    assert skipped["empty_text"] == 1 and skipped["no_reference"] == 1 and skipped["no_target"] == 1
    assert skipped["reference_missing"] >= 1
    assert skipped["reference_unreadable"] >= 1
    assert run.summary["skipped_total"] == sum(skipped.values())
    labelled = set(AuditLabel.objects.filter(run=run).values_list("query_id", flat=True))
    assert not labelled & {q_text, q_noref, q_missing, q_unreadable, q_target}
    assert len(labelled) == N_SINGLE - run.summary["skipped_total"]
    # the image left out of the gallery is neither ranked nor shown
    for top in AuditRank.objects.filter(run=run).values_list("top_mm", flat=True):
        assert ref.pk not in top and gone.pk not in top
    assert run.summary["plan"]["gallery"]["missing_left_out"] == 1


def test_candidate_panel_fuses_the_pool_and_leaves_out_every_target(demo):
    run = audit(demo)
    q = AuditLabel.objects.filter(run=run).first().query
    tops = dict(AuditRank.objects.filter(run=run, query=q).values_list("retriever", "top_mm"))
    pool = list(AuditRank.objects.filter(run=run, query=q).values_list("top_mm", "top_text", "top_image", "top_near"))
    first_target = Target.objects.get(query=q, is_primary=True).image_id
    # the pool: every retriever's top lists in three modalities and the images nearest the target
    assert len(pool) == 2 and all(len(top) == len(pool[0][0]) > 20 for row in pool for top in row)
    reference = Turn.objects.get(query=q).reference_image_id
    assert all({first_target, reference} <= set(row[3]) for row in pool)  # near the target and the reference
    # one extra, non-primary target that the first retriever ranks first: it must go too
    extra = Target.objects.create(query=q, image_id=tops[SPECS[0]][0], relevance=0.5, is_primary=False)
    panel = panels.candidate_panel(q, panels.pool_rankings(run, q), 20)
    targets = set(Target.objects.filter(query=q).values_list("image_id", flat=True))
    assert extra.image_id in targets and not targets & set(panel.ids)
    assert Turn.objects.get(query=q).reference_image_id not in panel.ids
    assert len(panel.ids) == len(set(panel.ids)) == 20
    union = {i for row in pool for top in row for i in top}
    # the top lists (AUDIT_CANDIDATES_N deep) reach past the panel once the target, the extra
    # target and the reference are left out: the whole panel comes from the pool, unpadded
    assert panel.fused == 20 and panel.padded == 0 and set(panel.ids) <= union


def test_a_split_must_be_chosen_when_there_are_several(demo):
    Query.objects.filter(dataset=demo, n_turns__gt=1).update(split="test")
    with pytest.raises(base.AuditError, match="several splits"):
        planning.create_run(demo, SPECS)
    with pytest.raises(base.AuditError, match="no split"):
        planning.create_run(demo, SPECS, split="nope")
    with pytest.raises(ValueError, match="unknown open_clip model"):
        planning.create_run(demo, ["openclip:no-such-model"], split="val")
    run = planning.create_run(demo, SPECS + ["openclip:cirval-tiny-vit@random:0"], split="val")
    assert run.retrievers == SPECS  # canonical specs, de-duplicated


def test_run_audit_command_eager_wait_prints_progress_and_counts(demo):
    from io import StringIO

    from django.core.management import call_command

    out, err = StringIO(), StringIO()
    call_command(
        "run_audit",
        "--dataset",
        "demo",
        "--retriever",
        SPECS[0],
        "--retriever",
        SPECS[1],
        "--chunk-queries",
        "10",
        "--eager",
        "--wait",
        stdout=out,
        stderr=err,
    )
    run = AuditRun.objects.get()
    text = out.getvalue()
    assert f"Audit {run.pk} done: {N_SINGLE} queries labelled; skipped: none." in text
    assert f"Sessions: {N_SESSIONS} scored; skipped: none." in text
    for label, n in run.summary["counts"].items():
        assert f"{label}" in text and f"{n}" in text
    assert "ETA" in err.getvalue() and f"{run.total}/{run.total}" in err.getvalue()
    assert run.chunk_queries == 10


def test_run_audit_command_queues_without_wait(demo, monkeypatch):
    from io import StringIO

    from django.core.management import CommandError, call_command

    kicked = []
    monkeypatch.setattr(dispatch, "kick_coordinator", lambda run_id, countdown=0: kicked.append(run_id))
    out = StringIO()
    call_command("run_audit", "--dataset", "demo", "--retriever", SPECS[0], "--k", "5", stdout=out)
    run = AuditRun.objects.get()
    assert kicked == [run.pk] and run.status == "queued" and run.k == 5
    assert f"Audit {run.pk} queued" in out.getvalue() and f"/audits/{run.pk}/" in out.getvalue()
    with pytest.raises(CommandError, match="no dataset named 'nope'"):
        call_command("run_audit", "--dataset", "nope", "--retriever", SPECS[0], stdout=StringIO())
    with pytest.raises(CommandError, match="unknown backend"):
        call_command("run_audit", "--dataset", "demo", "--retriever", "clip:x", stdout=StringIO())


def test_gallery_matrix_is_memory_mapped_from_the_cache(demo, settings):
    """A CPU worker's gallery matrix is a view of the embedding cache's image store (a gallery
    encoded in its order lies in consecutive rows of it), memory-mapped, not a copy."""
    from audit.runs.encoding import gallery_matrix

    audit(demo)
    clear_memos()
    gallery_ids = list(
        GalleryEntry.objects.filter(dataset=demo, split="val").order_by("ordinal").values_list("image_id", flat=True)
    )
    images = Image.objects.in_bulk(gallery_ids)
    keys = [images[i].sha256 for i in gallery_ids]
    r = build_retriever(SPECS[0], device="cpu")
    cache = EmbeddingCache(settings.EMBEDDING_CACHE_DIR, r.spec, r.dim)
    matrix, rows, enc = gallery_matrix(r, cache, "t", keys, lambda key: Path("/nonexistent") / key)
    assert rows == list(range(len(keys))) and enc.encoded == 0  # every vector came from the cache
    files = [str(cache.images_path)]  # the cache's one store of image embeddings
    assert not (cache.folder / "galleries").exists()  # no second copy of the gallery
    mapped = [
        line.split()[0].split("-")
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.split()[-1] in files
    ]
    ptr = matrix.data_ptr()
    assert any(int(lo, 16) <= ptr < int(hi, 16) for lo, hi in mapped)  # the tensor reads the mapped file
    assert torch.equal(matrix, torch.from_numpy(cache.get_many("image", keys).matrix))
    again, _, memo = gallery_matrix(r, cache, "t", keys, lambda key: Path("/nonexistent") / key)
    assert memo is None and again is matrix  # the process memo
    clear_memos()


def test_a_failed_audit_shows_a_reference_never_a_traceback_or_a_path(demo, monkeypatch, caplog):
    """An unexpected error in a chunk: the researcher's page shows the error's type and a
    reference number; the traceback is in the log under that reference."""
    import re as _re

    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client

    from audit.runs import execution

    def boom(*_args, **_kwargs):
        raise RuntimeError("cannot map /srv/cirval/var/embeddings/secret.npy")

    monkeypatch.setattr(execution, "_compute_group", boom)
    run = audit(demo)
    assert run.status == "failed"
    ref = _re.search(r"reference ([0-9a-f]{8})", run.error).group(1)
    assert "Traceback" not in run.error and "/srv/cirval" not in run.error and "secret.npy" in run.error
    assert any(ref in r.getMessage() and r.exc_info for r in caplog.records)  # the details, in the log
    user = get_user_model().objects.create_user("res", password="pw")
    user.groups.add(Group.objects.get_or_create(name="researcher")[0])
    c = Client()
    c.force_login(user)
    page = c.get(f"/audits/{run.pk}/").content.decode()
    assert ref in page and "Traceback" not in page and "/srv/cirval" not in page and 'File "' not in page
