"""Streaming JSON readers for the annotation parsers (ijson; memory does not grow with the file).

* :func:`iter_list` yields ``(index, record)`` for the items of a top-level JSON array;
* :func:`iter_object` yields ``(index, key, value)`` for the members of a top-level object;
* :func:`iter_jsonl` yields ``(index, record)`` for the lines of a JSON Lines file;
* :func:`sniff` tells the top-level shape and the first record, so a parser can take a
  file's role from its content;
* :func:`check_bounds` refuses, before any reader builds a value, a file nested deeper than
  :data:`config.limits.MAX_DEPTH`, an integer outside 64 bits (even one longer than Python
  converts, 4,300 digits), and a string that holds a NUL or a lone surrogate (no database
  column stores them): the limits of :mod:`config.limits`, which API bodies obey too;
* :func:`top_members` reads a top-level object's header members and streams its large lists
  item by item (a rank file's millions of ``gallery_paths``).

Why a separate bounded pass: ijson's ``items``/``parse`` keep a prefix string per level, so
their memory grows with the square of the nesting depth (629 MB for 32 KB nested 16k deep);
``basic_parse`` (yajl's C events, no prefixes) keeps memory flat and stops at the first level
too deep, so a 200 KB file nested 100k deep is refused in milliseconds. Every reader here
calls it first.

Errors are :class:`retrieval.records.ParseError` naming the file, the record and the field:
its JSON path in the record (:class:`_Where`: ``caption``, ``img_set.members[2]``; a path
deeper than 8 levels ends in ``…``), for a refusal of the bounded pass as for invalid JSON;
no field only where the error falls between two fields. Only standard JSON is accepted:
``NaN``, ``Infinity`` and ``-Infinity`` (which Python's own reader lets through) and numbers
that overflow a double are refused. A file cut short names the record it ends in (the one
after the last complete record), not a byte column. Nothing here uses Django (importing
:mod:`config.limits` loads the ``config`` package, whose ``__init__`` creates the Celery app).
"""

from __future__ import annotations

import contextvars
import io
import json
import math
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import ijson

from config.limits import INT_MAX, INT_MIN, MAX_DEPTH, UNSTORABLE, json_path, unstorable_name
from retrieval.records import ParseError

BOM = b"\xef\xbb\xbf"
_EMPTY = {"start_map": dict, "start_array": list}  # the container events, with the empty value of each
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


def check_bounds(path: Path | str, max_depth: int = MAX_DEPTH, *, first_only: bool = False) -> None:
    """Refuse ``path`` (a :class:`ParseError` naming the record) if it is nested deeper than
    ``max_depth``, holds an integer outside 64 bits, or a string with a NUL or a lone
    surrogate. Streams with flat memory; invalid JSON is left to the reader's own message.
    ``first_only``: stop after the first top-level item (what :func:`sniff` reads)."""
    with _open(Path(path)) as handle:
        guarded = _Guarded(handle)
        scan_events(
            str(path), ijson.basic_parse(guarded, use_float=True), max_depth, guard=guarded, first_only=first_only
        )


def check_document_bounds(source: str, document: bytes, max_depth: int = MAX_DEPTH, record: int | None = None) -> None:
    """:func:`check_bounds` for one in-memory document (a JSON Lines line: ``record`` is its number)."""
    guarded = _Guarded(io.BytesIO(document))
    scan_events(source, ijson.basic_parse(guarded, use_float=True), max_depth, record, guard=guarded)


# A \uD800-\uDBFF escape not followed by a \uDC00-\uDFFF one, or the reverse: yajl turns it into "?"
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


class _Guarded:
    """A reader that looks for escaped lone surrogates in the raw bytes (across chunk ends) and
    ends the stream just before the first one (``found`` says so), so the parser has read up to
    the string that holds it and the refusal names its field. The last :attr:`LOOK` bytes read
    are held back until the bytes after them are read (an escape is judged with the next one)."""

    LOOK = 12  # an escape (6 bytes) and the one after it; also the lookbehind kept of what was given

    def __init__(self, raw: Any):
        self.raw, self.before, self.held, self.found = raw, b"", b"", False

    def read(self, size: int = -1) -> bytes:
        if self.found or size == 0:
            return b""
        while True:
            data = self.raw.read(size)
            window = self.before + self.held + data
            start = len(self.before)
            end = max(start, len(window) - self.LOOK if data else len(window))
            for m in _LONE_SURROGATE.finditer(window):
                if start <= m.start() < end:
                    self.found = True
                    return window[start : m.start()]
            if end > start or not data:
                self.held, self.before = window[end:], window[:end][-self.LOOK :]
                return window[start:end]
            self.held = window[start:]  # too little to judge yet: read on (an empty read would end the stream)


