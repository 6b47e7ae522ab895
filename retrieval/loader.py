"""Write parsed annotation data to the database in one transaction, streaming.

The parsers (``retrieval.importers``) are pure and validate every record; this loader
checks what only the disk and the database can tell (files, symlinks, an existing
dataset of another format), then writes everything or nothing: it consumes the parser's
stream of queries in batches inside one transaction, so memory stays flat however long the
file, and any error rolls the whole import back. Images a parser does not keep (M-BEIR
candidate pools, which run to millions of lines) come through ``ParsedDataset.image_sink``
and are written, with their gallery entries, a batch at a time as the parser reads them.

Re-importing updates rows in place: queries are keyed by (dataset, split, external_id) and
images by (dataset, external_id), so no duplicates appear. Each query row stores a hash of
its normalised content (fields, turns, targets; not its position in the file); a re-import
writes only the queries whose hash changed and the images whose values changed, so
re-importing unchanged data costs about as much as reading it.

What a re-import did is counted by content, not by position (:class:`LoadReport`): *added*
(``queries_created``), *changed* (``queries_updated``: same query, other content), *removed*
and *unchanged* (same content; a record that only moved in its file is unchanged, and its
stored position follows). Formats whose ids are positions (:data:`retrieval.records.POSITIONAL_ID_FORMATS`)
are matched on their content first; a record whose content is new takes the stored row of
its id (changed) when that row matched nothing, else it is added.

Removed records are the stored queries of the same file (split and file name; for positional
ids the same split and category, which share the ids) that the new file no longer holds: a
re-import compares records only within the splits its files cover, so a split is added to a
dataset of other splits, or re-imported into one, in its own command, and nothing of the
others is removed (nor deleted by ``on_removed="delete"``). A record that names no gallery
(a caption file given without its split file) is unchanged when the stored one differs only
by naming the gallery it searches anyway (:meth:`_Writer._digests`). The safe default (``on_removed="refuse"``) refuses the whole import with
a message naming them and everything that depends on them (audit results, subsets, study
items); ``on_removed="delete"`` deletes them with their audit results and subset memberships
and reports the same list. Queries that annotators judged (study items) are never deleted by
an import: those refuse in either mode.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from django.conf import settings
from django.db import OperationalError, router, transaction
from django.db.models.deletion import Collector, ProtectedError
from django.utils.text import slugify

from .dbstats import refresh_statistics
from .galleries import gallery_keys, mixed_fallback, mixed_fallback_text, search_key
from .imagefiles import PathEscapeError, probe_image, resolve_under
from .importers._common import resolve_turn_references
from .models import Dataset, GalleryEntry, Image, Query, Target, Turn
from .records import POSITIONAL_ID_FORMATS, ImageRecord, ParsedDataset, ParseError, QueryRecord

T = TypeVar("T")

Progress = Callable[[str, int, int], None]
BATCH = 2000
MISSING_EXAMPLES = 10
ON_REMOVED = ("refuse", "delete")
QUERY_FIELDS = ["category", "ordinal", "source_file", "n_turns", "context_text", "tags", "raw", "extra", "content_hash"]
IMAGE_FIELDS = ["path", "url", "sha256", "width", "height", "missing", "extra"]


class LoadError(ValueError):
    """The parsed data cannot be written (naming what and why)."""


class DatabaseBusy(LoadError):
    """The database stayed write-locked by another process through every retry (SQLite)."""


#: Seconds slept between the tries of an import that found the database write-locked (SQLite
#: waits its own ``timeout`` inside each try first): about three minutes in all with the
#: settings' 30 s, which outlasts an audit chunk or a gallery batch holding the lock.
LOCK_BACKOFF = (2.0, 5.0, 10.0, 20.0)


def is_locked(exc: BaseException) -> bool:
    """SQLite's "database is locked" (or "database table is locked"): another connection holds
    the write lock past the connection's timeout."""
    return isinstance(exc, OperationalError) and "is locked" in str(exc)


def retry_when_locked(
    write: Callable[[], T],
    backoff: Iterable[float] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[int, float], None] | None = None,
) -> T:
    """``write()``, tried again after each pause of ``backoff`` while the database is locked
    (:func:`is_locked`; an import writes all or nothing, so a try that failed wrote nothing);
    then :class:`DatabaseBusy`, one sentence. ``backoff``: default :data:`LOCK_BACKOFF`;
    ``on_retry(try_number, pause)`` before each pause."""
    started = time.monotonic()
    pauses = list(LOCK_BACKOFF if backoff is None else backoff)
    for attempt in range(len(pauses) + 1):
        try:
            return write()
        except OperationalError as exc:
            if not is_locked(exc):
                raise
            if attempt == len(pauses):
                break
            if on_retry is not None:
                on_retry(attempt + 1, pauses[attempt])
            sleep(pauses[attempt])
    raise DatabaseBusy(
        f"the database stayed locked by another process (an audit, a gallery import or another "
        f"import writing to it) through {len(pauses) + 1} tries over {time.monotonic() - started:.0f} s; "
        "nothing was written: run the import again when that work has finished"
    ) from None


