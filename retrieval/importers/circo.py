"""CIRCO annotation parser.

Files: ``val.json`` and/or ``test.json`` (optional ``.sample`` before ``.json``), each a
list of queries ``{id, reference_img_id, relative_caption, shared_concept, [target_img_id,
gt_img_ids, semantic_aspects]}``.

Mapping: ``external_id = str(id)``; turn 1 = reference + ``relative_caption``;
``context_text = shared_concept``; ``tags = semantic_aspects``; targets = ``gt_img_ids`` in
order (role ``gt``) with ``target_img_id`` primary (it is always ``gt_img_ids[0]`` in the
release; if it is not in the list it is put first, with a warning). Images: id =
``str(coco_id)``, path ``f"{coco_id:012d}.jpg"`` relative to the COCO 2017 unlabeled folder.
Test queries have no targets. The gallery (all of COCO unlabeled, ~123k images) is not in
these files, so no gallery is produced.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from retrieval.importers._common import (
    SAMPLE,
    PathLike,
    Record,
    add_target,
    as_paths,
    collect,
    file_role,
    is_test_split,
    iter_list,
    list_of_objects_with,
    name_token,
    need,
    register,
)
from retrieval.records import ParsedDataset, ParseError, QueryRecord, TargetRecord, TextRecord, TurnRecord, record_name

FORMAT = "circo"

_PATTERNS = [("queries", re.compile(rf"^(?P<split>val|test){SAMPLE}\.json$"))]
_CONTENT = [("queries", list_of_objects_with("reference_img_id", "relative_caption"))]
_EXPECTED = "val.json or test.json (a list of {id, reference_img_id, relative_caption, shared_concept, ...})"


def image_path(coco_id: int) -> str:
    """File name of a COCO 2017 image: the id zero-padded to 12 digits."""
    return f"{coco_id:012d}.jpg"


def parse(paths: Iterable[PathLike], split: str | None = None, subset: str | None = None) -> ParsedDataset:
    """Parse CIRCO ``val.json`` / ``test.json`` files into a ParsedDataset."""
    return collect(stream, FORMAT, paths, split=split)


def stream(
    paths: Iterable[PathLike], dataset: ParsedDataset, split: str | None = None, subset: str | None = None
) -> Iterator[QueryRecord]:
    """Yield the queries of CIRCO files one by one, registering their images on ``dataset``."""
    files: list[tuple[Path, str]] = []
    seen_splits: dict[str, Path] = {}
    for path in as_paths(paths):
        _, named = file_role(path, _PATTERNS, _CONTENT, _EXPECTED)
        name = need(
            split or named.get("split") or name_token(path, ("val", "test")), path, "split", "--split", _EXPECTED
        )
        if name in seen_splits:
            raise ParseError(str(path), None, None, f"a second file for split {name!r} (first: {seen_splits[name]})")
        seen_splits[name] = path
        files.append((path, name))
    for path, name in files:
        yield from _parse_file(path, name, dataset)


def _image(rec: Record, dataset: ParsedDataset, coco_id: int, field_name: str) -> str:
    if coco_id < 0:
        rec.fail(field_name, f"negative COCO id {coco_id}")
    return register(dataset, str(coco_id), path=image_path(coco_id))


def _parse_file(path: Path, split: str, dataset: ParsedDataset) -> Iterator[QueryRecord]:
    test = is_test_split(split)
    seen: dict[int, int] = {}
    for index, raw in iter_list(path):
        rec = Record(path, index, raw)
        qid = rec.req_int("id")
        if qid in seen:
            rec.fail("id", f"duplicate id {qid} (first at {record_name(rec.file, seen[qid])})")
        seen[qid] = index
        reference = _image(rec, dataset, rec.req_int("reference_img_id"), "reference_img_id")
        caption = rec.req_str("relative_caption")
        concept = rec.req_str("shared_concept")
        aspects = rec.opt_str_list("semantic_aspects") or []
        if test:
            primary = rec.opt_int("target_img_id")
            gt = rec.req_int_list("gt_img_ids") if rec.has("gt_img_ids") else []
        else:
            primary = rec.req_int("target_img_id")
            gt = rec.req_int_list("gt_img_ids", non_empty=True)

        where = f"{path.name} {record_name(path, index)}"
        targets: list[TargetRecord] = []
        if primary is not None and primary not in gt:
            dataset.warnings.append(f"{where}: target_img_id {primary} is not in gt_img_ids; added first")
            image = _image(rec, dataset, primary, "target_img_id")
            targets.append(TargetRecord(image, 1.0, True, "gt", "target_img_id"))
        elif primary is not None and gt[0] != primary:
            dataset.warnings.append(f"{where}: target_img_id {primary} is not gt_img_ids[0]")
        for coco_id in gt:
            image = _image(rec, dataset, coco_id, "gt_img_ids")
            add_target(targets, TargetRecord(image, 1.0, coco_id == primary, "gt", "gt_img_ids"), dataset, where)

        yield QueryRecord(
            external_id=str(qid),
            split=split,
            ordinal=index,
            source_file=path.name,
            turns=[TurnRecord(1, reference, [TextRecord(caption, "caption")])],
            targets=targets,
            raw=raw,
            context_text=concept,
            tags=list(aspects),
        )
