"""On-disk embedding cache, keyed by (retriever spec, image sha256) and (spec, text).

Pure module: numpy and the standard library (torch only inside
:func:`encode_with_cache`). No Django, no Celery.

Layout: ``ROOT/<sha256(spec)[:32]>/`` per retriever spec, holding

* ``images.f32``: every image embedding, once: row after row of ``dim`` little-endian
  float32, appended, never rewritten. An audit's gallery matrix is a memory-mapped view of it
  (:meth:`EmbeddingCache.image_matrix`), so nothing else stores a gallery;
* ``cache.sqlite3``: one SQLite database in WAL mode: table ``image`` (``key TEXT PRIMARY
  KEY, row INTEGER``: the image's row of ``images.f32``), table ``text`` (``key TEXT PRIMARY
  KEY, vec BLOB``: ``dim`` little-endian float32) and a ``meta`` table (spec, dim, format);
* ``meta.json``: the same metadata, for people browsing the folder.

An image's row is appended to ``images.f32`` (and flushed to disk) inside the write
transaction that then records its key, so a key is never visible before its vector; rows a
crash left without a key are never read, and the next writer writes over them. A cache of
format 1 (image vectors in SQLite, plus ``galleries/*.npy`` copies of whole galleries) is
converted when it is first opened.

Why SQLite: several worker processes (e.g. two Celery workers) may write the same spec
at once. WAL lets readers proceed while one writer commits; writers queue on SQLite's
own lock (``busy_timeout``); each ``put_many`` is one transaction, so a crash never
leaves a half-written entry. Entries are write-once (``INSERT OR IGNORE``): the same
spec and key always yield the same embedding, so the first writer wins. Keep ROOT on a
local file system (SQLite locking is unreliable over NFS).

Claims: a process about to encode keys the cache lacks first claims them (table ``claim``:
kind, key, owner and an expiry time, in one ``BEGIN IMMEDIATE`` transaction), encodes only
those it claimed, stores them and drops its claims; keys another live owner has claimed are
waited for and read back when stored, so two processes (two pool processes of one worker,
or two workers) never encode the same key twice. A claim whose owner died expires after
:data:`CLAIM_TTL_S` and is taken over.

Keys: image keys are stored as given (the image file's sha256 hex); text keys are the
texts themselves and are stored as the sha256 hex of their UTF-8 bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from retrieval.encoders import Retriever

__all__ = ["CacheLookup", "EmbeddingCache", "EncodeStats", "encode_with_cache", "spec_folder_name", "text_key"]

Kind = Literal["image", "text", "query"]
#: ``query``: a whole query's embedding (an early-fusion pass, or any query that is not one
#: image encode and one text encode), keyed by :meth:`retrieval.retrievers.base.Retriever.query_cache_key`
#: (which names the retriever, its exact inputs and its template version), stored like a text.
KINDS: tuple[str, ...] = ("image", "text", "query")
FORMAT_VERSION = 2
#: The image vectors' file in a spec's folder (see the module notes).
IMAGES_FILE = "images.f32"
_SQL_CHUNK = 900  # bound parameters per query (old SQLite builds allow 999)
#: Seconds a claim on keys being encoded lasts (one ``chunk_size`` batch must be encoded
#: within it); a claim left by a process that died is taken over after it.
CLAIM_TTL_S = 300.0


def spec_folder_name(spec: str) -> str:
    """Filesystem-safe folder name for a retriever spec."""
    return hashlib.sha256(spec.encode("utf-8")).hexdigest()[:32]


def text_key(text: str) -> str:
    """Storage key of a text: sha256 hex of its UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CacheLookup(NamedTuple):
    """Result of :meth:`EmbeddingCache.get_many`.

    ``matrix``: ``[len(keys), dim]`` float32 in the order of the keys asked for; rows of
    keys not in the cache are NaN. ``missing``: those keys, deduplicated, in first-seen
    order (as given, i.e. texts for ``kind='text'``).
    """

    matrix: np.ndarray
    missing: list[str]

    @property
    def found_mask(self) -> np.ndarray:
        """Boolean ``[len(keys)]``: True where the row came from the cache."""
        return ~np.isnan(self.matrix[:, 0]) if self.matrix.shape[1] else np.ones(len(self.matrix), bool)