@dataclass
class LoadReport:
    dataset: str
    format: str
    dataset_created: bool
    queries: int = 0
    queries_created: int = 0
    queries_updated: int = 0
    queries_unchanged: int = 0
    queries_removed: int = 0
    removed_examples: list[str] = field(default_factory=list)
    removed_dependents: dict[str, int] = field(default_factory=dict)
    single_turn: int = 0
    multi_turn: int = 0
    turns: int = 0
    targets: int = 0
    images: int = 0
    images_created: int = 0
    images_updated: int = 0
    missing_images: int = 0
    missing_examples: list[str] = field(default_factory=list)
    gallery_entries: int = 0
    warnings: list[str] = field(default_factory=list)
    images_root: str = ""  # where the images were looked for: the root given, else the dataset's stored one

    def as_dict(self) -> dict:
        return asdict(self)


def _noop(stage: str, done: int, total: int) -> None:
    return None


_TURN_REFERENCE_FIELDS = ("reference_turns", "reference_checks")


def _turn_content(t: Any) -> dict[str, Any]:
    """A turn's fields for the digest; empty reference fields left out, so that the digests of
    turns without retrospective references are those written before these fields existed."""
    return {k: v for k, v in vars(t).items() if k not in _TURN_REFERENCE_FIELDS or v}


def content_hash(q: QueryRecord, positional: bool = False) -> str:
    """A digest of the content the loader writes for one query (its row, turns and targets),
    leaving out where the record sits (its ordinal and file name) and, for ``positional`` ids,
    the id (a position too)."""
    payload = [
        None if positional else q.external_id,
        q.split,
        q.category,
        q.context_text,
        q.tags,
        q.raw,
        q.extra,
        [_turn_content(t) for t in q.turns],
        [vars(t) for t in q.targets],
    ]
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=vars, allow_nan=False)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _check_references(parsed: ParsedDataset) -> None:
    for split, ids in parsed.galleries.items():
        for image_id in ids:
            if image_id not in parsed.images:
                raise LoadError(f"gallery {split!r} lists unknown image {image_id!r}")


def load_parsed(
    parsed: ParsedDataset,
    name: str,
    images_root: Path | None = None,
    description: str = "",
    progress: Progress = _noop,
) -> LoadReport:
    """Validate, then write an already parsed dataset (its ``queries`` list) as ``name``; all or nothing."""
    _check_references(parsed)
    _refuse_duplicates(parsed.queries)
    total = len(parsed.queries)
    return load_stream(
        parsed, parsed.queries, name, images_root, description, lambda done: progress("writing queries", done, total)
    )