def scan_events(
    source: str,
    events: Iterator[tuple[str, Any]],
    max_depth: int,
    record: int | None = None,
    guard: _Guarded | None = None,
    first_only: bool = False,
    on_event: Callable[[str, Any], None] | None = None,
) -> bool:
    """Check ``events`` (see :func:`check_bounds`), passing each to ``on_event`` once checked.
    False when the JSON is invalid before the end (the reader that follows says where).
    A refusal names the record and the field (:class:`_Where`)."""
    position = _Position()
    where = _Where(records_below=record is None)

    def refuse(message: str, pending: bool = False) -> ParseError:
        return ParseError(source, position.record if record is None else record, where.field(pending), message)

    try:
        for event, value in events:
            position.step(event)
            where.step(event, value)
            if position.depth > max_depth:
                raise refuse(f"JSON nested deeper than {max_depth} levels; refused before reading it")
            if event in ("string", "map_key") and UNSTORABLE.search(value):
                raise refuse(_unstorable_message(event, value))
            if on_event is not None:
                on_event(event, value)
            if first_only and position.complete:
                break
    except ijson.JSONError as exc:
        if guard is None or not guard.found:
            if "integer overflow" in str(exc):
                raise refuse(
                    f"an integer outside the 64-bit range ({INT_MIN} to {INT_MAX}); refused", pending=True
                ) from None
            return False  # invalid JSON: the reader that follows says where, in its own words
    except UnicodeDecodeError:
        raise refuse("a string is not valid UTF-8 (a lone surrogate?): no field may hold it", pending=True) from None
    if guard is not None and guard.found:
        raise refuse(
            "a string holds a lone surrogate (an unpaired \\uD800-\\uDFFF escape), which no field may hold",
            pending=True,
        )
    return True


def _unstorable_message(event: str, value: str) -> str:
    return f"{'its name' if event == 'map_key' else 'a string'} holds {unstorable_name(value)}, which no field may hold"


class _Where:
    """The JSON path of the value being read, below its record (``caption``, ``img_set.members[3]``,
    written by :func:`config.limits.json_path`). One frame per open container, so its memory
    is bounded by the depth check.

    ``records_below``: the document is a file of records (the top-level list's positions or the
    top-level object's members are the records), not one record (a JSON Lines line)."""

    def __init__(self, records_below: bool) -> None:
        self.frames: list[list[Any]] = []  # [is_object, key or list position]
        self.records_below = records_below
        self.after_key = False

    def step(self, event: str, value: Any) -> None:
        self.after_key = event == "map_key"
        if event == "map_key":
            self.frames[-1][1] = value
        elif event in ("end_map", "end_array"):
            self.frames.pop()
        else:
            if self.frames and not self.frames[-1][0]:
                self.frames[-1][1] += 1
            if event in _EMPTY:
                self.frames.append([event == "start_map", None if event == "start_map" else -1])

    def field(self, pending: bool = False) -> str | None:
        """The path of the last value read or, ``pending``, of the one the parser was reading
        when it stopped (a list's next position; an object's key when its name was read,
        else the object itself)."""
        frames = self.frames
        if self.records_below and frames and not frames[0][0]:
            frames = frames[1:]  # the top-level list: its positions are the records
        parts: list[str | int] = []
        for n, (is_object, at) in enumerate(frames):
            last = n == len(frames) - 1
            if is_object and at is not None and not (last and pending and not self.after_key):
                parts.append(at)
            elif not is_object and at + (last and pending) >= 0:
                parts.append(at + (last and pending))
        return json_path(parts) or None


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
    check_bounds(path)
    yield from _list_items(path)


def _list_items(path: Path) -> Iterator[tuple[int, Any]]:
    with _open(path) as handle:
        try:
            yield from enumerate(ijson.items(_Counting(handle), "item", use_float=True))
        except ijson.JSONError as exc:
            raise diagnose(path, exc) from None


def iter_object(path: Path) -> Iterator[tuple[int, str, Any]]:
    """Yield ``(index, key, value)`` for the members of the top-level object of ``path``."""
    _expect(path, "object")
    check_bounds(path)
    yield from _object_items(path)


def _object_items(path: Path) -> Iterator[tuple[int, str, Any]]:
    with _open(path) as handle:
        try:
            for index, (key, value) in enumerate(ijson.kvitems(_Counting(handle), "", use_float=True)):
                yield index, key, value
        except ijson.JSONError as exc:
            raise diagnose(path, exc) from None


