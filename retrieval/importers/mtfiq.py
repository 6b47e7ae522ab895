"""Multi-turn FashionIQ (Yuan & Lam, SIGIR 2021) annotation parser.

Files (optional ``.sample`` before ``.json``):

* ``<category>.<split>.json`` – sessions ``{"target": [url, asin], "reference":
  [[url, [cap1, cap2], asin], ...]}`` (category may be ``all``);
* ``split.<category>.<split>.json`` – optional gallery (list of ASINs);
* ``asin2attr.*.json`` (e.g. ``asin2attr.dress.val.new.json``) – optional attributes
  ``{asin: [[words], ... 6 groups]}``, matched on ASIN whatever the split.

Mapping: ``external_id = f"{category}/{split}/{ordinal:05d}"``; turn i = ``reference[i]``
(its URL kept in ``ImageRecord.url``) with its two captions (``annotator`` 0 and 1, verbatim);
``turn_target`` of turn i = the next image of the chain (``reference[i+1]``, or ``target``
for the last turn); ``target`` is the single primary final target (role ``gt``). Image
id = ASIN, path ``f"{asin}.jpg"``; attributes go to ``ImageRecord.extra['attributes']`` of the
images that sessions or galleries use. An attribute file describes many more ASINs than the
sessions use (an ``asin2attr`` file covers the whole category); those create no image rows
unless asked (``ParsedDataset.attribute_images``, ``import_dataset --attribute-images``): a
warning counts them.
Galleries are keyed ``f"{category}/{split}"`` (also in ``QueryRecord.extra['gallery']``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from retrieval.importers._common import (
    SAMPLE,
    TOKEN,
    PathLike,
    Record,
    collect,
    image_id_path,
    iter_list,
    iter_object,
    list_of_objects_with,
    list_of_strings,
    object_of,
    register,
    resolve_turn_references,
)
from retrieval.importers.fashioniq import CATEGORIES, group_files, parse_asin_list
from retrieval.records import ParsedDataset, ParseError, QueryRecord, TargetRecord, TextRecord, TurnRecord

FORMAT = "mtfiq"
IMAGE_TEMPLATE = "{id}.jpg"
#: The split of a sessions file whose name carries none (the release's own ``data/dress.json``).
UNSPLIT = "all"

_PATTERNS = [
    ("attributes", re.compile(r"^asin2attr(?:\..+)?\.json$")),
    ("split", re.compile(rf"^split\.(?P<category>{TOKEN})\.(?P<split>{TOKEN}){SAMPLE}\.json$")),
    ("sessions", re.compile(rf"^(?P<category>{TOKEN})\.(?P<split>{TOKEN}){SAMPLE}\.json$")),
    ("sessions", re.compile(rf"^(?P<category>{TOKEN}){SAMPLE}\.json$")),
]
_CONTENT = [
    ("sessions", list_of_objects_with("target", "reference")),
    ("split", list_of_strings),
    ("attributes", object_of(lambda value: isinstance(value, list))),
]
_EXPECTED = (
    "<category>.<split>.json or <category>.json (a list of {target, reference} sessions), "
    "split.<category>.<split>.json (a list of ASINs) or asin2attr.*.json (ASIN -> attribute lists)"
)


def parse(paths: Iterable[PathLike], split: str | None = None, subset: str | None = None) -> ParsedDataset:
    """Parse Multi-turn FashionIQ session, gallery and attribute files (``subset`` = category)."""
    return collect(stream, FORMAT, paths, split=split, subset=subset)


def stream(
    paths: Iterable[PathLike], dataset: ParsedDataset, split: str | None = None, subset: str | None = None
) -> Iterator[QueryRecord]:
    """Yield Multi-turn FashionIQ sessions one by one, registering images and galleries on ``dataset``.

    Attribute files are read first, so every image is complete before its sessions are yielded.
    """
    groups, attribute_files = group_files(
        paths, _PATTERNS, _CONTENT, _EXPECTED, split, subset, (*CATEGORIES, "all"), default_split=UNSPLIT
    )
    attributes: dict[str, list] = {}
    for path in attribute_files:
        _parse_attributes(path, dataset, attributes)
    for (category, split_name), roles in groups.items():
        gallery_key = f"{category}/{split_name}"
        if "split" in roles:
            parse_asin_list(roles["split"], dataset, gallery_key)
            for asin in dataset.galleries.get(gallery_key, []):
                if asin in attributes:
                    register(dataset, asin, extra={"attributes": attributes[asin]})
        if "sessions" in roles:
            if split_name == UNSPLIT and split is None:
                dataset.warnings.append(
                    f"{roles['sessions'].name}: no split in the file name; stored as split "
                    f"{UNSPLIT!r} (pass --split to name it)"
                )
            yield from _parse_sessions(
                roles["sessions"], category, split_name, dataset, gallery_key if "split" in roles else None, attributes
            )
    unused = sum(1 for asin in attributes if asin not in dataset.images)
    if unused:
        dataset.warnings.append(
            f"{unused} ASIN(s) of the attribute files are in no session or gallery: not stored "
            "as images (pass --attribute-images to store them)"
        )


def _check_image_entry(rec: Record, field_name: str, value: Any, size: int) -> list[Any]:
    """``value`` must be a list of ``size`` items whose first (url) and last (asin) are strings."""
    if not isinstance(value, list) or len(value) != size:
        rec.fail(field_name, f"expected a list of {size} items")
    if not isinstance(value[0], str):
        rec.fail(f"{field_name}[0]", "expected the image URL (string)")
    if not isinstance(value[-1], str):
        rec.fail(f"{field_name}[{size - 1}]", "expected the ASIN (string)")
    return value


def _image(
    dataset: ParsedDataset, rec: Record, asin: str, url: str, field_name: str, attributes: dict[str, list]
) -> str:
    path = image_id_path(asin, IMAGE_TEMPLATE, rec.file, rec.index, field_name)
    extra = {"attributes": attributes[asin]} if asin in attributes else None
    return register(dataset, asin, path=path, url=url or None, extra=extra)


def _parse_sessions(
    path: Path, category: str, split: str, dataset: ParsedDataset, gallery_key: str | None, attributes: dict[str, list]
) -> Iterator[QueryRecord]:
    for index, raw in iter_list(path):
        rec = Record(path, index, raw, "session")
        target = _check_image_entry(rec, "target", rec.req("target"), 2)
        chain = rec.req("reference")
        if not isinstance(chain, list) or not chain:
            rec.fail("reference", "expected a non-empty list of [url, [captions], asin] entries")
        steps: list[tuple[str, list[str], str]] = []
        for i, entry in enumerate(chain):
            name = f"reference[{i}]"
            _check_image_entry(rec, name, entry, 3)
            captions = entry[1]
            if not isinstance(captions, list) or not all(isinstance(c, str) for c in captions):
                rec.fail(f"{name}[1]", "expected a list of caption strings")
            steps.append((_image(dataset, rec, entry[2], entry[0], f"{name}[2]", attributes), captions, name))
        final = _image(dataset, rec, target[1], target[0], "target[1]", attributes)

        turns: list[TurnRecord] = []
        for i, (asin, captions, _name) in enumerate(steps):
            nxt = steps[i + 1][0] if i + 1 < len(steps) else final
            texts = [TextRecord(text, "caption", annotator=a) for a, text in enumerate(captions)]
            turns.append(TurnRecord(i + 1, asin, texts, turn_target=nxt))
        record = QueryRecord(
            external_id=f"{category}/{split}/{index:05d}",
            split=split,
            ordinal=index,
            source_file=path.name,
            turns=turns,
            targets=[TargetRecord(final, 1.0, True, "gt", "target")],
            raw=raw,
            category=category,
            extra={"gallery": gallery_key} if gallery_key else {},
        )
        resolve_turn_references(record)  # turn references ("the second turn") read from the captions
        yield record


def _parse_attributes(path: Path, dataset: ParsedDataset, attributes: dict[str, list]) -> None:
    """Read an attribute file into ``attributes`` (the first file naming an ASIN wins); images
    for every ASIN only when ``dataset.attribute_images`` asks for them."""
    for index, asin, groups in iter_object(path):
        if not isinstance(groups, list) or not all(
            isinstance(g, list) and all(isinstance(w, str) for w in g) for g in groups
        ):
            raise ParseError(str(path), index, asin, "expected a list of attribute groups (lists of strings)")
        image_path = image_id_path(asin, IMAGE_TEMPLATE, str(path), index, asin)
        attributes.setdefault(asin, groups)
        if dataset.attribute_images:
            register(dataset, asin, path=image_path, extra={"attributes": groups})
