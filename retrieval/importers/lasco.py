"""LaSCo annotation parser.

Files (optional ``.sample`` before ``.json``):

* ``lasco_<split>.json`` – triplets ``{"qid": int, "query-image": [coco_id, path],
  "query-text": str, "target-image": [coco_id, path]}`` (hyphenated keys);
* ``lasco_<split>_corpus.json`` (or any name containing ``corpus``) – the retrieval gallery,
  a list of ``{"id": coco_id, "path": str}``. A corpus name without a split takes the
  ``split`` argument, else the split of the triplet files when there is exactly one.

Mapping: ``external_id = str(qid)``; turn 1 = query image + query text; one primary target
(role ``gt``). Image id = ``str(coco_id)``, path = the pair's path (COCO 2014 layout,
e.g. ``val2014/COCO_val2014_000000028714.jpg``).

Path reconciliation: corpus paths carry an extra split folder (``val/val2014/...``) that
the triplet paths lack. A leading folder ``X/`` is dropped when the next folder is ``X``
followed by four digits (``val/val2014/`` -> ``val2014/``, ``train/train2014/`` ->
``train2014/``), so both files name the same file; the corpus spelling is kept in
``ImageRecord.extra['corpus_path']``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from retrieval.importers._common import (
    SAMPLE,
    PathLike,
    Record,
    as_paths,
    collect,
    file_role,
    is_int,
    is_test_split,
    iter_list,
    list_of_objects_with,
    name_token,
    register,
)
from retrieval.records import (
    ParsedDataset,
    ParseError,
    QueryRecord,
    TargetRecord,
    TextRecord,
    TurnRecord,
    record_name,
    safe_relpath,
)

FORMAT = "lasco"

_SPLIT = r"[A-Za-z0-9-]+"
_PATTERNS = [
    ("corpus", re.compile(rf"^lasco_(?P<split>{_SPLIT})_corpus{SAMPLE}\.json$")),
    ("corpus", re.compile(r"^.*corpus.*\.json$")),
    ("triplets", re.compile(rf"^lasco_(?P<split>{_SPLIT}){SAMPLE}\.json$")),
]
_CONTENT = [
    ("triplets", list_of_objects_with("qid", "query-image")),
    ("corpus", list_of_objects_with("id", "path")),
]
_EXPECTED = (
    "lasco_<split>.json (a list of {qid, query-image, query-text, target-image}) or "
    "lasco_<split>_corpus.json (a list of {id, path})"
)


def reconcile_corpus_path(path: str) -> str:
    """Drop the redundant leading split folder of a corpus path (``val/val2014/x`` -> ``val2014/x``)."""
    parts = path.split("/")
    if len(parts) >= 3 and re.fullmatch(re.escape(parts[0]) + r"\d{4}", parts[1]):
        return "/".join(parts[1:])
    return path


def parse(paths: Iterable[PathLike], split: str | None = None, subset: str | None = None) -> ParsedDataset:
    """Parse LaSCo triplet and corpus files into a ParsedDataset."""
    return collect(stream, FORMAT, paths, split=split)


def _classify(paths: Iterable[PathLike], split: str | None) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]]:
    """``(triplets, corpora)`` with their splits; a corpus without one takes the triplets' only split."""
    triplets: list[tuple[Path, str]] = []
    corpora: list[tuple[Path, str | None]] = []
    for path in as_paths(paths):
        role, named = file_role(path, _PATTERNS, _CONTENT, _EXPECTED)
        found = split or named.get("split") or name_token(path, ("train", "val", "test"))
        if role == "triplets":
            triplets.append((path, found or ""))
        else:
            corpora.append((path, found))
    triplet_splits = {name for _, name in triplets}
    _no_duplicates(triplets, "triplet")
    resolved: list[tuple[Path, str]] = []
    for path, name in corpora:
        if name is None:
            if len(triplet_splits) != 1:
                raise ParseError(
                    str(path),
                    None,
                    None,
                    "cannot tell the split of this corpus file; name it lasco_<split>_corpus.json or pass --split",
                )
            name = next(iter(triplet_splits))
        resolved.append((path, name))
    _no_duplicates(resolved, "corpus")
    return triplets, resolved


