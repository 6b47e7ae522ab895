"""A scratch index of candidate-pool rows, kept on disk so memory does not grow with the pool.

M-BEIR candidate pools run to millions of lines. While and after reading one, the parser
still has to answer, per row or per query:

* was this did already on an earlier line of the same pool file (a duplicate row, and where)?
* which values were first registered for a did (a later row may only complete them, as
  :meth:`retrieval.records.ParsedDataset.add_image` does)?
* is a did already in the gallery of a split (pools of one split may overlap)?
* which did has a query image's path (the first pool row with that path)?
* is a target did in a pool at all?

A dict per question would keep a few hundred bytes per pool row in Python. This index keeps
them in a private temporary SQLite database instead (``sqlite3.connect("")``: on disk, removed
when closed, with a page cache of at most :data:`CACHE_KIB`), so the parser holds one batch of
rows at a time whatever the pool's length; the disk it takes is about the size of the pool
file. Pure Python (the standard library's ``sqlite3``); nothing here imports Django.
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable

from retrieval.records import ImageRecord

#: Upper bound of SQLite's page cache for the index, in KiB (its memory stays below this).
CACHE_KIB = 8192

_SCHEMA = (
    # the first values registered for each image did of every pool (merged with later rows)
    "CREATE TABLE image (did TEXT PRIMARY KEY, path TEXT, url TEXT, extra TEXT NOT NULL) WITHOUT ROWID",
    # dids of the pool file being read, with their first line (emptied at each new file)
    "CREATE TABLE seen (did TEXT PRIMARY KEY, line INTEGER NOT NULL) WITHOUT ROWID",
    # gallery membership per split
    "CREATE TABLE member (split TEXT NOT NULL, did TEXT NOT NULL, PRIMARY KEY (split, did)) WITHOUT ROWID",
    # the first did of each image path
    "CREATE TABLE by_path (path TEXT PRIMARY KEY, did TEXT NOT NULL) WITHOUT ROWID",
)


class PoolIndex:
    """Lookups over the pool rows read so far (use as a context manager; closing deletes it)."""

    def __init__(self) -> None:
        self.db = sqlite3.connect("", isolation_level=None)
        for pragma in ("journal_mode = OFF", "synchronous = OFF", f"cache_size = -{CACHE_KIB}",
                       "temp_store = FILE"):
            self.db.execute(f"PRAGMA {pragma}")
        for statement in _SCHEMA:
            self.db.execute(statement)
        # one transaction for the index's whole life: nothing is ever committed (closing drops
        # it all), and SQLite does not write the dirty pages out at every statement
        self.db.execute("BEGIN")

    def __enter__(self) -> PoolIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    def _select(self, sql: str, keys: list[str], *before: str) -> list[tuple]:
        """Rows of ``sql`` (ending in ``IN ({marks})``) for ``keys``, a SQLite-sized chunk at a time."""
        rows: list[tuple] = []
        for start in range(0, len(keys), 900):
            chunk = keys[start : start + 900]
            rows.extend(self.db.execute(sql.format(marks=",".join("?" * len(chunk))), (*before, *chunk)))
        return rows

    # ------------------------------------------------------------------ one pool file

    def start_file(self) -> None:
        """Forget the dids of the previous pool file (duplicates are counted per file)."""
        self.db.execute("DELETE FROM seen")

    def first_lines(self, dids: Iterable[str]) -> dict[str, int]:
        """``did -> line`` for the ``dids`` already read on an earlier line of this file."""
        return dict(self._select("SELECT did, line FROM seen WHERE did IN ({marks})", list(set(dids))))

    def mark_seen(self, rows: Iterable[tuple[str, int]]) -> None:
        """Remember ``(did, line)`` pairs of this file (the first line of each did is kept)."""
        self.db.executemany("INSERT OR IGNORE INTO seen (did, line) VALUES (?, ?)", rows)

    # ------------------------------------------------------------------ images

    def images(self, dids: Iterable[str]) -> dict[str, ImageRecord]:
        """The registered values of the ``dids`` that an earlier row registered."""
        rows = self._select("SELECT did, path, url, extra FROM image WHERE did IN ({marks})", list(set(dids)))
        return {did: ImageRecord(did, path=path, url=url, extra=json.loads(extra)) for did, path, url, extra in rows}

    def store(self, new: list[ImageRecord], changed: list[ImageRecord]) -> None:
        """Register ``new`` images; replace the values of ``changed`` ones."""
        self.db.executemany("INSERT OR REPLACE INTO image (did, path, url, extra) VALUES (?, ?, ?, ?)",
                            [(i.external_id, i.path, i.url, json.dumps(i.extra)) for i in (*new, *changed)])

    def add_paths(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Remember ``(path, did)`` pairs; a path keeps the first did given for it."""
        self.db.executemany("INSERT OR IGNORE INTO by_path (path, did) VALUES (?, ?)", pairs)

    def has(self, did: str) -> bool:
        """Whether a pool row registered the image ``did``."""
        return self.db.execute("SELECT 1 FROM image WHERE did = ?", (did,)).fetchone() is not None

    def did_for_path(self, path: str) -> str | None:
        """The did of the first pool row with image path ``path``, if any."""
        row = self.db.execute("SELECT did FROM by_path WHERE path = ?", (path,)).fetchone()
        return None if row is None else row[0]

    # ------------------------------------------------------------------ galleries

    def add_members(self, split: str, dids: list[str]) -> list[str]:
        """Add ``dids`` to the gallery of ``split``; returns those that were not in it, in order."""
        there = {row[0] for row in self._select("SELECT did FROM member WHERE split = ? AND did IN ({marks})",
                                                list(set(dids)), split)}
        fresh = list(dict.fromkeys(d for d in dids if d not in there))
        self.db.executemany("INSERT INTO member (split, did) VALUES (?, ?)", [(split, d) for d in fresh])
        return fresh
