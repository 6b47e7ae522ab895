"""Import a retrieval gallery into a dataset: a folder of images or a list of COCO ids.

CIRCO's annotation files name only the 1,121 images their queries use; its published
figures rank against the 123,403 images of COCO 2017 *unlabeled*. This adds such a gallery
to an imported dataset as the gallery of one or more splits (``val``, ``test``: the key
:mod:`retrieval.galleries` looks up), so that an audit searches it:

* ``ids``: COCO ids from a text file (one per line), a JSON list, or COCO's
  ``image_info_unlabeled2017.json`` (``images[].id`` and ``file_name``); each image is
  ``%012d.jpg`` under the dataset's images root (CIRCO's naming) unless the info file names it;
* ``folder``: every ``.jpg``/``.jpeg``/``.png`` file under a folder inside the images root;
  an image's id is its file stem (a COCO number loses its leading zeros: ``000000000042.jpg``
  is image ``42``, the id the CIRCO importer gives it).

Images already in the dataset (the annotation images) are reused, not duplicated; one that has
no file yet (a format that names none) gets the gallery's. Rows are
written ``BATCH`` at a time (memory stays flat whatever the size) in one transaction (a
failed import writes nothing); every file is hashed and its header read, as the annotation
importers do. A re-import adds only what is new.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import transaction

from .dbstats import refresh_statistics
from .imagefiles import PathEscapeError, probe_image, resolve_under
from .loader import batched
from .models import Dataset, GalleryEntry, Image

BATCH = 2000
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_COCO_STEM = re.compile(r"^\d+$")


class GalleryImportError(ValueError):
    """The gallery cannot be imported (naming what and why)."""


@dataclass
class GalleryReport:
    dataset: str
    splits: list[str]
    listed: int = 0
    images_created: int = 0
    entries_created: int = 0
    missing: int = 0
    missing_examples: list[str] = field(default_factory=list)
    gallery_sizes: dict[str, int] = field(default_factory=dict)


def coco_file_name(coco_id: int) -> str:
    """COCO 2017's file name of an image id (CIRCO's ``%012d.jpg``)."""
    return f"{coco_id:012d}.jpg"


def _coco_id(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise GalleryImportError(f"{where}: {value!r} is not a COCO image id (a non-negative integer)")
    return int(value)


def ids_from_file(path: Path) -> Iterator[tuple[str, str]]:
    """``(external id, relative path)`` of each id a file lists (see the module notes)."""
    text_head = path.open("rb").read(1).strip()
    if text_head in (b"[", b"{"):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            images = data.get("images")
            if not isinstance(images, list):
                raise GalleryImportError(f"{path.name}: a JSON object without an 'images' list (COCO's image info)")
            for n, img in enumerate(images, 1):
                coco = _coco_id(img.get("id") if isinstance(img, dict) else img, f"{path.name} image {n}")
                yield str(coco), str(img.get("file_name") or coco_file_name(coco))
            return
        for n, value in enumerate(data, 1):
            coco = _coco_id(value, f"{path.name} entry {n}")
            yield str(coco), coco_file_name(coco)
        return
    with path.open(encoding="utf-8") as lines:
        for n, line in enumerate(lines, 1):
            if line.strip():
                coco = _coco_id(line.strip(), f"{path.name} line {n}")
                yield str(coco), coco_file_name(coco)


def ids_from_folder(folder: Path, root: Path) -> Iterator[tuple[str, str]]:
    """``(external id, path relative to root)`` of every image file under ``folder``, sorted."""
    try:
        rel_folder = folder.resolve().relative_to(root.resolve())
    except ValueError:
        raise GalleryImportError(f"folder {folder} is not inside the dataset's images root {root}") from None
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        base = rel_folder / Path(dirpath).resolve().relative_to(folder.resolve())
        for name in sorted(filenames):
            if Path(name).suffix.lower() in IMAGE_SUFFIXES:
                stem = Path(name).stem
                yield (str(int(stem)) if _COCO_STEM.match(stem) else stem), str(base / name)


def import_gallery(
    dataset: Dataset, splits: list[str], items: Iterable[tuple[str, str]], progress: Callable[[int], None] | None = None
) -> GalleryReport:
    """Add ``items`` (external id, relative path) to the galleries of ``splits``; see the module notes."""
    if not dataset.images_root:
        raise GalleryImportError(f"dataset {dataset.name!r} has no images root; import it with --images-root first")
    root = Path(dataset.images_root)
    report = GalleryReport(dataset.name, list(splits))
    seen: set[str] = set()
    with transaction.atomic():
        first = {s: GalleryEntry.objects.filter(dataset=dataset, split=s).count() for s in splits}
        for batch in batched(items, BATCH):
            batch = [(ext, rel) for ext, rel in batch if ext not in seen]
            seen.update(ext for ext, _ in batch)
            pks = _images(dataset, root, batch, report)
            for split in splits:
                rows = [
                    GalleryEntry(dataset=dataset, split=split, image_id=pk, ordinal=first[split] + report.listed + n)
                    for n, pk in enumerate(pks)
                ]
                before = GalleryEntry.objects.filter(dataset=dataset, split=split).count()
                GalleryEntry.objects.bulk_create(rows, batch_size=BATCH, ignore_conflicts=True)
                report.entries_created += GalleryEntry.objects.filter(dataset=dataset, split=split).count() - before
            report.listed += len(batch)
            if progress:
                progress(report.listed)
        report.gallery_sizes = {s: GalleryEntry.objects.filter(dataset=dataset, split=s).count() for s in splits}
    refresh_statistics(Image, GalleryEntry)
    return report


def _give_files(root: Path, paths: dict[str, str], pathless: list[tuple[str, int]]) -> None:
    """Images the dataset has without a file (an annotation format that names no path, e.g. a
    CIRCLED file of another source) get the gallery's file, probed as a new image is."""
    for ext, pk in pathless:
        try:
            probe = probe_image(resolve_under(root, paths[ext]), max_pixels=settings.IMAGE_MAX_PIXELS)
        except PathEscapeError as exc:
            raise GalleryImportError(f"image {ext!r}: path {paths[ext]!r} escapes the images root ({exc})") from None
        Image.objects.filter(pk=pk).update(
            path=paths[ext], sha256=probe.sha256, width=probe.width, height=probe.height, missing=not probe.exists
        )


