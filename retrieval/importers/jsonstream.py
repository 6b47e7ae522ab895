"""Streaming JSON readers for the annotation parsers (ijson; memory does not grow with the file).

* :func:`iter_list` yields ``(index, record)`` for the items of a top-level JSON array;
* :func:`iter_object` yields ``(index, key, value)`` for the members of a top-level object;
* :func:`iter_jsonl` yields ``(index, record)`` for the lines of a JSON Lines file;
* :func:`sniff` tells the top-level shape and the first record, so a parser can take a
  file's role from its content.

Errors are :class:`retrieval.records.ParseError` naming the file, the record and, where it
can be known, the field. Only standard JSON is accepted: ``NaN``, ``Infinity`` and
``-Infinity`` (which Python's own reader lets through) and numbers that overflow a double are
refused, naming the record and the field that holds them. A file cut short names the record
it ends in (the one after the last complete record), not a byte column. Nothing here imports
Django.
"""
from __future__ import annotations

import contextvars
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import ijson

from retrieval.records import ParseError

BOM = b"\xef\xbb\xbf"
NON_STANDARD = re.compile(r"(?<![\w\"])(-?Infinity|NaN)(?![\w\"])")
NON_STANDARD_MESSAGE = "non-standard JSON number {token} (only finite numbers are valid JSON; write null or a number)"


@dataclass
class Meter:
    """Bytes read so far across the files of one import (for progress reports)."""

    done: int = 0


#: The meter of the import running in this context, if any (set by the streaming driver).
METER: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("import_meter", default=None)


class _Counting:
    """A binary file wrapper that adds what is read to the current :data:`METER`."""

    def __init__(self, raw: IO[bytes]):
        self.raw = raw
        self.meter = METER.get()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        if self.meter is not None:
            self.meter.done += len(data)
        return data


def _open(path: Path) -> IO[bytes]:
    """Open ``path`` for reading past a UTF-8 BOM; an unreadable file is a ParseError."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the callers' ``with``
    except OSError as exc:
        raise ParseError(str(path), None, None, f"cannot read file: {exc.strerror or exc}") from exc
    if handle.read(3) != BOM:
        handle.seek(0)
    return handle


@dataclass
class FileStart:
    """What the start of a file tells before it is parsed: a UTF-8 byte order mark, and
    whether it holds nothing (an empty JSON list or object, or no non-blank line)."""

    bom: bool
    empty: bool


def file_start(path: Path, line_based: bool) -> FileStart:
    """Look at the start of ``path`` (a JSON document, or JSON Lines / text when ``line_based``)."""
    try:
        with open(path, "rb") as handle:
            bom = handle.read(3) == BOM
            if not bom:
                handle.seek(0)
            if line_based:
                return FileStart(bom, not any(line.strip() for line in handle))
            head = handle.read(4096).lstrip()
    except OSError as exc:
        raise ParseError(str(path), None, None, f"cannot read file: {exc.strerror or exc}") from exc
    opening = head[:1]
    closing = {b"[": b"]", b"{": b"}"}.get(opening)
    return FileStart(bom, closing is not None and head[1:].lstrip()[:1] == closing)


def top_level(path: Path) -> str:
    """``"list"``, ``"object"`` or ``"other"``: the JSON type the file starts with."""
    with _open(path) as handle:
        head = handle.read(4096).lstrip()
    return {b"[": "list", b"{": "object"}.get(head[:1], "other")


def _expect(path: Path, kind: str) -> None:
    found = top_level(path)
    if found != kind:
        shown = {"list": "a list", "object": "an object", "other": "something that is not a JSON list or object"}
        raise ParseError(str(path), None, None, f"expected a JSON {kind} at the top level, got {shown[found]}")


def iter_list(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, item)`` for the items of the top-level array of ``path``, streaming."""
    _expect(path, "list")
    index = 0
    with _open(path) as handle:
        try:
            for index, item in enumerate(ijson.items(_Counting(handle), "item", use_float=True)):
                yield index, item
        except ijson.JSONError as exc:
            raise diagnose(path, exc) from None


def iter_object(path: Path) -> Iterator[tuple[int, str, Any]]:
    """Yield ``(index, key, value)`` for the members of the top-level object of ``path``."""
    _expect(path, "object")
    with _open(path) as handle:
        try:
            for index, (key, value) in enumerate(ijson.kvitems(_Counting(handle), "", use_float=True)):
                yield index, key, value
        except ijson.JSONError as exc:
            raise diagnose(path, exc) from None


def sniff(path: Path) -> tuple[str, Any]:
    """``(shape, first)``: the top-level type and its first item (``(key, value)`` for an object).

    ``first`` is None for an empty or unreadable document; only the start of the file is read.
    """
    shape = top_level(path)
    try:
        if shape == "list":
            return shape, next((item for _, item in iter_list(path)), None)
        if shape == "object":
            return shape, next(((key, value) for _, key, value in iter_object(path)), None)
    except ParseError:
        return shape, None
    return shape, None


class _LineError(ValueError):
    def __init__(self, token: str):
        super().__init__(token)
        self.token = token


