"""Gallery encoding with its loader processes: parallel decode/preprocess gives the in-process
batches, and encode_images streams into the cache through them (moved from
tests/unit/test_audit_encoding.py: unit tests start no processes)."""

from __future__ import annotations

from pathlib import Path

import torch

from audit.runs.encoding import encode_images, encode_texts
from retrieval.embcache import EmbeddingCache
from retrieval.encoders import LazyRetriever, build_retriever, load_image, preprocessed_batches
from tests.unit.test_audit_encoding import TINY, _images


def test_parallel_loader_gives_the_in_process_batches_and_reports_unreadable(tmp_path: Path) -> None:
    r = build_retriever(TINY, device="cpu", batch_size=3)
    paths = _images(tmp_path, 7)
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image")
    items = [(f"k{i}", p) for i, p in enumerate(paths)] + [("bad", bad)]

    def run(workers: int):
        keys, pixels, unreadable = [], [], {}
        for k, x, u in preprocessed_batches(items, r.preprocess, 3, workers=workers):
            keys += k
            unreadable.update(u)
            if x is not None:
                pixels.append(x)
        return keys, torch.cat(pixels), unreadable

    k0, x0, u0 = run(0)
    k2, x2, u2 = run(2)
    assert k0 == k2 == [f"k{i}" for i in range(7)]
    assert torch.equal(x0, x2)
    assert set(u0) == set(u2) == {"bad"}
    # the preprocessed batches encode to what the plain image path gives
    assert torch.allclose(r.embed_pixels(x0), r.embed_images([load_image(p) for p in paths]), atol=1e-6)


def test_encode_images_streams_into_the_cache_and_a_warm_call_builds_no_model(tmp_path: Path) -> None:
    paths = _images(tmp_path / "img", 5)
    keys = [f"{i:064x}" for i in range(5)]
    where = dict(zip(keys, paths))
    cold = LazyRetriever(TINY, device="cpu", batch_size=2)
    cache = EmbeddingCache(tmp_path / "cache", cold.spec, cold.dim)
    seen: list[tuple[int, int]] = []
    first = encode_images(cold, cache, keys, where.__getitem__, workers=1, progress=lambda d, t: seen.append((d, t)))
    assert first.encoded == 5 and first.hits == 0 and cold.is_built
    assert seen[-1] == (5, 5) and len(seen) == 3  # one call per model batch of 2
    expect = build_retriever(TINY, device="cpu").embed_images([load_image(p) for p in paths])
    assert torch.allclose(first.matrix, expect, atol=1e-6)

    warm = LazyRetriever(TINY, device="cpu")
    again = encode_images(warm, cache, keys, lambda k: Path("/nonexistent"))
    texts = encode_texts(warm, cache, [])
    assert (again.encoded, again.hits, texts.encoded) == (0, 5, 0)
    assert torch.equal(again.matrix, first.matrix)
    assert not warm.is_built  # everything came from the cache: the model was never built