def _images(dataset: Dataset, root: Path, batch: list[tuple[str, str]], report: GalleryReport) -> list[int]:
    """Image ids of ``batch``, creating (and probing) the images the dataset lacks."""
    found = list(
        Image.objects.filter(dataset=dataset, external_id__in=[e for e, _ in batch]).values_list(
            "external_id", "pk", "path"
        )
    )
    existing = {ext: pk for ext, pk, _ in found}
    _give_files(root, dict(batch), [(ext, pk) for ext, pk, path in found if not path])
    new = []
    for ext, rel in batch:
        if ext in existing:
            continue
        try:
            full = resolve_under(root, rel)
        except PathEscapeError as exc:
            raise GalleryImportError(f"image {ext!r}: path {rel!r} escapes the images root ({exc})") from None
        probe = probe_image(full, max_pixels=settings.IMAGE_MAX_PIXELS)
        if not probe.exists:
            report.missing += 1
            if len(report.missing_examples) < 10:
                report.missing_examples.append(f"{ext}: {probe.problem}")
        new.append(
            Image(
                dataset=dataset,
                external_id=ext,
                path=rel,
                sha256=probe.sha256,
                width=probe.width,
                height=probe.height,
                missing=not probe.exists,
                extra={"gallery_import": True},
            )
        )
    Image.objects.bulk_create(new, batch_size=BATCH)
    report.images_created += len(new)
    if new:
        existing.update(
            Image.objects.filter(dataset=dataset, external_id__in=[i.external_id for i in new]).values_list(
                "external_id", "pk"
            )
        )
    return [existing[ext] for ext, _ in batch]
