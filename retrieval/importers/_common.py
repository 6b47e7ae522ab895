"""Shared helpers for the annotation parsers: file loading, name matching, field checks.

Every failure is reported as :class:`retrieval.records.ParseError` naming the file (the
path as given), the 0-based record number and the field, so an import page can point at
the exact spot. Nothing here imports Django.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from retrieval.records import ImageRecord, ParsedDataset, ParseError, TargetRecord, safe_relpath

PathLike = str | Path

#: Optional ``.sample`` marker accepted before the extension of every known file name
#: (the excerpts under shared/reference keep the official names plus ``.sample``).
SAMPLE = r"(?:\.sample)?"

#: A split or category token inside a file name.
TOKEN = r"[A-Za-z0-9_-]+"

def as_paths(paths: Iterable[PathLike] | PathLike) -> list[Path]:
    """Normalise the ``paths`` argument of a parser to a non-empty list of :class:`Path`."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    result = [Path(p) for p in paths]
    if not result:
        raise ValueError("no annotation files given")
    return result


def read_text(path: Path) -> str:
    """Read a UTF-8 file (a BOM is tolerated); I/O and decoding errors become ParseError."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ParseError(str(path), None, None, f"not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise ParseError(str(path), None, None, f"cannot read file: {exc.strerror or exc}") from exc


def load_json(path: Path) -> Any:
    """Load a whole JSON document; bad JSON reports its line and column."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(
            str(path), None, None, f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from exc


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, record)`` for each non-blank line of a JSON Lines file.

    ``index`` is the 0-based line number, so it doubles as the record number of errors
    and as the record's ordinal (blank lines are skipped but keep their number).
    """
    text = read_text(path)
    for index, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            yield index, json.loads(line)
        except json.JSONDecodeError as exc:
            raise ParseError(
                str(path), index, None, f"invalid JSON at line {index + 1}, column {exc.colno}: {exc.msg}"
            ) from exc


def expect_list(data: Any, path: Path) -> list[Any]:
    """The top level of ``path`` must be a JSON array."""
    if not isinstance(data, list):
        raise ParseError(str(path), None, None, f"expected a JSON list at the top level, got {json_type(data)}")
    return data


def expect_object(data: Any, path: Path) -> dict[str, Any]:
    """The top level of ``path`` must be a JSON object."""
    if not isinstance(data, dict):
        raise ParseError(str(path), None, None, f"expected a JSON object at the top level, got {json_type(data)}")
    return data


def json_type(value: Any) -> str:
    """JSON name of a loaded value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def is_int(value: Any) -> bool:
    """True for JSON integers (booleans excluded)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """True for JSON numbers (booleans excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Record:
    """One source record being validated: knows its file and index for error reports.

    ``req_*`` accessors demand the key; ``opt_*`` accessors return ``None`` when it is
    absent. Types are checked strictly (a boolean is not an integer, a float is not an int).
    """

    def __init__(self, path: Path | str, index: int | None, data: Any, what: str = "record"):
        self.file = str(path)
        self.index = index
        self.data = data
        if not isinstance(data, dict):
            self.fail(None, f"expected a JSON object for this {what}, got {json_type(data)}")

    def fail(self, field_name: str | None, message: str) -> NoReturn:
        """Raise a ParseError for this record."""
        raise ParseError(self.file, self.index, field_name, message)

    def has(self, key: str) -> bool:
        """Whether the key is present (even with a null value)."""
        return key in self.data

    def req(self, key: str) -> Any:
        """The value of a required key."""
        if key not in self.data:
            self.fail(key, "missing field")
        return self.data[key]

    def req_str(self, key: str) -> str:
        """A required string."""
        return self._str(key, self.req(key))

    def opt_str(self, key: str) -> str | None:
        """An optional string; absent or null gives ``None``."""
        value = self.data.get(key)
        return None if value is None else self._str(key, value)

    def nullable_str(self, key: str) -> str | None:
        """A key that must be present but may be null."""
        value = self.req(key)
        return None if value is None else self._str(key, value)

    def req_int(self, key: str) -> int:
        """A required integer (booleans and floats are refused)."""
        return self._int(key, self.req(key))

    def opt_int(self, key: str) -> int | None:
        """An optional integer; absent or null gives ``None``."""
        value = self.data.get(key)
        return None if value is None else self._int(key, value)

    def req_str_list(self, key: str, *, non_empty: bool = False) -> list[str]:
        """A required list of strings."""
        return check_str_list(self, key, self.req(key), non_empty=non_empty)

    def opt_str_list(self, key: str) -> list[str] | None:
        """An optional list of strings."""
        value = self.data.get(key)
        return None if value is None else check_str_list(self, key, value)

    def req_int_list(self, key: str, *, non_empty: bool = False) -> list[int]:
        """A required list of integers."""
        value = self.req(key)
        if not isinstance(value, list) or not all(is_int(v) for v in value):
            self.fail(key, f"expected a list of integers, got {describe(value)}")
        if non_empty and not value:
            self.fail(key, "expected a non-empty list")
        return value

    def req_obj(self, key: str) -> dict[str, Any]:
        """A required JSON object."""
        value = self.req(key)
        if not isinstance(value, dict):
            self.fail(key, f"expected an object, got {json_type(value)}")
        return value

    def opt_obj(self, key: str) -> dict[str, Any] | None:
        """An optional JSON object."""
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.fail(key, f"expected an object, got {json_type(value)}")
        return value

    def _str(self, key: str, value: Any) -> str:
        if not isinstance(value, str):
            self.fail(key, f"expected a string, got {json_type(value)}")
        return value

    def _int(self, key: str, value: Any) -> int:
        if not is_int(value):
            self.fail(key, f"expected an integer, got {json_type(value)}")
        return value


def check_str_list(rec: Record, field_name: str, value: Any, *, non_empty: bool = False) -> list[str]:
    """``value`` must be a list of strings (reported against ``field_name``)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        rec.fail(field_name, f"expected a list of strings, got {describe(value)}")
    if non_empty and not value:
        rec.fail(field_name, "expected a non-empty list")
    return value


def describe(value: Any) -> str:
    """Short type description of a list-ish value for messages (``list with number``)."""
    if isinstance(value, list):
        kinds = sorted({json_type(v) for v in value})
        return "list of " + "/".join(kinds) if kinds else "empty list"
    return json_type(value)


def image_id_path(value: str, template: str, file: str, record: int | None, field_name: str) -> str:
    """Build an image path from an id (``template.format(id=value)``) and validate it.

    Ids that carry path syntax (``/``, ``\\``, ``..``, NUL) are refused so an id cannot
    point outside the images root; the result goes through :func:`safe_relpath`.
    """
    if not value or value in (".", "..") or any(c in value for c in "/\\\0"):
        raise ParseError(file, record, field_name, f"image id {value!r} is not a plain file name")
    return safe_relpath(template.format(id=value), file, record, field_name)


def match_name(path: Path, patterns: Sequence[tuple[str, re.Pattern[str]]], fmt: str) -> tuple[str, re.Match[str]]:
    """Return ``(role, match)`` for the first pattern that matches the file's name."""
    for role, pattern in patterns:
        m = pattern.match(path.name)
        if m:
            return role, m
    raise ParseError(str(path), None, None, f"unrecognised file name {path.name!r} for the {fmt} format")


def add_target(
    targets: list[TargetRecord], target: TargetRecord, dataset: ParsedDataset, where: str
) -> bool:
    """Append ``target`` unless its image is already a target of the query (warn then)."""
    if any(t.image == target.image for t in targets):
        dataset.warnings.append(f"{where}: image {target.image!r} listed twice as a target; kept the first")
        return False
    targets.append(target)
    return True


def register(dataset: ParsedDataset, external_id: str, path: str | None = None, url: str | None = None,
             extra: dict[str, Any] | None = None) -> str:
    """Shorthand for ``dataset.add_image(ImageRecord(...))``."""
    return dataset.add_image(ImageRecord(external_id, path=path, url=url, extra=dict(extra or {})))


def is_test_split(split: str) -> bool:
    """Splits whose ground truth is hidden (CIRR test1, FashionIQ test, CIRCO test)."""
    return split.lower().startswith("test")
