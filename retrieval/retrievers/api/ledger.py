"""The ledger of paid inputs: every embedding a hosted API returned, kept the moment it arrives.

A hosted embedder charges per input. The ledger makes an input paid for never sent again:
before a request, the retriever looks up each input's key here and sends only those missing;
after each answer it stores the answer's vectors in one committed transaction, before the next
request. A run stopped at any point (a crash, a kill, a worker lost) resumes from the ledger and
loses at most the answer in flight. Standard library and numpy only.

Layout: one SQLite file per spec, ``ROOT/<sha256(spec)[:32]>.sqlite3``, in WAL mode with
``synchronous = FULL`` (a commit is on disk when it returns): table ``paid`` (``key`` TEXT
PRIMARY KEY: sha256 of the exact request content of one input, :func:`input_key`; ``vec`` BLOB:
``dim`` little-endian float32, as the API sent it) and table ``call`` (one row per answered
request: time, inputs, the usage the API reported), which is what was spent.

Claims: several processes (two workers of one audit) may need the same inputs at once. Before a
request, a process claims the keys it will send (table ``claim``: key, owner, expiry, in one
``BEGIN IMMEDIATE`` transaction); keys paid or claimed by another live owner are not sent but
waited for, and read back once that owner has stored them. A claim whose owner died expires
(``ttl_s``) and is taken over. So two processes never pay for the same input.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.retrievers.api.providers import Input

_CHUNK = 900


def input_key(spec: str, template: str, input_type: str, parts: Input) -> str:
    """sha256 naming one input as sent: the spec (provider, model, dimension), the template
    version, the input type and every part in order (a text verbatim, an image by the sha256 of
    its ``ident``, or the sha256 of its encoded bytes, and its type)."""
    h = hashlib.sha256()
    head = json.dumps([spec, template, input_type], separators=(",", ":"), ensure_ascii=False)
    h.update(head.encode("utf-8"))
    for p in parts:
        if p.is_image:
            ident = p.ident.encode() if p.ident else hashlib.sha256(p.data or b"").digest()
            h.update(b"\x00image\x00" + p.mime.encode() + b"\x00" + ident)
        else:
            h.update(b"\x00text\x00" + (p.text or "").encode("utf-8"))
    return h.hexdigest()


class Ledger:
    """The paid inputs of one spec (see the module notes). Safe across threads and processes."""

    def __init__(self, root: str | os.PathLike[str], spec: str, dim: int) -> None:
        self.root = Path(root)
        self.spec, self.dim = spec, int(dim)
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = self.root / (hashlib.sha256(spec.encode("utf-8")).hexdigest()[:32] + ".sqlite3")
        self._local = threading.local()
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute("CREATE TABLE IF NOT EXISTS paid (key TEXT PRIMARY KEY, vec BLOB NOT NULL)")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS call (at REAL NOT NULL, inputs INTEGER NOT NULL, usage TEXT NOT NULL)"
            )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS claim (key TEXT PRIMARY KEY, owner TEXT NOT NULL, until REAL NOT NULL)"
            )
            conn.executemany(
                "INSERT OR IGNORE INTO meta (name, value) VALUES (?, ?)", [("spec", spec), ("dim", str(self.dim))]
            )
            meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if meta["spec"] != spec or int(meta["dim"]) != self.dim:
            raise ValueError(
                f"{self.path} is the ledger of {meta['spec']!r} (dim {meta['dim']}), not of {spec!r} (dim {self.dim})"
            )

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            conn = sqlite3.connect(self.path, timeout=120.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def get_many(self, keys: Iterable[str]) -> dict[str, np.ndarray]:
        """Key -> its stored vector (float32), for the keys stored."""
        keys = list(dict.fromkeys(keys))
        out: dict[str, np.ndarray] = {}
        conn = self._conn()
        for start in range(0, len(keys), _CHUNK):
            part = keys[start : start + _CHUNK]
            rows = conn.execute(f"SELECT key, vec FROM paid WHERE key IN ({','.join('?' * len(part))})", part)
            for key, blob in rows:
                if len(blob) != 4 * self.dim:
                    raise ValueError(f"corrupt entry {key} in {self.path}: {len(blob)} bytes")
                out[key] = np.frombuffer(blob, dtype="<f4").copy()
        return out

    def _in(self, conn: sqlite3.Connection, sql: str, keys: list[str], *head: Any) -> set[str]:
        out: set[str] = set()
        for start in range(0, len(keys), _CHUNK):
            part = keys[start : start + _CHUNK]
            out.update(k for (k,) in conn.execute(sql.format(marks=",".join("?" * len(part))), (*head, *part)))
        return out

    def claim(self, keys: Iterable[str], owner: str, ttl_s: float) -> list[str]:
        """Claim for ``owner`` the ``keys`` neither paid nor claimed by another owner (expired
        claims do not count); returns those claimed, in order."""
        keys = list(dict.fromkeys(keys))
        now = time.time()
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM claim WHERE until < ?", (now,))
            busy = self._in(conn, "SELECT key FROM paid WHERE key IN ({marks})", keys)
            busy |= self._in(conn, "SELECT key FROM claim WHERE owner != ? AND key IN ({marks})", keys, owner)
            mine = [k for k in keys if k not in busy]
            conn.executemany(
                "INSERT OR REPLACE INTO claim (key, owner, until) VALUES (?, ?, ?)",
                [(k, owner, now + ttl_s) for k in mine],
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return mine

    def release(self, keys: Iterable[str], owner: str) -> None:
        """Drop ``owner``'s claims on ``keys`` (stored, or given up)."""
        keys = list(keys)
        conn = self._conn()
        for start in range(0, len(keys), _CHUNK):
            part = keys[start : start + _CHUNK]
            conn.execute(f"DELETE FROM claim WHERE owner = ? AND key IN ({','.join('?' * len(part))})", (owner, *part))

    def record(self, keys: Sequence[str], vectors: np.ndarray, usage: dict[str, Any] | None = None) -> None:
        """Store one answer: its vectors under ``keys`` and the call, in one durable commit (the
        keys' claims go with it)."""
        arr = np.asarray(vectors, dtype="<f4")
        if arr.shape != (len(keys), self.dim):
            raise ValueError(f"vectors of shape {arr.shape} for {len(keys)} keys of dim {self.dim}")
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(
                "INSERT OR IGNORE INTO paid (key, vec) VALUES (?, ?)",
                [(k, arr[i].tobytes()) for i, k in enumerate(keys)],
            )
            conn.execute(
                "INSERT INTO call (at, inputs, usage) VALUES (?, ?, ?)",
                (time.time(), len(keys), json.dumps(usage or {}, sort_keys=True)),
            )
            for start in range(0, len(keys), _CHUNK):
                part = list(keys[start : start + _CHUNK])
                conn.execute(f"DELETE FROM claim WHERE key IN ({','.join('?' * len(part))})", part)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def count(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM paid").fetchone()[0])

    def calls(self) -> list[dict[str, Any]]:
        """Every answered call, oldest first: ``at``, ``inputs``, ``usage``."""
        rows = self._conn().execute("SELECT at, inputs, usage FROM call ORDER BY rowid")
        return [{"at": at, "inputs": n, "usage": json.loads(u)} for at, n, u in rows]

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            conn.close()
        self._local.conn = None
