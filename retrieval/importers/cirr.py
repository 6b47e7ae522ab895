"""CIRR (release rc2) annotation parser.

Files, recognised by name (an optional ``.sample`` before ``.json`` is accepted):

* ``cap.rc2.<split>.json`` – the triplets (list of objects), required for queries;
* ``cap.ext.rc2.<split>.json`` – optional ``caption_extend`` per ``pairid``;
* ``split.rc2.<split>.json`` – image id -> ``./<dir>/<id>.png``; gives the image paths
  and the split's gallery (in file order).

Mapping: ``external_id = str(pairid)``; turn 1 = reference + caption (+ the four
``caption_extend`` texts, role ``caption_ext``, key ``"0"``..``"3"``); targets =
``target_hard`` (primary, role ``hard``, relevance ``target_soft[hard]`` or 1.0) then every
other ``target_soft`` key (role ``soft``, relevance = its score). Test splits (``test1``)
carry no targets. ``img_set`` is kept in ``QueryRecord.extra['img_set']``. Images that the
captions reference but the split file lacks get ``path=None`` (and a warning).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from retrieval.importers._common import (
    SAMPLE,
    TOKEN,
    PathLike,
    Record,
    add_target,
    as_paths,
    check_str_list,
    chunks,
    collect,
    file_role,
    is_int,
    is_number,
    is_test_split,
    iter_list,
    iter_object,
    list_of_objects_with,
    name_token,
    need,
    object_of,
    register,
    warn_repeated,
)
from retrieval.importers.poolindex import PoolIndex, stream_images
from retrieval.records import (
    ImageRecord,
    ParsedDataset,
    ParseError,
    QueryRecord,
    TargetRecord,
    TextRecord,
    TurnRecord,
    record_name,
    safe_relpath,
)

FORMAT = "cirr"
SPLITS = ("train", "val", "test1", "dev")
#: Split-file entries and caption records read, validated and handed over together.
BATCH = 2000
# scopes of the scratch index's pairids: one per file kind, read side by side
_CAPTIONS, _EXTENDED = "cap", "ext"

_PATTERNS = [
    ("ext", re.compile(rf"^cap\.ext\.(?P<ver>rc\d+)\.(?P<split>{TOKEN}){SAMPLE}\.json$")),
    ("cap", re.compile(rf"^cap\.(?P<ver>rc\d+)\.(?P<split>{TOKEN}){SAMPLE}\.json$")),
    ("split", re.compile(rf"^split\.(?P<ver>rc\d+)\.(?P<split>{TOKEN}){SAMPLE}\.json$")),
]
_CONTENT = [
    ("ext", list_of_objects_with("pairid", "caption_extend")),
    ("cap", list_of_objects_with("pairid", "caption")),
    ("split", object_of(lambda value: isinstance(value, str))),
]
_EXPECTED = (
    "cap.rc2.<split>.json (a list of {pairid, reference, caption, ...}), cap.ext.rc2.<split>.json "
    "(a list of {pairid, caption_extend}) or split.rc2.<split>.json (an object image id -> path)"
)


def parse(paths: Iterable[PathLike], split: str | None = None, subset: str | None = None) -> ParsedDataset:
    """Parse CIRR caption, extended-caption and image-split files into a ParsedDataset."""
    return collect(stream, FORMAT, paths, split=split)


def _group(paths: Iterable[PathLike], split: str | None) -> dict[str, dict[str, Path]]:
    """Files by split and role (``cap``, ``ext``, ``split``); a second file of a role is refused."""
    groups: dict[str, dict[str, Path]] = {}
    for path in as_paths(paths):
        role, named = file_role(path, _PATTERNS, _CONTENT, _EXPECTED)
        name = need(split or named.get("split") or name_token(path, SPLITS), path, "split", "--split", _EXPECTED)
        roles = groups.setdefault(name, {})
        if role in roles:
            raise ParseError(str(path), None, None, f"a second {role} file for split {name!r} (first: {roles[role]})")
        roles[role] = path
    return groups


def stream(
    paths: Iterable[PathLike], dataset: ParsedDataset, split: str | None = None, subset: str | None = None
) -> Iterator[QueryRecord]:
    """Yield the queries of CIRR files one by one, registering images and galleries on ``dataset``.

    The split files are read first, :data:`BATCH` entries at a time, their images handed over
    through :meth:`ParsedDataset.add_streamed_images` (the loader writes each batch at once);
    what the captions look up later (is an image registered, is it in the split's gallery,
    was a pairid seen) lives in a scratch index on disk (:mod:`retrieval.importers.poolindex`),
    so memory does not grow with the files."""
    groups = _group(paths, split)
    for roles in groups.values():
        if "ext" in roles and "cap" not in roles:
            raise ParseError(
                str(roles["ext"]), None, None, "extended captions given without their cap.rc2 caption file"
            )
    with PoolIndex() as index:
        # every split file before any caption: an image a caption names is then registered
        # (and written) once, whichever split file lists it
        for name, roles in groups.items():
            if "split" in roles:
                _parse_split_file(roles["split"], dataset, name, index)
        for name, roles in groups.items():
            if "cap" in roles:
                ext = _ExtJoin(roles["ext"], dataset, index) if "ext" in roles else None
                yield from _parse_captions(roles["cap"], name, dataset, index, "split" in roles, ext)
                if ext is not None:
                    ext.finish()


def _parse_split_file(path: Path, dataset: ParsedDataset, split: str, index: PoolIndex) -> None:
    """Register every image of a split file (id -> path) and add it to the split's gallery, a
    batch at a time; an id listed twice is kept once, with a warning."""
    dataset.galleries.setdefault(split, [])
    repeated, first = 0, None
    for batch in chunks(iter_object(path), BATCH):
        images = [ImageRecord(image_id, path=safe_relpath(rel, str(path), i, image_id)) for i, image_id, rel in batch]
        again = stream_images(split, images, dataset, index)
        repeated += len(again)
        first = first if first is not None or not again else again[0]
    warn_repeated(dataset, path.name, repeated, first)


class _Warnings:
    """What one caption file warns about, gathered while its records stream past."""

    def __init__(self) -> None:
        self.flagged = 0  # queries that list their reference as a positive target
        self.first_flagged = ""
        self.missing: set[str] = set()  # referenced images that the split file lacks


def _parse_captions(
    path: Path, split: str, dataset: ParsedDataset, index: PoolIndex, gallery: bool, ext: _ExtJoin | None
) -> Iterator[QueryRecord]:
    """Validate and map every triplet of a ``cap.rc2`` file, streaming (:data:`BATCH` records
    validated in file order, then their images looked up in ``index`` at once). ``gallery``:
    a split file of this split was given."""
    test = is_test_split(split)
    notes = _Warnings()
    index.start_file(_CAPTIONS)
    for batch in chunks(iter_list(path), BATCH):
        seen = index.first_lines(
            (str(raw["pairid"]) for _, raw in batch if isinstance(raw, dict) and is_int(raw.get("pairid"))), _CAPTIONS
        )
        queries = []
        for i, raw in batch:
            query = _caption_query(Record(path, i, raw), split, dataset, gallery, test, seen)
            if ext is not None:
                ext.attach(query)
            queries.append(query)
        index.mark_seen(((q.external_id, q.ordinal) for q in queries), _CAPTIONS)
        yield from _register_images(queries, split, dataset, index, gallery, notes)
    _warn_captions(path, split, dataset, gallery, notes)


def _register_images(
    queries: list[QueryRecord], split: str, dataset: ParsedDataset, index: PoolIndex, gallery: bool, notes: _Warnings
) -> Iterator[QueryRecord]:
    """Register the images of a batch of queries that no split file registered (no path), note
    those missing from the split's gallery, and yield the queries."""
    used = {image_id for query in queries for image_id in _images_of(query)}
    registered, members = index.known(used, split if gallery else None)
    for query in queries:
        images = _images_of(query)
        for image_id in images:
            if image_id not in registered:
                register(dataset, image_id)
        if any(t.image == query.turns[0].reference and t.relevance > 0 for t in query.targets):
            notes.flagged += 1
            notes.first_flagged = notes.first_flagged or query.external_id
        if gallery:
            notes.missing.update(i for i in images if i not in members)
        yield query


