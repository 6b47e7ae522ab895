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
from collections.abc import Iterable
from pathlib import Path

from retrieval.importers._common import (
    SAMPLE,
    TOKEN,
    PathLike,
    Record,
    as_paths,
    expect_list,
    image_id_path,
    is_test_split,
    load_json,
    match_name,
    register,
)
from retrieval.records import ParsedDataset, ParseError, QueryRecord, TargetRecord, TextRecord, TurnRecord

FORMAT = "fashioniq"
IMAGE_TEMPLATE = "{id}.jpg"

_PATTERNS = [
    ("cap", re.compile(rf"^cap\.(?P<category>{TOKEN})\.(?P<split>{TOKEN}){SAMPLE}\.json$")),
    ("split", re.compile(rf"^split\.(?P<category>{TOKEN})\.(?P<split>{TOKEN}){SAMPLE}\.json$")),
]


def parse(paths: Iterable[PathLike], split: str | None = None) -> ParsedDataset:
    """Parse FashionIQ caption and image-split files into a ParsedDataset."""
    groups: dict[tuple[str, str], dict[str, Path]] = {}
    for path in as_paths(paths):
        role, m = match_name(path, _PATTERNS, FORMAT)
        add_to_group(groups, (m.group("category"), split or m.group("split")), role, path)

    dataset = ParsedDataset(format=FORMAT)
    for (category, split_name), roles in groups.items():
        gallery_key = f"{category}/{split_name}"
        if "split" in roles:
            dataset.galleries[gallery_key] = parse_asin_list(roles["split"], dataset)
        if "cap" in roles:
            _parse_captions(roles["cap"], category, split_name, dataset,
                            gallery_key if "split" in roles else None)
    return dataset


def add_to_group(groups: dict[tuple[str, str], dict[str, Path]], key: tuple[str, str], role: str,
                 path: Path) -> None:
    """File ``path`` as the ``role`` file of (category, split) ``key``; a second one is an error."""
    roles = groups.setdefault(key, {})
    if role in roles:
        raise ParseError(str(path), None, None, f"a second {role} file for {key[0]}/{key[1]} (first: {roles[role]})")
    roles[role] = path


def parse_asin_list(path: Path, dataset: ParsedDataset) -> list[str]:
    """Read a list of ASINs (an image split file), registering each image; returns the list."""
    data = expect_list(load_json(path), path)
    gallery: list[str] = []
    for index, asin in enumerate(data):
        if not isinstance(asin, str):
            raise ParseError(str(path), index, None, "expected an ASIN string")
        register(dataset, asin, path=image_id_path(asin, IMAGE_TEMPLATE, str(path), index, None))
        gallery.append(asin)
    return gallery


def _parse_captions(path: Path, category: str, split: str, dataset: ParsedDataset, gallery_key: str | None) -> None:
    """Validate and map every triplet of a ``cap.<category>.<split>`` file."""
    data = expect_list(load_json(path), path)
    test = is_test_split(split)
    for index, raw in enumerate(data):
        rec = Record(path, index, raw)
        candidate = rec.req_str("candidate")
        target = rec.opt_str("target") if test else rec.req_str("target")
        captions = rec.req_str_list("captions", non_empty=True)
        if len(captions) != 2:
            dataset.warnings.append(f"{path.name} record {index}: {len(captions)} captions instead of 2")

        register(dataset, candidate, path=image_id_path(candidate, IMAGE_TEMPLATE, str(path), index, "candidate"))
        targets: list[TargetRecord] = []
        if target is not None:
            register(dataset, target, path=image_id_path(target, IMAGE_TEMPLATE, str(path), index, "target"))
            targets.append(TargetRecord(target, 1.0, True, "gt", "target"))
        texts = [TextRecord(text, "caption", annotator=i) for i, text in enumerate(captions)]
        dataset.queries.append(QueryRecord(
            external_id=f"{category}/{split}/{index:05d}",
            split=split,
            ordinal=index,
            source_file=path.name,
            turns=[TurnRecord(1, candidate, texts)],
            targets=targets,
            raw=raw,
            category=category,
            extra={"gallery": gallery_key} if gallery_key else {},
        ))