def stream(
    paths: Iterable[PathLike], dataset: ParsedDataset, split: str | None = None, subset: str | None = None
) -> Iterator[QueryRecord]:
    """Yield LaSCo queries one by one, then read the corpora into galleries (registering images)."""
    triplets, corpora = _classify(paths, split)
    corpus_splits = {name for _, name in corpora}
    for path, name in triplets:
        yield from _parse_triplets(path, name, dataset, name in corpus_splits)
    for path, name in corpora:
        _parse_corpus(path, name, dataset)


def _no_duplicates(files: list[tuple[Path, str]], what: str) -> None:
    first: dict[str, Path] = {}
    for path, name in files:
        if name in first:
            raise ParseError(str(path), None, None, f"a second {what} file for split {name!r} (first: {first[name]})")
        first[name] = path


def _pair(rec: Record, key: str) -> tuple[int, str]:
    """Check an ``[coco_id, path]`` pair and return it with the path normalised."""
    value = rec.req(key)
    if not (isinstance(value, list) and len(value) == 2 and is_int(value[0]) and isinstance(value[1], str)):
        rec.fail(key, "expected a [coco_id (integer), path (string)] pair")
    if value[0] < 0:
        rec.fail(key, f"negative COCO id {value[0]}")
    return value[0], safe_relpath(value[1], rec.file, rec.index, key)


def _parse_triplets(path: Path, split: str, dataset: ParsedDataset, has_gallery: bool) -> Iterator[QueryRecord]:
    test = is_test_split(split)
    seen: dict[int, int] = {}
    for index, raw in iter_list(path):
        rec = Record(path, index, raw)
        qid = rec.req_int("qid")
        if qid in seen:
            rec.fail("qid", f"duplicate qid {qid} (first at {record_name(rec.file, seen[qid])})")
        seen[qid] = index
        ref_id, ref_path = _pair(rec, "query-image")
        text = rec.req_str("query-text")
        target = _pair(rec, "target-image") if not test or rec.has("target-image") else None
        reference = _image(dataset, ref_id, ref_path)
        targets: list[TargetRecord] = []
        if target is not None:
            targets.append(TargetRecord(_image(dataset, *target), 1.0, True, "gt", "target-image"))
        extra: dict[str, Any] = {"gallery": split} if has_gallery else {}
        yield QueryRecord(
            external_id=str(qid),
            split=split,
            ordinal=index,
            source_file=path.name,
            turns=[TurnRecord(1, reference, [TextRecord(text, "caption")])],
            targets=targets,
            raw=raw,
            extra=extra,
        )


def _image(dataset: ParsedDataset, coco_id: int, rel: str) -> str:
    image_id = str(coco_id)
    known = dataset.images.get(image_id)
    if known is not None and known.path and known.path != rel:
        dataset.warnings.append(f"image {image_id}: path {rel!r} differs from {known.path!r}; kept the first")
    return register(dataset, image_id, path=rel)


def _parse_corpus(path: Path, split: str, dataset: ParsedDataset) -> None:
    gallery: list[str] = []
    seen: dict[int, int] = {}
    for index, raw in iter_list(path):
        rec = Record(path, index, raw, "corpus entry")
        coco_id = rec.req_int("id")
        if coco_id in seen:
            rec.fail("id", f"duplicate id {coco_id} (first at {record_name(rec.file, seen[coco_id])})")
        seen[coco_id] = index
        original = safe_relpath(rec.req_str("path"), rec.file, index, "path")
        image_id = _image(dataset, coco_id, reconcile_corpus_path(original))
        dataset.images[image_id].extra.setdefault("corpus_path", original)
        gallery.append(image_id)
    dataset.galleries[split] = gallery
