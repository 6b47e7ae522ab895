"""Tests for retrieval.embcache: SQLite-backed embedding cache and encode_with_cache."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from retrieval.embcache import CacheLookup, EmbeddingCache, encode_with_cache, spec_folder_name, text_key
from retrieval.encoders import OpenClipRetriever, build_retriever

SPEC = "openclip:test@random:0"


def _vec(key: str, dim: int) -> np.ndarray:
    """A deterministic float32 vector per key (what any writer would compute for it)."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")
    return np.random.default_rng(seed).standard_normal(dim).astype(np.float32)


# ------------------------------------------------------------------ storage


def test_round_trip_is_bit_exact(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path, SPEC, dim=4)
    keys = ["a" * 64, "b" * 64, "c" * 64]
    arr = np.array(
        [
            [1.0, -0.0, 1e-45, 3.4028235e38],  # subnormal, negative zero, float32 max
            [0.1, 0.2, 0.3, 0.4],
            [-1.5, 2.25, -3.125, 4.0625],
        ],
        dtype=np.float32,
    )
    assert cache.put_many("image", keys, torch.from_numpy(arr)) == 3
    got, missing = cache.get_many("image", keys)
    assert missing == []
    assert got.dtype == np.float32
    assert got.tobytes() == arr.tobytes()


def test_get_many_order_duplicates_and_missing(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path, SPEC, dim=3)
    cache.put_many("image", ["k1", "k2"], np.stack([_vec("k1", 3), _vec("k2", 3)]))
    look = cache.get_many("image", ["k2", "x", "k1", "x", "y", "k2"])
    assert isinstance(look, CacheLookup)
    assert look.missing == ["x", "y"]  # deduplicated, first-seen order
    assert look.found_mask.tolist() == [True, False, True, False, False, True]
    assert np.array_equal(look.matrix[0], _vec("k2", 3))
    assert np.array_equal(look.matrix[2], _vec("k1", 3))
    assert np.array_equal(look.matrix[5], _vec("k2", 3))
    assert np.isnan(look.matrix[[1, 3, 4]]).all()
    empty = cache.get_many("image", [])
    assert empty.matrix.shape == (0, 3) and empty.missing == []


def test_kinds_are_separate_and_text_keys_hashed(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path, SPEC, dim=2)
    cache.put_many("text", ["abc"], np.array([[1.0, 2.0]], np.float32))
    assert cache.get_many("image", ["abc"]).missing == ["abc"]
    look = cache.get_many("text", ["abc"])
    assert look.missing == [] and look.matrix.tolist() == [[1.0, 2.0]]
    # sha256("abc"), the FIPS 180-2 test vector
    assert text_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    with sqlite3.connect(cache.db_path) as conn:
        assert conn.execute("SELECT key FROM text").fetchall() == [(text_key("abc"),)]
    assert cache.count("text") == 1 and cache.count("image") == 0
    with pytest.raises(ValueError, match="kind"):
        cache.get_many("video", ["abc"])  # type: ignore[arg-type]


def test_folder_per_spec_meta_and_mismatches(tmp_path: Path) -> None:
    a = EmbeddingCache(tmp_path, SPEC, dim=8)
    b = EmbeddingCache(tmp_path, "openclip:other@random:0", dim=8)
    assert a.folder != b.folder
    assert a.folder.name == spec_folder_name(SPEC) == hashlib.sha256(SPEC.encode()).hexdigest()[:32]
    meta = json.loads((a.folder / "meta.json").read_text())
    assert meta["spec"] == SPEC and meta["dim"] == 8
    with pytest.raises(ValueError, match="dim 8"):
        EmbeddingCache(tmp_path, SPEC, dim=16)
    again = EmbeddingCache(tmp_path, SPEC, dim=8)  # reopening is fine
    assert again.count("image") == 0


