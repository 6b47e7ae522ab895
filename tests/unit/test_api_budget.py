"""The calls and cost of ``api:`` retrievers before a run (issue 37, item 3): the pure estimate,
the workload read from a dataset, and ``run_audit --max-cost`` refusing a run before anything
is written or sent."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditRun
from audit.runs.planning import resolve_split
from retrieval.embcache import EmbeddingCache
from retrieval.models import Dataset, GalleryEntry, Image, Query, Turn
from retrieval.retrievers.api.budget import audit_estimates, pool_estimates, refusal, scope_workload
from retrieval.retrievers.api.catalog import model_info
from retrieval.retrievers.api.client import ClientConfig
from retrieval.retrievers.api.cost import CandidateInput, QueryInput, Workload, estimate
from retrieval.retrievers.base import parse_spec
from tests.fake_embedding_api import FakeEmbeddingApi

VOYAGE = "api:voyage/voyage-multimodal-3.5"
GEMINI = "api:gemini/gemini-embedding-2"

#: Three queries (two share reference A), four gallery images: A 100x100 (billed as Voyage's
#: 50k-pixel minimum), B 1000x1000, C 3000x3000 (billed as the 2M maximum), D of unknown size
#: (priced at the maximum).
WORK = Workload(
    queries=[
        QueryInput("A", 100, 100, "is red"),
        QueryInput("A", 100, 100, "is blue"),
        QueryInput("B", 1000, 1000, "is red"),
    ],
    candidates=[
        CandidateInput("A", 100, 100),
        CandidateInput("B", 1000, 1000),
        CandidateInput("C", 3000, 3000),
        CandidateInput("D", None, None),
    ],
)


def test_voyage_estimate_by_hand():
    est = estimate(parse_spec(VOYAGE)[1], WORK)
    # query inputs: 3 multimodal, 2 text-only (two texts), 2 image-only (two references)
    assert (est.query_inputs, est.candidate_inputs, est.calls) == (7, 4, 2)
    assert est.text_tokens == 3 * 2 + 2 * 2  # 6 and 7 characters: 2 tokens each
    pixels = (50_000 + 50_000 + 1_000_000) + (50_000 + 1_000_000) + (50_000 + 1_000_000 + 2_000_000 + 2_000_000)
    assert est.image_units == pixels
    assert est.usd == pytest.approx(10 * 0.12 / 1e6 + pixels * 0.60 / 1e9)
    assert "estimated $0.00" in est.line() and "2026-11-29" in est.line() and "docs.voyageai.com" in est.line()


def test_gemini_estimate_by_hand_and_calls_follow_the_batch():
    est = estimate(parse_spec(GEMINI)[1], WORK)
    assert est.image_units == 9 * 258 and est.image_unit == "image tokens"
    assert est.usd == pytest.approx(10 * 0.20 / 1e6 + 9 * 258 * 0.45 / 1e6)
    info = model_info("gemini", "gemini-embedding-2")
    assert estimate(parse_spec(GEMINI)[1], WORK, config=ClientConfig.for_model(info, batch=2)).calls == 4 + 2
    assert estimate(parse_spec(GEMINI)[1], WORK, config=ClientConfig.for_model(info, batch=3)).calls == 3 + 2
    small_requests = ClientConfig.for_model(info, max_request_mb=0.5)  # two 1000x1000 JPEGs do not fit in one
    assert estimate(parse_spec(GEMINI)[1], WORK, config=small_requests).calls > 2
    with pytest.raises(ValueError, match="at most 100 inputs a request, not 101"):
        ClientConfig.for_model(info, batch=101)


def test_circus_text_only_queries_carry_a_black_image():
    family = estimate(parse_spec(VOYAGE)[1], WORK)
    circus = estimate(parse_spec(VOYAGE)[1], WORK, "circus")
    # three text-only inputs (a black image of each reference's size with its text) instead of two texts
    assert (circus.query_inputs, family.query_inputs) == (8, 7)
    assert circus.image_units - family.image_units == 50_000 + 50_000 + 1_000_000


def test_refusal():
    est = estimate(parse_spec(VOYAGE)[1], WORK)
    assert refusal([est], None) is None and refusal([est], 1.0) is None
    assert "over --max-cost $0.00" in refusal([est], 0.001)


@pytest.fixture
def dataset(db):
    ds = Dataset.objects.create(name="apicost", format="cirr")
    sizes = {"A": (100, 100), "B": (1000, 1000), "C": (3000, 3000), "D": (None, None), "E": (10, 10)}
    img = {
        k: Image.objects.create(dataset=ds, external_id=k, path=f"{k}.jpg", sha256=k * 64, width=w, height=h)
        for k, (w, h) in sizes.items()
    }
    img["E"].missing = True  # not readable: neither a candidate nor a reference
    img["E"].save()
    for n, k in enumerate("ABCDE"):
        GalleryEntry.objects.create(dataset=ds, split="val", image=img[k], ordinal=n)
    for n, (ref, text) in enumerate([("A", "is red"), ("A", "is blue"), ("B", "is red"), ("B", "  "), ("E", "x")]):
        q = Query.objects.create(dataset=ds, external_id=str(n), split="val", ordinal=n)
        Turn.objects.create(query=q, index=1, reference_image=img[ref], texts=[{"text": text, "role": "caption"}])
    return ds


def test_workload_of_a_dataset_and_the_cache(dataset, tmp_path):
    work = scope_workload(dataset.pk, "val")
    # the blank text and the missing reference are not sent
    assert [(q.image_key[0], q.width, q.height, q.text) for q in work.queries] == [
        (q.image_key, q.width, q.height, q.text) for q in WORK.queries
    ]
    assert {c.image_key[0] for c in work.candidates} == {"A", "B", "C", "D"}
    want = estimate(parse_spec(VOYAGE)[1], WORK)
    assert pool_estimates(["openclip:cirval-tiny-vit", VOYAGE], dataset.pk, "val")[0].usd == pytest.approx(want.usd)
    assert not list(tmp_path.iterdir())
    assert pool_estimates([VOYAGE], dataset.pk, "val", cache_root=tmp_path)[0].candidate_inputs == 4
    assert not list(tmp_path.iterdir())  # an estimate creates no cache
    cache = EmbeddingCache(tmp_path, VOYAGE, 1024)
    cache.put_many("image", ["C" * 64], [[1.0] + [0.0] * 1023])
    cache.close()
    assert pool_estimates([VOYAGE], dataset.pk, "val", cache_root=tmp_path)[0].candidate_inputs == 3
    assert audit_estimates("apicost", None, ["openclip:cirval-tiny-vit"], resolve_split) == []
    assert audit_estimates("nope", None, [VOYAGE], resolve_split) == []
    assert len(audit_estimates("apicost", None, [VOYAGE, GEMINI], resolve_split)) == 2


def test_run_audit_refuses_a_run_over_max_cost_and_writes_nothing(dataset, tmp_path, settings, capsys):
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    settings.API_LEDGER_DIR = tmp_path / "ledger"
    with FakeEmbeddingApi() as api:
        env = api.env()
        settings.API_KEYS = {"voyage": env["VOYAGE_API_KEY"], "gemini": env["GEMINI_API_KEY"]}
        settings.API_BASE_URLS = {"voyage": env["VOYAGE_BASE_URL"], "gemini": env["GEMINI_BASE_URL"]}
        with pytest.raises(
            CommandError, match=r"estimated cost \$0\.00 is over --max-cost \$0\.00; nothing was started"
        ):
            call_command(
                "run_audit",
                "--dataset",
                "apicost",
                "--retriever",
                "openclip:cirval-tiny-vit",
                "--retriever",
                VOYAGE,
                "--max-cost",
                "0.001",
                "--eager",
            )
        assert api.requests == 0
    out = capsys.readouterr().out
    assert f"cost estimate: {VOYAGE}: 2+ calls, 7 query + 4 candidate inputs" in out
    assert AuditRun.objects.count() == 0
    assert not (tmp_path / "ledger").exists() and not (tmp_path / "embeddings").exists()
