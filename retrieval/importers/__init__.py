"""Pure parsers for the public CIR annotation formats.

Each module exposes ``parse(paths, split=None) -> ParsedDataset``; files are recognised by
name, the split comes from the names unless ``split`` is given, and malformed input raises
:class:`retrieval.records.ParseError` naming the file, record and field. Nothing here
imports Django.
"""
from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

from retrieval.importers import circled, circo, cirr, fashioniq, lasco, mbeir, mtfiq
from retrieval.importers._common import PathLike
from retrieval.records import ParsedDataset, ParseError

FORMATS: dict[str, ModuleType] = {
    "cirr": cirr,
    "fashioniq": fashioniq,
    "circo": circo,
    "lasco": lasco,
    "mbeir": mbeir,
    "circled": circled,
    "mtfiq": mtfiq,
}

__all__ = ["FORMATS", "ParseError", "parse"]


def parse(format: str, paths: Iterable[PathLike], split: str | None = None) -> ParsedDataset:
    """Parse ``paths`` with the parser registered for ``format`` (a key of :data:`FORMATS`)."""
    module = FORMATS.get(format) if isinstance(format, str) else None
    if module is None:
        raise ValueError(f"unknown annotation format {format!r}; known: {', '.join(sorted(FORMATS))}")
    return module.parse(paths, split=split)