def _images_of(query: QueryRecord) -> list[str]:
    """The images a query names: its reference, its targets, its ``img_set`` members."""
    img_set = query.extra.get("img_set")
    members = img_set["members"] if img_set else []
    return [query.turns[0].reference or "", *(t.image for t in query.targets), *members]


def _caption_query(
    rec: Record, split: str, dataset: ParsedDataset, gallery: bool, test: bool, seen: dict[str, int]
) -> QueryRecord:
    """One ``cap.rc2`` record, validated and mapped. ``seen``: ``pairid -> record`` of the
    pairids read before (this one is added)."""
    pairid = rec.req_int("pairid")
    if str(pairid) in seen:
        rec.fail("pairid", f"duplicate pairid {pairid} (first at {record_name(rec.file, seen[str(pairid)])})")
    seen[str(pairid)] = rec.index or 0
    reference = rec.req_str("reference")
    caption = rec.req_str("caption")
    img_set = _check_img_set(rec)
    hard = rec.opt_str("target_hard") if test else rec.req_str("target_hard")
    soft = _check_soft(rec)

    targets: list[TargetRecord] = []
    where = f"{Path(rec.file).name} {record_name(rec.file, rec.index)}"
    if hard is not None:
        relevance = float(soft[hard]) if soft is not None and hard in soft else 1.0
        targets.append(TargetRecord(hard, relevance, True, "hard", "target_hard"))
    for image_id, score in (soft or {}).items():
        if image_id != hard:
            add_target(targets, TargetRecord(image_id, float(score), False, "soft", "target_soft"), dataset, where)

    extra: dict[str, Any] = {}
    if img_set is not None:
        extra["img_set"] = img_set
    if gallery:
        extra["gallery"] = split
    return QueryRecord(
        external_id=str(pairid),
        split=split,
        ordinal=rec.index or 0,
        source_file=Path(rec.file).name,
        turns=[TurnRecord(1, reference, [TextRecord(caption, "caption")])],
        targets=targets,
        raw=rec.data,
        extra=extra,
    )


