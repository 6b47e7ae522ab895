"""An eager audit of a small demo world whose pool holds an ``api:`` retriever (issue 37, item 3),
against the local fake of the hosted APIs (tests/fake_embedding_api.py, a thread of this
process): every query is labelled, no input is paid twice, a second audit sends nothing, and an
audit stopped by faults until its tries run out resumes to the same ranks."""

from __future__ import annotations

import pytest

from audit.models import AuditLabel, AuditRank, AuditRun
from audit.runs import dispatch, planning
from audit.runs.encoding import clear_memos
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from retrieval.models import Dataset, Query
from tests.fake_embedding_api import FakeEmbeddingApi

pytestmark = pytest.mark.django_db

API = "api:voyage/voyage-multimodal-3.5"
SPECS = ["openclip:cirval-tiny-vit", API]
N_SINGLE, N_SESSIONS, N_GALLERY = 12, 2, 60


@pytest.fixture
def api(settings, tmp_path):
    with FakeEmbeddingApi(slow_s=0.3) as server:
        env = server.env()
        settings.API_KEYS = {"voyage": env["VOYAGE_API_KEY"], "gemini": env["GEMINI_API_KEY"]}
        settings.API_BASE_URLS = {"voyage": env["VOYAGE_BASE_URL"], "gemini": env["GEMINI_BASE_URL"]}
        settings.API_LEDGER_DIR = tmp_path / "ledger"
        settings.API_TIMEOUT_S = 0.2
        settings.API_BATCH = 16
        yield server


@pytest.fixture
def demo(tmp_path, settings) -> Dataset:
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    root = tmp_path / "demo"
    load_parsed(
        build_demo(root, n_gallery=N_GALLERY, n_single=N_SINGLE, n_sessions=N_SESSIONS), "demo", images_root=root
    )
    clear_memos()
    yield Dataset.objects.get(name="demo")
    clear_memos()


def audit(dataset: Dataset) -> AuditRun:
    return dispatch.run_inline(planning.create_run(dataset, SPECS, chunk_queries=5, chunk_gallery=20))


def ranks(run: AuditRun) -> dict:
    return {
        (q, r): (mm, t, i)
        for q, r, mm, t, i in AuditRank.objects.filter(run=run).values_list(
            "query_id", "retriever", "mm", "text", "image"
        )
    }


def test_an_audit_with_an_api_retriever(api, demo, monkeypatch):
    run = audit(demo)
    assert run.status == "done", run.error
    singles = set(Query.objects.filter(dataset=demo, n_turns=1).values_list("pk", flat=True))
    assert set(AuditLabel.objects.filter(run=run).values_list("query_id", flat=True)) == singles
    assert {r for (_, r) in ranks(run)} == set(SPECS)
    assert not api.bad_requests and not api.duplicates()
    paid, requests = sum(api.paid.values()), api.requests
    assert paid > N_GALLERY

    clear_memos()
    again = audit(demo)  # the embedding cache (and behind it the ledger) serves everything
    assert again.status == "done", again.error
    assert api.requests == requests
    assert ranks(again) == {k: v for k, v in ranks(run).items()}


def test_an_audit_stopped_by_faults_resumes_to_the_same_ranks(api, demo, settings, tmp_path):
    """The API fails for good after three answers: the run fails with the API's error; once the
    API is back, the run resumes from the ledger (no input paid twice) and its ranks equal those
    of an audit that met no fault."""
    settings.API_MAX_TRIES = 2
    api.faults.extend(["ok"] * 3 + ["500"] * 10_000)
    run = audit(demo)
    assert run.status == "failed" and "gave up after 2 tries" in run.error
    paid_before = sum(api.paid.values())
    assert paid_before > 0  # three answers were paid (and kept in the ledger) before the API failed
    api.faults.clear()
    dispatch.retry_failed(run)
    run.refresh_from_db()
    clear_memos()
    run = dispatch.run_inline(run)
    assert run.status == "done", run.error
    assert not api.duplicates() and not api.bad_requests

    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings-clean"
    settings.API_LEDGER_DIR = tmp_path / "ledger-clean"
    clear_memos()
    clean = audit(demo)
    assert clean.status == "done", clean.error
    assert ranks(run) == ranks(clean)


def test_run_audit_prints_an_estimate_that_matches_what_is_paid(api, demo, capsys, settings):
    """run_audit's estimate before the run (under --max-cost) against what the fake API was paid,
    under the circus modality rule (its text-only queries carry a black image)."""
    settings.AUDIT_MODALITY_RULE = "circus"
    import json
    import re

    from django.core.management import call_command

    call_command(
        "run_audit",
        "--dataset",
        "demo",
        "--retriever",
        SPECS[0],
        "--retriever",
        API,
        "--max-cost",
        "5",
        "--eager",
        "--chunk-queries",
        "5",
        "--chunk-gallery",
        "20",
    )
    out = capsys.readouterr().out
    m = re.search(rf"cost estimate: {re.escape(API)}: (\d+)\+ calls, (\d+) query \+ (\d+) candidate inputs", out)
    assert m, out
    calls, queries, candidates = map(int, m.groups())
    assert AuditRun.objects.get().status == "done"
    paid = {"query": 0, "document": 0}
    for key, n in api.paid.items():
        paid[json.loads(key)[2]] += n
    assert (paid["query"], paid["document"]) == (queries, candidates)  # every input foreseen, none more
    assert api.paid_calls >= calls  # the audit's chunks split the batches further
