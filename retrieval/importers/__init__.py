"""Pure parsers for the public CIR annotation formats.

Each module exposes ``stream(paths, dataset, split=None, subset=None)``, which yields the
queries one by one while it registers images, galleries and warnings on ``dataset`` (files
are read with a streaming JSON reader, so memory does not grow with the file), and
``parse(paths, split=None, subset=None) -> ParsedDataset``, which collects the stream. A
file's role comes from its content where the content tells (its name otherwise); split and
category/subset from the content or the name unless ``split`` / ``subset`` override them.
Malformed input raises :class:`retrieval.records.ParseError` naming the file, record and
field; a refused file that looks like another format's says which
(:mod:`retrieval.importers.sniffing`). Nothing here imports Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import ModuleType

from retrieval.importers import circled, circo, cirr, fashioniq, lasco, mbeir, mtfiq
from retrieval.importers._common import PathLike, as_paths
from retrieval.importers.sniffing import with_format_hint
from retrieval.records import ParsedDataset, ParseError, QueryRecord

FORMATS: dict[str, ModuleType] = {
    "cirr": cirr,
    "fashioniq": fashioniq,
    "circo": circo,
    "lasco": lasco,
    "mbeir": mbeir,
    "circled": circled,
    "mtfiq": mtfiq,
}

__all__ = ["FORMATS", "ParseError", "parse", "stream"]


def _module(format: str) -> ModuleType:
    module = FORMATS.get(format) if isinstance(format, str) else None
    if module is None:
        raise ValueError(f"unknown annotation format {format!r}; known: {', '.join(sorted(FORMATS))}")
    return module


def parse(format: str, paths: Iterable[PathLike], split: str | None = None, subset: str | None = None) -> ParsedDataset:
    """Parse ``paths`` with the parser registered for ``format`` (a key of :data:`FORMATS`)."""
    module, paths = _module(format), as_paths(paths)
    try:
        return module.parse(paths, split=split, subset=subset)
    except ParseError as exc:
        raise with_format_hint(exc, format, paths) from exc.__cause__


def stream(
    format: str, paths: Iterable[PathLike], dataset: ParsedDataset, split: str | None = None, subset: str | None = None
) -> Iterator[QueryRecord]:
    """Yield the queries of ``paths`` one by one, registering images and galleries on ``dataset``."""
    module, paths = _module(format), as_paths(paths)
    return _hinted(module.stream(paths, dataset, split=split, subset=subset), format, paths)


def _hinted(queries: Iterator[QueryRecord], format: str, paths: list) -> Iterator[QueryRecord]:
    """``queries``, a refusal saying which other format its file looks like (:mod:`.sniffing`)."""
    try:
        yield from queries
    except ParseError as exc:
        raise with_format_hint(exc, format, paths) from exc.__cause__
