"""retrieval.embcache across processes: concurrent writers, openers and encoders, and a cache
object that survives a fork (moved from tests/unit/test_embcache.py: unit tests start no processes)."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path

import numpy as np

from retrieval.embcache import EmbeddingCache, encode_with_cache
from tests.unit.test_embcache import SPEC, _vec


def _clean_fork():
    """A start method whose children are forked from a single-threaded process (multiprocessing's
    fork server), as Celery's prefork pool forks from its worker's main process. Forking the
    test process itself is not safe: under pytest-xdist it holds other threads (a browser
    test's Playwright loop and executors), and a child forked while one of them held SQLite's
    mutex waited on it for ever (seen once in CI: the child stuck in ``sqlite3.connect``, the
    test failing after 120 s and pytest then hanging on the child at exit). The server imports
    this module once, so the children start in milliseconds."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _writer(root: str, keys: list[str], batch: int) -> None:
    cache = EmbeddingCache(root, SPEC, dim=16, timeout_s=60)
    for start in range(0, len(keys), batch):
        chunk = keys[start : start + batch]
        cache.put_many("image", chunk, np.stack([_vec(k, 16) for k in chunk]))
        cache.get_many("image", chunk)  # interleave reads with the other writer's commits


def test_concurrent_writers_leave_consistent_cache(tmp_path: Path) -> None:
    keys = [f"{i:064x}" for i in range(1500)]
    first, second = keys[:1000], keys[500:]  # 500 keys written by both
    # forked from a clean process, as Celery's prefork pool does; the children use only sqlite3 and numpy
    ctx = _clean_fork()
    procs = [
        ctx.Process(target=_writer, args=(str(tmp_path), first, 3)),
        ctx.Process(target=_writer, args=(str(tmp_path), list(reversed(second)), 2)),
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    cache = EmbeddingCache(tmp_path, SPEC, dim=16)
    assert cache.count("image") == 1500
    look = cache.get_many("image", keys)
    assert look.missing == []
    assert np.array_equal(look.matrix, np.stack([_vec(k, 16) for k in keys]))
    with sqlite3.connect(cache.db_path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def _opener(root: str, spec: str, barrier, errors) -> None:
    barrier.wait()  # every process opens the same new cache at the same moment
    try:
        EmbeddingCache(root, spec, dim=4)
    except Exception as exc:  # reported to the parent, which asserts there were none
        errors.put(f"{type(exc).__name__}: {exc}")


def test_processes_opening_one_new_cache_at_once_all_succeed(tmp_path: Path) -> None:
    """Two workers starting one audit open the same new cache together. Switching a new
    file to WAL needs it to itself, and SQLite says "database is locked" at once, without
    the busy timeout; before the retry, about 1 in 200 openings failed this way and
    failed its audit chunk."""
    ctx = _clean_fork()
    errors = ctx.Queue()
    for n in range(100):
        barrier = ctx.Barrier(6)
        procs = [
            ctx.Process(target=_opener, args=(str(tmp_path), f"openclip:race@random:{n}", barrier, errors))
            for _ in range(6)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []


def _fork_child(cache: EmbeddingCache) -> None:
    cache.put_many("image", ["from-child"], np.ones((1, 16), np.float32))


def _fork_with_cache(folder: str) -> None:
    """In a clean process: open a cache, write, fork a child that writes through the same
    object (what a prefork pool does with a cache built before the fork), and check both."""
    cache = EmbeddingCache(Path(folder), SPEC, dim=16)
    cache.put_many("image", ["from-parent"], np.zeros((1, 16), np.float32))
    p = mp.get_context("fork").Process(target=_fork_child, args=(cache,))
    p.start()
    p.join(timeout=60)
    if p.exitcode != 0:
        raise SystemExit(f"the forked child ended with {p.exitcode}")
    if cache.get_many("image", ["from-parent", "from-child"]).missing:
        raise SystemExit("the parent does not see the child's write")


def test_cache_object_survives_fork(tmp_path: Path) -> None:
    # The fork itself happens in a fork-server child (see _clean_fork), never in the test process.
    p = _clean_fork().Process(target=_fork_with_cache, args=(str(tmp_path),))
    p.start()
    p.join(timeout=120)
    assert p.exitcode == 0
    cache = EmbeddingCache(tmp_path, SPEC, dim=16)
    assert cache.get_many("image", ["from-parent", "from-child"]).missing == []


class _SlowTexts:
    """A retriever whose text encoder is slow and logs each text it encodes to a file."""

    spec, dim = SPEC, 16

    def __init__(self, log: str) -> None:
        self.log = log

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        import time

        time.sleep(0.05)
        with open(self.log, "a", encoding="utf-8") as f:
            f.writelines(t + "\n" for t in texts)
        return np.stack([_vec(t, 16) for t in texts])


def _text_encoder(root: str, log: str, texts: list[str], barrier) -> None:
    cache = EmbeddingCache(root, SPEC, dim=16, timeout_s=60)
    barrier.wait()
    emb, stats = encode_with_cache(_SlowTexts(log), cache, "text", texts, chunk_size=4)
    assert np.array_equal(emb.numpy(), np.stack([_vec(t, 16) for t in texts]))


def test_two_processes_never_encode_the_same_text_twice(tmp_path: Path) -> None:
    texts = [f"text {i}" for i in range(40)]
    log = tmp_path / "encoded.log"
    ctx = _clean_fork()
    barrier = ctx.Barrier(2)
    procs = [
        ctx.Process(target=_text_encoder, args=(str(tmp_path), str(log), order, barrier))
        for order in (texts, texts[::-1] + texts[:7])
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    encoded = log.read_text(encoding="utf-8").splitlines()
    assert sorted(encoded) == sorted(texts)  # every text once, by one process or the other
    assert EmbeddingCache(tmp_path, SPEC, dim=16).count("text") == 40
