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
from collections.abc import Iterable
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
    expect_list,
    expect_object,
    is_int,
    is_number,
    is_test_split,
    load_json,
    match_name,
    register,
)
from retrieval.records import ParsedDataset, ParseError, QueryRecord, TargetRecord, TextRecord, TurnRecord, safe_relpath

FORMAT = "cirr"

_PATTERNS = [
    ("ext", re.compile(rf"^cap\.ext\.(?P<ver>rc\d+)\.(?P<split>{TOKEN}){SAMPLE}\.json$")),
    ("cap", re.compile(rf"^cap\.(?P<ver>rc\d+)\.(?P<split>{TOKEN}){SAMPLE}\.json$")),
    ("split", re.compile(rf"^split\.(?P<ver>rc\d+)\.(?P<split>{TOKEN}){SAMPLE}\.json$")),
]


def parse(paths: Iterable[PathLike], split: str | None = None) -> ParsedDataset:
    """Parse CIRR caption, extended-caption and image-split files into a ParsedDataset."""
    groups: dict[str, dict[str, Path]] = {}
    for path in as_paths(paths):
        role, m = match_name(path, _PATTERNS, FORMAT)
        name = split or m.group("split")
        roles = groups.setdefault(name, {})
        if role in roles:
            raise ParseError(str(path), None, None, f"a second {role} file for split {name!r} (first: {roles[role]})")
        roles[role] = path

    dataset = ParsedDataset(format=FORMAT)
    for name, roles in groups.items():
        if "ext" in roles and "cap" not in roles:
            raise ParseError(str(roles["ext"]), None, None,
                             "extended captions given without their cap.rc2 caption file")
        known: set[str] | None = None
        if "split" in roles:
            known = _parse_split_file(roles["split"], dataset, name)
        if "cap" in roles:
            queries = _parse_captions(roles["cap"], name, dataset, known)
            if "ext" in roles:
                _attach_ext(roles["ext"], queries, dataset)
            dataset.queries.extend(queries)
    return dataset


def _parse_split_file(path: Path, dataset: ParsedDataset, split: str) -> set[str]:
    """Register every image of a split file (id -> path) and record the split's gallery."""
    data = expect_object(load_json(path), path)
    gallery: list[str] = []
    for index, (image_id, rel) in enumerate(data.items()):
        norm = safe_relpath(rel, str(path), index, image_id)
        register(dataset, image_id, path=norm)
        gallery.append(image_id)
    dataset.galleries[split] = gallery
    return set(gallery)


def _parse_captions(path: Path, split: str, dataset: ParsedDataset, known: set[str] | None) -> list[QueryRecord]:
    """Validate and map every triplet of a ``cap.rc2`` file."""
    data = expect_list(load_json(path), path)
    test = is_test_split(split)
    queries: list[QueryRecord] = []
    seen: dict[int, int] = {}
    referenced: list[str] = []
    for index, raw in enumerate(data):
        rec = Record(path, index, raw)
        pairid = rec.req_int("pairid")
        if pairid in seen:
            rec.fail("pairid", f"duplicate pairid {pairid} (first at record {seen[pairid]})")
        seen[pairid] = index
        reference = rec.req_str("reference")
        caption = rec.req_str("caption")
        img_set = _check_img_set(rec)
        hard = rec.opt_str("target_hard") if test else rec.req_str("target_hard")
        soft = _check_soft(rec)

        targets: list[TargetRecord] = []
        where = f"{path.name} record {index}"
        if hard is not None:
            relevance = float(soft[hard]) if soft is not None and hard in soft else 1.0
            targets.append(TargetRecord(hard, relevance, True, "hard", "target_hard"))
        for image_id, score in (soft or {}).items():
            if image_id != hard:
                add_target(targets, TargetRecord(image_id, float(score), False, "soft", "target_soft"), dataset, where)

        images = [reference, *(t.image for t in targets), *(img_set["members"] if img_set else [])]
        referenced.extend(images)
        for image_id in images:
            register(dataset, image_id)

        extra: dict[str, Any] = {}
        if img_set is not None:
            extra["img_set"] = img_set
        if known is not None:
            extra["gallery"] = split
        queries.append(QueryRecord(
            external_id=str(pairid),
            split=split,
            ordinal=index,
            source_file=path.name,
            turns=[TurnRecord(1, reference, [TextRecord(caption, "caption")])],
            targets=targets,
            raw=raw,
            extra=extra,
        ))

    flagged = [q.external_id for q in queries
               if any(t.image == q.turns[0].reference and t.relevance > 0 for t in q.targets)]
    if flagged:
        dataset.warnings.append(
            f"{path.name}: {len(flagged)} quer(y/ies) list the reference image as a positive target "
            f"(misaligned soft labels?), e.g. pairid {flagged[0]}"
        )
    if known is None:
        dataset.warnings.append(
            f"{path.name}: no split.rc2.{split}.json given; image paths are unknown and no gallery was built"
        )
    else:
        missing = sorted(set(referenced) - known)
        if missing:
            dataset.warnings.append(
                f"{path.name}: {len(missing)} referenced image(s) are not in the split file "
                f"(path left empty), e.g. {missing[0]!r}"
            )
    return queries


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


def _attach_ext(path: Path, queries: list[QueryRecord], dataset: ParsedDataset) -> None:
    """Add the ``caption_extend`` texts of a ``cap.ext`` file to the matching queries."""
    data = expect_list(load_json(path), path)
    by_pairid: dict[int, tuple[int, dict[str, str], dict[str, Any]]] = {}
    for index, raw in enumerate(data):
        rec = Record(path, index, raw)
        pairid = rec.req_int("pairid")
        if pairid in by_pairid:
            rec.fail("pairid", f"duplicate pairid {pairid} (first at record {by_pairid[pairid][0]})")
        rec.opt_str("reference")
        rec.opt_str("target_hard")
        ext = rec.req_obj("caption_extend")
        for key, text in ext.items():
            if not isinstance(text, str):
                rec.fail("caption_extend", f"text of key {key!r} must be a string")
        by_pairid[pairid] = (index, ext, raw)

    used = 0
    for query in queries:
        found = by_pairid.get(int(query.external_id))
        if found is None:
            continue
        used += 1
        index, ext, raw = found
        if isinstance(raw.get("reference"), str) and raw["reference"] != query.turns[0].reference:
            dataset.warnings.append(
                f"{path.name} record {index}: reference differs from the caption file for pairid {query.external_id}"
            )
        query.turns[0].texts.extend(TextRecord(text, "caption_ext", key=key) for key, text in ext.items())
        query.extra["caption_extend"] = raw
    if used < len(by_pairid):
        dataset.warnings.append(f"{path.name}: {len(by_pairid) - used} entries match no pairid of the caption file")
