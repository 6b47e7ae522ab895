"""Write a parsed dataset to the database in one transaction.

The parsers (``retrieval.importers``) are pure and validate every record; this loader
checks what only the disk and the database can tell (files, symlinks, an existing
dataset of another format), then writes everything or nothing. Re-importing the same
file updates rows in place: queries are keyed by (dataset, split, external_id) and
images by (dataset, external_id), so no duplicates appear.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import transaction

from .imagefiles import PathEscapeError, probe_image, resolve_under
from .models import Dataset, GalleryEntry, Image, Query, Target, Turn
from .records import ParsedDataset, ParseError

Progress = Callable[[str, int, int], None]
BATCH = 2000
MISSING_EXAMPLES = 10


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
    single_turn: int = 0
    multi_turn: int = 0
    turns: int = 0
    targets: int = 0
    images: int = 0
    images_created: int = 0
    missing_images: int = 0
    missing_examples: list[str] = field(default_factory=list)
    gallery_entries: int = 0
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _noop(stage: str, done: int, total: int) -> None:
    return None


def _check_references(parsed: ParsedDataset) -> None:
    known = parsed.images
    for q in parsed.queries:
        for turn in q.turns:
            for fld, image_id in (("reference", turn.reference), ("turn_target", turn.turn_target)):
                if image_id is not None and image_id not in known:
                    raise ParseError(q.source_file, q.ordinal, fld, f"image {image_id!r} is not defined")
        for t in q.targets:
            if t.image not in known:
                raise ParseError(q.source_file, q.ordinal, "targets", f"image {t.image!r} is not defined")
    for split, ids in parsed.galleries.items():
        for image_id in ids:
            if image_id not in known:
                raise LoadError(f"gallery {split!r} lists unknown image {image_id!r}")


def probe_images(parsed: ParsedDataset, images_root: Path | None, progress: Progress = _noop) -> dict[str, dict]:
    """Look at every image file once: path safety, existence, sha256, size."""
    found: dict[str, dict] = {}
    total = len(parsed.images)
    root = Path(images_root).resolve() if images_root else None
    for n, (image_id, rec) in enumerate(parsed.images.items(), 1):
        info = {"sha256": "", "width": None, "height": None, "missing": True, "problem": "no path"}
        if rec.path and root is not None:
            try:
                full = resolve_under(root, rec.path)
            except PathEscapeError as exc:
                raise LoadError(f"image {image_id!r}: path {rec.path!r} escapes the images root ({exc})") from None
            probe = probe_image(full, max_pixels=settings.IMAGE_MAX_PIXELS)
            info.update(sha256=probe.sha256, width=probe.width, height=probe.height, missing=not probe.exists,
                        problem=probe.problem)
        found[image_id] = info
        if n % 500 == 0 or n == total:
            progress("checking images", n, total)
    return found


def load_parsed(
    parsed: ParsedDataset,
    name: str,
    images_root: Path | None = None,
    description: str = "",
    progress: Progress = _noop,
) -> LoadReport:
    """Validate, then write ``parsed`` as dataset ``name``; all or nothing."""
    _check_references(parsed)
    probes = probe_images(parsed, images_root, progress)
    root_text = str(Path(images_root).resolve()) if images_root else ""

    with transaction.atomic():
        dataset, created = Dataset.objects.select_for_update().get_or_create(
            name=name, defaults={"format": parsed.format, "images_root": root_text, "description": description}
        )
        if not created:
            if dataset.format != parsed.format:
                raise LoadError(
                    f"dataset {name!r} was imported as {dataset.format!r}; refusing to add {parsed.format!r} data to it"
                )
            if root_text and dataset.images_root and dataset.images_root != root_text:
                raise LoadError(
                    f"dataset {name!r} has images under {dataset.images_root}; this import names {root_text}"
                )
            if root_text and not dataset.images_root:
                dataset.images_root = root_text
                dataset.save(update_fields=["images_root", "updated_at"])
        report = LoadReport(dataset=name, format=parsed.format, dataset_created=created)
        report.warnings.extend(parsed.warnings)

        image_ids = _write_images(dataset, parsed, probes, report, progress)
        _write_gallery(dataset, parsed, image_ids, report)
        _write_queries(dataset, parsed, image_ids, report, progress)

    missing = [i for i, p in probes.items() if p["missing"]]
    report.missing_images = len(missing)
    report.missing_examples = missing[:MISSING_EXAMPLES]
    unusable = [f"{i}: {p['problem']}" for i, p in probes.items() if p["missing"] and p["problem"] not in ("", "no path", "no such file")]
    report.warnings.extend(f"image refused ({x})" for x in unusable[:MISSING_EXAMPLES])
    if len(unusable) > MISSING_EXAMPLES:
        report.warnings.append(f"... and {len(unusable) - MISSING_EXAMPLES} more unusable image files")
    return report


def _write_images(dataset, parsed, probes, report, progress) -> dict[str, int]:
    existing = {
        ext: (pk, path, sha, w, h, miss, url)
        for ext, pk, path, sha, w, h, miss, url in Image.objects.filter(dataset=dataset).values_list(
            "external_id", "id", "path", "sha256", "width", "height", "missing", "url"
        )
    }
    new, changed = [], []
    for image_id, rec in parsed.images.items():
        p = probes[image_id]
        values = dict(
            path=rec.path or "", url=rec.url or "", sha256=p["sha256"], width=p["width"], height=p["height"],
            missing=p["missing"], extra=rec.extra,
        )
        if image_id in existing:
            pk, path, sha, w, h, miss, url = existing[image_id]
            if (path, sha, w, h, miss, url) != (values["path"], values["sha256"], values["width"], values["height"], values["missing"], values["url"]):
                changed.append(Image(id=pk, dataset=dataset, external_id=image_id, **values))
        else:
            new.append(Image(dataset=dataset, external_id=image_id, **values))
    for start in range(0, len(new), BATCH):
        Image.objects.bulk_create(new[start : start + BATCH])
        progress("writing images", start + len(new[start : start + BATCH]), len(new))
    if changed:
        Image.objects.bulk_update(changed, ["path", "url", "sha256", "width", "height", "missing", "extra"], batch_size=BATCH)
    report.images = len(parsed.images)
    report.images_created = len(new)
    ids = {ext: row[0] for ext, row in existing.items()}
    ids.update({img.external_id: img.id for img in new})
    return ids


def _write_gallery(dataset, parsed, image_ids, report) -> None:
    rows = [
        GalleryEntry(dataset=dataset, split=split, image_id=image_ids[ext], ordinal=n)
        for split, members in parsed.galleries.items()
        for n, ext in enumerate(members)
    ]
    GalleryEntry.objects.bulk_create(rows, batch_size=BATCH, ignore_conflicts=True)
    report.gallery_entries = len(rows)


def _write_queries(dataset, parsed, image_ids, report, progress) -> None:
    existing = {
        (split, ext): pk
        for split, ext, pk in Query.objects.filter(dataset=dataset).values_list("split", "external_id", "id")
    }
    seen: set[tuple[str, str]] = set()
    new, updated = [], []
    for q in parsed.queries:
        key = (q.split, q.external_id)
        if key in seen:
            raise ParseError(q.source_file, q.ordinal, "external_id", f"duplicate query id {q.external_id!r} in split {q.split!r}")
        seen.add(key)
        obj = Query(
            dataset=dataset, external_id=q.external_id, split=q.split, category=q.category, ordinal=q.ordinal,
            source_file=q.source_file, n_turns=len(q.turns), context_text=q.context_text, tags=q.tags,
            raw=q.raw, extra=q.extra,
        )
        if key in existing:
            obj.id = existing[key]
            updated.append(obj)
        else:
            new.append(obj)
    for start in range(0, len(new), BATCH):
        Query.objects.bulk_create(new[start : start + BATCH])
    if updated:
        Query.objects.bulk_update(
            updated,
            ["category", "ordinal", "source_file", "n_turns", "context_text", "tags", "raw", "extra"],
            batch_size=BATCH,
        )
        stale = [q.id for q in updated]
        for start in range(0, len(stale), BATCH):
            Turn.objects.filter(query_id__in=stale[start : start + BATCH]).delete()
            Target.objects.filter(query_id__in=stale[start : start + BATCH]).delete()

    by_key = {(q.split, q.external_id): q.id for q in new + updated}
    turns, targets = [], []
    total = len(parsed.queries)
    for n, q in enumerate(parsed.queries, 1):
        qid = by_key[(q.split, q.external_id)]
        for t in q.turns:
            turns.append(
                Turn(
                    query_id=qid, index=t.index, provenance=t.provenance,
                    reference_image_id=image_ids[t.reference] if t.reference else None,
                    turn_target_id=image_ids[t.turn_target] if t.turn_target else None,
                    texts=[{k: v for k, v in vars(x).items() if v is not None} for x in t.texts],
                )
            )
        seen_targets: set[str] = set()
        for t in q.targets:
            if t.image in seen_targets:
                raise ParseError(q.source_file, q.ordinal, "targets", f"image {t.image!r} is listed twice as a target")
            seen_targets.add(t.image)
            targets.append(
                Target(query_id=qid, image_id=image_ids[t.image], relevance=t.relevance, is_primary=t.is_primary,
                       role=t.role, source_field=t.source_field)
            )
        if len(turns) >= BATCH:
            Turn.objects.bulk_create(turns)
            report.turns += len(turns)
            turns = []
        if len(targets) >= BATCH:
            Target.objects.bulk_create(targets)
            report.targets += len(targets)
            targets = []
        if n % 1000 == 0 or n == total:
            progress("writing queries", n, total)
    Turn.objects.bulk_create(turns)
    Target.objects.bulk_create(targets)
    report.turns += len(turns)
    report.targets += len(targets)
    report.queries = len(parsed.queries)
    report.queries_created = len(new)
    report.queries_updated = len(updated)
    report.single_turn = sum(1 for q in parsed.queries if len(q.turns) == 1)
    report.multi_turn = report.queries - report.single_turn