def load_stream(
    parsed: ParsedDataset,
    queries: Iterable[QueryRecord],
    name: str,
    images_root: Path | None = None,
    description: str = "",
    on_batch: Callable[[int], None] | None = None,
    on_removed: str = "refuse",
) -> LoadReport:
    """Write the ``queries`` a parser yields (images, galleries, warnings gathered on ``parsed``).

    Images a parser streams (``parsed.image_sink``: M-BEIR candidate pools) are written batch by
    batch as they come, with their gallery entries, and not kept. ``on_batch(n)`` is called
    after each written batch with the number of queries so far. ``on_removed``: what to do
    with stored queries the file no longer holds (module docstring): ``refuse`` or ``delete``.
    """
    if on_removed not in ON_REMOVED:
        raise LoadError(f"on_removed must be one of {ON_REMOVED}, got {on_removed!r}")
    root = Path(images_root).resolve() if images_root else None
    with transaction.atomic():
        dataset, created = _open_dataset(name, parsed.format, root, description)
        if root is None and dataset.images_root:
            root = Path(dataset.images_root)  # a re-import looks where the dataset keeps its images
        report = LoadReport(
            dataset=name, format=parsed.format, dataset_created=created, images_root=str(root) if root else ""
        )
        writer = _Writer(dataset, created, parsed, root, report, on_removed)
        parsed.image_sink = writer.write_streamed_images
        try:
            for batch in batched(queries, BATCH):
                writer.write_queries(batch)
                if on_batch is not None:
                    on_batch(report.queries)
            writer.finish()
        finally:
            parsed.image_sink = None
        dataset.save(update_fields=["images_root", "updated_at"])  # a re-import is an update too
    report.warnings[:0] = parsed.warnings
    return report


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last one shorter), read lazily."""
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def check_dataset_name(name: str) -> None:
    """A new dataset's name is a slug (it names URLs, subsets and export files): lowercase
    letters, digits, hyphens and underscores. The import form and the loader both ask this."""
    if not name or slugify(name) != name:
        raise LoadError(
            f"dataset name {name!r}: use lowercase letters, digits, hyphens and underscores "
            f"(e.g. {slugify(name) or 'my-dataset'!r})"
        )


def _open_dataset(name: str, fmt: str, root: Path | None, description: str) -> tuple[Dataset, bool]:
    """Get or create dataset ``name`` (locked); refuse another format or another images root,
    and a new dataset whose name is no slug (:func:`check_dataset_name`)."""
    if not Dataset.objects.filter(name=name).exists():
        check_dataset_name(name)
    root_text = str(root) if root else ""
    dataset, created = Dataset.objects.select_for_update().get_or_create(
        name=name, defaults={"format": fmt, "images_root": root_text, "description": description}
    )
    if created:
        return dataset, created
    if dataset.format != fmt:
        raise LoadError(f"dataset {name!r} was imported as {dataset.format!r}; refusing to add {fmt!r} data to it")
    if root_text and dataset.images_root and dataset.images_root != root_text:
        raise LoadError(f"dataset {name!r} has images under {dataset.images_root}; this import names {root_text}")
    if root_text and not dataset.images_root:
        dataset.images_root = root_text
    return dataset, created


class PkSet:
    """A set of positive integer primary keys, as a bitmap over the range they span (one bit per
    key from the lowest to the highest added): the rows a re-import matched cost an eighth of a
    byte each (25 KB for 200,000 queries stored together, where a Python set took 14 MB)."""

    def __init__(self) -> None:
        self.bits = bytearray()
        self.base = 0  # the byte of the lowest key added, once one is

    def add(self, pk: int) -> None:
        byte = pk >> 3
        if not self.bits:
            self.base = byte
        elif byte < self.base:
            self.bits[:0] = bytes(self.base - byte)
            self.base = byte
        if byte - self.base >= len(self.bits):
            self.bits.extend(bytes(byte - self.base + 1 - len(self.bits)))
        self.bits[byte - self.base] |= 1 << (pk & 7)

    def __contains__(self, pk: int) -> bool:
        at = (pk >> 3) - self.base
        return 0 <= at < len(self.bits) and bool(self.bits[at] >> (pk & 7) & 1)


class _Probes:
    """Looks at image files (path safety, existence, sha256, size) and tallies what is missing."""

    UNREPORTED = ("", "no path", "no such file")

    def __init__(self, root: Path | None):
        self.root = root
        self.missing = 0
        self.missing_examples: list[str] = []
        self.unusable: list[str] = []
        self.unusable_count = 0

    def values(self, image_id: str, rec: ImageRecord, before: bool | None = None) -> dict[str, Any]:
        """The column values of image ``image_id`` (probing its file when there is a root).

        ``before``: the ``missing`` flag this import already wrote for the image, when it
        writes it again (completed values); it was tallied then, so only a change is."""
        info: dict[str, Any] = {"sha256": "", "width": None, "height": None, "missing": True}
        problem = "no path"
        if rec.path and self.root is not None:
            try:
                full = resolve_under(self.root, rec.path)
            except PathEscapeError as exc:
                raise LoadError(f"image {image_id!r}: path {rec.path!r} escapes the images root ({exc})") from None
            probe = probe_image(full, max_pixels=settings.IMAGE_MAX_PIXELS)
            info.update(sha256=probe.sha256, width=probe.width, height=probe.height, missing=not probe.exists)
            problem = probe.problem
        if info["missing"] and not before:
            self._tally(image_id, problem)
        elif before and not info["missing"]:
            self._untally(image_id)
        return {"path": rec.path or "", "url": rec.url or "", "extra": rec.extra, **info}

    def _tally(self, image_id: str, problem: str) -> None:
        self.missing += 1
        if len(self.missing_examples) < MISSING_EXAMPLES:
            self.missing_examples.append(image_id)
        if problem not in self.UNREPORTED:
            self.unusable_count += 1
            if len(self.unusable) < MISSING_EXAMPLES:
                self.unusable.append(f"{image_id}: {problem}")

    def _untally(self, image_id: str) -> None:
        self.missing -= 1
        if image_id in self.missing_examples:
            self.missing_examples.remove(image_id)

    def warnings(self) -> list[str]:
        found = [f"image refused ({x})" for x in self.unusable]
        if self.unusable_count > MISSING_EXAMPLES:
            found.append(f"... and {self.unusable_count - MISSING_EXAMPLES} more unusable image files")
        return found


class _Writer:
    """Writes images (when first needed), query batches and galleries of one import."""

    def __init__(
        self,
        dataset: Dataset,
        created: bool,
        parsed: ParsedDataset,
        root: Path | None,
        report: LoadReport,
        on_removed: str = "refuse",
    ):
        self.dataset = dataset
        self.created = created
        self.parsed = parsed
        self.report = report
        self.positional = parsed.format in POSITIONAL_ID_FORMATS
        self.on_removed = on_removed
        self.claimed = PkSet()  # stored queries this import matched
        # (split, source file) of the records read; positional ids: (split, category), whose ids they share
        self.scope: set[tuple[str, str]] = set()
        self.pending: list[tuple[QueryRecord, str]] = []  # positional: content not stored yet
        self.moves: list[tuple[int, QueryRecord]] = []  # positional: matched rows whose id/position moved
        self.probes = _Probes(root)
        self.pks: dict[str, int] = {}  # images of ``parsed.images`` written so far
        self.batch_pks: dict[str, int] = {}  # streamed images the query batch being written uses
        self.streamed = 0  # images received through write_streamed_images (not kept in ``pks``)
        self.ordinals: dict[str, int] = {}  # split -> next gallery ordinal of streamed members
        self.stored_keys = set() if created else gallery_keys(dataset.pk)  # galleries stored before

    # ------------------------------------------------------------------ images

    def write_images(self, ids: Iterable[str]) -> None:
        """Write the images ``ids`` not written yet: create the new, update those whose values changed."""
        todo = [i for i in dict.fromkeys(ids) if i not in self.pks]
        for start in range(0, len(todo), BATCH):
            chunk = todo[start : start + BATCH]
            self._write_image_chunk(chunk)
            self.parsed.touched.difference_update(chunk)

    def _write_image_chunk(self, chunk: list[str]) -> None:
        self.pks.update(self._write_records([self.parsed.images[image_id] for image_id in chunk]))

    def _write_records(self, records: list[ImageRecord], again: bool = False) -> dict[str, int]:
        """Create the images of ``records`` not stored yet, update those whose values changed;
        returns ``external_id -> pk`` of them all. ``again``: this import wrote them before."""
        if not records:
            return {}
        chunk = [rec.external_id for rec in records]
        existing = (
            {
                row[0]: row[1:]
                for row in Image.objects.filter(dataset=self.dataset, external_id__in=chunk).values_list(
                    "external_id", "id", *IMAGE_FIELDS
                )
            }
            if again or not self.created
            else {}
        )
        missing_at = 1 + IMAGE_FIELDS.index("missing")
        pks: dict[str, int] = {}
        new, changed = [], []
        for rec in records:
            row = existing.get(rec.external_id)
            if row is not None and not again:
                rec = _kept_from(rec, dict(zip(IMAGE_FIELDS, row[1:])))
            values = self.probes.values(rec.external_id, rec, before=row[missing_at] if again and row else None)
            if row is None:
                new.append(Image(dataset=self.dataset, external_id=rec.external_id, **values))
                continue
            pks[rec.external_id] = row[0]
            if tuple(values[f] for f in IMAGE_FIELDS) != tuple(row[1:]):
                changed.append(Image(id=row[0], dataset=self.dataset, external_id=rec.external_id, **values))
        Image.objects.bulk_create(new)
        pks.update((img.external_id, img.id) for img in new)
        if changed:
            Image.objects.bulk_update(changed, IMAGE_FIELDS)
        self.report.images_created += len(new)
        self.report.images_updated += len(changed)
        return pks

    def _stored_pks(self, ids: list[str]) -> dict[str, int]:
        """``external_id -> pk`` of the stored images among ``ids``."""
        found: dict[str, int] = {}
        for start in range(0, len(ids), BATCH):
            rows = Image.objects.filter(dataset=self.dataset, external_id__in=ids[start : start + BATCH])
            found.update(rows.values_list("external_id", "id"))
        return found

    def write_streamed_images(
        self, split: str, new: list[ImageRecord], changed: list[ImageRecord], members: list[str]
    ) -> None:
        """The image sink of a streaming parser: write one batch of images (``new`` ones and
        ``changed`` ones, completed since an earlier batch) and the gallery entries of
        ``members`` in ``split``, keeping nothing per image."""
        pks = self._write_records(new)
        pks.update(self._write_records(changed, again=True))  # written by an earlier batch
        rest = [m for m in members if m not in pks]
        if rest:
            pks.update(self._stored_pks(rest))
        unknown = next((m for m in members if m not in pks), None)
        if unknown is not None:
            raise LoadError(f"gallery {split!r} lists unknown image {unknown!r}")
        first = self.ordinals.get(split, 0)
        self._add_gallery_entries(split, [pks[ext] for ext in members], first)
        self.ordinals[split] = first + len(members)
        self.streamed += len(new)

    def _update_touched(self) -> None:
        """Images completed (path, url, extra) after they were written get their new values."""
        ids = [i for i in self.parsed.touched if i in self.pks]
        for start in range(0, len(ids), BATCH):
            chunk = ids[start : start + BATCH]
            before = dict(Image.objects.filter(id__in=[self.pks[i] for i in chunk]).values_list("id", "missing"))
            rows = [
                Image(
                    id=self.pks[i],
                    dataset=self.dataset,
                    external_id=i,
                    **self.probes.values(i, self.parsed.images[i], before=before[self.pks[i]]),
                )
                for i in chunk
            ]
            Image.objects.bulk_update(rows, IMAGE_FIELDS)
        self.parsed.touched.clear()

    def _pk(self, q: QueryRecord, field_name: str, image_id: str | None) -> int | None:
        if image_id is None:
            return None
        pk = self.pks.get(image_id, self.batch_pks.get(image_id))
        if pk is None:
            raise ParseError(q.source_file, q.ordinal, field_name, f"image {image_id!r} is not defined")
        return pk

    def _use_images(self, records: list[QueryRecord]) -> None:
        """Write the images of ``parsed.images`` that ``records`` use, and look up the pks of the
        streamed ones they use (written as they came; only this batch's are held)."""
        used = list(dict.fromkeys(i for q in records for i in _images_of(q)))
        self.write_images(i for i in used if i in self.parsed.images)
        streamed = [i for i in used if i not in self.pks]
        self.batch_pks = self._stored_pks(streamed) if streamed and self.streamed else {}

    # ------------------------------------------------------------------ queries

    def write_queries(self, batch: list[QueryRecord]) -> None:
        """Write one batch: new queries created, changed ones rewritten, unchanged ones left alone
        (their position updated when it moved). Positional formats on a re-import keep the
        records whose content is new for :meth:`finish_queries`."""
        self._use_images(batch)
        _refuse_duplicates(batch)
        for q in batch:
            resolve_turn_references(q)
        self.scope.update((q.split, q.category if self.positional else q.source_file) for q in batch)
        if self.positional and not self.created:
            self._match_by_content(batch)
            return
        existing = self._existing(batch)
        new, changed, moved = [], [], []
        for q in batch:
            digests = self._digests(q)
            digest = digests[0]
            row = existing.get((q.split, q.external_id))
            if row is not None:
                self.claimed.add(row[0])
                if row[1] in digests:
                    if row[2:] != (q.ordinal, q.source_file):
                        moved.append(Query(id=row[0], ordinal=q.ordinal, source_file=q.source_file))
                    continue
            obj = self._query(q, digest)
            if row is None:
                new.append((q, obj))
            else:
                obj.id = row[0]
                changed.append((q, obj))
        Query.objects.bulk_update(moved, ["ordinal", "source_file"])
        self._save(new, changed)
        for _, obj in new:  # rows this import created are the file's, never "removed" by it
            self.claimed.add(obj.id)
        self._count(batch, len(new), len(changed))

    def _digests(self, q: QueryRecord) -> tuple[str, ...]:
        """The content hashes a stored query equal to ``q`` may have: ``q``'s own, and, on a
        re-import of a record that names no gallery (a caption file given without its split
        file), the hash of ``q`` naming the stored gallery it searches anyway
        (:func:`retrieval.galleries.search_key`): the same content, as an import with the split
        file wrote it, is unchanged, not changed."""
        digest = content_hash(q, self.positional)
        if self.created or "gallery" in q.extra:
            return (digest,)
        key = search_key(q.split, q.category, None, self.stored_keys)
        if key is None:
            return (digest,)
        return digest, content_hash(replace(q, extra={**q.extra, "gallery": key}), self.positional)

    def _query(self, q: QueryRecord, digest: str) -> Query:
        return Query(
            dataset=self.dataset,
            external_id=q.external_id,
            split=q.split,
            category=q.category,
            ordinal=q.ordinal,
            source_file=q.source_file,
            n_turns=len(q.turns),
            context_text=q.context_text,
            tags=q.tags,
            raw=q.raw,
            extra=q.extra,
            content_hash=digest,
        )

    def _existing(self, batch: list[QueryRecord]) -> dict[tuple[str, str], tuple[int, str, int, str]]:
        """``(split, external_id) -> (pk, content_hash, ordinal, source_file)`` of the batch's stored queries."""
        if self.created:
            return {}
        found: dict[tuple[str, str], tuple[int, str, int, str]] = {}
        by_split: dict[str, list[str]] = {}
        for q in batch:
            by_split.setdefault(q.split, []).append(q.external_id)
        for split, ids in by_split.items():
            rows = Query.objects.filter(dataset=self.dataset, split=split, external_id__in=ids)
            for ext, pk, digest, ordinal, source in rows.values_list(
                "external_id", "id", "content_hash", "ordinal", "source_file"
            ):
                found[(split, ext)] = (pk, digest, ordinal, source)
        return found

    def _match_by_content(self, batch: list[QueryRecord]) -> None:
        """Positional ids: each record takes a stored, unclaimed query of the same split and
        content (unchanged; its id and position follow the file); the others wait."""
        digests: dict[str, set[str]] = {q.split: set() for q in batch}
        keyed = [(q, self._digests(q)) for q in batch]
        for q, ours in keyed:
            digests[q.split].update(ours)
        stored: dict[tuple[str, str], list[tuple[int, str, int, str]]] = {}
        for split, wanted in digests.items():
            rows = Query.objects.filter(dataset=self.dataset, split=split, content_hash__in=wanted).order_by("id")
            for pk, digest, ext, ordinal, source in rows.values_list(
                "id", "content_hash", "external_id", "ordinal", "source_file"
            ):
                if pk not in self.claimed:
                    stored.setdefault((split, digest), []).append((pk, ext, ordinal, source))
        for q, ours in keyed:
            candidates = next((found for d in ours if (found := stored.get((q.split, d)))), None)
            if not candidates:
                self.pending.append((q, ours[0]))
                continue
            # the row of the same id first, else the first stored
            pick = next((c for c in candidates if c[1] == q.external_id), candidates[0])
            candidates.remove(pick)
            self.claimed.add(pick[0])
            if pick[1:] != (q.external_id, q.ordinal, q.source_file):
                self.moves.append((pick[0], q))
        self._count(batch, 0, 0)

    def _save(self, new: list[tuple[QueryRecord, Query]], changed: list[tuple[QueryRecord, Query]]) -> None:
        Query.objects.bulk_create([obj for _, obj in new])
        if changed:
            Query.objects.bulk_update([obj for _, obj in changed], QUERY_FIELDS)
            stale = [obj.id for _, obj in changed]
            Turn.objects.filter(query_id__in=stale).delete()
            Target.objects.filter(query_id__in=stale).delete()
        turns, targets = [], []
        for q, obj in new + changed:
            turns.extend(self._turns(q, obj.id))
            targets.extend(self._targets(q, obj.id))
        Turn.objects.bulk_create(turns)
        Target.objects.bulk_create(targets)

    def _turns(self, q: QueryRecord, qid: int) -> list[Turn]:
        return [
            Turn(
                query_id=qid,
                index=t.index,
                provenance=t.provenance,
                reference_image_id=self._pk(q, "reference", t.reference),
                turn_target_id=self._pk(q, "turn_target", t.turn_target),
                reference_turns=t.reference_turns or [],
                reference_checks=t.reference_checks or [],
                texts=[{k: v for k, v in vars(x).items() if v is not None} for x in t.texts],
            )
            for t in q.turns
        ]

    def _targets(self, q: QueryRecord, qid: int) -> list[Target]:
        rows, seen = [], set()
        for t in q.targets:
            if t.image in seen:
                raise ParseError(q.source_file, q.ordinal, "targets", f"image {t.image!r} is listed twice as a target")
            seen.add(t.image)
            rows.append(
                Target(
                    query_id=qid,
                    image_id=self._pk(q, "targets", t.image),
                    relevance=t.relevance,
                    is_primary=t.is_primary,
                    role=t.role,
                    source_field=t.source_field,
                )
            )
        return rows

    def _count(self, batch: list[QueryRecord], created: int, changed: int) -> None:
        r = self.report
        r.queries += len(batch)
        r.queries_created += created
        r.queries_updated += changed
        r.queries_unchanged += len(batch) - created - changed
        r.turns += sum(len(q.turns) for q in batch)
        r.targets += sum(len(q.targets) for q in batch)
        r.single_turn += sum(1 for q in batch if len(q.turns) == 1)
        r.multi_turn = r.queries - r.single_turn

    # ------------------------------------------------------------------ the end

    def finish_queries(self) -> None:
        """After the last batch of a re-import: for positional ids the records whose content is
        new (changed when a stored query that matched nothing shows the same images, else
        added) and the moves; then the removed queries (refused or deleted, with what depends
        on them)."""
        if self.created:
            return
        unclaimed = self._unclaimed()
        changed, new, moving = [], [], list(self.moves)
        if self.pending:
            by_images = self._images_of_rows(unclaimed)
            for q, digest in self.pending:
                obj = self._query(q, digest)
                pk = _pick(by_images.get((q.split, _signature(q))), unclaimed.get((q.split, q.external_id)))
                if pk is None:
                    new.append((q, obj))
                    continue
                obj.id = pk
                changed.append((q, obj))
                moving.append((pk, q))
        left = {pk for pk in unclaimed.values()} - {obj.id for _, obj in changed}
        # free the ids that move: a kept record's new id may be another's old one
        Query.objects.bulk_update([Query(id=pk, external_id=f"~moving~{pk}~") for pk, _ in moving], ["external_id"])
        self._remove(sorted(left))
        Query.objects.bulk_update(
            [Query(id=pk, external_id=q.external_id, ordinal=q.ordinal, source_file=q.source_file) for pk, q in moving],
            ["external_id", "ordinal", "source_file"],
        )
        self._use_images([q for q, _ in new + changed])
        self._save(new, changed)
        r = self.report
        r.queries_created += len(new)
        r.queries_updated += len(changed)
        r.queries_unchanged -= len(new) + len(changed)

    def _images_of_rows(self, rows: dict[tuple[str, str], int]) -> dict[tuple[str, tuple], list[int]]:
        """``(split, image signature) -> pks`` of the stored queries ``rows`` (see :func:`_signature`)."""
        pks = {pk: split for (split, _), pk in rows.items()}
        parts: dict[int, list] = {pk: [] for pk in pks}
        ids = sorted(pks)
        for start in range(0, len(ids), BATCH):
            chunk = ids[start : start + BATCH]
            for qid, ref, nxt in (
                Turn.objects.filter(query_id__in=chunk)
                .order_by("query_id", "index")
                .values_list("query_id", "reference_image__external_id", "turn_target__external_id")
            ):
                parts[qid].append((ref, nxt))
            for qid, image in (
                Target.objects.filter(query_id__in=chunk)
                .order_by("query_id", "id")
                .values_list("query_id", "image__external_id")
            ):
                parts[qid].append(image)
        out: dict[tuple[str, tuple], list[int]] = {}
        for pk in ids:
            out.setdefault((pks[pk], tuple(parts[pk])), []).append(pk)
        return out

    def _unclaimed(self) -> dict[tuple[str, str], int]:
        """``(split, external_id) -> pk`` of the stored queries of this import's files (for
        positional ids: of its categories, since the ids are ``<category>/<split>/<n>``) that
        no record matched."""
        out: dict[tuple[str, str], int] = {}
        key = "category" if self.positional else "source_file"
        for split, value in sorted(self.scope):
            rows = Query.objects.filter(dataset=self.dataset, split=split, **{key: value})
            for pk, ext in rows.values_list("id", "external_id").iterator(chunk_size=BATCH):  # not all at once
                if pk not in self.claimed:
                    out[(split, ext)] = pk
        return out

    def _remove(self, pks: list[int]) -> None:
        """Refuse or delete the removed queries ``pks``, naming them and what depends on them."""
        if not pks:
            return
        r = self.report
        rows = list(Query.objects.filter(pk__in=pks).order_by("split", "ordinal", "id"))
        r.queries_removed = len(rows)
        r.removed_examples = [q.external_id for q in rows[:MISSING_EXAMPLES]]
        collector = Collector(using=router.db_for_write(Query))
        protected: list[Any] = []
        try:
            collector.collect(rows)
        except ProtectedError as exc:
            protected = list(exc.protected_objects)
        r.removed_dependents = _dependents(collector, protected)
        named = ", ".join(r.removed_examples) + (
            f" and {len(rows) - len(r.removed_examples)} more" if len(rows) > len(r.removed_examples) else ""
        )
        depends = "; ".join(f"{n} {label}" for label, n in r.removed_dependents.items())
        deps = f"what depends on them: {depends}" if depends else "nothing depends on them"
        if protected:
            raise LoadError(
                f"{len(rows)} stored quer{'y is' if len(rows) == 1 else 'ies are'} not in the file any "
                f"more ({named}), and some of them are items of annotation studies ({deps}); an import "
                "never deletes annotation work: keep those records in the file, or delete the studies first"
            )
        if self.on_removed != "delete":
            raise LoadError(
                f"{len(rows)} stored quer{'y is' if len(rows) == 1 else 'ies are'} not in the file any "
                f"more: {named} ({deps}). Nothing was written. Import again with "
                "--delete-removed (upload page: 'delete records missing from the file') to delete them"
            )
        collector.delete()

    def finish(self) -> None:
        """Write the images no query used, updates to written ones, the galleries; fill the report."""
        self.finish_queries()
        _check_references(self.parsed)
        self.write_images(self.parsed.images)
        self._update_touched()
        self._write_galleries()
        r = self.report
        r.images = len(self.parsed.images) + self.streamed
        r.missing_images = self.probes.missing
        r.missing_examples = list(self.probes.missing_examples)
        r.warnings.extend(self.probes.warnings())
        mixed = mixed_fallback(self.dataset.pk, Query.objects.filter(dataset=self.dataset))
        if mixed:
            r.warnings.append(mixed_fallback_text(mixed))
        # Audits and studies of this dataset come next: let PostgreSQL plan them from its new size.
        refresh_statistics(Image, Query, Turn, Target, GalleryEntry)

    def _write_galleries(self) -> None:
        """Create the gallery entries not stored yet, a batch at a time; the report counts what
        the galleries hold (streamed ones included: their entries were written as they came)."""
        splits = list(self.parsed.galleries)
        if not splits:
            return
        for split, members in self.parsed.galleries.items():
            for start in range(0, len(members), BATCH):
                self._add_gallery_entries(split, [self.pks[ext] for ext in members[start : start + BATCH]], start)
        self.report.gallery_entries = GalleryEntry.objects.filter(dataset=self.dataset, split__in=splits).count()

    def _add_gallery_entries(self, split: str, pks: list[int], first: int) -> None:
        """Gallery entries for images ``pks`` of ``split`` at ordinals ``first``, ``first + 1``...;
        an entry stored already keeps its row (and ordinal)."""
        stored = (
            set()
            if self.created
            else set(
                GalleryEntry.objects.filter(dataset=self.dataset, split=split, image_id__in=pks).values_list(
                    "image_id", flat=True
                )
            )
        )
        rows = [
            GalleryEntry(dataset=self.dataset, split=split, image_id=pk, ordinal=first + n)
            for n, pk in enumerate(pks)
            if pk not in stored
        ]
        GalleryEntry.objects.bulk_create(rows, batch_size=BATCH, ignore_conflicts=True)


def _kept_from(rec: ImageRecord, stored: dict[str, Any]) -> ImageRecord:
    """An image a re-import names again, completed from what is stored: a file that names no
    path, url or extra key (a CIRR caption file without its split file) keeps the stored ones,
    so a re-import that knows less never blanks what an earlier one found (nothing else
    removes them either: a changed path or url replaces the stored one)."""
    if rec.path and rec.url and not (set(stored["extra"] or {}) - set(rec.extra)):
        return rec
    return replace(
        rec,
        path=rec.path or stored["path"],
        url=rec.url or stored["url"],
        extra={**(stored["extra"] or {}), **rec.extra},
    )


def _signature(q: QueryRecord) -> tuple:
    """The images a record names, in order (each turn's reference and next image, then the
    targets): how a positional record whose text changed finds its stored query."""
    return tuple([(t.reference, t.turn_target) for t in q.turns] + [t.image for t in q.targets])


def _pick(candidates: list[int] | None, same_id: int | None) -> int | None:
    """Take one pk from ``candidates`` (the one of the same id first); None when there is none."""
    if not candidates:
        return None
    pk = same_id if same_id in candidates else candidates[0]
    candidates.remove(pk)
    return pk


def _dependents(collector: Collector, protected: list[Any]) -> dict[str, int]:
    """What deleting the collected queries would delete too, and what protects them:
    ``model label -> rows`` (the queries with their own turns and targets left out), largest first."""
    counts: dict[str, int] = {}
    for model, objs in collector.data.items():
        if model not in (Query, Turn, Target):
            counts[model._meta.label] = counts.get(model._meta.label, 0) + len(objs)
    for qs in collector.fast_deletes:
        n = 0 if qs.model in (Turn, Target) else qs.count()
        if n:
            counts[qs.model._meta.label] = counts.get(qs.model._meta.label, 0) + n
    for obj in protected:
        label = f"{obj._meta.label} (protected)"
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _refuse_duplicates(queries: Iterable[QueryRecord]) -> None:
    """A query id may appear once per split (the parsers check their streams; this checks a list)."""
    seen: set[tuple[str, str]] = set()
    for q in queries:
        key = (q.split, q.external_id)
        if key in seen:
            raise ParseError(
                q.source_file, q.ordinal, "external_id", f"duplicate query id {q.external_id!r} in split {q.split!r}"
            )
        seen.add(key)


def _images_of(q: QueryRecord) -> Iterator[str]:
    """The image ids one query's turns and targets point at."""
    for t in q.turns:
        if t.reference is not None:
            yield t.reference
        if t.turn_target is not None:
            yield t.turn_target
    for target in q.targets:
        yield target.image
