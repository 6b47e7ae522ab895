"""An eager audit of a small demo world whose pool holds ``hf:`` retrievers (issue 37, item 2) on
tiny random-weight Qwen2-VL and Qwen3-VL checkpoints beside an open_clip one: every query is
labelled, every retriever ranks all three modalities, a second audit builds no model (the
embedding cache serves every input), and the CIRCUS modality rule audits too."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.models import AuditLabel, AuditRank, AuditRun
from audit.runs import dispatch, planning
from audit.runs.encoding import clear_memos
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from retrieval.models import Dataset, Query
from retrieval.retrievers.hf import tiny
from retrieval.retrievers.hf.embedder import HfRetriever

pytestmark = pytest.mark.django_db

N_SINGLE, N_SESSIONS, N_GALLERY = 10, 2, 40


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-audit")
    return {"qwen2_vl": tiny.qwen2_vl(root / "qwen2_vl"), "qwen3_vl": tiny.qwen3_vl(root / "qwen3_vl")}


@pytest.fixture
def demo(tmp_path, settings) -> Dataset:
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    settings.AUDIT_DEVICE = "cpu"
    root = tmp_path / "demo"
    load_parsed(
        build_demo(root, n_gallery=N_GALLERY, n_single=N_SINGLE, n_sessions=N_SESSIONS), "demo", images_root=root
    )
    clear_memos()
    yield Dataset.objects.get(name="demo")
    clear_memos()


def pool(checkpoints: dict[str, Path]) -> list[str]:
    return [
        "openclip:cirval-tiny-vit",
        f"hf:vlm2vec@{checkpoints['qwen2_vl']}",
        f"hf:qwen3-vl-embedding@{checkpoints['qwen3_vl']}",
    ]


def audit(dataset: Dataset, specs: list[str], **options) -> AuditRun:
    run = dispatch.run_inline(planning.create_run(dataset, specs, chunk_queries=4, chunk_gallery=16, **options))
    assert run.status == "done", run.error
    return run


def ranks(run: AuditRun) -> dict:
    return {
        (q, r): (mm, t, i)
        for q, r, mm, t, i in AuditRank.objects.filter(run=run).values_list(
            "query_id", "retriever", "mm", "text", "image"
        )
    }


def test_an_audit_with_hf_retrievers_and_a_second_one_that_encodes_nothing(demo, checkpoints, monkeypatch):
    specs = pool(checkpoints)
    encoded: list[int] = []
    encode = HfRetriever.encode_items
    monkeypatch.setattr(
        HfRetriever, "encode_items", lambda self, items: encoded.append(len(items)) or encode(self, items)
    )
    run = audit(demo, specs)
    assert sum(encoded) >= 2 * N_GALLERY  # each hf: retriever embedded the gallery (and the queries)
    singles = set(Query.objects.filter(dataset=demo, n_turns=1).values_list("pk", flat=True))
    assert set(AuditLabel.objects.filter(run=run).values_list("query_id", flat=True)) == singles
    got = ranks(run)
    assert {r for (_, r) in got} == set(run.retrievers)
    assert all(None not in three for three in got.values())

    encoded.clear()
    clear_memos()
    again = audit(demo, specs)
    assert ranks(again) == got
    assert encoded == []  # the embedding cache served every input of the hf: retrievers


def test_the_circus_rule_audits_hf_retrievers(demo, checkpoints, settings, monkeypatch):
    """The rule is the run's (recorded on it), not the setting of the worker that runs it."""
    settings.AUDIT_MODALITY_RULE = "family"
    rules: list[str] = []
    encode = HfRetriever.encode_items
    monkeypatch.setattr(
        HfRetriever, "encode_items", lambda self, items: rules.append(self.modality_rule) or encode(self, items)
    )
    run = audit(demo, pool(checkpoints)[1:], modality_rule="circus")
    assert run.summary["modality_rule"] == "circus" and planning.run_modality_rule(run) == "circus"
    assert rules and set(rules) == {"circus"}
    got = ranks(run)
    assert {r for (_, r) in got} == set(run.retrievers) and all(None not in v for v in got.values())


def test_an_unknown_modality_rule_is_refused_before_anything_is_stored(demo):
    before = AuditRun.objects.count()
    with pytest.raises(planning.AuditError, match="unknown modality rule 'clip'"):
        planning.create_run(demo, ["openclip:cirval-tiny-vit"], modality_rule="clip")
    assert AuditRun.objects.count() == before
