"""CIRCLED (released multi-turn sessions) annotation parser.

Files: ``{subset}.json`` (optional ``.sample`` before ``.json``) with subset
``cirr_<split>``, ``circo_<split>`` or ``fashioniq_<category>_<split>``; each a list of
``{session_id, subset, ground_truth_ids, num_turns, turns: [{turn, reference_image_id,
relative_caption}]}``.

Mapping: ``external_id = session_id``; ``category = subset``; turns in file order (their
``turn`` numbers must run 1..n), turn 1 provenance ``human`` (the source caption, role
``caption``), later turns provenance ``llm`` (role ``generated``); turn k's
``turn_target`` = the reference of turn k+1 (a turn's optional ``provenance``, e.g. ``human`` in
CIRVal's export of sessions written by people, replaces the default) (the last turn has none: its goal is the
final target); targets = ``ground_truth_ids`` in order (role ``gt``), the first primary. A turn may carry
``reference_turns`` (CIRVal's extension: the earlier turns whose images form its effective
reference, FashionMT's rollback/combination turns); without it they are read from the
caption (:func:`retrieval.sessions.session_turn_references`).

Image ids and paths follow the subset's source dataset, relative to that dataset's
images root, so they coincide with what the CIRR / FashionIQ / CIRCO parsers produce:

* CIRR names: ``dev-*`` -> ``dev/<id>.png``, ``test1-*`` -> ``test1/<id>.png``; ``train-*``
  images live in numbered sub-folders only CIRR's split file knows, so their path is left
  empty (warning);
* FashionIQ ASINs -> ``<asin>.jpg``;
* CIRCO 12-digit COCO ids (also the ``"%012d.jpg"`` fallback spelling) -> id ``str(int)``
  (as the CIRCO parser) and path ``%012d.jpg``; the spelling in the file is kept in
  ``ImageRecord.extra['source_id']`` when it differs;
* any other source (``<source>_<split>``, e.g. the sessions of CIRVal's demo world exported
  by a session study): the ids as they are, with no path (one warning per file).
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
    add_target,
    as_paths,
    collect,
    file_role,
    image_id_path,
    iter_list,
    list_of_objects_with,
    register,
    resolve_turn_references,
    sniff,
    turn_reference_list,
)
from retrieval.records import ParsedDataset, ParseError, QueryRecord, TargetRecord, TextRecord, TurnRecord, record_name

FORMAT = "circled"

_SUBSET = re.compile(
    r"^(?P<subset>(?P<source>cirr|circo|fashioniq_(?P<category>[A-Za-z0-9]+)|[A-Za-z0-9]+)_(?P<split>[A-Za-z0-9]+))$"
)
_PATTERNS = [("sessions", re.compile(rf"^(?P<subset>[A-Za-z0-9_]+?){SAMPLE}\.json$"))]
_CONTENT = [("sessions", list_of_objects_with("session_id", "turns"))]
_SUBSETS = "cirr_<split>, circo_<split>, fashioniq_<category>_<split> or <source>_<split>"
_EXPECTED = f"a list of CIRCLED sessions, in a file named <subset>.json with subset {_SUBSETS}"


def parse(paths: Iterable[PathLike], split: str | None = None, subset: str | None = None) -> ParsedDataset:
    """Parse CIRCLED subset files into a ParsedDataset."""
    return collect(stream, FORMAT, paths, split=split, subset=subset)


def _file_subset(path: Path, name: str | None, override: str | None, dataset: ParsedDataset) -> re.Match[str]:
    """The subset of one file: ``--subset``, else its first record's ``subset``, else its name."""
    _, first = sniff(path)
    in_records = first.get("subset") if isinstance(first, dict) and isinstance(first.get("subset"), str) else None
    named = name if name and _SUBSET.match(name) else None
    chosen = override or in_records or named
    if chosen is None:
        raise ParseError(
            str(path),
            None,
            None,
            "cannot tell the subset: the records carry none and the file name "
            f"is not <subset>.json; pass --subset ({_SUBSETS})",
        )
    m = _SUBSET.match(chosen)
    if m is None:
        where = "--subset" if override else "the records"
        raise ParseError(
            str(path),
            None if override else 0,
            None if override else "subset",
            f"unknown subset {chosen!r} from {where}; expected {_SUBSETS}",
        )
    if in_records and named and named != in_records and not override:
        dataset.warnings.append(
            f"{path.name}: the records say subset {in_records!r}, the file name {named!r}; used the records'"
        )
    return m


def stream(
    paths: Iterable[PathLike], dataset: ParsedDataset, split: str | None = None, subset: str | None = None
) -> Iterator[QueryRecord]:
    """Yield CIRCLED sessions one by one; each file's subset comes from its records (or ``subset``)."""
    files: list[tuple[Path, re.Match[str]]] = []
    first: dict[str, Path] = {}
    for path in as_paths(paths):
        _, named = file_role(path, _PATTERNS, _CONTENT, _EXPECTED)
        m = _file_subset(path, named.get("subset"), subset, dataset)
        if m.group("subset") in first:
            raise ParseError(
                str(path),
                None,
                None,
                f"a second file for subset {m.group('subset')!r} (first: {first[m.group('subset')]})",
            )
        first[m.group("subset")] = path
        files.append((path, m))
    seen: dict[tuple[str, str], str] = {}  # (split, session_id) -> where first seen, across files
    for path, m in files:
        source = "fashioniq" if m.group("category") else m.group("source")
        yield from _parse_file(
            path, m.group("subset"), source, split or m.group("split"), dataset, subset is not None, seen
        )


