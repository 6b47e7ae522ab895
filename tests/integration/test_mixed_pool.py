"""Issue 37's acceptance: one audit of the demo world with a pool of every kind (open_clip, hf:
tiny Qwen2-VL and Qwen3-VL, api: the local fake server, a textual-inversion composer, a Combiner
and a plugin's early-fusion retriever) labels every query with ranks in all three modalities for
every retriever; a second audit with the same pool encodes nothing (nor pays the API again)."""

from __future__ import annotations

import pytest

from audit.models import AuditLabel, AuditRank
from audit.runs import dispatch, planning
from audit.runs.encoding import clear_memos
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from retrieval.models import Dataset, Query
from tests.fake_embedding_api import FakeEmbeddingApi
from tests.plugin_dist import forget_lab_kind, install_lab_plugin

pytestmark = pytest.mark.django_db

N_SINGLE, N_SESSIONS, N_GALLERY = 8, 2, 60


@pytest.fixture
def world(tmp_path, settings, monkeypatch):
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    settings.AUDIT_DEVICE = "cpu"
    root = tmp_path / "demo"
    load_parsed(
        build_demo(root, n_gallery=N_GALLERY, n_single=N_SINGLE, n_sessions=N_SESSIONS), "demo", images_root=root
    )
    forget_lab_kind()
    monkeypatch.syspath_prepend(str(install_lab_plugin(tmp_path / "site")))
    clear_memos()
    yield Dataset.objects.get(name="demo")
    clear_memos()
    forget_lab_kind()


def _composers(tmp_path) -> list[str]:
    import torch

    from retrieval import encoders
    from retrieval.demo_composers import composer_path, composer_spec, train_composer

    backbone = tmp_path / "models" / "cirval-demo-compose-v3-s7.pt"
    backbone.parent.mkdir(parents=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        torch.save(encoders.open_clip_module().create_model("cirval-demo").state_dict(), backbone)
    return [
        composer_spec(train_composer(composer_path(backbone, name), name, backbone, steps=2, n_refs=8))
        for name in ("searle", "combiner")
    ]


def _hf(tmp_path) -> list[str]:
    from retrieval.retrievers.hf import tiny

    return [
        f"hf:gme@{tiny.qwen2_vl(tmp_path / 'qwen2vl')}",
        f"hf:qwen3-vl-embedding@{tiny.qwen3_vl(tmp_path / 'qwen3vl')}",
    ]


def test_one_audit_with_every_kind_then_a_second_that_encodes_nothing(world, tmp_path, settings):
    with FakeEmbeddingApi() as api:
        env = api.env()
        settings.API_KEYS = {"voyage": env["VOYAGE_API_KEY"], "gemini": env["GEMINI_API_KEY"]}
        settings.API_BASE_URLS = {"voyage": env["VOYAGE_BASE_URL"], "gemini": env["GEMINI_BASE_URL"]}
        settings.API_LEDGER_DIR = tmp_path / "ledger"
        pool = [
            "openclip:cirval-tiny-vit",
            *_composers(tmp_path),
            *_hf(tmp_path),
            "api:voyage/voyage-multimodal-3.5",
            "lab:toy@5",
        ]
        first = dispatch.run_inline(planning.create_run(world, pool, chunk_queries=5, chunk_gallery=25))
        assert first.status == "done", first.error
        paid = api.paid_calls
        assert paid > 0 and not api.bad_requests

        singles = set(Query.objects.filter(dataset=world, n_turns=1).values_list("pk", flat=True))
        assert set(AuditLabel.objects.filter(run=first).values_list("query_id", flat=True)) == singles
        rows = list(AuditRank.objects.filter(run=first).values_list("query_id", "retriever", "mm", "text", "image"))
        assert {r for _, r, *_ in rows} == set(first.retrievers) and len(first.retrievers) == len(pool)
        assert len(rows) == len(pool) * N_SINGLE
        for spec in first.retrievers:  # every retriever ranked every query's positives in all three modalities
            mine = [r for r in rows if r[1] == spec]
            assert all(any(v is not None for v in (mm, text, image)) for _, _, mm, text, image in mine), spec
            assert any(mm is not None for _, _, mm, _, _ in mine) and any(t is not None for *_, t, _ in mine)
        assert first.summary["sessions"]["n_sessions"] == N_SESSIONS
        assert first.timings["cache"]["query_mm_encoded"] > 0  # the whole-query passes (early fusion, composers)

        clear_memos()
        second = dispatch.run_inline(planning.create_run(world, pool, chunk_queries=5, chunk_gallery=25))
        assert second.status == "done", second.error
        cache = second.timings["cache"]
        assert cache["encoded"] == 0, cache
        assert api.paid_calls == paid  # nothing sent to the API again
        labels = [dict(AuditLabel.objects.filter(run=r).values_list("query_id", "label")) for r in (first, second)]
        assert labels[0] == labels[1]
