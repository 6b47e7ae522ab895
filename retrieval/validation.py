"""Strict field checks for JSON records, with errors that name the file, record and field.

The one validation approach of CIRVal for JSON read from files and from clients: wrap each
decoded record in :class:`Record` and read its fields with the ``req_*`` / ``opt_*``
accessors, which check types strictly (a boolean is not an integer, a float is not an int)
and raise :class:`retrieval.records.ParseError` naming the file, the record (``record N``,
0-based, or the record's own ``label``: ``line 3``, ``sample 2``) and the field
(``turns[1].relative_caption`` for a nested object read through ``prefix`` /
:meth:`Record.nested`, ``categories[2]`` for the objects of a list read through
:meth:`Record.objects`). ``allowed`` refuses unknown fields, naming the first one and
listing the allowed ones. A value that is not one of a file's records (a rubric, a
submitted payload) is read with ``index=None``: ``path`` names its source and the field is
its path inside it (``rubric.categories[2].key``). Checks that involve more than one field
or record (duplicates, counts that must agree, safe paths, a reader's own vocabulary) stay
in the reader, next to the mapping they protect, and fail through :meth:`Record.fail`.

The readers that use it (all of CIRVal's):

* the annotation importers, ``retrieval/importers/`` (CIRR, FashionIQ, CIRCO, LaSCo, M-BEIR,
  CIRCLED, Multi-turn FashionIQ; through ``retrieval/importers/_common.py``);
* the CIRCUS rank files, ``audit/rankfiles.py`` (:func:`audit.rankfiles.parse_rank_document`,
  ``sample N``; its :class:`audit.rankfiles.RankFileError` is a ParseError);
* the rank lines of ``manage.py audit_labels`` (``audit/management/commands/audit_labels.py``,
  ``line N``, 1-based) and the session lines of ``manage.py session_metrics``
  (``audit/management/commands/session_metrics.py``, ``line N``);
* the judgement lines of ``manage.py agreement``
  (``annotation/management/commands/agreement.py``, ``line N``, 1-based);
* the CIRCUS per-annotator assignment files, ``annotation/agreement/circus_files.py``
  (``assignments[N]``; its :class:`annotation.agreement.circus_files.CircusFormatError` is a ParseError);
* rubric definitions, ``annotation/core/rubric.py`` (:meth:`Rubric.from_dict`; source
  ``rubric 'key' vN``, fields ``rubric.categories[2].shortcut_key``; identifier, reserved
  shortcut, uniqueness and decision-order rules stay there);
* submitted judgement payloads, ``annotation/core/rubric.py``
  (:func:`validate_judgement`; fields ``category``, ``also[0].sub_reason``,
  ``scales.overall``; its :class:`JudgementError` is a ParseError whose ``field`` is that
  path, what the annotation API returns to the page).

Why not pydantic v2 strict mode: tried on the CIRCLED session record, the model classes
replace the accessor calls one for one (the values still have to be mapped to the
normalised records afterwards), keeping today's messages needs an adapter from pydantic's
error types and locations to ours, and the cross-field/cross-record checks would become
validators of the same length; so it would add four packages without removing code.
Nothing here imports Django.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, NoReturn

from retrieval.records import ParseError


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

    ``allowed``: when given, a key outside it is refused (the error names the first unknown
    field and lists the allowed ones). ``index`` may be ``None`` for a value that is not one
    of a file's records (a rubric definition, a submitted payload): ``path`` then names the
    source and ``prefix`` the path of the object inside it (``rubric.categories[2]``).
    """

    def __init__(
        self,
        path: Path | str,
        index: int | None,
        data: Any,
        what: str = "record",
        prefix: str = "",
        label: str | None = None,
        allowed: Collection[str] | None = None,
    ):
        self.file = str(path)
        self.index = index
        self.data = data
        self.prefix = prefix  # a nested object (``turns[1]``) names its fields ``turns[1].turn``
        self.label = label  # how messages name the record (default ``record N``; e.g. ``line 3``, ``sample 2``)
        if not isinstance(data, Mapping):
            self.fail(None, f"expected a JSON object for this {what}, got {json_type(data)}")
        if allowed is not None:
            self._refuse_unknown(allowed)

    def _refuse_unknown(self, allowed: Collection[str]) -> None:
        unknown = sorted(str(k) for k in self.data if k not in allowed)
        if unknown:
            others = f" (also unknown: {unknown[1:]})" if len(unknown) > 1 else ""
            self.fail(unknown[0], f"unknown field{others}; allowed: {sorted(allowed)}")

    def nested(self, key: str, value: Any, what: str, allowed: Collection[str] | None = None) -> Record:
        """A Record for the object ``value`` held by field ``key`` (its fields named ``key.field``)."""
        prefix = f"{self.prefix}.{key}" if self.prefix else key
        return Record(self.file, self.index, value, what, prefix=prefix, label=self.label, allowed=allowed)

    def objects(self, key: str, what: str, allowed: Collection[str] | None = None) -> list[Record]:
        """An optional list of objects (absent or null: empty), each a Record named ``key[i]``."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(key, f"expected a list, got {json_type(value)}")
        return [self.nested(f"{key}[{i}]", v, what, allowed) for i, v in enumerate(value)]

    def fail(self, field_name: str | None, message: str) -> NoReturn:
        """Raise a ParseError for this record."""
        full = f"{self.prefix}.{field_name}" if self.prefix and field_name else (self.prefix or field_name)
        raise ParseError(self.file, self.index, full, message, record_label=self.label)

    def has(self, key: str) -> bool:
        """Whether the key is present (even with a null value)."""
        return key in self.data

    def req(self, key: str) -> Any:
        """The value of a required key."""
        if key not in self.data:
            self.fail(key, "missing field")
        return self.data[key]

    def req_str(self, key: str, *, non_blank: bool = False) -> str:
        """A required string; ``non_blank``: with a character other than white space."""
        value = self._str(key, self.req(key))
        if non_blank and not value.strip():
            self.fail(key, "must not be blank")
        return value

    def opt_str(self, key: str) -> str | None:
        """An optional string; absent or null gives ``None``."""
        value = self.data.get(key)
        return None if value is None else self._str(key, value)

    def nullable_str(self, key: str) -> str | None:
        """A key that must be present but may be null."""
        value = self.req(key)
        return None if value is None else self._str(key, value)

    def req_id(self, key: str) -> str | int:
        """A required identifier: a string with a non-blank character, or an integer."""
        value = self.req(key)
        if isinstance(value, str):
            if not value.strip():
                self.fail(key, "must not be empty")
            return value
        if not is_int(value):
            self.fail(key, f"expected a string or an integer, got {json_type(value)} ({value!r})")
        return value

    def req_int(self, key: str) -> int:
        """A required integer (booleans and floats are refused)."""
        return self._int(key, self.req(key))

    def opt_int(self, key: str) -> int | None:
        """An optional integer; absent or null gives ``None``."""
        value = self.data.get(key)
        return None if value is None else self._int(key, value)

    def req_bool(self, key: str) -> bool:
        """A required boolean (``true`` / ``false``; 0 and 1 are refused)."""
        value = self.req(key)
        if not isinstance(value, bool):
            self.fail(key, f"expected true or false, got {json_type(value)}")
        return value

    def opt_bool(self, key: str) -> bool | None:
        """An optional boolean; absent or null gives ``None``."""
        return None if self.data.get(key) is None else self.req_bool(key)

    def nullable_bool(self, key: str) -> bool | None:
        """A key that must be present, holding a boolean or null."""
        return None if self.req(key) is None else self.req_bool(key)

    def req_list(self, key: str) -> list[Any]:
        """A required list (its items are the reader's to check)."""
        value = self.req(key)
        if not isinstance(value, list):
            self.fail(key, f"expected a list, got {json_type(value)}")
        return value

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
            shown = f" ({value!r})" if isinstance(value, (bool, float)) else ""  # 2.0, True: say which
            self.fail(key, f"expected an integer, got {json_type(value)}{shown}")
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
