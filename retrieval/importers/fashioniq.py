"""FashionIQ annotation parser.

Files, recognised by name (optional ``.sample`` before ``.json``):

* ``cap.<category>.<split>.json`` – list of ``{"target", "candidate", "captions": [c0, c1]}``
  (test files have no ``target``);
* ``split.<category>.<split>.json`` – list of ASINs: the gallery of that category and split.

Mapping: ``external_id = f"{category}/{split}/{ordinal:05d}"``; turn 1 = ``candidate``
(the reference image) with each caption as its own TextRecord (``annotator`` = its index;
empty strings and leading spaces kept verbatim); ``target`` is the single primary target
(role ``gt``). Image id = ASIN, path ``f"{asin}.jpg"`` relative to the FashionIQ images root.
Galleries are keyed ``f"{category}/{split}"`` (each category has its own search space); the
key is repeated in ``QueryRecord.extra['gallery']``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from retrieval.importers._common import (
    SAMPLE,
    TOKEN,
    PathLike,
    Record,
    as_paths,
    collect,
    file_role,
    fill_gallery,
    image_id_path,
    is_test_split,
    iter_list,
    list_of_objects_with,
    list_of_strings,
    name_token,
    need,
    register,
)
from retrieval.records import ParsedDataset, ParseError, QueryRecord, TargetRecord, TextRecord, TurnRecord, record_name

FORMAT = "fashioniq"
IMAGE_TEMPLATE = "{id}.jpg"
CATEGORIES = ("dress", "shirt", "toptee")
SPLITS = ("train", "val", "test")

_PATTERNS = [
    ("cap", re.compile(rf"^cap\.(?P<category>{TOKEN})\.(?P<split>{TOKEN}){SAMPLE}\.json$")),
    ("split", re.compile(rf"^split\.(?P<category>{TOKEN})\.(?P<split>{TOKEN}){SAMPLE}\.json$")),
]
_CONTENT = [
    ("cap", list_of_objects_with("candidate", "captions")),
    ("split", list_of_strings),
]
_EXPECTED = (
    "cap.<category>.<split>.json (a list of {candidate, target, captions}) or "
    "split.<category>.<split>.json (a list of ASINs)"
)


def parse(paths: Iterable[PathLike], split: str | None = None, subset: str | None = None) -> ParsedDataset:
    """Parse FashionIQ caption and image-split files into a ParsedDataset (``subset`` = category)."""
    return collect(stream, FORMAT, paths, split=split, subset=subset)


def group_files(
    paths: Iterable[PathLike],
    patterns,
    content,
    expected: str,
    split: str | None,
    subset: str | None,
    categories: Iterable[str],
    default_split: str | None = None,
) -> tuple[dict[tuple[str, str], dict[str, Path]], list[Path]]:
    """Files by (category, split) and role, from content and names; plus the ``attributes`` files.

    The category comes from ``subset``, else the name; the split from ``split``, else the name,
    else ``default_split``.
    """
    groups: dict[tuple[str, str], dict[str, Path]] = {}
    attributes: list[Path] = []
    for path in as_paths(paths):
        role, named = file_role(path, patterns, content, expected)
        if role == "attributes":
            attributes.append(path)
            continue
        category = need(
            subset or named.get("category") or name_token(path, categories), path, "category", "--subset", expected
        )
        split_name = need(
            split or named.get("split") or name_token(path, SPLITS) or default_split, path, "split", "--split", expected
        )
        add_to_group(groups, (category, split_name), role, path)
    return groups, attributes


def stream(
    paths: Iterable[PathLike], dataset: ParsedDataset, split: str | None = None, subset: str | None = None
) -> Iterator[QueryRecord]:
    """Yield FashionIQ queries one by one, registering images and galleries on ``dataset``."""
    groups, _ = group_files(paths, _PATTERNS, _CONTENT, _EXPECTED, split, subset, CATEGORIES)
    for (category, split_name), roles in groups.items():
        gallery_key = f"{category}/{split_name}"
        if "split" in roles:
            parse_asin_list(roles["split"], dataset, gallery_key)
        if "cap" in roles:
            yield from _parse_captions(
                roles["cap"], category, split_name, dataset, gallery_key if "split" in roles else None
            )


def add_to_group(groups: dict[tuple[str, str], dict[str, Path]], key: tuple[str, str], role: str, path: Path) -> None:
    """File ``path`` as the ``role`` file of (category, split) ``key``; a second one is an error."""
    roles = groups.setdefault(key, {})
    if role in roles:
        raise ParseError(str(path), None, None, f"a second {role} file for {key[0]}/{key[1]} (first: {roles[role]})")
    roles[role] = path


def parse_asin_list(path: Path, dataset: ParsedDataset, gallery_key: str) -> None:
    """Read a list of ASINs (an image split file) into the gallery ``gallery_key``, registering each image.

    An ASIN listed twice is stored once, with a warning.
    """

    def members() -> Iterator[str]:
        for index, asin in iter_list(path):
            if not isinstance(asin, str):
                raise ParseError(str(path), index, None, "expected an ASIN string")
            yield register(dataset, asin, path=image_id_path(asin, IMAGE_TEMPLATE, str(path), index, None))

    fill_gallery(dataset, gallery_key, path.name, members())


def _parse_captions(
    path: Path, category: str, split: str, dataset: ParsedDataset, gallery_key: str | None
) -> Iterator[QueryRecord]:
    """Validate and map every triplet of a ``cap.<category>.<split>`` file, streaming."""
    test = is_test_split(split)
    for index, raw in iter_list(path):
        rec = Record(path, index, raw)
        candidate = rec.req_str("candidate")
        target = rec.opt_str("target") if test else rec.req_str("target")
        captions = rec.req_str_list("captions", non_empty=True)
        if len(captions) != 2:
            dataset.warnings.append(f"{path.name} {record_name(path, index)}: {len(captions)} captions instead of 2")

        register(dataset, candidate, path=image_id_path(candidate, IMAGE_TEMPLATE, str(path), index, "candidate"))
        targets: list[TargetRecord] = []
        if target is not None:
            register(dataset, target, path=image_id_path(target, IMAGE_TEMPLATE, str(path), index, "target"))
            targets.append(TargetRecord(target, 1.0, True, "gt", "target"))
        texts = [TextRecord(text, "caption", annotator=i) for i, text in enumerate(captions)]
        yield QueryRecord(
            external_id=f"{category}/{split}/{index:05d}",
            split=split,
            ordinal=index,
            source_file=path.name,
            turns=[TurnRecord(1, candidate, texts)],
            targets=targets,
            raw=raw,
            category=category,
            extra={"gallery": gallery_key} if gallery_key else {},
        )