def _refuse_constant(token: str) -> Any:
    raise _LineError(token)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _LineError(text)
    return value


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, record)`` for each non-blank line of a JSON Lines file, streaming.

    ``index`` is the 0-based line number, so it doubles as the record number of errors and as
    the record's ordinal (blank lines are skipped but keep their number).
    """
    with _open(path) as handle:
        for index, raw in enumerate(handle):
            _count(len(raw))
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ParseError(str(path), index, None, f"not UTF-8 text: {exc}", record_label=f"line {index + 1}") from None
            if not line.strip():
                continue
            try:
                yield index, json.loads(line, parse_constant=_refuse_constant, parse_float=_finite_float)
            except _LineError as exc:
                field_name = _field_of(line.encode("utf-8"))
                raise ParseError(str(path), index, field_name, NON_STANDARD_MESSAGE.format(token=exc.token),
                                 record_label=f"line {index + 1}") from None
            except json.JSONDecodeError as exc:
                raise ParseError(str(path), index, None, f"invalid JSON at column {exc.colno}: {exc.msg}",
                                 record_label=f"line {index + 1}") from None


def _count(n: int) -> None:
    meter = METER.get()
    if meter is not None:
        meter.done += n


def _field_of(document: bytes) -> str | None:
    """The dotted path of the last key read before ``document`` stops parsing (None if none)."""
    keys: list[str | None] = []
    last: str | None = None
    try:
        for _prefix, event, value in ijson.parse(document, use_float=True):
            last = _track(keys, event, value) or last
    except ijson.JSONError:
        return _dotted(keys) or last
    return None


def _track(keys: list[str | None], event: str, value: Any) -> str | None:
    """Keep ``keys`` as the stack of object keys above the current value; returns a new key."""
    if event == "start_map":
        keys.append(None)
    elif event == "end_map":
        keys.pop()
    elif event == "map_key":
        keys[-1] = value
        return value
    return None


def _dotted(keys: list[str | None]) -> str | None:
    named = [k for k in keys if k is not None]
    return ".".join(named) if named else None


def diagnose(path: Path, exc: Exception) -> ParseError:
    """Re-read ``path`` up to the error of ``exc`` and say in which record and field it is."""
    record, keys = _locate(path)
    text = str(exc).strip()
    reason = text.splitlines()[0] if text else "invalid JSON"
    token = NON_STANDARD.search(text)
    # inside an array the first stacked key is the array's placeholder; an object's is the member key
    field_name = _dotted(keys if top_level(path) == "object" else keys[1:])
    if token is not None:
        return ParseError(str(path), record, field_name, NON_STANDARD_MESSAGE.format(token=token.group(1)))
    if "overflow" in reason:
        return ParseError(str(path), record, field_name, "number too large for a double (not a finite number)")
    if record is None:
        return ParseError(str(path), None, None, f"invalid JSON before the first record: {reason}")
    last = f"record {record} is the last complete one" if record else "no record is complete"  # 1-based
    if "premature EOF" in reason:
        return ParseError(str(path), record, None, f"invalid JSON: the file ends inside this record ({last}); truncated?")
    return ParseError(str(path), record, None, f"invalid JSON ({last}): {reason}")


def _locate(path: Path) -> tuple[int | None, list[str | None]]:
    """``(record, keys)`` where parsing ``path`` stops: the top-level item index and the key stack.

    ``record`` is the item being read when parsing stopped; between two items it is the next one.
    """
    position = _Position()
    keys: list[str | None] = []
    with _open(path) as handle:
        try:
            for _prefix, event, value in ijson.parse(handle, use_float=True):
                position.step(event)
                _track_container(keys, event, value)
        except ijson.JSONError:
            pass
    return position.current(), keys


class _Position:
    """Follows the parse events of a document: container depth and top-level item number."""

    VALUE_STARTS = ("start_map", "start_array", "string", "number", "boolean", "null", "integer", "double")

    def __init__(self) -> None:
        self.depth = 0
        self.in_object = False
        self.record: int | None = None
        self.complete = False

    def step(self, event: str) -> None:
        starts_item = event == "map_key" if self.in_object else event in self.VALUE_STARTS
        if self.depth == 1 and starts_item:
            self.record = 0 if self.record is None else self.record + 1
            self.complete = False
        if event in ("start_map", "start_array"):
            self.in_object = self.in_object or (self.depth == 0 and event == "start_map")
            self.depth += 1
        elif event in ("end_map", "end_array"):
            self.depth -= 1
        self.complete = self.depth == 1 and self.record is not None and event != "map_key"

    def current(self) -> int | None:
        """The item parsing stopped in (the one after the last complete item when between two)."""
        if self.complete and self.record is not None:
            return self.record + 1
        return self.record


def _track_container(keys: list[str | None], event: str, value: Any) -> None:
    """Like :func:`_track` but also stacks arrays (so the top-level container is ``keys[0]``)."""
    if event in ("start_map", "start_array"):
        keys.append(None)
    elif event in ("end_map", "end_array"):
        keys.pop()
    elif event == "map_key":
        keys[-1] = value
