"""``api:`` retrievers (issue 37, item 3) against a local fake of the Voyage and Gemini APIs on a
thread of this process: the documented requests, the ledger of paid inputs, retries of injected
faults (429 with Retry-After, 5xx, timeouts, dropped connections, malformed bodies), a run
stopped midway and resumed, and the rate limiter."""

from __future__ import annotations

import ast
import email.utils
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from retrieval.retrievers.api.catalog import model_info
from retrieval.retrievers.api.client import ApiClient, ClientConfig, batches
from retrieval.retrievers.api.retriever import ApiRetriever
from retrieval.retrievers.api.transport import (
    ApiGaveUp,
    ApiKeyMissing,
    ApiRefused,
    RateLimiter,
    RetryPolicy,
    retry_after_seconds,
)
from retrieval.retrievers.base import parse_spec
from tests.fake_embedding_api import FakeEmbeddingApi, vector_of

ROOT = Path(__file__).resolve().parents[2]
VOYAGE = "api:voyage/voyage-multimodal-3.5"
GEMINI = "api:gemini/gemini-embedding-2@768"


@pytest.fixture
def api():
    with FakeEmbeddingApi(retry_after="3", slow_s=0.5) as server:
        yield server


def images(n: int, seed: int = 0, size: tuple[int, int] = (24, 16)) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(n)]


class Stop(RuntimeError):
    """The simulated crash of a run (after some answers were paid)."""


def retriever(
    api: FakeEmbeddingApi,
    root: Path,
    spec: str = VOYAGE,
    *,
    rule: str = "family",
    batch: int = 3,
    max_tries: int = 6,
    key: str | None = None,
    sleeps: list[float] | None = None,
    on_batch=None,
) -> ApiRetriever:
    """A retriever of ``spec`` whose client talks to ``api`` (``key``: instead of the right one)
    and records its backoff sleeps instead of sleeping."""
    _, parsed = parse_spec(spec)
    info = model_info(parsed["provider"], parsed["model"])
    env = api.env()
    provider = parsed["provider"].upper()
    config = ClientConfig(
        key=env[f"{provider}_API_KEY"] if key is None else key,
        base_url=env[f"{provider}_BASE_URL"],
        rpm=100_000,
        tpm=100_000_000,
        batch=batch,
        max_request_bytes=8 << 20,
        policy=RetryPolicy(max_tries=max_tries, base_s=0.01, cap_s=30.0, timeout_s=0.25),
    )
    client = ApiClient(
        info,
        parsed["dim"],
        config,
        sleep=(sleeps.append if sleeps is not None else lambda s: None),
        rng=random.Random(0),
    )
    return ApiRetriever(parsed, root, modality_rule=rule, client=client, on_batch=on_batch)


def workload() -> tuple[list[Image.Image | None], list[str | None], list[Image.Image]]:
    refs = images(4, seed=1)
    q_images = [refs[0], refs[1], refs[2], refs[3], None, refs[0], refs[1]]
    q_texts = ["is red", "has a collar", "is longer", "no sleeves", "is blue", None, "has a collar"]
    return q_images, q_texts, images(8, seed=2)


def ranks(q: torch.Tensor, c: torch.Tensor) -> list[list[int]]:
    return torch.argsort(q @ c.T, dim=1, descending=True, stable=True).tolist()


def normalised(vectors: list[list[float]]) -> np.ndarray:
    arr = np.asarray(vectors, dtype=np.float32)
    return arr / np.linalg.norm(arr, axis=1, keepdims=True)


# --------------------------------------------------------------------------- specs


