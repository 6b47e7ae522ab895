"""Which public format a file looks like, from its first record (pure; no Django).

The one place that tells formats apart by content: when an importer refuses a file
(:func:`with_format_hint`, called by :func:`retrieval.importers.stream` and
:func:`retrieval.importers.parse` for every format), the refusal says which other format the
file looks like ("looks like a FashionIQ caption file (cap.<category>.<split>.json): import it
with --format fashioniq"), so a file given under the wrong ``--format`` is named as such rather
than refused for a field it was never meant to have.

Only the start of a file is read: the first item of a JSON list or object
(:func:`retrieval.importers.jsonstream.sniff`) or the first line of a JSON Lines file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from retrieval.importers._common import list_of_objects_with, list_of_strings, object_of
from retrieval.importers.jsonstream import sniff
from retrieval.records import ParseError

#: How messages name the formats (the keys of :data:`retrieval.importers.FORMATS`).
FORMAT_NAMES = {
    "cirr": "CIRR",
    "fashioniq": "FashionIQ",
    "circo": "CIRCO",
    "lasco": "LaSCo",
    "mbeir": "M-BEIR",
    "circled": "CIRCLED",
    "mtfiq": "Multi-turn FashionIQ",
}
#: The first line of a JSON Lines file read to tell its format (a longer one is not told).
MAX_LINE = 1 << 20


def _jsonl_with(*keys: str) -> Callable[[str, Any], bool]:
    return lambda shape, first: shape == "jsonl" and isinstance(first, dict) and all(k in first for k in keys)


#: ``(formats, what the file is, test(shape, first))``, most specific first. A file whose
#: layout two formats share (FashionIQ's and Multi-turn FashionIQ's ASIN lists) names both.
SIGNATURES: list[tuple[tuple[str, ...], str, Callable[[str, Any], bool]]] = [
    (
        ("cirr",),
        "a CIRR extended-caption file (cap.ext.rc2.<split>.json)",
        list_of_objects_with("pairid", "caption_extend"),
    ),
    (("cirr",), "a CIRR caption file (cap.rc2.<split>.json)", list_of_objects_with("pairid", "reference", "caption")),
    (("cirr",), "a CIRR split file (split.rc2.<split>.json)", object_of(lambda value: isinstance(value, str))),
    (
        ("fashioniq",),
        "a FashionIQ caption file (cap.<category>.<split>.json)",
        list_of_objects_with("candidate", "target", "captions"),
    ),
    (("fashioniq", "mtfiq"), "a FashionIQ image split file (split.<category>.<split>.json)", list_of_strings),
    (("mtfiq",), "a Multi-turn FashionIQ session file", list_of_objects_with("reference", "target")),
    (("mtfiq",), "a Multi-turn FashionIQ attribute file", object_of(lambda value: isinstance(value, list))),
    (("circo",), "a CIRCO annotation file", list_of_objects_with("reference_img_id", "relative_caption")),
    (("lasco",), "a LaSCo triplet file (lasco_<split>.json)", list_of_objects_with("qid", "query-image")),
    (("lasco",), "a LaSCo corpus file (lasco_<split>_corpus.json)", list_of_objects_with("id", "path")),
    (("circled",), "a CIRCLED session file (<subset>.json)", list_of_objects_with("session_id", "turns")),
    (("mbeir",), "an M-BEIR query file (mbeir_<task>_<split>.jsonl)", _jsonl_with("qid", "pos_cand_list")),
    (("mbeir",), "an M-BEIR candidate pool (*cand_pool*.jsonl)", _jsonl_with("did", "modality")),
]


def first_record(path: Path) -> tuple[str, Any]:
    """``(shape, first)``: ``list`` / ``object`` and the first item for a JSON document,
    ``jsonl`` and the first line's value for JSON Lines, ``("other", None)`` when neither can
    be read (a damaged or hostile start is not this module's to report: the reader does)."""
    try:
        with open(path, "rb") as handle:
            start = handle.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip()
        if start[:1] in (b"[", b"{") and not path.name.lower().endswith((".jsonl", ".ndjson")):
            return sniff(path)
        with open(path, encoding="utf-8-sig") as handle:
            line = next((text for text in iter(lambda: handle.readline(MAX_LINE), "") if text.strip()), "")
        return "jsonl", json.loads(line)
    except (OSError, ValueError, ParseError, RecursionError):
        return "other", None


def looks_like(path: Path) -> tuple[tuple[str, ...], str] | None:
    """``(formats, what the file is)`` of the first signature the file's start fits, else None."""
    shape, first = first_record(path)
    if first is None:
        return None
    return next(((formats, what) for formats, what, test in SIGNATURES if test(shape, first)), None)


def format_hint(path: Path, fmt: str) -> str:
    """A sentence saying which other format ``path`` looks like, '' when it looks like ``fmt``'s
    own file or like none."""
    found = looks_like(path)
    if found is None or fmt in found[0]:
        return ""
    options = " or ".join(f"--format {f}" for f in found[0])
    names = " or ".join(FORMAT_NAMES.get(f, f) for f in found[0])
    return f"this file looks like {found[1]}, not {FORMAT_NAMES.get(fmt, fmt)}: import it as {names} ({options})"


def with_format_hint(exc: ParseError, fmt: str, paths: Iterable[Path]) -> ParseError:
    """``exc`` with :func:`format_hint` of the file it names added, when that is one of ``paths``
    and looks like another format; ``exc`` itself otherwise."""
    named = next((Path(p) for p in paths if str(p) == exc.file), None)
    hint = format_hint(named, fmt) if named is not None and named.is_file() else ""
    if not hint:
        return exc
    return ParseError(exc.file, exc.record, exc.field, f"{exc.message}; {hint}", record_label=exc.record_label)
