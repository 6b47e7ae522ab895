"""Session audits: multi-turn queries ranked turn by turn, CIRCLED filters and metrics.

Eager (in-process) audits of a small demo world with the two tiny retrievers, plus an
aggregation of hand-written ranks whose metrics and filter counts are worked out below.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
import torch
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction

from audit.models import AuditChunk, AuditLabel, AuditRun, AuditSessionRank
from audit.runs import aggregation, dispatch, execution, planning
from audit.runs.encoding import clear_memos
from retrieval.demo import build_demo
from retrieval.embcache import EmbeddingCache
from retrieval.encoders import build_retriever
from retrieval.loader import load_parsed
from retrieval.models import Dataset, GalleryEntry, Image, Query, QuerySubset, Target, Turn
from retrieval.sessions import STRATEGIES, aggregate_history, session_metrics
from tests.reference_impl import naive_rank

pytestmark = pytest.mark.django_db

SPECS = ["openclip:cirval-tiny-vit", "openclip:cirval-tiny-vit-b"]
MODALITIES = ("multimodal", "text_only", "image_only")
NS = "{http://www.w3.org/2000/svg}"
N_SINGLE, N_SESSIONS, N_GALLERY = 10, 12, 110  # the queries need 102 images


@pytest.fixture
def demo(tmp_path, settings) -> Dataset:
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    root = tmp_path / "demo"
    parsed = build_demo(root, n_gallery=N_GALLERY, n_single=N_SINGLE, n_sessions=N_SESSIONS)
    load_parsed(parsed, "demo", images_root=root)
    clear_memos()
    yield Dataset.objects.get(name="demo")
    clear_memos()


def audit(dataset: Dataset, specs=SPECS, **kwargs) -> AuditRun:
    kwargs.setdefault("chunk_queries", 5)
    kwargs.setdefault("chunk_gallery", 30)
    return dispatch.run_inline(planning.create_run(dataset, specs, **kwargs))


def session_ids(dataset: Dataset) -> list[int]:
    sessions = Query.objects.filter(dataset=dataset, n_turns__gt=1).order_by("ordinal", "id")
    return list(sessions.values_list("pk", flat=True))


def rows_of(run: AuditRun) -> dict[tuple, list]:
    return {
        (q, r, s, m): ranks
        for q, r, s, m, ranks in AuditSessionRank.objects.filter(run=run).values_list(
            "query_id", "retriever", "strategy", "modality", "ranks"
        )
    }


def test_every_turn_of_every_session_is_ranked(demo):
    run = audit(demo)
    assert run.status == "done", run.error
    sessions = session_ids(demo)
    assert len(sessions) == N_SESSIONS
    n_turns = dict(Query.objects.filter(pk__in=sessions).values_list("pk", "n_turns"))
    rows = rows_of(run)
    # one row per (session, retriever, strategy, modality), one rank per turn
    assert len(rows) == AuditSessionRank.objects.filter(run=run).count() == N_SESSIONS * len(SPECS) * 3 * 3
    assert {q for q, *_ in rows} == set(sessions)
    for (q, *_), ranks in rows.items():
        assert len(ranks) == n_turns[q]
        assert all(x is None or (isinstance(x, int) and x >= 1) for x in ranks)
    # at turn 1 the history is one turn: latest = average = weighted
    for q in sessions:
        for r in SPECS:
            for m in MODALITIES:
                first = {rows[(q, r, s, m)][0] for s in STRATEGIES}
                assert len(first) == 1, (q, r, m, first)
    # later turns do differ between strategies somewhere
    differ = sum(
        rows[(q, r, "latest", m)] != rows[(q, r, "average", m)] for q in sessions for r in SPECS for m in MODALITIES
    )
    assert differ > 0

    # the single-turn audit is unchanged: labels for the single-turn queries only
    singles = set(Query.objects.filter(dataset=demo, n_turns=1).values_list("pk", flat=True))
    assert set(AuditLabel.objects.filter(run=run).values_list("query_id", flat=True)) == singles
    assert "multi_turn" not in run.summary["skipped"]

    ses = run.summary["sessions"]
    assert ses["n_sessions"] == N_SESSIONS and ses["skipped_total"] == 0
    assert (ses["k"], ses["epsilon"], ses["tau"], ses["alpha"]) == (10, 30.0, 0.8, 0.8)
    assert ses["tau_encoder"] == SPECS[0] == run.tau_encoder
    assert ses["l_max"] == max(n_turns.values())
    assert sum(ses["turn_histogram"].values()) == N_SESSIONS
    assert ses["turn_histogram"] == {str(n): list(n_turns.values()).count(n) for n in sorted(set(n_turns.values()))}

    # the stored metrics are session_metrics of the stored ranks
    for r in SPECS:
        for s in STRATEGIES:
            for m in MODALITIES:
                expect = session_metrics({q: rows[(q, r, s, m)] for q in sessions}, k=10, epsilon=30)
                got = ses["metrics"][r][s][m]
                assert got["hits_at_k"] == pytest.approx(expect["hits_at_k"])
                assert got["final_recall_at_k"] == pytest.approx(expect["final_recall_at_k"])
                assert got["auc"] == pytest.approx(expect["auc"])
                assert got["epsilon_violations"] == len(expect["epsilon_violations"])
                assert len(got["hits_at_k"]) == ses["l_max"]

    # filters: success -> multi-turn -> epsilon -> tau, consistent counts
    f = ses["filters"]
    names = [st["name"] for st in f["steps"]]
    assert names == ["success", "multi_turn", "epsilon_consistency", "tau_diversity"]
    assert f["n_sessions"] == N_SESSIONS
    assert sum(st["removed"] for st in f["steps"]) + f["n_kept"] == N_SESSIONS
    left = N_SESSIONS
    for st in f["steps"]:
        assert st["remaining"] == left - st["removed"]
        assert st["removed"] <= st["removed_alone"] <= N_SESSIONS
        left = st["remaining"]
    assert left == f["n_kept"]
    assert ses["filter_basis"] == {"retriever": SPECS[0], "strategy": "latest", "modality": "multimodal"}
    # success and multi-turn recomputed from the basis ranks
    basis = {q: rows[(q, SPECS[0], "latest", "multimodal")] for q in sessions}
    never = [q for q in sessions if not any(x is not None and x <= 10 for x in basis[q])]
    assert f["steps"][0]["removed"] == f["steps"][0]["removed_alone"] == len(never)
    at_one = [q for q in sessions if basis[q][0] is not None and basis[q][0] <= 10]
    assert f["steps"][1]["removed_alone"] == len(at_one)
    subset = QuerySubset.objects.get(dataset=demo, name=f"audit{run.pk}:sessions_kept")
    kept = set(subset.queries.values_list("pk", flat=True))
    assert len(kept) == f["n_kept"] and kept <= set(sessions)
    for q in kept:
        assert q not in never and q not in at_one
    assert sum(ses["kept_turn_histogram"].values()) == f["n_kept"]

    # the tau encoder's texts chunk stored one value per session
    texts = AuditChunk.objects.filter(run=run, kind="texts")
    assert texts.count() == 3 and {c.retriever for c in texts} == {SPECS[0]}  # 12 sessions, 5 a chunk
    assert set().union(*(c.stats["max_text_cosine"] for c in texts)) == {str(q) for q in sessions}
    assert ses["text_cosine"]["sessions"] == N_SESSIONS


def rank_bounds(scores: torch.Tensor, pos: list[int], exclude: list[int], tol: float) -> tuple[list, list]:
    """Per row, the best rank with near-ties (within ``tol``) all resolved for / against the positives."""
    low, high = [], []
    for t in range(scores.shape[0]):
        row = scores[t].clone()
        row[exclude[t]] = float("-inf")
        lo = [1 + int((row > row[p] + tol).sum()) for p in pos if p != exclude[t]]
        hi = [int((row >= row[p] - tol).sum()) for p in pos if p != exclude[t]]
        low.append(min(lo, default=None))
        high.append(min(hi, default=None))
    return low, high


def test_session_ranks_match_a_naive_recomputation(demo, settings):
    """Every stored rank equals a full-sort ranking of the cached embeddings' aggregated history,
    each turn's image being its effective reference (a rollback turn's: the earlier turn's image;
    a combination's: the normalised mean of its turns' normalised images)."""
    run = audit(demo)
    rows = rows_of(run)
    gallery_ids = list(
        GalleryEntry.objects.filter(dataset=demo, split="val").order_by("ordinal").values_list("image_id", flat=True)
    )
    images = Image.objects.in_bulk(gallery_ids)
    index = {pk: n for n, pk in enumerate(gallery_ids)}
    sessions = session_ids(demo)
    retrospective: list[tuple] = []
    for spec in SPECS:
        r = build_retriever(spec, device="cpu")
        cache = EmbeddingCache(settings.EMBEDDING_CACHE_DIR, r.spec, r.dim)
        g = torch.from_numpy(cache.get_many("image", [images[i].sha256 for i in gallery_ids]).matrix)
        for q in sessions:
            turns = list(Turn.objects.filter(query_id=q).order_by("index").select_related("reference_image"))
            own = cache.get_many("image", [t.reference_image.sha256 for t in turns]).matrix
            img = own.copy()
            for n, t in enumerate(turns):
                if t.reference_turns:
                    unit = own[[k - 1 for k in t.reference_turns]]
                    unit = unit / np.linalg.norm(unit, axis=1, keepdims=True)
                    img[n] = unit.mean(axis=0) / np.linalg.norm(unit.mean(axis=0))
                    retrospective.append((q, t.index, t.reference_turns))
                    assert not np.allclose(img[n], own[n] / np.linalg.norm(own[n]), atol=1e-4)
            txt = cache.get_many("text", [t.text for t in turns]).matrix
            assert not np.isnan(img).any() and not np.isnan(txt).any()
            mm = torch.nn.functional.normalize(torch.from_numpy(img) + torch.from_numpy(txt), dim=-1).numpy()
            pos = [index[t.image_id] for t in Target.objects.filter(query_id=q) if t.relevance > 0 and t.role != "neg"]
            exclude = [index[t.reference_image_id] for t in turns]
            for m, base in (("multimodal", mm), ("text_only", txt), ("image_only", img)):
                for s in STRATEGIES:
                    agg = torch.from_numpy(aggregate_history(base, s, 0.8))
                    expect = naive_rank(agg, g, [pos] * len(turns), exclude, top_k=0).best_rank
                    # the worker scores every session in one batched product, this test one session
                    # at a time: float32 results may differ by an ulp between the two, so a score
                    # within 1e-6 of a positive's may fall either side of the pessimistic tie rule
                    low, high = rank_bounds(agg.double() @ g.double().T, pos, exclude, 1e-6)
                    for got, want, lo, hi in zip(rows[(q, spec, s, m)], expect, low, high):
                        assert got == want or lo <= got <= hi, (q, spec, s, m)
    # the demo's FashionMT-style turns were read from their texts: a rollback and a combination
    assert any(len(refs) == 1 for *_, refs in retrospective), retrospective
    assert any(len(refs) == 2 and refs[1] == t for _, t, refs in retrospective), retrospective


def test_rerun_hits_the_cache_and_rows_are_unique(demo):
    first = audit(demo)
    c1 = first.timings["cache"]
    assert c1["session_text_encoded"] > 0  # session texts are new; their images are gallery images
    assert c1["tau_text_encoded"] == 0  # the tau encoder is the first retriever: its texts are cached
    clear_memos()
    second = audit(demo)
    c2 = second.timings["cache"]
    assert c2["encoded"] == 0
    assert c2["session_image_encoded"] == c2["session_text_encoded"] == c2["tau_text_encoded"] == 0
    assert c2["session_image_hits"] > 0 and c2["tau_text_hits"] > 0
    assert rows_of(second) == {k: v for k, v in rows_of(first).items()}
    assert second.summary["sessions"]["metrics"] == first.summary["sessions"]["metrics"]
    assert second.summary["sessions"]["filters"] == first.summary["sessions"]["filters"]

    row = AuditSessionRank.objects.filter(run=second).first()
    with pytest.raises(IntegrityError), transaction.atomic():
        AuditSessionRank.objects.create(
            run=second,
            query_id=row.query_id,
            retriever=row.retriever,
            strategy=row.strategy,
            modality=row.modality,
            ranks=[1],
        )


def test_redelivered_session_chunk_writes_nothing_twice(demo, monkeypatch):
    monkeypatch.setattr(dispatch, "_send_chunk", lambda pk, kind: True)
    run = planning.create_run(demo, SPECS[:1], chunk_queries=5, chunk_gallery=100)
    planning.plan_run(run)
    chunk = AuditChunk.objects.filter(run=run, kind="sessions").order_by("index").first()
    assert execution.process_chunk(chunk.pk, owner="w1", heartbeat=False) == "waiting"  # gallery first
    for c in AuditChunk.objects.filter(run=run, kind="gallery"):
        assert execution.process_chunk(c.pk, owner="w1", heartbeat=False) == "ok"
    assert execution.process_chunk(chunk.pk, owner="w1", heartbeat=False) == "ok"
    n = AuditSessionRank.objects.filter(run=run).count()
    assert n == len(chunk.items) * 9
    assert execution.process_chunk(chunk.pk, owner="w2", heartbeat=False) == "done"
    assert AuditSessionRank.objects.filter(run=run).count() == n
    # a texts chunk does not wait for the gallery
    texts = AuditChunk.objects.filter(run=run, kind="texts").first()
    assert execution.process_chunk(texts.pk, owner="w1", heartbeat=False) == "ok"
    for c in AuditChunk.objects.filter(run=run).exclude(status="done"):
        assert execution.process_chunk(c.pk, owner="w3", heartbeat=False) == "ok"
    assert aggregation.aggregate_run(run.pk) is True
    assert AuditSessionRank.objects.filter(run=run).count() == N_SESSIONS * 9


def test_unusable_sessions_are_skipped_with_a_reason(demo):
    sessions = session_ids(demo)
    q_text, q_target, q_gone = sessions[:3]
    Turn.objects.filter(query_id=q_text, index=2).update(texts=[{"text": " ", "role": "caption"}])
    Target.objects.filter(query_id=q_target).delete()
    # the reference image of a later turn loses its file after the import: every
    # session that uses it (checked, not only q_gone) is skipped when it is ranked
    gone = Turn.objects.get(query_id=q_gone, index=2).reference_image
    (Path(demo.images_root) / gone.path).unlink()
    users = set(Turn.objects.filter(reference_image=gone, query_id__in=sessions).values_list("query_id", flat=True))
    unreadable = users - {q_text, q_target}
    assert q_gone in unreadable
    run = audit(demo)
    assert run.status == "done", run.error
    ses = run.summary["sessions"]
    assert ses["skipped"] == {"empty_text": 1, "reference_unreadable": len(unreadable), "no_target": 1}
    assert ses["skipped_total"] == 2 + len(unreadable)
    assert set(ses["skipped_examples"]["reference_unreadable"]) == unreadable
    scored = set(AuditSessionRank.objects.filter(run=run).values_list("query_id", flat=True))
    assert scored == set(sessions) - {q_text, q_target} - unreadable
    assert ses["n_sessions"] == ses["filters"]["n_sessions"] == N_SESSIONS - ses["skipped_total"]
    subset = QuerySubset.objects.get(dataset=demo, name=f"audit{run.pk}:sessions_kept")
    kept = subset.queries.values_list("pk", flat=True)
    assert not set(kept) & (unreadable | {q_text, q_target})


def test_a_dataset_of_sessions_only_is_audited(demo):
    QuerySubset.objects.create(dataset=demo, name="shortcut_free", source="an older audit")
    Query.objects.filter(dataset=demo, n_turns=1).delete()
    run = audit(demo, specs=SPECS[:1])
    assert run.status == "done", run.error
    assert run.summary["n_queries"] == 0 and run.summary["plan"]["eligible"] == 0
    assert run.summary["sessions"]["n_sessions"] == N_SESSIONS
    assert not AuditChunk.objects.filter(run=run, kind="queries").exists()
    # the latest single-turn subset is left alone by an audit without single-turn queries
    assert QuerySubset.objects.get(dataset=demo, name="shortcut_free").source == "an older audit"


def test_an_empty_split_still_fails_with_a_reason(demo):
    Turn.objects.filter(query__dataset=demo).update(texts=[])
    run = audit(demo, specs=SPECS[:1])
    assert run.status == "failed"
    assert "no query can be audited" in run.error and "session empty_text" in run.error


def test_run_audit_options_for_the_session_filters(demo):
    out = StringIO()
    call_command(
        "run_audit",
        "--dataset",
        "demo",
        "--retriever",
        SPECS[0],
        "--epsilon",
        "5",
        "--tau",
        "0.95",
        "--tau-encoder",
        SPECS[1],
        "--chunk-queries",
        "20",
        "--eager",
        stdout=out,
        stderr=StringIO(),
    )
    run = AuditRun.objects.get()
    assert (run.epsilon, run.tau, run.tau_encoder) == (5.0, 0.95, SPECS[1])
    assert run.status == "done", run.error
    ses = run.summary["sessions"]
    assert (ses["epsilon"], ses["tau"], ses["tau_encoder"]) == (5.0, 0.95, SPECS[1])
    assert AuditChunk.objects.get(run=run, kind="texts").retriever == SPECS[1]
    # the tau encoder is not in the pool: its texts were encoded by the texts chunk
    assert run.timings["cache"]["tau_text_encoded"] > 0
    rows = rows_of(run)
    basis = {q: rows[(q, SPECS[0], "latest", "multimodal")] for q in session_ids(demo)}
    eps_alone = sum(
        1
        for r in basis.values()
        if not all(
            (b if b is not None else float("inf")) <= (a if a is not None else float("inf")) + 5
            for a, b in zip(r, r[1:])
        )
    )
    assert ses["filters"]["steps"][2]["removed_alone"] == eps_alone
    text = out.getvalue()
    assert f"Sessions: {N_SESSIONS} scored" in text and "epsilon_consistency" in text and "tau 0.95" in text
    for bad, message in (
        (["--tau", "2"], "tau must be"),
        (["--epsilon", "-1"], "epsilon must be"),
        (["--tau-encoder", "clip:x"], "unknown backend"),
    ):
        with pytest.raises(CommandError, match=message):
            call_command("run_audit", "--dataset", "demo", "--retriever", SPECS[0], *bad, stdout=StringIO())


# ----------------------------------------------------------------------------- hand-made ranks

# Five sessions; the first retriever's multimodal latest ranks (the filter basis), K = 10:
#   s1 [12, 5]        first hit at turn 2          -> passes success, multi-turn, epsilon
#   s2 [3, 1]         hit at turn 1                -> removed by multi-turn
#   s3 [None, 50, 90] never within 10; 50 -> 90 worsens by 40 > 30 -> removed by success
#   s4 [20, 60, 8]    hit at turn 3; 20 -> 60 worsens by 40 -> removed by epsilon
#   s5 [15, 45, 9]    hit at turn 3; 15 -> 45 worsens by exactly 30 (passes)
# Largest text cosines: s2 0.9, s5 0.8 (= tau: removed), the others below 0.8.
# Chain: success removes s3 (alone: s3), multi-turn s2 (alone: s2), epsilon s4 (alone:
# s3, s4), tau s5 (alone: s2, s5) -> kept: s1.
# Hits@10 curve (first hits at turns 2, 1, -, 3, 3 of 5): [1/5, 2/5, 4/5]; Final Recall@10
# (last ranks 5, 1, 90, 8, 9): 4/5; AUC = ((0.2 + 0.4) / 2 + (0.4 + 0.8) / 2) / 2 = 0.45;
# epsilon-consistent: 3 (s3 and s4 violate).
BASIS = {"s1": [12, 5], "s2": [3, 1], "s3": [None, 50, 90], "s4": [20, 60, 8], "s5": [15, 45, 9]}
COSINE = {"s1": 0.5, "s2": 0.9, "s3": 0.1, "s4": 0.79, "s5": 0.8}


@pytest.fixture
def hand_run(db):
    dataset = Dataset.objects.create(name="hand", format="circled")
    queries = {
        sid: Query.objects.create(dataset=dataset, external_id=sid, split="val", ordinal=n, n_turns=len(r))
        for n, (sid, r) in enumerate(BASIS.items())
    }
    run = planning.create_run(dataset, SPECS)
    run.status, run.planned = AuditRun.Status.RUNNING, True
    run.summary = {"plan": {"sessions_in_split": 5}, "session_plan": {"skipped": {}, "skipped_examples": {}}}
    run.save()
    items = [q.pk for q in queries.values()]
    AuditChunk.objects.create(
        run=run,
        retriever=SPECS[0],
        kind="texts",
        index=0,
        items=items,
        status="done",
        stats={"max_text_cosine": {str(queries[s].pk): v for s, v in COSINE.items()}},
    )
    for spec in SPECS:
        AuditChunk.objects.create(
            run=run, retriever=spec, kind="sessions", index=0, items=items, status="done", stats={"session_skipped": {}}
        )
    other = {"s1": [1, 1], "s2": [None, None], "s3": [40, 11, 10], "s4": [12, 30, 7], "s5": [9, 100, 200]}
    for spec in SPECS:
        for s in STRATEGIES:
            for m in MODALITIES:
                ranks = BASIS if (spec, s, m) == (SPECS[0], "latest", "multimodal") else other
                for sid, r in ranks.items():
                    AuditSessionRank.objects.create(
                        run=run, query=queries[sid], retriever=spec, strategy=s, modality=m, ranks=r
                    )
    return run, queries, other


def test_aggregation_of_hand_made_ranks(hand_run):
    run, queries, other = hand_run
    assert aggregation.aggregate_run(run.pk) is True
    run.refresh_from_db()
    ses = run.summary["sessions"]
    assert ses["n_sessions"] == 5 and ses["l_max"] == 3
    basis = ses["metrics"][SPECS[0]]["latest"]["multimodal"]
    assert basis["hits_at_k"] == pytest.approx([0.2, 0.4, 0.8])
    assert basis["final_recall_at_k"] == pytest.approx(0.8)
    assert basis["auc"] == pytest.approx(0.45)
    assert basis["epsilon_consistent"] == 3 and basis["epsilon_violations"] == 2
    # every other ranking: exactly retrieval.sessions.session_metrics of the same ranks
    expect = session_metrics({queries[s].pk: r for s, r in other.items()}, k=10, epsilon=30)
    for spec in SPECS:
        for s in STRATEGIES:
            for m in MODALITIES:
                if (spec, s, m) == (SPECS[0], "latest", "multimodal"):
                    continue
                got = ses["metrics"][spec][s][m]
                assert got["hits_at_k"] == pytest.approx(expect["hits_at_k"])
                assert got["final_recall_at_k"] == pytest.approx(expect["final_recall_at_k"])
                assert got["auc"] == pytest.approx(expect["auc"])
    steps = {st["name"]: st for st in ses["filters"]["steps"]}
    pk = {s: q.pk for s, q in queries.items()}
    assert [(st["removed"], st["removed_alone"], st["remaining"]) for st in ses["filters"]["steps"]] == [
        (1, 1, 4),
        (1, 1, 3),
        (1, 2, 2),
        (1, 2, 1),
    ]
    assert steps["success"]["removed_examples"] == [pk["s3"]]
    assert steps["multi_turn"]["removed_examples"] == [pk["s2"]]
    assert steps["epsilon_consistency"]["removed_examples"] == [pk["s4"]]
    assert steps["tau_diversity"]["removed_examples"] == [pk["s5"]]
    assert ses["filters"]["n_kept"] == 1
    kept = QuerySubset.objects.get(name=f"audit{run.pk}:sessions_kept")
    assert list(kept.queries.values_list("pk", flat=True)) == [pk["s1"]]
    assert ses["turn_histogram"] == {"2": 2, "3": 3} and ses["kept_turn_histogram"] == {"2": 1}
    assert ses["text_cosine"] == {"sessions": 5, "at_or_above_tau": 2, "max": 0.9}
    # "other" ranks through the chain: success removes s2 (never within 10); multi-turn
    # s1 and s5 (within 10 at turn 1); s3 [40, 11, 10] and s4 [12, 30, 7] pass epsilon
    # and tau (0.1 and 0.79 < 0.8) -> 2 kept
    assert ses["kept_per_ranking"][SPECS[1]]["average"]["image_only"] == 2
    assert ses["kept_per_ranking"][SPECS[0]]["latest"]["multimodal"] == 1


# ----------------------------------------------------------------------------- pure parts


class _Composer:
    """Stands in for a retriever: only ``compose`` is used by rank_sessions."""

    def compose(self, image_emb, text_emb):
        from retrieval.encoders import compose_embeddings

        return compose_embeddings(image_emb, text_emb)


def test_rank_sessions_on_hand_made_embeddings():
    """Gallery e1, e2, t = (e1 + e2)/sqrt 2 (the target); one session of two turns.

    Images e1 then e2, texts e2 twice. Image only: turn 1 ranks t after e1 (2); turn 2
    latest (e2) ranks it after e2 (2), average and weighted (both along e1 + e2 ... e2
    direction with t on top: average = t itself; weighted 0.8 e1 + e2 scores e1 .62, e2
    .78, t .99) rank it first. Text only: e2 every time -> 2. Multimodal turn 1:
    normalise(e1 + e2) = t -> 1. Leaving e2 out at turn 2 lifts image-only latest to 1.
    """
    from audit.runs.encoding import rank_sessions

    s = 1 / np.sqrt(2)
    gallery = torch.tensor([[1.0, 0.0], [0.0, 1.0], [s, s]])
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    txt = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    out = rank_sessions(_Composer(), img, txt, [2], gallery, [[2]], [None, None]).ranks
    assert out[("latest", "image_only")] == [[2, 2]]
    assert out[("average", "image_only")] == [[2, 1]]
    assert out[("weighted", "image_only")] == [[2, 1]]
    for strategy in STRATEGIES:
        assert out[(strategy, "text_only")] == [[2, 2]]
        assert out[(strategy, "multimodal")][0][0] == 1
    excluded = rank_sessions(_Composer(), img, txt, [2], gallery, [[2]], [None, 1]).ranks
    assert excluded[("latest", "image_only")] == [[2, 1]]
    # two sessions in one call: rows are split back per session
    both = rank_sessions(
        _Composer(), torch.cat([img, img[:1]]), torch.cat([txt, txt[:1]]), [2, 1], gallery, [[2], [0]], None
    ).ranks
    assert both[("latest", "image_only")] == [[2, 2], [1]]
    with pytest.raises(ValueError, match="one positives list per session"):
        rank_sessions(_Composer(), img, txt, [2], gallery, [[2], [1]], None)


def test_line_panels_chart_scales_and_keeps_coinciding_series_visible():
    from audit.charts import Y_STEPS, line_panels_svg

    svg = line_panels_svg(
        [("multi<modal>", {"latest": [0.1, 0.3], "average": [0.1, None]}), ("text", {"latest": [0.0, 0.05]})],
        ["1", "2"],
        "Hits & curves",
        y_label="Hits@10",
    )
    root = ET.fromstring(svg)
    assert "multi&lt;modal&gt;" in svg and "Hits &amp; curves" in svg
    assert Y_STEPS[2] == 0.4  # the largest value, 0.3, fits under 0.4: the axis ends there
    ticks = [t.text for t in root.iter(f"{NS}text")]
    assert {"0", "0.1", "0.2", "0.3", "0.4"} <= set(ticks) and "0.6" not in ticks and "0.8" not in ticks
    lines = root.findall(f"{NS}polyline")
    assert len(lines) == 2  # "average" has a gap: no line of a single point
    (x1, y1), (x2, y2) = [tuple(map(float, p.split(","))) for p in lines[0].get("points").split()]
    top, bottom = 70.0, 300 - 44
    assert y1 == pytest.approx(bottom - 0.25 * (bottom - top), abs=0.1)  # 0.1 of 0.4
    assert y2 == pytest.approx(bottom - 0.75 * (bottom - top), abs=0.1)  # 0.3 of 0.4
    # the two series coincide at turn 1: their markers are drawn side by side
    tips = {el.find(f"{NS}title").text: el for el in root if el.find(f"{NS}title") is not None}
    a = tips["multi<modal> · latest · turn 1: 0.100"]
    b = tips["multi<modal> · average · turn 1: 0.100"]
    ax = float(a.get("cx"))
    bx = float(b.get("x")) + 3.5  # the square's centre
    assert bx - ax == pytest.approx(5.0, abs=0.05)
