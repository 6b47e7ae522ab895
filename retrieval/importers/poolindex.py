"""A scratch index of streamed image rows, kept on disk so memory does not grow with the file.

M-BEIR candidate pools run to millions of lines, CIRR split files to hundreds of thousands of
images (and caption files to as many pairids). While and after reading one, a parser still
has to answer, per row or per query:

* was this did (or pairid) already on an earlier line of the same file (a duplicate row, and
  where)? (``scope`` names the file's kind, so two files read side by side keep apart)
* which values were first registered for a did (a later row may only complete them, as
  :meth:`retrieval.records.ParsedDataset.add_image` does)?
* is a did already in the gallery of a split (pools of one split may overlap)?
* which did has a query image's path (the first pool row with that path)?
* is a target did in a pool at all? which of a query's images are in a split's gallery?

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

from retrieval.records import ImageRecord, ParsedDataset, merge_image

#: Upper bound of SQLite's page cache for the index, in KiB (its memory stays below this).
CACHE_KIB = 8192

_SCHEMA = (
    # the first values registered for each image did of every pool (merged with later rows)
    "CREATE TABLE image (did TEXT PRIMARY KEY, path TEXT, url TEXT, extra TEXT NOT NULL) WITHOUT ROWID",
    # dids (ids) of the file being read in each scope, with their first line (emptied at each new file)
    "CREATE TABLE seen (scope TEXT NOT NULL, did TEXT NOT NULL, line INTEGER NOT NULL, PRIMARY KEY (scope, did))"
    " WITHOUT ROWID",
    # gallery membership per split
    "CREATE TABLE member (split TEXT NOT NULL, did TEXT NOT NULL, PRIMARY KEY (split, did)) WITHOUT ROWID",
    # the first did of each image path
    "CREATE TABLE by_path (path TEXT PRIMARY KEY, did TEXT NOT NULL) WITHOUT ROWID",
)


class PoolIndex:
    """Lookups over the pool rows read so far (use as a context manager; closing deletes it)."""

    def __init__(self) -> None:
        self.db = sqlite3.connect("", isolation_level=None)
        for pragma in ("journal_mode = OFF", "synchronous = OFF", f"cache_size = -{CACHE_KIB}", "temp_store = FILE"):
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

    def start_file(self, scope: str = "") -> None:
        """Forget the dids of the previous file of ``scope`` (duplicates are counted per file)."""
        self.db.execute("DELETE FROM seen WHERE scope = ?", (scope,))

    def first_lines(self, dids: Iterable[str], scope: str = "") -> dict[str, int]:
        """``did -> line`` for the ``dids`` already read on an earlier line of this file."""
        return dict(
            self._select("SELECT did, line FROM seen WHERE scope = ? AND did IN ({marks})", list(set(dids)), scope)
        )

    def mark_seen(self, rows: Iterable[tuple[str, int]], scope: str = "") -> None:
        """Remember ``(did, line)`` pairs of this file (the first line of each did is kept)."""
        self.db.executemany(
            "INSERT OR IGNORE INTO seen (scope, did, line) VALUES (?, ?, ?)", ((scope, did, line) for did, line in rows)
        )

    # ------------------------------------------------------------------ images

    def images(self, dids: Iterable[str]) -> dict[str, ImageRecord]:
        """The registered values of the ``dids`` that an earlier row registered."""
        rows = self._select("SELECT did, path, url, extra FROM image WHERE did IN ({marks})", list(set(dids)))
        return {did: ImageRecord(did, path=path, url=url, extra=json.loads(extra)) for did, path, url, extra in rows}

    def store(self, new: list[ImageRecord], changed: list[ImageRecord]) -> None:
        """Register ``new`` images; replace the values of ``changed`` ones."""
        self.db.executemany(
            "INSERT OR REPLACE INTO image (did, path, url, extra) VALUES (?, ?, ?, ?)",
            [(i.external_id, i.path, i.url, json.dumps(i.extra)) for i in (*new, *changed)],
        )

    def add_paths(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Remember ``(path, did)`` pairs; a path keeps the first did given for it."""
        self.db.executemany("INSERT OR IGNORE INTO by_path (path, did) VALUES (?, ?)", pairs)

    def known(self, dids: Iterable[str], split: str | None = None) -> tuple[set[str], set[str]]:
        """The ``dids`` that an earlier row registered, and those of them in the gallery of
        ``split`` (none without a split), in one look-up."""
        rows = self._select(
            "SELECT i.did, m.did IS NOT NULL FROM image i LEFT JOIN member m ON m.split = ? "
            "AND m.did = i.did WHERE i.did IN ({marks})",
            list(set(dids)),
            split or "",
        )
        return {did for did, _ in rows}, {did for did, member in rows if member}

    def has(self, did: str) -> bool:
        """Whether a pool row registered the image ``did``."""
        return self.db.execute("SELECT 1 FROM image WHERE did = ?", (did,)).fetchone() is not None

    def did_for_path(self, path: str) -> str | None:
        """The did of the first pool row with image path ``path``, if any."""
        row = self.db.execute("SELECT did FROM by_path WHERE path = ?", (path,)).fetchone()
        return None if row is None else row[0]

    # ------------------------------------------------------------------ galleries

    def members(self, split: str, dids: Iterable[str]) -> set[str]:
        """The ``dids`` that are in the gallery of ``split``."""
        return {
            row[0]
            for row in self._select(
                "SELECT did FROM member WHERE split = ? AND did IN ({marks})", list(set(dids)), split
            )
        }

    def add_members(self, split: str, dids: list[str]) -> list[str]:
        """Add ``dids`` to the gallery of ``split``; returns those that were not in it, in order."""
        there = self.members(split, dids)
        fresh = list(dict.fromkeys(d for d in dids if d not in there))
        self.db.executemany("INSERT INTO member (split, did) VALUES (?, ?)", [(split, d) for d in fresh])
        return fresh


def stream_images(split: str, images: list[ImageRecord], dataset: ParsedDataset, index: PoolIndex) -> list[str]:
    """Register one batch of streamed images and add them to the gallery of ``split``, handing
    them to :meth:`ParsedDataset.add_streamed_images`; ``index`` keeps what later lookups need.

    An image seen before (in an earlier batch or file, or earlier in this batch) only completes
    its first values (:func:`retrieval.records.merge_image`: sent as changed when an earlier
    batch sent it). Returns the ids listed again in the gallery of ``split`` (each repeat, in
    order): they are kept once."""
    known = index.images(image.external_id for image in images)
    batch: dict[str, ImageRecord] = {}  # the record of each id of this batch (its first values)
    new: list[ImageRecord] = []
    changed: dict[str, ImageRecord] = {}
    for image in images:
        first = batch.get(image.external_id) or known.get(image.external_id)
        if first is None:
            new.append(image)
            batch[image.external_id] = image
            continue
        batch[image.external_id] = first
        # a new one of this batch goes out with its completed values; one an earlier batch sent, as changed
        if merge_image(first, image) and image.external_id in known:
            changed[image.external_id] = first
    index.store(new, list(changed.values()))
    ids = [image.external_id for image in images]
    members = index.add_members(split, ids)
    fresh = set(members)
    repeated = []
    for image_id in ids:
        if image_id in fresh:
            fresh.discard(image_id)
        else:
            repeated.append(image_id)
    dataset.add_streamed_images(split, new, list(changed.values()), members)
    return repeated