def test_parse_canonical_and_errors():
    kind, parsed = parse_spec(" api:voyage/voyage-multimodal-3.5 ")
    assert parsed == {
        "backend": "api",
        "provider": "voyage",
        "model": "voyage-multimodal-3.5",
        "dim": 1024,
        "canonical": "api:voyage/voyage-multimodal-3.5",
    }
    assert kind.fusion(parsed) == "early"
    assert parse_spec("api:voyage/voyage-multimodal-3.5@1024")[1]["canonical"] == VOYAGE  # the default dim
    assert parse_spec(GEMINI)[1]["dim"] == 768
    for bad, says in [
        ("api:voyage", "PROVIDER/MODEL"),
        ("api:openai/x", "unknown API provider 'openai'"),
        ("api:voyage/voyage-2", "unknown voyage model 'voyage-2'"),
        ("api:voyage/voyage-multimodal-3@512", "offered: 1024"),
        ("api:gemini/gemini-embedding-2@big", "not an output dimension"),
    ]:
        with pytest.raises(ValueError, match=says) as err:
            parse_spec(bad)
        assert bad in str(err.value)


def test_parsing_and_estimating_import_no_torch_pil_or_network():
    """The web tier parses api: specs and estimates their cost: those modules import neither
    torch nor PIL nor Django, and open no connection (module level)."""
    folder = ROOT / "retrieval" / "retrievers" / "api"
    for name in ("__init__.py", "catalog.py", "providers.py", "cost.py", "client.py", "transport.py", "ledger.py"):
        tree = ast.parse((folder / name).read_text())
        top = set()
        for node in tree.body:  # module-level imports only (build() imports the retriever lazily)
            if isinstance(node, ast.Import):
                top.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                top.add(node.module.split(".")[0])
        assert not top & {"torch", "PIL", "django", "open_clip", "transformers", "requests"}, name


# --------------------------------------------------------------------------- requests and answers


def test_voyage_requests_and_answers_as_documented(api, tmp_path):
    q_images, q_texts, cands = workload()
    r = retriever(api, tmp_path)
    assert (r.fusion, r.dim, r.spec) == ("early", 1024, VOYAGE)
    q = r.embed_queries(q_images, q_texts)
    c = r.embed_candidates(cands)
    assert not api.bad_requests
    assert q.dtype == c.dtype == torch.float32 and q.device.type == "cpu"
    assert q.shape == (7, 1024) and c.shape == (8, 1024)
    assert torch.allclose(q.norm(dim=1), torch.ones(7)) and torch.allclose(c.norm(dim=1), torch.ones(8))
    # a query is the reference image then the text, sent with input_type query; candidates as documents
    first = api.last_bodies[0]
    assert first["model"] == "voyage-multimodal-3.5" and first["input_type"] == "query" and first["truncation"] is True
    assert "output_dimension" not in first  # the model's default dimension
    types = [[seg["type"] for seg in item["content"]] for item in first["inputs"]]
    assert types == [["image_base64", "text"]] * 3
    assert first["inputs"][0]["content"][1] == {"type": "text", "text": "is red"}
    assert first["inputs"][0]["content"][0]["image_base64"].startswith("data:image/jpeg;base64,/9j/")
    assert {b["input_type"] for b in api.last_bodies[-3:]} == {"document"}
    # the vectors are the API's, L2-normalised; the text-only query is the text alone
    text_only = [{"type": "text", "text": "is blue"}]
    assert np.allclose(
        q[4].numpy(), normalised([vector_of("voyage-multimodal-3.5", "query", text_only, 1024)])[0], atol=1e-6
    )
    # the repeated query (same image, same text) was sent once: 6 unique query inputs, 8 candidates
    assert sum(api.paid.values()) == 6 + 8 and not api.duplicates()
    assert torch.equal(q[1], q[6])
    assert r.ledger.count() == 14 and len(r.ledger.calls()) == api.paid_calls == 2 + 3


def test_gemini_requests_task_prefix_and_dimension(api, tmp_path):
    q_images, q_texts, cands = workload()
    r = retriever(api, tmp_path, GEMINI, batch=50)
    q = r.embed_queries(q_images, q_texts)
    c = r.embed_candidates(cands)
    assert not api.bad_requests and q.shape == (7, 768) and c.shape == (8, 768)
    body = api.last_bodies[0]
    req = body["requests"][0]
    assert req["model"] == "models/gemini-embedding-2" and req["outputDimensionality"] == 768
    image, text = req["content"]["parts"]
    assert image["inlineData"]["mimeType"] == "image/jpeg"
    assert text == {"text": "task: search result | query: is red"}
    image_only = body["requests"][5]["content"]["parts"]
    assert image_only[1] == {"text": "task: search result | query:"}
    assert [list(p) for p in api.last_bodies[1]["requests"][0]["content"]["parts"]] == [["inlineData"]]  # documents
    assert sum(api.paid.values()) == 6 + 8 and not api.duplicates()


