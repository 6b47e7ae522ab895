"""Shared helpers for the annotation parsers: file loading, name matching, field checks.

Every failure is reported as :class:`retrieval.records.ParseError` naming the file (the
path as given), the 0-based record number and the field, so an import page can point at
the exact spot. Nothing here imports Django.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from retrieval.importers.jsonstream import iter_jsonl, iter_list, iter_object, sniff
from retrieval.records import ImageRecord, ParsedDataset, ParseError, QueryRecord, TargetRecord, safe_relpath

__all__ = ["iter_jsonl", "iter_list", "iter_object", "sniff"]

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


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(index, line)`` for the lines of a UTF-8 text file, streaming (a BOM is tolerated)."""
    try:
        with open(path, encoding="utf-8-sig") as handle:
            for index, line in enumerate(handle):
                yield index, line
    except UnicodeDecodeError as exc:
        raise ParseError(str(path), None, None, f"not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise ParseError(str(path), None, None, f"cannot read file: {exc.strerror or exc}") from exc


def collect(stream: Callable[..., Iterator[QueryRecord]], fmt: str, paths: Iterable[PathLike] | PathLike,
            split: str | None = None, subset: str | None = None) -> ParsedDataset:
    """Run a parser's ``stream`` to the end and return the whole ParsedDataset (queries in a list)."""
    dataset = ParsedDataset(format=fmt)
    dataset.queries.extend(stream(paths, dataset, split=split, subset=subset))
    return dataset


def fill_gallery(dataset: ParsedDataset, split: str, file: str, members: Iterable[str]) -> None:
    """Add ``members`` to the gallery of ``split``; entries listed twice are kept once, with a warning."""
    dataset.galleries.setdefault(split, [])
    duplicates = [image_id for image_id in members if not dataset.add_to_gallery(split, image_id)]
    if duplicates:
        dataset.warnings.append(
            f"{file}: {len(duplicates)} gallery entr{'y is' if len(duplicates) == 1 else 'ies are'} listed more "
            f"than once (kept once), e.g. {duplicates[0]!r}"
        )


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

    def __init__(self, path: Path | str, index: int | None, data: Any, what: str = "record", prefix: str = ""):
        self.file = str(path)
        self.index = index
        self.data = data
        self.prefix = prefix  # a nested object (``turns[1]``) names its fields ``turns[1].turn``
        if not isinstance(data, dict):
            self.fail(None, f"expected a JSON object for this {what}, got {json_type(data)}")

    def fail(self, field_name: str | None, message: str) -> NoReturn:
        """Raise a ParseError for this record."""
        full = f"{self.prefix}.{field_name}" if self.prefix and field_name else (self.prefix or field_name)
        raise ParseError(self.file, self.index, full, message)

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


#: A content rule: ``(role, test)`` where ``test(shape, first)`` looks at the top-level JSON type
#: of a file and its first item (see :func:`retrieval.importers.jsonstream.sniff`).
ContentRule = tuple[str, Callable[[str, Any], bool]]


def list_of_objects_with(*keys: str) -> Callable[[str, Any], bool]:
    """Content test: a JSON list whose first item is an object holding every key of ``keys``."""
    return lambda shape, first: shape == "list" and isinstance(first, dict) and all(k in first for k in keys)


def list_of_strings(shape: str, first: Any) -> bool:
    """Content test: a JSON list whose first item is a string."""
    return shape == "list" and isinstance(first, str)


def object_of(test: Callable[[Any], bool]) -> Callable[[str, Any], bool]:
    """Content test: a JSON object whose first member's value passes ``test``."""
    return lambda shape, first: shape == "object" and first is not None and test(first[1])


def file_role(path: Path, patterns: Sequence[tuple[str, re.Pattern[str]]], rules: Sequence[ContentRule],
              expected: str) -> tuple[str, dict[str, str | None]]:
    """``(role, name_groups)`` of an annotation file: the role from its content where the content
    tells, else from its name; the groups of the name pattern that matched (empty when none did).

    Refuses a file whose role neither its content nor its name tells, saying what was expected.
    """
    named = next(((role, m) for role, pattern in patterns if (m := pattern.match(path.name))), None)
    shape, first = sniff(path) if path.suffix.lower() == ".json" else ("other", None)
    by_content = next((role for role, test in rules if test(shape, first)), None)
    if by_content is None and named is None:
        raise ParseError(str(path), None, None, f"cannot tell what this file is from its name or content; expected {expected}")
    groups = named[1].groupdict() if named is not None else {}
    return by_content or named[0], groups


def name_token(path: Path, known: Iterable[str]) -> str | None:
    """The last token of the file name (split on ``.``, ``_``, ``-``) that is one of ``known``."""
    tokens = re.split(r"[._-]", path.name)
    return next((t for t in reversed(tokens) if t in set(known)), None)


def need(value: str | None, path: Path, what: str, option: str, expected: str) -> str:
    """``value``, or a ParseError saying the ``what`` cannot be told and how to give it."""
    if value:
        return value
    raise ParseError(str(path), None, None, f"cannot tell the {what} of this file; name it {expected} or pass {option}")
