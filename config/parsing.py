"""One request-parsing layer: hostile input is refused with 400 and the field named.

Every JSON body of the API goes through :class:`SafeJSONParser`; query-string ids go through
:func:`query_int`. What they refuse, before any view or database sees it:

* nesting deeper than :data:`config.limits.MAX_DEPTH` (a ``RecursionError`` otherwise);
* ``NaN``, ``Infinity`` and numbers such as ``1e999`` that overflow to infinity;
* integers outside a signed 64-bit range (:data:`config.limits.INT_MIN` ..
  :data:`config.limits.INT_MAX`: no database column holds them), even of 5,000 digits (never
  converted);
* NUL characters and lone UTF-16 surrogates in any string or key (PostgreSQL refuses NUL in
  text and JSON; a lone surrogate cannot be encoded as UTF-8);
* other control characters (:data:`CONTROL`: all but tab, line feed and carriage return);
* bodies that are not UTF-8.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from config.limits import MAX_DEPTH, fits_int64, json_path, unstorable_name

_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}:,]', re.S)  # strings first: a bracket inside one is text
_ASCII_DIGITS = re.compile(r"[0-9]{1,18}")


class HostileInput(ValueError):
    """A value no field may hold; ``field`` is its dotted path in the document."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


class _Overflow(float):
    """A float literal that overflowed; the walk reports it with its field's name."""

    def __new__(cls, text: str):
        obj = super().__new__(cls, "inf")
        obj.text = text
        return obj


def _parse_int(text: str) -> int | _Overflow:
    """Integers past 64 bits are never converted (Python refuses over 4,300 digits with a
    ValueError): the walk reports them as out of range, naming the field."""
    if len(text.lstrip("-")) > 19:
        return _Overflow(text)
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    return _Overflow(text) if math.isinf(value) else value


def _refuse_constant(name: str):
    raise HostileInput("", f"{name} is not a number JSON allows")


def too_deep(text: str, limit: int = MAX_DEPTH) -> list[str | int] | None:
    """The path (keys and list positions) of the first value of a JSON text nested deeper than
    ``limit`` (``[]``: the body itself), ``None`` when none is. Reads strings, brackets, colons and
    commas with one regular expression: no recursion, memory bounded by ``limit``."""
    frames: list[list[Any]] = []  # [is_object, key or list position] per open container
    last = '""'
    for m in _TOKENS.finditer(text):
        token = m.group()
        if token in "[{":
            if len(frames) == limit:
                return [at for _, at in frames if at is not None]
            frames.append([token == "{", None if token == "{" else 0])
        elif token in "]}":
            frames = frames[:-1]
        elif token == "," and frames and not frames[-1][0]:
            frames[-1][1] += 1
        elif token == ":" and frames and frames[-1][0]:
            frames[-1][1] = _key(last)
        elif token[0] == '"':
            last = token
    return None


def _key(token: str) -> str:
    try:
        return json.loads(token)
    except ValueError:
        return token.strip('"')


#: Control characters (Unicode category Cc) no request text may hold, NUL aside: all but tab,
#: line feed and carriage return (a textarea's line ends). Imported files are not held to it.
CONTROL = re.compile("[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def check_text(value: str, field: str) -> None:
    """Refuse a request's text (a query parameter, a form field, a JSON string or key) that
    holds a character no field may hold: :class:`HostileInput` names the field. The one check
    the middleware runs on form bodies (URL-encoded and multipart) and the JSON parser on JSON."""
    what = unstorable_name(value)
    if what:
        raise HostileInput(field, f"contains {what}, which no field may hold")
    control = CONTROL.search(value)
    if control:
        raise HostileInput(
            field, f"contains the control character U+{ord(control.group()):04X}, which no field may hold"
        )


def check_value(value: Any, field: str = "") -> None:
    """Walk a parsed document and refuse the first hostile value, naming its field."""
    stack = [(value, field)]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            check_text(v, path)
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if not fits_int64(v):
                raise HostileInput(path, "integer out of range")
        elif isinstance(v, _Overflow):
            raise HostileInput(path, f"number {v.text[:40]} out of range")
        elif isinstance(v, dict):
            for k, item in v.items():
                check_text(k, f"{path}.{k[:40]!r}" if path else repr(k[:40]))
                stack.append((item, f"{path}.{k}" if path else k))
        elif isinstance(v, list):
            stack.extend((item, f"{path}[{n}]") for n, item in enumerate(v))


def loads(raw: bytes | str) -> Any:
    """Parse JSON and refuse hostile input (:class:`HostileInput` names the field)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise HostileInput("", f"the body is not UTF-8 (byte {exc.start})") from None
    deep = too_deep(text)
    if deep is not None:
        raise HostileInput(json_path(deep), f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        data = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise HostileInput("", f"not valid JSON: {exc}") from None
    check_value(data)
    return data


class SafeJSONParser(JSONParser):
    """DRF's JSON parser with :func:`loads`: 400 ``{"field", "detail"}`` on hostile input."""

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1) if stream is not None else b""
        if limit and len(raw) > limit:
            raise ParseError({"field": "", "detail": f"the body is larger than {limit} bytes"})
        try:
            return loads(raw)
        except HostileInput as exc:
            raise ParseError({"field": exc.field, "detail": str(exc)}) from None


def query_int(request, name: str) -> int | None:
    """An optional integer query parameter (ASCII digits only); ``ValueError`` names it."""
    raw = request.GET.get(name)
    if raw in (None, ""):
        return None
    if not _ASCII_DIGITS.fullmatch(raw):
        raise HostileInput(name, f"?{name}= must be a whole number")
    return int(raw)