class _Images:
    """Maps the source ids of one subset to image records (see the module doc)."""

    def __init__(self, source: str, dataset: ParsedDataset):
        self.source = source
        self.dataset = dataset
        self.no_path: set[str] = set()

    def add(self, rec: Record, value: str, field_name: str) -> str:
        file = rec.file
        if self.source == "circo":
            digits = value[:-4] if value.endswith(".jpg") else value
            if not re.fullmatch(r"[0-9]+", digits):
                rec.fail(field_name, f"CIRCO image id {value!r} is not a COCO number")
            coco_id = int(digits)
            extra = {"source_id": value} if value != str(coco_id) else {}
            return register(self.dataset, str(coco_id), path=f"{coco_id:012d}.jpg", extra=extra)
        if self.source not in ("cirr", "fashioniq"):
            self.no_path.add(value)  # no path is built from the id
            return register(self.dataset, value)
        if self.source == "fashioniq":
            return register(self.dataset, value, path=image_id_path(value, "{id}.jpg", file, rec.index, field_name))
        # CIRR
        folder = value.split("-", 1)[0]
        if folder in ("dev", "test1"):
            path = image_id_path(value, folder + "/{id}.png", file, rec.index, field_name)
            return register(self.dataset, value, path=path)
        image_id_path(value, "{id}.png", file, rec.index, field_name)  # still refuse path-like ids
        self.no_path.add(value)
        return register(self.dataset, value)


def _parse_file(
    path: Path,
    subset: str,
    source: str,
    split: str,
    dataset: ParsedDataset,
    overridden: bool,
    seen: dict[tuple[str, str], str],
) -> Iterator[QueryRecord]:
    images = _Images(source, dataset)
    for index, raw in iter_list(path):
        rec = Record(path, index, raw, "session")
        session_id = rec.req_str("session_id")
        if (split, session_id) in seen:
            rec.fail(
                "session_id",
                f"duplicate session_id {session_id!r} in split {split!r} (first at {seen[(split, session_id)]})",
            )
        seen[(split, session_id)] = f"{path.name} {record_name(path, index)}"
        found = rec.opt_str("subset")
        if found is not None and found != subset and not overridden:
            rec.fail("subset", f"subset {found!r} differs from the file's subset {subset!r}")
        gt_ids = rec.req_str_list("ground_truth_ids", non_empty=True)
        turns = _turns(rec, images)
        targets: list[TargetRecord] = []
        for gt in gt_ids:
            image = images.add(rec, gt, "ground_truth_ids")
            add_target(
                targets,
                TargetRecord(image, 1.0, not targets, "gt", "ground_truth_ids"),
                dataset,
                f"{path.name} {record_name(path, index)}",
            )
        record = QueryRecord(
            external_id=session_id,
            split=split,
            ordinal=index,
            source_file=path.name,
            turns=turns,
            targets=targets,
            raw=raw,
            category=subset,
            extra={"source": source, "num_turns": len(turns)},
        )
        resolve_turn_references(record)
        yield record
    if images.no_path and source == "cirr":
        dataset.warnings.append(
            f"{path.name}: {len(images.no_path)} CIRR image(s) outside dev/test1 (e.g. {sorted(images.no_path)[0]!r}); "
            "their path needs CIRR's split file and was left empty"
        )
    elif images.no_path:
        dataset.warnings.append(
            f"{path.name}: subset {subset!r} is not from CIRR, FashionIQ or CIRCO; its "
            f"{len(images.no_path)} image id(s) were kept as they are, with no path"
        )


def _turns(rec: Record, images: _Images) -> list[TurnRecord]:
    """The validated turns of a session; turn k's ``turn_target`` is the reference of turn k+1."""
    num_turns = rec.req_int("num_turns")
    turns_raw: Any = rec.req("turns")
    if not isinstance(turns_raw, list) or not turns_raw:
        rec.fail("turns", "expected a non-empty list of turns")
    if num_turns != len(turns_raw):
        rec.fail("num_turns", f"num_turns is {num_turns} but {len(turns_raw)} turns are listed")
    turns: list[TurnRecord] = []
    for k, turn in enumerate(turns_raw):
        name = f"turns[{k}]"
        item = Record(rec.file, rec.index, turn, "turn", prefix=name)
        number = item.req_int("turn")
        reference = item.req_str("reference_image_id")
        caption = item.req_str("relative_caption")
        if number != k + 1:
            rec.fail(f"{name}.turn", f"turn number {number} at position {k + 1} (turns must run 1..n)")
        # A turn's own provenance where the record gives one (CIRVal's export of sessions
        # written by people says "human" on every turn); CIRCLED's turn 1 is the source caption.
        provenance = item.opt_str("provenance") or ("human" if k == 0 else "llm")
        human = provenance == "human"
        turns.append(
            TurnRecord(
                index=k + 1,
                reference=images.add(rec, reference, f"{name}.reference_image_id"),
                texts=[TextRecord(caption, "caption" if human else "generated")],
                provenance=provenance,
                reference_turns=turn_reference_list(rec, turn, name),
            )
        )
    for current, following in zip(turns, turns[1:]):
        current.turn_target = following.reference
    return turns
