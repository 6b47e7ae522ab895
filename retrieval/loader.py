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
its normalised content (fields, turns, targets); a re-import writes only the queries whose
hash changed and the images whose values changed, so re-importing unchanged data costs
about as much as reading it.
"""
from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from .dbstats import refresh_statistics
from .imagefiles import PathEscapeError, probe_image, resolve_under
from .models import Dataset, GalleryEntry, Image, Query, Target, Turn
from .records import ImageRecord, ParsedDataset, ParseError, QueryRecord

Progress = Callable[[str, int, int], None]
BATCH = 2000
MISSING_EXAMPLES = 10
QUERY_FIELDS = ["category", "ordinal", "source_file", "n_turns", "context_text", "tags", "raw", "extra", "content_hash"]
IMAGE_FIELDS = ["path", "url", "sha256", "width", "height", "missing", "extra"]


class LoadError(ValueError):
    """The parsed data cannot be written (naming what and why)."""


@dataclass
class LoadReport:
    dataset: str
    format: str
    dataset_created: bool
    queries: int = 0
    queries_created: int = 0
    queries_updated: int = 0
    queries_unchanged: int = 0
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

    def as_dict(self) -> dict:
        return asdict(self)


def _noop(stage: str, done: int, total: int) -> None:
    return None


def content_hash(q: QueryRecord) -> str:
    """A digest of everything the loader writes for one query (its row, turns and targets)."""
    payload = [q.external_id, q.split, q.category, q.ordinal, q.source_file, q.context_text, q.tags, q.raw,
               q.extra, [vars(t) for t in q.turns], [vars(t) for t in q.targets]]
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
    return load_stream(parsed, parsed.queries, name, images_root, description,
                       lambda done: progress("writing queries", done, total))


def load_stream(
    parsed: ParsedDataset,
    queries: Iterable[QueryRecord],
    name: str,
    images_root: Path | None = None,
    description: str = "",
    on_batch: Callable[[int], None] | None = None,
) -> LoadReport:
    """Write the ``queries`` a parser yields (images, galleries, warnings gathered on ``parsed``).

    Images a parser streams (``parsed.image_sink``: M-BEIR candidate pools) are written batch by
    batch as they come, with their gallery entries, and not kept. ``on_batch(n)`` is called
    after each written batch with the number of queries so far.
    """
    root = Path(images_root).resolve() if images_root else None
    with transaction.atomic():
        dataset, created = _open_dataset(name, parsed.format, root, description)
        report = LoadReport(dataset=name, format=parsed.format, dataset_created=created)
        writer = _Writer(dataset, created, parsed, root, report)
        parsed.image_sink = writer.write_streamed_images
        try:
            for batch in _batches(queries, BATCH):
                writer.write_queries(batch)
                if on_batch is not None:
                    on_batch(report.queries)
            writer.finish()
        finally:
            parsed.image_sink = None
        dataset.save(update_fields=["images_root", "updated_at"])  # a re-import is an update too
    report.warnings[:0] = parsed.warnings
    return report


def _batches(items: Iterable[QueryRecord], size: int) -> Iterator[list[QueryRecord]]:
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def _open_dataset(name: str, fmt: str, root: Path | None, description: str) -> tuple[Dataset, bool]:
    """Get or create dataset ``name`` (locked); refuse another format or another images root."""
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

    def __init__(self, dataset: Dataset, created: bool, parsed: ParsedDataset, root: Path | None, report: LoadReport):
        self.dataset = dataset
        self.created = created
        self.parsed = parsed
        self.report = report
        self.probes = _Probes(root)
        self.pks: dict[str, int] = {}
        self.streamed = 0  # images received through write_streamed_images (not kept in ``pks``)
        self.ordinals: dict[str, int] = {}  # split -> next gallery ordinal of streamed members

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
        existing = {
            row[0]: row[1:] for row in Image.objects.filter(dataset=self.dataset, external_id__in=chunk).values_list(
                "external_id", "id", *IMAGE_FIELDS)
        } if again or not self.created else {}
        missing_at = 1 + IMAGE_FIELDS.index("missing")
        pks: dict[str, int] = {}
        new, changed = [], []
        for rec in records:
            row = existing.get(rec.external_id)
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

    def write_streamed_images(self, split: str, new: list[ImageRecord], changed: list[ImageRecord],
                              members: list[str]) -> None:
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
            rows = [Image(id=self.pks[i], dataset=self.dataset, external_id=i,
                          **self.probes.values(i, self.parsed.images[i], before=before[self.pks[i]])) for i in chunk]
            Image.objects.bulk_update(rows, IMAGE_FIELDS)
        self.parsed.touched.clear()

    def _pk(self, q: QueryRecord, field_name: str, image_id: str | None) -> int | None:
        if image_id is None:
            return None
        if image_id not in self.pks:
            raise ParseError(q.source_file, q.ordinal, field_name, f"image {image_id!r} is not defined")
        return self.pks[image_id]

    # ------------------------------------------------------------------ queries

    def write_queries(self, batch: list[QueryRecord]) -> None:
        """Write one batch: new queries created, changed ones rewritten, unchanged ones left alone."""
        used = list(dict.fromkeys(i for q in batch for i in _images_of(q)))
        self.write_images(i for i in used if i in self.parsed.images)
        streamed = [i for i in used if i not in self.pks]  # images a parser streamed (written, not kept)
        if streamed and self.streamed:
            self.pks.update(self._stored_pks(streamed))
        _refuse_duplicates(batch)
        existing = self._existing(batch)
        new, changed = [], []
        for q in batch:
            digest = content_hash(q)
            row = existing.get((q.split, q.external_id))
            if row is not None and row[1] == digest:
                continue
            obj = Query(dataset=self.dataset, external_id=q.external_id, split=q.split, category=q.category,
                        ordinal=q.ordinal, source_file=q.source_file, n_turns=len(q.turns),
                        context_text=q.context_text, tags=q.tags, raw=q.raw, extra=q.extra, content_hash=digest)
            if row is None:
                new.append((q, obj))
            else:
                obj.id = row[0]
                changed.append((q, obj))
        self._save(new, changed)
        self._count(batch, len(new), len(changed))

    def _existing(self, batch: list[QueryRecord]) -> dict[tuple[str, str], tuple[int, str]]:
        """``(split, external_id) -> (pk, content_hash)`` of the batch's queries already stored."""
        if self.created:
            return {}
        found: dict[tuple[str, str], tuple[int, str]] = {}
        by_split: dict[str, list[str]] = {}
        for q in batch:
            by_split.setdefault(q.split, []).append(q.external_id)
        for split, ids in by_split.items():
            rows = Query.objects.filter(dataset=self.dataset, split=split, external_id__in=ids)
            for ext, pk, digest in rows.values_list("external_id", "id", "content_hash"):
                found[(split, ext)] = (pk, digest)
        return found

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
            Turn(query_id=qid, index=t.index, provenance=t.provenance,
                 reference_image_id=self._pk(q, "reference", t.reference),
                 turn_target_id=self._pk(q, "turn_target", t.turn_target),
                 texts=[{k: v for k, v in vars(x).items() if v is not None} for x in t.texts])
            for t in q.turns
        ]

    def _targets(self, q: QueryRecord, qid: int) -> list[Target]:
        rows, seen = [], set()
        for t in q.targets:
            if t.image in seen:
                raise ParseError(q.source_file, q.ordinal, "targets", f"image {t.image!r} is listed twice as a target")
            seen.add(t.image)
            rows.append(Target(query_id=qid, image_id=self._pk(q, "targets", t.image), relevance=t.relevance,
                               is_primary=t.is_primary, role=t.role, source_field=t.source_field))
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

    def finish(self) -> None:
        """Write the images no query used, updates to written ones, the galleries; fill the report."""
        _check_references(self.parsed)
        self.write_images(self.parsed.images)
        self._update_touched()
        self._write_galleries()
        r = self.report
        r.images = len(self.parsed.images) + self.streamed
        r.missing_images = self.probes.missing
        r.missing_examples = list(self.probes.missing_examples)
        r.warnings.extend(self.probes.warnings())
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
        stored = set() if self.created else set(GalleryEntry.objects.filter(
            dataset=self.dataset, split=split, image_id__in=pks).values_list("image_id", flat=True))
        rows = [GalleryEntry(dataset=self.dataset, split=split, image_id=pk, ordinal=first + n)
                for n, pk in enumerate(pks) if pk not in stored]
        GalleryEntry.objects.bulk_create(rows, batch_size=BATCH, ignore_conflicts=True)


def _refuse_duplicates(queries: Iterable[QueryRecord]) -> None:
    """A query id may appear once per split (the parsers check their streams; this checks a list)."""
    seen: set[tuple[str, str]] = set()
    for q in queries:
        key = (q.split, q.external_id)
        if key in seen:
            raise ParseError(q.source_file, q.ordinal, "external_id",
                             f"duplicate query id {q.external_id!r} in split {q.split!r}")
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