def sniff(path: Path) -> tuple[str, Any]:
    """``(shape, first)``: the top-level type and its first item (``(key, value)`` for an object).

    ``first`` is None for an empty or unreadable document; only the start of the file is read.
    The first item is built from checked events (:func:`scan_events`), never by ijson's
    ``items``, whose read-ahead would build what follows it: a hostile first item is a
    ParseError, and a hostile second one is left to the full check of the reader.
    """
    shape = top_level(path)
    if shape not in ("list", "object"):
        return shape, None
    first = _FirstItem()
    with _open(path) as handle:
        guarded = _Guarded(handle)
        complete = scan_events(
            str(path),
            ijson.basic_parse(guarded, use_float=True),
            MAX_DEPTH,
            guard=guarded,
            first_only=True,
            on_event=first.event,
        )
    if not complete or not first.fed:
        return shape, None
    return shape, (first.key, first.builder.value) if shape == "object" else first.builder.value


class _FirstItem:
    """Builds the first item of a top-level list (or the first member of an object) from events."""

    def __init__(self) -> None:
        self.depth, self.key, self.fed = 0, None, False
        self.builder = ijson.ObjectBuilder()

    def event(self, event: str, value: Any) -> None:
        if self.depth == 1 and event == "map_key":
            self.key = value
        elif self.depth >= 2 or (self.depth == 1 and event not in ("end_map", "end_array")):
            self.builder.event(event, value)
            self.fed = True
        self.depth += 1 if event in ("start_map", "start_array") else -1 if event in ("end_map", "end_array") else 0


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
                raise ParseError(
                    str(path),
                    index,
                    _field_at(raw[: exc.start]),
                    f"not UTF-8 text: {exc}",
                    record_label=f"line {index + 1}",
                ) from None
            if not line.strip():
                continue
            check_document_bounds(str(path), raw, record=index)
            try:
                yield index, json.loads(line, parse_constant=_refuse_constant, parse_float=_finite_float)
            except _LineError as exc:
                raise ParseError(
                    str(path),
                    index,
                    _field_at(raw),
                    NON_STANDARD_MESSAGE.format(token=exc.token),
                    record_label=f"line {index + 1}",
                ) from None
            except json.JSONDecodeError as exc:
                raise ParseError(
                    str(path),
                    index,
                    _field_at(line[: exc.pos].encode("utf-8")),
                    f"invalid JSON at column {exc.colno}: {exc.msg}",
                    record_label=f"line {index + 1}",
                ) from None


def _count(n: int) -> None:
    meter = METER.get()
    if meter is not None:
        meter.done += n


def _field_at(document: bytes) -> str | None:
    """The path (:class:`_Where`) of the value ``document`` (one record) stops parsing in:
    the field an error at its end is in; None where it stops between two fields, or parses."""
    where = _Where(records_below=False)
    try:
        for event, value in ijson.basic_parse(document, use_float=True):
            where.step(event, value)
    except ijson.JSONError:
        return where.field(pending=True)
    return None


def _bad_number(text: str) -> str | None:
    """The message for a parse error caused by a number JSON does not allow (NaN, Infinity, one
    too large for a double), from the parser's error ``text``; ``None`` for any other error."""
    token = NON_STANDARD.search(text)
    if token is not None:
        return NON_STANDARD_MESSAGE.format(token=token.group(1))
    if "overflow" in (text.splitlines()[0] if text else ""):
        return "number too large for a double (not a finite number)"
    return None


def diagnose(path: Path, exc: Exception) -> ParseError:
    """Re-read ``path`` up to the error of ``exc`` and say in which record and field it is."""
    record, field_name = _locate(path)
    text = str(exc).strip()
    reason = text.splitlines()[0] if text else "invalid JSON"
    number = _bad_number(text)
    if number is not None:
        return ParseError(str(path), record, field_name, number)
    if record is None:
        return ParseError(str(path), None, None, f"invalid JSON before the first record: {reason}")
    last = f"record {record} is the last complete one" if record else "no record is complete"  # 1-based
    if "premature EOF" in reason:
        return ParseError(
            str(path), record, field_name, f"invalid JSON: the file ends inside this record ({last}); truncated?"
        )
    return ParseError(str(path), record, field_name, f"invalid JSON ({last}): {reason}")


def _locate(path: Path) -> tuple[int | None, str | None]:
    """``(record, field)`` where parsing ``path`` stops: the top-level item index and the path
    (:class:`_Where`) of the value being read, None between two fields. Flat memory.

    ``record`` is the item being read when parsing stopped; between two items it is the next one.
    """
    position = _Position()
    where = _Where(records_below=True)
    with _open(path) as handle:
        try:
            for event, value in ijson.basic_parse(handle, use_float=True):
                position.step(event)
                where.step(event, value)
        except ijson.JSONError:
            pass
    return position.current(), where.field(pending=True)


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