def test_circus_rule_sends_a_black_image_with_a_text_only_query(api, tmp_path):
    r = retriever(api, tmp_path, rule="circus")
    r.embed_queries([None, images(1)[0]], ["is blue", None])
    parts = [[seg["type"] for seg in item["content"]] for item in api.last_bodies[0]["inputs"]]
    assert parts == [["image_base64", "text"], ["image_base64"]]
    assert r.template_version == "voyage-1-circus" != retriever(api, tmp_path / "f").template_version
    assert r.query_cache_key("abc", "t") != retriever(api, tmp_path / "g").query_cache_key("abc", "t")


# --------------------------------------------------------------------------- keys


def test_a_missing_key_names_its_variable_and_a_paid_run_needs_none(api, tmp_path):
    q_images, q_texts, _ = workload()
    with pytest.raises(ApiKeyMissing, match="set the environment variable VOYAGE_API_KEY"):
        retriever(api, tmp_path, key="").embed_queries(q_images, q_texts)
    assert api.requests == 0
    first = retriever(api, tmp_path).embed_queries(q_images, q_texts)
    again = retriever(api, tmp_path, key="").embed_queries(q_images, q_texts)  # all in the ledger: no key asked
    assert torch.equal(first, again)
    with pytest.raises(ApiKeyMissing, match="GEMINI_API_KEY"):
        ApiClient(model_info("gemini", "gemini-embedding-2"), 3072).key()


def test_the_kind_builds_from_the_settings(api, tmp_path, settings):
    """build() takes the key, the API root, the limits and the ledger folder from the settings."""
    env = api.env()
    settings.API_KEYS = {"voyage": env["VOYAGE_API_KEY"], "gemini": ""}
    settings.API_BASE_URLS = {"voyage": env["VOYAGE_BASE_URL"], "gemini": ""}
    settings.API_BATCH = 2
    settings.API_LEDGER_DIR = tmp_path / "ledger"
    kind, parsed = parse_spec(VOYAGE)
    r = kind.build(parsed, device="cpu", precision="fp32", modality_rule="circus")
    assert (r.spec, r.fusion, r.template_version) == (VOYAGE, "early", "voyage-1-circus")
    assert r.embed_candidates(images(3)).shape == (3, 1024)
    assert api.paid_calls == 2 and (tmp_path / "ledger").is_dir()
    gemini = kind.build(parse_spec(GEMINI)[1], device="cpu", precision="fp32")
    with pytest.raises(ApiKeyMissing, match="GEMINI_API_KEY"):
        gemini.embed_candidates(images(1))


def test_identity_without_building_and_one_ledger_for_both_modality_rules(api, tmp_path):
    kind, parsed = parse_spec(GEMINI)
    for rule in ("family", "circus"):
        built = retriever(api, tmp_path, GEMINI, rule=rule)
        assert kind.identity(parsed, device="cpu", precision="fp32", modality_rule=rule) == {
            "spec": built.spec,
            "dim": built.dim,
            "template_version": built.template_version,
        }
    ref = images(1)
    family = retriever(api, tmp_path, GEMINI).embed_queries(ref, ["is red"])
    circus = retriever(api, tmp_path, GEMINI, rule="circus").embed_queries(ref, ["is red"])
    assert torch.equal(family, circus) and sum(api.paid.values()) == 1  # the same request, paid once