def test_put_many_validation_and_write_once(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path, SPEC, dim=2)
    with pytest.raises(ValueError, match="shape"):
        cache.put_many("image", ["a"], np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="shape"):
        cache.put_many("image", ["a", "b"], np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        cache.put_many("image", ["a"], np.array([[np.nan, 0.0]], np.float32))
    assert cache.count("image") == 0  # nothing half-written
    assert cache.put_many("image", ["a"], np.array([[1.0, 0.0]])) == 1
    assert cache.put_many("image", ["a", "b"], np.array([[9.0, 9.0], [0.0, 1.0]])) == 1
    assert cache.get_many("image", ["a", "b"]).matrix.tolist() == [[1.0, 0.0], [0.0, 1.0]]


# ------------------------------------------------------------------ encode_with_cache


class CountingRetriever:
    """Wraps a retriever and records every item it is asked to encode."""

    def __init__(self, inner: OpenClipRetriever) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.dim = inner.dim
        self.images_seen = 0
        self.texts_seen: list[str] = []

    def embed_images(self, images: list[Image.Image]) -> torch.Tensor:
        self.images_seen += len(images)
        return self.inner.embed_images(images)

    def embed_texts(self, texts: list[str]) -> torch.Tensor:
        self.texts_seen.extend(texts)
        return self.inner.embed_texts(texts)

    def compose(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        return self.inner.compose(image_emb, text_emb)


@pytest.fixture(scope="module")
def tiny() -> OpenClipRetriever:
    return build_retriever("openclip:cirval-tiny-vit", device="cpu")


def test_encode_with_cache_texts_second_call_encodes_nothing(tmp_path: Path, tiny: OpenClipRetriever) -> None:
    r = CountingRetriever(tiny)
    cache = EmbeddingCache(tmp_path, r.spec, r.dim)
    texts = ["make it red", "a dog", "make it red", "two cats"]
    emb, stats = encode_with_cache(r, cache, "text", texts, chunk_size=2)
    assert (stats.hits, stats.misses, stats.encoded) == (0, 4, 3)
    assert r.texts_seen == ["make it red", "a dog", "two cats"]  # each unique text once
    assert emb.shape == (4, tiny.dim) and emb.dtype == torch.float32
    assert torch.allclose(emb, tiny.embed_texts(texts), atol=1e-6)
    emb2, stats2 = encode_with_cache(r, cache, "text", texts)
    assert (stats2.hits, stats2.misses, stats2.encoded) == (4, 0, 0)
    assert r.texts_seen == ["make it red", "a dog", "two cats"]  # nothing new encoded
    assert torch.equal(emb, emb2)
    # a partly cached request encodes only the new text
    _, stats3 = encode_with_cache(r, cache, "text", ["a dog", "a horse"])
    assert (stats3.hits, stats3.misses, stats3.encoded) == (1, 1, 1)
    assert r.texts_seen[-1] == "a horse"


def test_encode_with_cache_images_with_loader(tmp_path: Path, tiny: OpenClipRetriever) -> None:
    images = {}
    for i in range(5):
        im = Image.fromarray(np.random.RandomState(i).randint(0, 256, (32, 32, 3), dtype=np.uint8))
        images[hashlib.sha256(im.tobytes()).hexdigest()] = im
    keys = list(images)
    asked: list[list[str]] = []

    def loader(ks: list[str]) -> list[Image.Image]:
        asked.append(list(ks))
        return [images[k] for k in ks]

    r = CountingRetriever(tiny)
    cache = EmbeddingCache(tmp_path, r.spec, r.dim)
    encode_with_cache(r, cache, "image", keys[:2], loader)
    progress: list[tuple[int, int]] = []
    emb, stats = encode_with_cache(
        r, cache, "image", keys, loader, chunk_size=2, progress=lambda d, t: progress.append((d, t))
    )
    assert asked == [keys[:2], keys[2:4], keys[4:]]  # only missing keys, in chunks
    assert progress == [(2, 3), (3, 3)]
    assert (stats.hits, stats.misses, stats.encoded) == (2, 3, 3)
    assert r.images_seen == 5
    assert torch.allclose(emb, tiny.embed_images([images[k] for k in keys]), atol=1e-6)
    _, again = encode_with_cache(r, cache, "image", keys, loader)
    assert again.encoded == 0 and r.images_seen == 5


def test_encode_with_cache_checks(tmp_path: Path, tiny: OpenClipRetriever) -> None:
    wrong = EmbeddingCache(tmp_path, "openclip:something-else", tiny.dim)
    with pytest.raises(ValueError, match="spec"):
        encode_with_cache(tiny, wrong, "text", ["x"])
    cache = EmbeddingCache(tmp_path, tiny.spec, tiny.dim)
    with pytest.raises(ValueError, match="loader is required"):
        encode_with_cache(tiny, cache, "image", ["k"])
    with pytest.raises(ValueError, match="loader returned 0 items"):
        encode_with_cache(tiny, cache, "image", ["k"], loader=lambda ks: [])


# ------------------------------------------------------------------ claims


def test_claims_exclude_other_owners_until_released_or_expired(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path, SPEC, dim=16)
    cache.put_many("text", ["stored"], _vec("stored", 16)[None, :])
    assert cache.claim("text", ["stored", "a", "b", "a", "c"], "A", limit=2) == ["a", "b"]
    assert cache.claim("text", ["a", "b", "c"], "B", limit=10) == ["c"]  # a, b are A's; stored ones never
    assert cache.claim("text", ["a"], "A", limit=10) == ["a"]  # its own claim, renewed
    cache.release("text", ["a"], "A")
    assert cache.claim("text", ["a", "b"], "B", limit=10) == ["a"]
    assert cache.claim("image", ["b"], "B", limit=10) == ["b"]  # kinds are separate
    cache.claim("text", ["d"], "A", limit=1, ttl_s=-1.0)  # its owner died: the claim has expired
    assert cache.claim("text", ["d"], "B", limit=1) == ["d"]


# ------------------------------------------------------------------ one store of image vectors


def test_image_vectors_are_stored_once_in_one_file(tmp_path: Path) -> None:
    """Image vectors live in images.f32 only: SQLite keeps each key's row, not a copy of its vector."""
    cache = EmbeddingCache(tmp_path, SPEC, dim=4)
    keys = [f"{i:064x}" for i in range(5)]
    vecs = np.stack([_vec(k, 4) for k in keys])
    assert cache.put_many("image", keys[:3], vecs[:3]) == 3
    assert cache.put_many("image", keys, vecs) == 2  # the first three are kept, not written again
    assert cache.images_path.stat().st_size == 5 * 4 * 4
    with sqlite3.connect(cache.db_path) as conn:
        assert [c[1] for c in conn.execute("PRAGMA table_info(image)")] == ["key", "row"]
        assert sorted(r for (r,) in conn.execute("SELECT row FROM image")) == [0, 1, 2, 3, 4]
    assert np.array_equal(cache.get_many("image", keys).matrix, vecs)
    assert not (cache.folder / "galleries").exists()


def test_image_matrix_is_a_mapped_view_when_rows_follow_each_other(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path, SPEC, dim=4)
    keys = [f"{i:064x}" for i in range(6)]
    vecs = np.stack([_vec(k, 4) for k in keys])
    cache.put_many("image", keys, vecs)
    view = cache.image_matrix(keys[1:5])
    assert isinstance(view, np.memmap) and np.array_equal(view, vecs[1:5])
    assert view.flags.writeable  # copy-on-write: torch takes it without a warning, the file never changes
    shuffled = cache.image_matrix([keys[3], keys[0], keys[3]])
    assert not isinstance(shuffled, np.memmap) and np.array_equal(shuffled, vecs[[3, 0, 3]])
    assert cache.image_matrix([]).shape == (0, 4)
    assert cache.missing_images([keys[0], "x", "y", "x"]) == ["x", "y"]
    with pytest.raises(KeyError, match="1 image"):
        cache.image_matrix([keys[0], "x"])


def test_a_half_written_row_is_written_over(tmp_path: Path) -> None:
    """A crash between appending a vector and recording its key leaves bytes no key points to:
    never read, and the next writer writes over them."""
    cache = EmbeddingCache(tmp_path, SPEC, dim=4)
    cache.put_many("image", ["a"], _vec("a", 4)[None, :])
    with open(cache.images_path, "ab") as f:
        f.write(b"\x00" * 6)  # a torn row
    assert cache.put_many("image", ["b"], _vec("b", 4)[None, :]) == 1
    assert cache.images_path.stat().st_size == 2 * 16
    assert np.array_equal(cache.get_many("image", ["a", "b"]).matrix, np.stack([_vec("a", 4), _vec("b", 4)]))


def test_a_format_1_cache_is_converted_on_open(tmp_path: Path) -> None:
    """Format 1 kept image vectors in SQLite and whole galleries again in galleries/*.npy:
    opening it moves the vectors to images.f32 and drops the copies; texts stay."""
    folder = tmp_path / spec_folder_name(SPEC)
    (folder / "galleries").mkdir(parents=True)
    np.save(folder / "galleries" / "old.npy", np.zeros((2, 4), np.float32))
    keys = ["k1", "k2", "k3"]
    with sqlite3.connect(folder / "cache.sqlite3") as conn:
        conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.executemany("INSERT INTO meta VALUES (?, ?)", [("spec", SPEC), ("dim", "4"), ("format", "1")])
        for kind in ("image", "text"):
            conn.execute(f"CREATE TABLE {kind} (key TEXT PRIMARY KEY, vec BLOB NOT NULL)")
        conn.executemany("INSERT INTO image VALUES (?, ?)", [(k, _vec(k, 4).astype("<f4").tobytes()) for k in keys])
        conn.execute("INSERT INTO text VALUES (?, ?)", (text_key("hello"), _vec("hello", 4).tobytes()))
    cache = EmbeddingCache(tmp_path, SPEC, dim=4)
    assert not (folder / "galleries").exists()
    assert cache.count("image") == 3 and cache.count("text") == 1
    assert np.array_equal(cache.image_matrix(keys), np.stack([_vec(k, 4) for k in keys]))
    assert np.array_equal(cache.get_many("text", ["hello"]).matrix[0], _vec("hello", 4))
    with sqlite3.connect(cache.db_path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone() == ("2",)
    again = EmbeddingCache(tmp_path, SPEC, dim=4)  # converted once
    assert again.images_path.stat().st_size == 3 * 16