def top_members(
    path: Path | str, build: Collection[str], stream: Mapping[str, Callable[[Any], None]] | None = None
) -> dict[str, Any]:
    """The members of the top-level object of ``path``, in one streaming pass: those named in
    ``build`` with their values, every other one as an empty value of its type (``[]``, ``{}``)
    or its scalar, so a reader can check a header and then stream a large member with
    :func:`iter_member`. A list member named in ``stream`` is not kept: each of its items is
    built in turn and passed to its callback (memory holds one item, never the list). Call
    :func:`check_bounds` first."""
    path = Path(path)
    _expect(path, "object")
    reader = _MemberReader(build, stream or {})
    with _open(path) as handle:
        try:
            for _prefix, event, value in ijson.parse(_Counting(handle), use_float=True):
                reader.event(event, value)
        except ijson.JSONError as exc:
            raise ParseError(str(path), None, None, f"not valid JSON: {str(exc).splitlines()[0]}") from None
    return reader.out


class _MemberReader:
    """The events of a top-level object -> :attr:`out` (see :func:`top_members`)."""

    def __init__(self, build: Collection[str], stream: Mapping[str, Callable[[Any], None]]):
        self.build, self.stream = build, stream
        self.out: dict[str, Any] = {}
        self.builder: ijson.ObjectBuilder | None = None
        self.key: str | None = None
        self.depth = 0
        self.base = 1  # the depth at which a built value is complete: 1 for a member, 2 for a streamed item
        self.streaming = False  # inside a list member named in ``stream``

    def event(self, event: str, value: Any) -> None:
        if self.depth == 1:
            self._member(event, value)
        elif self.depth == 2 and self.streaming and self.builder is None and event not in ("end_map", "end_array"):
            self._item(event, value)
        elif self.builder is not None:
            self.builder.event(event, value)
        self.depth += 1 if event in _EMPTY else -1 if event in ("end_map", "end_array") else 0
        if self.builder is not None and self.depth == self.base:
            self._done(self.builder.value)

    def _member(self, event: str, value: Any) -> None:
        if event == "map_key":
            self.key = value
        elif event not in ("end_map", "end_array"):
            self.out[self.key] = _EMPTY[event]() if event in _EMPTY else value
            self.streaming = self.key in self.stream and event == "start_array"
            if self.key in self.build:
                self.builder, self.base = ijson.ObjectBuilder(), 1
                self.builder.event(event, value)

    def _item(self, event: str, value: Any) -> None:
        if event in _EMPTY:
            self.builder, self.base = ijson.ObjectBuilder(), 2
            self.builder.event(event, value)
        else:
            self.stream[self.key](value)

    def _done(self, value: Any) -> None:
        if self.base == 1:
            self.out[self.key] = value
        else:
            self.stream[self.key](value)
        self.builder = None


def diagnose_member(path: Path | str, member: str, exc: Exception, label: str = "item") -> ParseError:
    """Re-read ``path`` up to the error of ``exc`` and say in which item of the top-level
    object's list ``member`` it is (``<label> N``, 0-based as the list's index) and in which
    field of it (nested keys dotted, list positions left out)."""
    item = f"{member}.item"
    index: int | None = None
    field_name: str | None = None
    with _open(Path(path)) as handle:
        try:
            for prefix, event, value in ijson.parse(handle, use_float=True):
                if prefix == item and event in _Position.VALUE_STARTS:
                    index, field_name = (0 if index is None else index + 1), None
                elif event == "map_key" and index is not None and (prefix == item or prefix.startswith(item + ".")):
                    inner = ".".join(p for p in prefix[len(item) :].split(".") if p and p != "item")
                    field_name = f"{inner}.{value}" if inner else value
        except ijson.JSONError as again:  # this pass's own error says more than the caller's first line
            exc = again
    text = str(exc).strip()
    reason = _bad_number(text) or f"not valid JSON: {text.splitlines()[0] if text else 'invalid JSON'}"
    if index is None:
        return ParseError(str(path), None, None, reason)
    if "premature EOF" in text:
        reason = f"not valid JSON: the file ends inside this {label}; truncated?"
    return ParseError(str(path), index, field_name, reason, record_label=f"{label} {index}")


def iter_member(path: Path | str, member: str) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, item)`` for the items of the list ``member`` of the top-level object."""
    path = Path(path)
    with _open(path) as handle:
        try:
            yield from enumerate(ijson.items(_Counting(handle), f"{member}.item", use_float=True))
        except ijson.JSONError as exc:
            raise ParseError(str(path), None, member, f"not valid JSON: {str(exc).splitlines()[0]}") from None