def test_the_audit_pipeline_drives_it(api, tmp_path, settings):
    """The audit's wrapper (retrieval.retrievers.pipeline) embeds candidates and the three query
    modalities of the circus rule (a black image of the reference's size, the empty text)."""
    from retrieval.retrievers.base import black_like
    from retrieval.retrievers.pipeline import audit_retriever, modality_pairs

    env = api.env()
    settings.API_KEYS = {"voyage": env["VOYAGE_API_KEY"], "gemini": ""}
    settings.API_BASE_URLS = {"voyage": env["VOYAGE_BASE_URL"], "gemini": ""}
    settings.API_LEDGER_DIR = tmp_path / "ledger"
    r = audit_retriever(VOYAGE, device="cpu", modality_rule="circus")
    assert (r.spec, r.dim, r.fusion) == (VOYAGE, 1024, "early") and not r.is_built
    ref = images(1)[0]
    pairs = modality_pairs("circus", "k", "is red")
    image_of = {"k": ref, "black:k": black_like(ref)}
    q = r.embed_queries([image_of[k] for k, _ in pairs.values()], [t for _, t in pairs.values()])
    assert q.shape == (3, 1024) and not api.bad_requests
    sent = [[seg["type"] for seg in item["content"]] for item in api.last_bodies[0]["inputs"]]
    assert sent == [["image_base64", "text"], ["image_base64", "text"], ["image_base64"]]
    assert r.embed_pixels(images(2)).shape == (2, 1024)


def test_a_refused_key_fails_at_once_naming_the_variable(api, tmp_path):
    with pytest.raises(ApiRefused, match=r"HTTP 401 \(is VOYAGE_API_KEY a valid key\?\)"):
        retriever(api, tmp_path, key="wrong").embed_candidates(images(2))
    assert api.requests == 1


# --------------------------------------------------------------------------- faults


def test_faults_are_retried_and_nothing_is_paid_twice(api, tmp_path):
    q_images, q_texts, cands = workload()
    clean_dir, faulty_dir = tmp_path / "clean", tmp_path / "faulty"
    clean_q = retriever(api, clean_dir).embed_queries(q_images, q_texts)
    clean_c = retriever(api, clean_dir).embed_candidates(cands)
    api.paid.clear()
    api.faults.extend(["429", "500", "slow", "malformed", "drop", "short", "503"])
    sleeps: list[float] = []
    r = retriever(api, faulty_dir, sleeps=sleeps, max_tries=8)
    q = r.embed_queries(q_images, q_texts)
    c = r.embed_candidates(cands)
    assert not api.faults and not api.bad_requests
    assert torch.equal(q, clean_q) and torch.equal(c, clean_c)
    assert not api.duplicates() and sum(api.paid.values()) == 6 + 8
    assert sleeps[0] >= 3.0  # the 429's Retry-After: 3 was honoured
    assert len(sleeps) == 7 and all(s >= 0 for s in sleeps)


def test_gives_up_after_max_tries_with_what_it_met(api, tmp_path):
    api.faults.extend(["500"] * 4)
    r = retriever(api, tmp_path, max_tries=4)
    with pytest.raises(ApiGaveUp, match=r"gave up after 4 tries; the last one met HTTP 500"):
        r.embed_candidates(images(2))
    assert api.requests == 4 and r.ledger.count() == 0


def test_vectors_of_another_dimension_fail_at_once(api, tmp_path):
    """A well-formed answer of the wrong dimension is not retried (each retry would be paid)."""
    api.faults.append("wrongdim")
    with pytest.raises(ApiRefused, match="the embeddings have 1025 values, the spec says 1024"):
        retriever(api, tmp_path).embed_candidates(images(2))
    assert api.requests == 1


def test_a_run_stopped_midway_resumes_without_paying_twice(api, tmp_path):
    q_images, q_texts, cands = workload()
    whole = retriever(api, tmp_path / "whole")
    want_q, want_c = whole.embed_queries(q_images, q_texts), whole.embed_candidates(cands)
    api.paid.clear()

    done: list[int] = []

    def crash_after_three(n_done: int, n_todo: int) -> None:
        done.append(n_done)
        if len(done) == 3:
            raise Stop("killed after 3 batches")

    stopped = retriever(api, tmp_path / "run", on_batch=crash_after_three)
    stopped.embed_queries(q_images, q_texts)  # 6 unique queries, batches of 3: two batches
    # the first batch of candidates is paid and in the ledger, then the process dies
    with pytest.raises(Stop):
        stopped.embed_candidates(cands)
    assert sum(api.paid.values()) == 6 + 3
    resumed = retriever(api, tmp_path / "run")  # a fresh process would open the same ledger
    got_q, got_c = resumed.embed_queries(q_images, q_texts), resumed.embed_candidates(cands)
    assert not api.duplicates() and sum(api.paid.values()) == 6 + 8
    assert torch.equal(got_q, want_q) and torch.equal(got_c, want_c)
    assert ranks(got_q, got_c) == ranks(want_q, want_c)