def _warn_captions(path: Path, split: str, dataset: ParsedDataset, gallery: bool, notes: _Warnings) -> None:
    if notes.flagged:
        dataset.warnings.append(
            f"{path.name}: {notes.flagged} quer(y/ies) list the reference image as a positive target "
            f"(misaligned soft labels?), e.g. pairid {notes.first_flagged}"
        )
    if not gallery:
        dataset.warnings.append(
            f"{path.name}: no split.rc2.{split}.json given; image paths are unknown and no gallery was built"
        )
        return
    missing = sorted(notes.missing)
    if missing:
        dataset.warnings.append(
            f"{path.name}: {len(missing)} referenced image(s) are not in the split file "
            f"(path left empty), e.g. {missing[0]!r}"
        )


def _check_img_set(rec: Record) -> dict[str, Any] | None:
    """``img_set`` is optional; when present: ``id`` int and ``members`` list of str."""
    img_set = rec.opt_obj("img_set")
    if img_set is None:
        return None
    if not is_int(img_set.get("id")):
        rec.fail("img_set.id", "expected an integer")
    check_str_list(rec, "img_set.members", img_set.get("members"))
    for key in ("reference_rank", "target_rank"):
        if key in img_set and not is_int(img_set[key]):
            rec.fail(f"img_set.{key}", "expected an integer")
    return img_set


def _check_soft(rec: Record) -> dict[str, float] | None:
    """``target_soft`` is optional; when present: object image id -> number."""
    soft = rec.opt_obj("target_soft")
    if soft is None:
        return None
    for image_id, score in soft.items():
        if not is_number(score):
            rec.fail("target_soft", f"score of {image_id!r} must be a number")
    return soft


class _ExtJoin:
    """Joins a ``cap.ext`` file to the caption records while both stream.

    The ext file is read ahead only as far as the pairid asked for (its records come
    :data:`BATCH` at a time, validated one by one as they are reached); entries read past are
    kept until asked for, so files in the same order hold one batch at a time in memory. The
    pairids read (for duplicates) are kept in the import's scratch ``index``.
    """

    def __init__(self, path: Path, dataset: ParsedDataset, index: PoolIndex):
        self.path = path
        self.dataset = dataset
        self.index = index
        self.entries = chunks(iter_list(path), BATCH)
        self.buffer: deque[tuple[int, Any]] = deque()  # records read, not validated yet
        self.earlier: dict[str, int] = {}  # pairid -> first record, of the buffered pairids read before
        self.read: list[tuple[str, int]] = []  # (pairid, record) validated since the index was told
        self.pending: dict[int, tuple[int, dict[str, str], dict[str, Any]]] = {}
        self.used = 0
        index.start_file(_EXTENDED)

    def _next(self) -> tuple[int, Any] | None:
        """The next record of the file (None at its end), reading a batch when none is left."""
        if not self.buffer:
            self.index.mark_seen(self.read, _EXTENDED)
            self.read = []
            batch = next(self.entries, None)
            if batch is None:
                return None
            self.buffer.extend(batch)
            self.earlier = self.index.first_lines(
                (str(raw["pairid"]) for _, raw in batch if isinstance(raw, dict) and is_int(raw.get("pairid"))),
                _EXTENDED,
            )
        return self.buffer.popleft()

    def _read_until(self, pairid: int) -> None:
        while (entry := self._next()) is not None:
            index, raw = entry
            rec = Record(self.path, index, raw)
            found = rec.req_int("pairid")
            if str(found) in self.earlier:
                rec.fail(
                    "pairid", f"duplicate pairid {found} (first at {record_name(rec.file, self.earlier[str(found)])})"
                )
            self.earlier[str(found)] = index
            self.read.append((str(found), index))
            rec.opt_str("reference")
            rec.opt_str("target_hard")
            ext = rec.req_obj("caption_extend")
            for key, text in ext.items():
                if not isinstance(text, str):
                    rec.fail("caption_extend", f"text of key {key!r} must be a string")
            self.pending[found] = (index, ext, raw)
            if found == pairid:
                return

    def attach(self, query: QueryRecord) -> None:
        """Add the ``caption_extend`` texts of the query's pairid, if the ext file has them."""
        pairid = int(query.external_id)
        if pairid not in self.pending:
            self._read_until(pairid)
        found = self.pending.pop(pairid, None)
        if found is None:
            return
        self.used += 1
        index, ext, raw = found
        if isinstance(raw.get("reference"), str) and raw["reference"] != query.turns[0].reference:
            self.dataset.warnings.append(
                f"{self.path.name} {record_name(self.path, index)}: reference differs from the caption file for pairid {pairid}"
            )
        query.turns[0].texts.extend(TextRecord(text, "caption_ext", key=key) for key, text in ext.items())
        query.extra["caption_extend"] = raw

    def finish(self) -> None:
        """Validate the rest of the ext file and warn about entries that matched no caption."""
        self._read_until(-1)
        if self.pending:
            self.dataset.warnings.append(
                f"{self.path.name}: {len(self.pending)} entries match no pairid of the caption file"
            )