class EmbeddingCache:
    """Embedding cache of one retriever spec under ``root``.

    Safe to share between threads and across ``fork`` (connections are opened per
    process and thread on first use).
    """

    def __init__(self, root: str | os.PathLike[str], spec: str, dim: int, timeout_s: float = 120.0) -> None:
        if not spec:
            raise ValueError("spec must be a non-empty string")
        if int(dim) < 1:
            raise ValueError(f"dim must be >= 1, not {dim}")
        self.root = Path(root)
        self.spec = spec
        self.dim = int(dim)
        self.timeout_s = float(timeout_s)
        self.folder = self.root / spec_folder_name(spec)
        self.db_path = self.folder / "cache.sqlite3"
        self.images_path = self.folder / IMAGES_FILE
        self._row_bytes = self.dim * 4
        self._local = threading.local()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._init_db()
        self._write_meta_json()

    # -- connection handling -------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        pid = os.getpid()
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != pid:
            # A connection inherited through fork must not be used; open a fresh one.
            conn = sqlite3.connect(self.db_path, timeout=self.timeout_s, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
            conn.execute("PRAGMA synchronous = NORMAL")
            self._local.conn = conn
            self._local.pid = pid
        return conn

    def close(self) -> None:
        """Close this thread's connection (others close when garbage collected)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            conn.close()
        self._local.conn = None

    def __enter__(self) -> EmbeddingCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL (once; the mode persists in the file). The switch needs the
        file to itself, and SQLite answers "database is locked" at once, without waiting for
        the busy timeout, when another process opens the same new cache at that moment (two
        workers starting one audit): retry until ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        delay = 0.005
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def _init_db(self) -> None:
        conn = self._conn()
        self._enable_wal(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            fresh = not conn.execute("SELECT 1 FROM meta").fetchone()
            conn.execute(
                "CREATE TABLE IF NOT EXISTS image (key TEXT PRIMARY KEY, "
                f"{'row INTEGER' if fresh else 'vec BLOB'} NOT NULL)"
            )
            conn.execute("CREATE TABLE IF NOT EXISTS text (key TEXT PRIMARY KEY, vec BLOB NOT NULL)")
            conn.execute("CREATE TABLE IF NOT EXISTS query (key TEXT PRIMARY KEY, vec BLOB NOT NULL)")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS claim (kind TEXT NOT NULL, key TEXT NOT NULL, "
                "owner TEXT NOT NULL, until REAL NOT NULL, PRIMARY KEY (kind, key))"
            )
            conn.executemany(
                "INSERT OR IGNORE INTO meta (name, value) VALUES (?, ?)",
                [("spec", self.spec), ("dim", str(self.dim)), ("format", str(FORMAT_VERSION))],
            )
            meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
            if int(meta["format"]) == 1 and meta["spec"] == self.spec and int(meta["dim"]) == self.dim:
                self._convert_from_format_1(conn)
                meta["format"] = str(FORMAT_VERSION)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if meta["spec"] != self.spec:
            raise ValueError(f"{self.db_path} belongs to spec {meta['spec']!r}, not {self.spec!r}")
        if int(meta["dim"]) != self.dim:
            raise ValueError(f"{self.db_path} holds dim {meta['dim']} embeddings for {self.spec!r}, not dim {self.dim}")
        if int(meta["format"]) != FORMAT_VERSION:
            raise ValueError(f"{self.db_path} has cache format {meta['format']}, expected {FORMAT_VERSION}")
        shutil.rmtree(self.folder / "galleries", ignore_errors=True)  # format 1's gallery copies

    def _convert_from_format_1(self, conn: sqlite3.Connection) -> None:
        """Format 1 kept image vectors in SQLite (and copies of whole galleries in
        ``galleries/*.npy``): append them to ``images.f32`` and keep only their rows (in the
        caller's write transaction)."""
        conn.execute("CREATE TABLE image_rows (key TEXT PRIMARY KEY, row INTEGER NOT NULL)")
        first = self._file_rows()
        keys: list[str] = []
        with open(self.images_path, "r+b" if self.images_path.exists() else "wb") as f:
            f.seek(first * self._row_bytes)
            for key, vec in conn.execute("SELECT key, vec FROM image ORDER BY rowid"):
                if len(vec) != self._row_bytes:
                    raise ValueError(
                        f"corrupt entry image/{key} in {self.db_path}: {len(vec)} bytes, expected {self._row_bytes}"
                    )
                f.write(vec)
                keys.append(key)
            f.flush()
            os.fsync(f.fileno())
        conn.executemany(
            "INSERT INTO image_rows (key, row) VALUES (?, ?)", ((k, first + n) for n, k in enumerate(keys))
        )
        conn.execute("DROP TABLE image")
        conn.execute("ALTER TABLE image_rows RENAME TO image")
        conn.execute("UPDATE meta SET value = ? WHERE name = 'format'", (str(FORMAT_VERSION),))

    def _write_meta_json(self) -> None:
        path = self.folder / "meta.json"
        if path.exists():
            return
        data = {"spec": self.spec, "dim": self.dim, "format": FORMAT_VERSION, "dtype": "float32-le"}
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".meta.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, path)  # atomic; concurrent writers write identical content

    # -- keys ------------------------------------------------------------------------------

    @staticmethod
    def _check_kind(kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be 'image', 'text' or 'query', not {kind!r}")

    @staticmethod
    def _storage_keys(kind: str, keys: Sequence[str]) -> list[str]:
        for i, k in enumerate(keys):
            if not isinstance(k, str):
                raise TypeError(f"keys[{i}] is {type(k).__name__}, not str")
        if kind == "text":
            return [text_key(k) for k in keys]
        return list(keys)

    # -- reads and writes ------------------------------------------------------------------

    def get_many(self, kind: Kind, keys: Sequence[str]) -> CacheLookup:
        """Look up many keys at once; see :class:`CacheLookup`."""
        self._check_kind(kind)
        keys = list(keys)
        skeys = self._storage_keys(kind, keys)
        matrix = np.full((len(keys), self.dim), np.nan, dtype=np.float32)
        if not keys:
            return CacheLookup(matrix, [])
        found = self._stored(kind, skeys)
        missing: dict[str, None] = {}
        rows: list[int] = []
        values: list[Any] = []
        for row, (key, skey) in enumerate(zip(keys, skeys)):
            value = found.get(skey)
            if value is None:
                missing.setdefault(key, None)
            else:
                rows.append(row)
                values.append(value)
        if rows:  # every vector found, copied in at once (not one numpy call per row)
            matrix[rows] = self._image_rows(values) if kind == "image" else self._blobs(values)
        return CacheLookup(matrix, list(missing))

    def _stored(self, kind: str, skeys: list[str]) -> dict[str, Any]:
        """Storage key -> its row of ``images.f32`` (images) or its vector's bytes (texts), for
        the keys stored, in one consistent snapshot."""
        column = "row" if kind == "image" else "vec"
        found: dict[str, Any] = {}
        conn = self._conn()
        conn.execute("BEGIN")  # one consistent snapshot for all chunks
        try:
            unique = list(dict.fromkeys(skeys))
            for start in range(0, len(unique), _SQL_CHUNK):
                chunk = unique[start : start + _SQL_CHUNK]
                marks = ",".join("?" * len(chunk))
                found.update(conn.execute(f"SELECT key, {column} FROM {kind} WHERE key IN ({marks})", chunk).fetchall())
        finally:
            conn.execute("COMMIT")
        return found

    def _blobs(self, blobs: list[bytes]) -> np.ndarray:
        for blob in blobs:
            if len(blob) != self._row_bytes:
                raise ValueError(f"corrupt text entry in {self.db_path}: {len(blob)} bytes, expected {self._row_bytes}")
        return np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), self.dim)

    def _file_rows(self) -> int:
        """Whole rows in ``images.f32`` (a row a crash left half-written is not one)."""
        try:
            return self.images_path.stat().st_size // self._row_bytes
        except FileNotFoundError:
            return 0

    def _mapped(self) -> np.ndarray:
        """``images.f32`` as a ``[rows, dim]`` copy-on-write memory map (an empty array when it
        has no row: a zero-length file cannot be mapped)."""
        n = self._file_rows()
        if not n:
            return np.zeros((0, self.dim), dtype="<f4")
        return np.memmap(self.images_path, dtype="<f4", mode="c", shape=(n, self.dim))

    def _image_rows(self, rows: Sequence[int]) -> np.ndarray:
        """The vectors of ``rows`` of ``images.f32``: a view of its memory map when they are
        consecutive, in order, else a copy."""
        mapped = self._mapped()
        index = np.asarray(rows, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= len(mapped)):
            raise ValueError(
                f"corrupt image index in {self.db_path}: row {int(index.max())} of an "
                f"{IMAGES_FILE} of {len(mapped)} rows"
            )
        if index.size and index[-1] - index[0] == index.size - 1 and bool((np.diff(index) == 1).all()):
            return mapped[int(index[0]) : int(index[-1]) + 1]
        return np.asarray(mapped[index])

    def image_rows(self, keys: Sequence[str]) -> dict[str, int]:
        """Key -> its row of ``images.f32``, for the ``keys`` stored (no vector is read)."""
        return self._stored("image", list(keys))

    def image_matrix(self, keys: Sequence[str], rows: dict[str, int] | None = None) -> np.ndarray:
        """``[len(keys), dim]`` float32 image embeddings of ``keys``, every one of them stored
        (KeyError otherwise; ``rows``: :meth:`image_rows` of them, when the caller has it).
        When the keys' rows follow each other in ``images.f32`` (a gallery encoded in its
        order), the matrix is a memory-mapped view of that file: the process holds no copy of
        it, the page cache does."""
        keys = list(keys)
        found = self.image_rows(keys) if rows is None else rows
        lacking = [k for k in keys if k not in found]
        if lacking:
            raise KeyError(f"{len(lacking)} image(s) not in the cache, e.g. {lacking[0]}")
        return self._image_rows([found[k] for k in keys]) if keys else np.zeros((0, self.dim), dtype=np.float32)

    def missing_images(self, keys: Sequence[str]) -> list[str]:
        """The ``keys`` (deduplicated, in order) that have no stored image embedding; no vector is read."""
        found = self.image_rows(keys)
        return [k for k in dict.fromkeys(keys) if k not in found]

    def put_many(self, kind: Kind, keys: Sequence[str], embeddings: Any) -> int:
        """Store ``embeddings[i]`` under ``keys[i]`` (a torch tensor or array, ``[N, dim]``).

        Existing entries are kept (write-once). Returns the number of new rows written.
        """
        self._check_kind(kind)
        keys = list(keys)
        arr = _as_float32_matrix(embeddings)
        if arr.shape != (len(keys), self.dim):
            raise ValueError(f"embeddings have shape {arr.shape}, expected ({len(keys)}, {self.dim})")
        if not np.isfinite(arr).all():
            raise ValueError("embeddings contain NaN or infinite values")
        if not keys:
            return 0
        skeys = self._storage_keys(kind, keys)
        le = arr.astype("<f4", copy=False)
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            if kind == "image":
                written = self._append_images(conn, skeys, le)
            else:
                before = conn.total_changes
                conn.executemany(
                    f"INSERT OR IGNORE INTO {kind} (key, vec) VALUES (?, ?)",
                    [(k, le[i].tobytes()) for i, k in enumerate(skeys)],
                )
                written = conn.total_changes - before
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return written

    def _append_images(self, conn: sqlite3.Connection, skeys: list[str], le: np.ndarray) -> int:
        """Append the vectors of the keys not stored yet to ``images.f32`` (flushed to disk)
        and record their rows, in the caller's write transaction; returns how many."""
        stored = self._keys_in(conn, "SELECT key FROM image WHERE key IN ({marks})", list(dict.fromkeys(skeys)))
        new: dict[str, int] = {}
        for i, k in enumerate(skeys):
            if k not in stored and k not in new:
                new[k] = i
        if not new:
            return 0
        first = self._file_rows()
        with open(self.images_path, "r+b" if self.images_path.exists() else "wb") as f:
            f.seek(first * self._row_bytes)  # over any half-written row a crash left
            f.write(np.ascontiguousarray(le[list(new.values())]).tobytes())
            f.flush()
            os.fdatasync(f.fileno())
        conn.executemany("INSERT INTO image (key, row) VALUES (?, ?)", ((k, first + n) for n, k in enumerate(new)))
        return len(new)

    def _keys_in(self, conn: sqlite3.Connection, sql: str, skeys: list[str], *head: Any) -> set[str]:
        out: set[str] = set()
        for start in range(0, len(skeys), _SQL_CHUNK):
            part = skeys[start : start + _SQL_CHUNK]
            out.update(k for (k,) in conn.execute(sql.format(marks=",".join("?" * len(part))), (*head, *part)))
        return out

    def claim(self, kind: Kind, keys: Sequence[str], owner: str, limit: int, ttl_s: float = CLAIM_TTL_S) -> list[str]:
        """Claim for ``owner`` up to ``limit`` of ``keys`` (as given, deduplicated) that are
        neither stored nor claimed by another owner (expired claims do not count); returns
        the keys claimed, in order. See the module notes."""
        self._check_kind(kind)
        keys = list(dict.fromkeys(keys))
        skeys = self._storage_keys(kind, keys)
        now = time.time()
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM claim WHERE until < ?", (now,))
            busy = self._keys_in(conn, f"SELECT key FROM {kind} WHERE key IN ({{marks}})", skeys)
            busy |= self._keys_in(
                conn, "SELECT key FROM claim WHERE kind = ? AND owner != ? AND key IN ({marks})", skeys, kind, owner
            )
            mine = [(k, sk) for k, sk in zip(keys, skeys) if sk not in busy][: max(int(limit), 0)]
            conn.executemany(
                "INSERT OR REPLACE INTO claim (kind, key, owner, until) VALUES (?, ?, ?, ?)",
                [(kind, sk, owner, now + ttl_s) for _, sk in mine],
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return [k for k, _ in mine]

    def release(self, kind: Kind, keys: Sequence[str], owner: str) -> None:
        """Drop ``owner``'s claims on ``keys`` (stored or given up)."""
        self._check_kind(kind)
        skeys = self._storage_keys(kind, list(keys))
        conn = self._conn()
        for start in range(0, len(skeys), _SQL_CHUNK):
            part = skeys[start : start + _SQL_CHUNK]
            conn.execute(
                f"DELETE FROM claim WHERE kind = ? AND owner = ? AND key IN ({','.join('?' * len(part))})",
                (kind, owner, *part),
            )

    def count(self, kind: Kind) -> int:
        """Number of entries of ``kind``."""
        self._check_kind(kind)
        return int(self._conn().execute(f"SELECT COUNT(*) FROM {kind}").fetchone()[0])

    def __repr__(self) -> str:
        return f"EmbeddingCache(folder={str(self.folder)!r}, spec={self.spec!r}, dim={self.dim})"


def _as_float32_matrix(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor, without importing torch here
        x = x.detach().to("cpu").float().numpy()
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim != 2:
        raise ValueError(f"embeddings must be 2-D, got shape {arr.shape}")
    return np.ascontiguousarray(arr)


# --------------------------------------------------------------------------- encoding


@dataclass
class EncodeStats:
    """What :func:`encode_with_cache` did: rows served from cache, unique keys encoded."""

    hits: int = 0
    misses: int = 0
    encoded: int = 0


def encode_with_cache(
    retriever: Retriever,
    cache: EmbeddingCache,
    kind: Kind,
    keys: Sequence[str],
    loader: Callable[[list[str]], Sequence[Any]] | None = None,
    chunk_size: int = 1024,
    progress: Callable[[int, int], None] | None = None,
    embed: Callable[[list[Any]], Any] | None = None,
) -> tuple[torch.Tensor, EncodeStats]:
    """Embeddings for ``keys`` in key order, encoding only what the cache lacks.

    ``loader(missing_keys)`` returns the images (``kind='image'``) or texts
    (``kind='text'``) for those keys, in order; for texts it defaults to the identity
    (the key is the text). Missing keys are loaded, encoded and stored ``chunk_size`` at
    a time, so an interrupted run keeps what it finished; ``progress(done, total)`` is
    called after each chunk. Returns a ``[len(keys), dim]`` float32 CPU tensor and
    stats: ``hits`` (rows of ``keys`` found in the cache), ``misses`` (rows not found),
    ``encoded`` (unique keys encoded). ``embed(items)``: how the loaded items are encoded
    (default ``retriever.embed_images``/``embed_texts``; required for ``kind='query'``).
    """
    import torch

    if cache.spec != retriever.spec:
        raise ValueError(f"cache is for spec {cache.spec!r}, retriever is {retriever.spec!r}")
    if cache.dim != retriever.dim:
        raise ValueError(f"cache dim {cache.dim} != retriever dim {retriever.dim}")
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    if loader is None:
        if kind != "text":
            raise ValueError(f"a loader is required for kind={kind!r}")
        loader = list
    keys = list(keys)
    lookup = cache.get_many(kind, keys)
    matrix = lookup.matrix
    found = lookup.found_mask
    stats = EncodeStats(hits=int(found.sum()), misses=int((~found).sum()))
    missing = lookup.missing
    if missing:
        if embed is None and kind == "query":
            raise ValueError("kind='query' needs embed (how a query is encoded)")
        embed = embed or (retriever.embed_images if kind == "image" else retriever.embed_texts)
        fresh = _encode_claimed(
            cache, kind, missing, lambda chunk: _embedded(embed, loader, chunk), chunk_size, stats, progress
        )
        for row in np.flatnonzero(~found):
            matrix[row] = fresh[keys[row]]
    return torch.from_numpy(matrix), stats


def _embedded(
    embed: Callable[[list[Any]], Any], loader: Callable[[list[str]], Sequence[Any]], chunk: list[str]
) -> np.ndarray:
    items = list(loader(chunk))
    if len(items) != len(chunk):
        raise ValueError(f"loader returned {len(items)} items for {len(chunk)} keys")
    return _as_float32_matrix(embed(items))


def _encode_claimed(
    cache: EmbeddingCache,
    kind: Kind,
    missing: list[str],
    encode: Callable[[list[str]], np.ndarray],
    chunk_size: int,
    stats: EncodeStats,
    progress: Callable[[int, int], None] | None,
) -> dict[str, np.ndarray]:
    """Embeddings of ``missing``: claimed and encoded ``chunk_size`` at a time, those another
    process claimed read back once it has stored them (see the module notes)."""
    owner = f"{os.getpid()}-{uuid.uuid4().hex}"
    fresh: dict[str, np.ndarray] = {}
    pending, delay = list(missing), 0.01
    while pending:
        chunk = cache.claim(kind, pending, owner, chunk_size)
        if chunk:
            try:
                emb = encode(chunk)
                cache.put_many(kind, chunk, emb)
            finally:
                cache.release(kind, chunk, owner)
            fresh.update(zip(chunk, emb))
            stats.encoded += len(chunk)
            if progress is not None:
                progress(stats.encoded, len(missing))
        else:  # every pending key is another process's: wait for it to store them
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        others = [k for k in pending if k not in fresh]
        look = cache.get_many(kind, others)
        fresh.update((others[n], look.matrix[n]) for n in np.flatnonzero(look.found_mask))
        pending = look.missing
    return fresh