def test_two_processes_never_pay_for_the_same_input(api, tmp_path):
    """Two retrievers on one ledger (two workers) asked for the same inputs at once: each input
    is paid once; the one that did not send reads the other's answers back from the ledger."""
    import threading

    _, q_texts, cands = workload()
    gate = threading.Barrier(2)
    out: dict[int, torch.Tensor] = {}

    def work(n: int) -> None:
        r = retriever(api, tmp_path, batch=2)
        gate.wait()
        out[n] = r.embed_candidates(cands)

    threads = [threading.Thread(target=work, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert torch.equal(out[0], out[1])
    assert not api.duplicates() and sum(api.paid.values()) == 8


def test_a_claim_of_a_dead_process_expires(tmp_path):
    from retrieval.retrievers.api.ledger import Ledger

    ledger = Ledger(tmp_path, VOYAGE, 4)
    assert ledger.claim(["a", "b"], "dead", ttl_s=-1) == ["a", "b"]  # expired at once
    assert ledger.claim(["a", "b", "c"], "alive", ttl_s=60) == ["a", "b", "c"]
    assert ledger.claim(["a", "d"], "other", ttl_s=60) == ["d"]
    ledger.record(["a"], np.ones((1, 4)), {})
    assert ledger.claim(["a", "b"], "other", ttl_s=60) == []  # a paid, b claimed
    ledger.release(["b"], "alive")
    assert ledger.claim(["a", "b"], "other", ttl_s=60) == ["b"]


# --------------------------------------------------------------------------- limits


def test_rate_limiter_keeps_requests_and_tokens_per_minute():
    now = [0.0]
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s

    limiter = RateLimiter(rpm=2, tpm=1000, clock=lambda: now[0], sleep=sleep)
    assert limiter.acquire(100) == 0 and limiter.acquire(100) == 0
    assert limiter.acquire(100) == pytest.approx(60.0)  # the third request of the minute waits
    now[0] = 200.0
    limiter = RateLimiter(rpm=100, tpm=1000, clock=lambda: now[0], sleep=sleep)
    limiter.acquire(700)
    now[0] += 10
    assert limiter.acquire(400) == pytest.approx(50.0)  # waits for the 700 tokens to leave the window
    assert limiter.acquire(5000) > 0  # bigger than a minute's budget: waits for an empty window, then goes


def test_backoff_and_retry_after():
    policy = RetryPolicy(base_s=1.0, cap_s=10.0)
    rng = random.Random(1)
    assert all(0 <= policy.backoff(a, rng) <= min(10.0, 2 ** (a - 1)) for a in range(1, 10) for _ in range(20))
    assert policy.backoff(1, rng, retry_after=7.0) >= 7.0
    assert policy.backoff(1, rng, retry_after=500.0) <= 10.0 + 0.25  # capped
    assert retry_after_seconds("12") == 12.0 and retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    date = email.utils.formatdate(1_000_030.0, usegmt=True)
    assert retry_after_seconds(date, now=1_000_000.0) == pytest.approx(30.0)


def test_batches_keep_every_limit():
    sizes = [(10, 5)] * 7
    assert [list(b) for b in batches(sizes, 3, 10_000, 10_000)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [len(b) for b in batches(sizes, 100, 25, 10_000)] == [2, 2, 2, 1]
    assert [len(b) for b in batches(sizes, 100, 10_000, 12)] == [2, 2, 2, 1]
    assert [len(b) for b in batches([(99, 1), (1, 1)], 10, 50, 10)] == [1, 1]  # too big alone: goes alone
