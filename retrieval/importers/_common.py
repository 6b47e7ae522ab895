"""Shared helpers for the annotation parsers: file loading, name matching, field checks.

Every failure is reported as :class:`retrieval.records.ParseError` naming the file (the
path as given), the 0-based record number and the field, so an import page can point at
the exact spot. Nothing here imports Django.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from retrieval.captions import DEFAULT_JOIN, join_captions
from retrieval.importers.jsonstream import iter_jsonl, iter_list, iter_object, sniff
from retrieval.records import ImageRecord, ParsedDataset, ParseError, QueryRecord, TargetRecord, safe_relpath
from retrieval.sessions import REF_NOT_EARLIER, REFERENCE_CHECKS, session_turn_references
from retrieval.validation import Record, check_str_list, describe, is_int, is_number, json_type

__all__ = [
    "Record",
    "check_str_list",
    "describe",
    "is_int",
    "is_number",
    "iter_jsonl",
    "iter_list",
    "iter_object",
    "json_type",
    "sniff",
]

PathLike = str | Path
T = TypeVar("T")

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
            yield from enumerate(handle)
    except UnicodeDecodeError as exc:
        raise ParseError(str(path), None, None, f"not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise ParseError(str(path), None, None, f"cannot read file: {exc.strerror or exc}") from exc


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size``, read lazily. When reading the items fails (a file cut
    short, malformed JSON), the items read before the failure come first, as a shorter list,
    and the error after it: a parser that validates a list at a time still reports an
    earlier record's error before a later record's."""
    iterator = iter(items)
    while True:
        batch: list[T] = []
        try:
            for item in iterator:
                batch.append(item)
                if len(batch) == size:
                    break
        except ParseError:
            if batch:
                yield batch
            raise
        if not batch:
            return
        yield batch


def collect(
    stream: Callable[..., Iterator[QueryRecord]],
    fmt: str,
    paths: Iterable[PathLike] | PathLike,
    split: str | None = None,
    subset: str | None = None,
) -> ParsedDataset:
    """Run a parser's ``stream`` to the end and return the whole ParsedDataset (queries in a list)."""
    dataset = ParsedDataset(format=fmt)
    dataset.queries.extend(stream(paths, dataset, split=split, subset=subset))
    return dataset


def fill_gallery(dataset: ParsedDataset, split: str, file: str, members: Iterable[str]) -> None:
    """Add ``members`` to the gallery of ``split``; entries listed twice are kept once, with a warning."""
    dataset.galleries.setdefault(split, [])
    duplicates = [image_id for image_id in members if not dataset.add_to_gallery(split, image_id)]
    warn_repeated(dataset, file, len(duplicates), duplicates[0] if duplicates else None)


def warn_repeated(dataset: ParsedDataset, file: str, count: int, first: str | None) -> None:
    """Warn that ``count`` gallery entries of ``file`` repeat an earlier one (``first``: the first)."""
    if count:
        dataset.warnings.append(
            f"{file}: {count} gallery entr{'y is' if count == 1 else 'ies are'} listed more "
            f"than once (kept once), e.g. {first!r}"
        )


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


def add_target(targets: list[TargetRecord], target: TargetRecord, dataset: ParsedDataset, where: str) -> bool:
    """Append ``target`` unless its image is already a target of the query (warn then)."""
    if any(t.image == target.image for t in targets):
        dataset.warnings.append(f"{where}: image {target.image!r} listed twice as a target; kept the first")
        return False
    targets.append(target)
    return True


def register(
    dataset: ParsedDataset,
    external_id: str,
    path: str | None = None,
    url: str | None = None,
    extra: dict[str, Any] | None = None,
) -> str:
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


def file_role(
    path: Path, patterns: Sequence[tuple[str, re.Pattern[str]]], rules: Sequence[ContentRule], expected: str
) -> tuple[str, dict[str, str | None]]:
    """``(role, name_groups)`` of an annotation file: the role from its content where the content
    tells, else from its name; the groups of the name pattern that matched (empty when none did).

    Refuses a file whose role neither its content nor its name tells, saying what was expected.
    """
    named = next(((role, m) for role, pattern in patterns if (m := pattern.match(path.name))), None)
    shape, first = sniff(path) if path.suffix.lower() == ".json" else ("other", None)
    by_content = next((role for role, test in rules if test(shape, first)), None)
    if by_content is None and named is None:
        raise ParseError(
            str(path), None, None, f"cannot tell what this file is from its name or content; expected {expected}"
        )
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


#: Text roles that carry a turn's modification text (as :data:`retrieval.models.CAPTION_ROLES`).
_CAPTION_ROLES = ("caption", "generated")


def resolve_turn_references(q: QueryRecord) -> None:
    """Fill each session turn's ``reference_turns`` and ``reference_checks`` that its importer
    left unread (``None``) from the turn texts (:func:`retrieval.sessions.session_turn_references`).
    Given ``reference_turns`` (a format that stores them) are kept; those that are not earlier
    turns of the session are dropped and flagged :data:`~retrieval.sessions.REF_NOT_EARLIER`.
    Single-turn queries get none."""
    if len(q.turns) < 2:
        for t in q.turns:
            t.reference_turns, t.reference_checks = t.reference_turns or [], t.reference_checks or []
        return
    texts = [join_captions([x.text for x in t.texts if x.role in _CAPTION_ROLES], DEFAULT_JOIN) for t in q.turns]
    for t, (refs, checks) in zip(q.turns, session_turn_references(texts)):
        given = t.reference_turns
        if t.reference_checks is None:
            t.reference_checks = checks
        if given is None:
            t.reference_turns = refs
            continue
        valid = sorted({k for k in given if 1 <= k <= t.index})  # the turn itself: a combination's base
        if len(valid) != len(set(given)):
            failed = {*t.reference_checks, REF_NOT_EARLIER}
            t.reference_checks = [c for c in REFERENCE_CHECKS if c in failed]
        t.reference_turns = [] if valid == [t.index] else valid


def turn_reference_list(rec: Record, turn: Any, name: str) -> list[int] | None:
    """A turn's optional ``reference_turns`` field (a list of 1-based turn numbers), or None."""
    if not isinstance(turn, dict) or turn.get("reference_turns") is None:
        return None
    value = turn["reference_turns"]
    if not isinstance(value, list) or not all(is_int(v) for v in value):
        rec.fail(f"{name}.reference_turns", "expected a list of turn numbers")
    return [int(v) for v in value]
