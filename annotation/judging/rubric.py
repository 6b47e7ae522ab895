"""Annotation rubrics as data, and validation of one annotator's judgement against them.

No Django, no Celery. A rubric is a versioned, JSON-serialisable definition (stored in a
database JSON field): :meth:`Rubric.from_dict` validates it and raises :class:`ValueError`
naming the offending path; :meth:`Rubric.to_dict` gives the canonical dictionary back.

Two rubric kinds exist:

* ``"category"``: the annotator picks exactly one top-level category (with a sub-reason
  where the category has them). Example: the CIRVal/CIRCUS *validity* rubric.
* ``"session"``: 1-5 scales, boolean checks per turn and session-level reject flags.
  Example: the *session* rubric for generated multi-turn sessions.

Keyboard scheme (checked on load, see :data:`RESERVED_KEYS`):

* the UI reserves ``n`` (focus note), ``Enter`` (submit), ``s`` (skip), ``f`` (flag
  for adjudication), ``b`` (back) and ``?`` (help); no rubric key may use them;
* keys are single printable characters compared case-insensitively;
* *first level* (categories, scale focus keys, per-turn checks, reject flags): unique
  across the whole rubric. The built-in validity rubric numbers its categories ``1``..``5``
  in decision order;
* *second level* (sub-reasons): unique within their category and distinct from every
  first-level key, so both levels can listen at once. Sub-reasons of different
  categories may share keys. The built-ins give the named sub-reasons ``q w e r t`` in
  listed order and every ``other`` the key ``o``;
* when a rubric has scales, digits set a scale's value, so no other key may be a digit.

:func:`validate_judgement` checks a submitted payload and returns a
:class:`CleanJudgement`, or raises :class:`JudgementError` whose ``field`` names the
offending payload field (``"category"``, ``"also[0].sub_reason"``, ``"scales.overall"``...).
"""
from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS: tuple[str, ...] = ("category", "session")

RESERVED_KEYS: dict[str, str] = {
    "n": "focus note",
    "Enter": "submit",
    "s": "skip",
    "f": "flag for adjudication",
    "b": "back",
    "?": "help",
}
_RESERVED_FOLDED = {k.casefold() for k in RESERVED_KEYS}

#: Canonical order of the CIRCUS issue flags (the order of signature strings).
CIRCUS_FLAG_ORDER: tuple[str, ...] = (
    "INVALID_TEXT_QUERY",
    "INVALID_IMAGE_QUERY",
    "INVALID_TARGET_IMAGE",
    "QUERY_TOO_BROAD",
)
VALID_SIGNATURE = "VALID"
UNSPECIFIED_SIGNATURE = "INVALID_UNSPECIFIED"

NOTE_MAX_CHARS = 5000
TIME_SPENT_MAX_MS = 24 * 60 * 60 * 1000

_IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_TRUE_STRINGS = {"true", "1", "on", "yes"}
_FALSE_STRINGS = {"false", "0", "off", "no", ""}


# --------------------------------------------------------------------------- definition


@dataclass(frozen=True)
class SubReason:
    """A reason under a category; ``requires_note`` makes a non-blank note mandatory."""

    key: str
    label: str
    shortcut_key: str
    requires_note: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "shortcut_key": self.shortcut_key,
                "requires_note": self.requires_note}


@dataclass(frozen=True)
class Category:
    """A top-level category. ``severity``: higher is more severe; ``valid``: a pass verdict."""

    key: str
    label: str
    description: str
    shortcut_key: str
    severity: int
    valid: bool
    sub_reasons: tuple[SubReason, ...] = ()

    def sub_reason(self, key: str) -> SubReason | None:
        """The sub-reason with this key, or ``None``."""
        return next((s for s in self.sub_reasons if s.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "description": self.description,
                "shortcut_key": self.shortcut_key, "severity": self.severity,
                "valid": self.valid, "sub_reasons": [s.to_dict() for s in self.sub_reasons]}


@dataclass(frozen=True)
class DecisionStep:
    """One question of the decision order; ``category`` is what it leads to (if any)."""

    question: str
    category: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "category": self.category}


@dataclass(frozen=True)
class FlagSpec:
    """How a category judgement is stored as CIRCUS-style flags.

    ``order``: the invalid categories in canonical signature order (one boolean each);
    ``validated_field`` / ``note_field``: names of the pass boolean and the note string.
    """

    order: tuple[str, ...]
    validated_field: str = "validated"
    note_field: str = "other"

    def to_dict(self) -> dict[str, Any]:
        return {"order": list(self.order), "validated_field": self.validated_field,
                "note_field": self.note_field}


@dataclass(frozen=True)
class Scale:
    """An ordinal rating scale ``min..max``. ``shortcut_key`` focuses it, digits set it."""

    key: str
    label: str
    description: str = ""
    min: int = 1
    max: int = 5
    shortcut_key: str | None = None
    anchors: tuple[tuple[int, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "description": self.description,
                "min": self.min, "max": self.max, "shortcut_key": self.shortcut_key,
                "anchors": {str(v): text for v, text in self.anchors}}


@dataclass(frozen=True)
class Check:
    """A named boolean (a per-turn check or a session reject flag)."""

    key: str
    label: str
    description: str = ""
    shortcut_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "description": self.description,
                "shortcut_key": self.shortcut_key}


@dataclass(frozen=True)
class Rubric:
    """A validated, immutable rubric definition. Build it with :meth:`from_dict`."""

    key: str
    version: int
    title: str
    kind: str
    description: str = ""
    decision_order: tuple[DecisionStep, ...] = ()
    categories: tuple[Category, ...] = ()
    flags: FlagSpec | None = None
    scales: tuple[Scale, ...] = ()
    per_turn_checks: tuple[Check, ...] = ()
    reject_flags: tuple[Check, ...] = ()

    # ---- accessors

    def category(self, key: str) -> Category | None:
        """The category with this key, or ``None``."""
        return next((c for c in self.categories if c.key == key), None)

    @property
    def valid_category(self) -> Category | None:
        """The single category with ``valid = True`` (category rubrics), else ``None``."""
        return next((c for c in self.categories if c.valid), None)

    def by_severity(self) -> list[Category]:
        """Categories from most to least severe."""
        return sorted(self.categories, key=lambda c: -c.severity)

    # ---- (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON-serialisable definition (``from_dict`` round-trips it)."""
        return {
            "key": self.key,
            "version": self.version,
            "title": self.title,
            "kind": self.kind,
            "description": self.description,
            "decision_order": [s.to_dict() for s in self.decision_order],
            "categories": [c.to_dict() for c in self.categories],
            "flags": self.flags.to_dict() if self.flags is not None else None,
            "scales": [s.to_dict() for s in self.scales],
            "per_turn_checks": [c.to_dict() for c in self.per_turn_checks],
            "reject_flags": [c.to_dict() for c in self.reject_flags],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rubric:
        """Parse and validate a definition; :class:`ValueError` names the offending path."""
        return _parse_rubric(data)


# --------------------------------------------------------------------------- parsing

_RUBRIC_FIELDS = {"key", "version", "title", "kind", "description", "decision_order", "categories",
                  "flags", "scales", "per_turn_checks", "reject_flags"}


class _Reader:
    """Reads typed fields from a mapping, raising ValueError prefixed with a path."""

    def __init__(self, data: Any, path: str, allowed: set[str]) -> None:
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: expected an object, got {type(data).__name__}")
        unknown = sorted(str(k) for k in data if k not in allowed)
        if unknown:
            raise ValueError(f"{path}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")
        self.data = data
        self.path = path

    def error(self, name: str, problem: str) -> ValueError:
        return ValueError(f"{self.path}.{name}: {problem}")

    def text(self, name: str, *, required: bool = True, default: str = "") -> str:
        value = self.data.get(name)
        if value is None:
            if required:
                raise self.error(name, "is required")
            return default
        if not isinstance(value, str):
            raise self.error(name, f"must be a string, got {type(value).__name__}")
        if required and not value.strip():
            raise self.error(name, "must not be blank")
        return value

    def ident(self, name: str) -> str:
        value = self.text(name)
        if not _IDENT.match(value):
            raise self.error(name, f"{value!r} is not an identifier (letters, digits, '_', leading letter)")
        return value

    def integer(self, name: str, *, default: int | None = None) -> int:
        value = self.data.get(name, default)
        if value is None:
            raise self.error(name, "is required")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, f"must be an integer, got {value!r}")
        return value

    def boolean(self, name: str, *, default: bool | None = None) -> bool:
        value = self.data.get(name, default)
        if value is None:
            raise self.error(name, "is required")
        if not isinstance(value, bool):
            raise self.error(name, f"must be true or false, got {value!r}")
        return value

    def shortcut(self, name: str, *, required: bool = True) -> str | None:
        value = self.data.get(name)
        if value is None:
            if required:
                raise self.error(name, "is required")
            return None
        if not isinstance(value, str) or len(value) != 1 or not value.isprintable() or value.isspace():
            raise self.error(name, f"must be a single printable character, got {value!r}")
        if value.casefold() in _RESERVED_FOLDED:
            action = next(a for k, a in RESERVED_KEYS.items() if k.casefold() == value.casefold())
            raise self.error(name, f"{value!r} is reserved by the UI for {action!r}")
        return value

    def items(self, name: str) -> list[tuple[str, Any]]:
        """(path, element) pairs of a list field (missing or null = empty list)."""
        value = self.data.get(name)
        if value is None:
            return []
        if not isinstance(value, (list, tuple)):
            raise self.error(name, f"must be a list, got {type(value).__name__}")
        return [(f"{self.path}.{name}[{i}]", v) for i, v in enumerate(value)]


def _unique(keys: Iterable[tuple[str, str]], what: str) -> None:
    """Raise on a repeated key; ``keys`` are (path, key) pairs."""
    seen: dict[str, str] = {}
    for path, key in keys:
        if key in seen:
            raise ValueError(f"{path}: duplicate {what} {key!r} (also at {seen[key]})")
        seen[key] = path


def _unique_shortcuts(keys: Iterable[tuple[str, str | None]], level: str) -> None:
    seen: dict[str, str] = {}
    for path, key in keys:
        if key is None:
            continue
        folded = key.casefold()
        if folded in seen:
            raise ValueError(f"{path}: shortcut key {key!r} collides with {seen[folded]} ({level})")
        seen[folded] = path


def _parse_sub_reason(data: Any, path: str) -> SubReason:
    r = _Reader(data, path, {"key", "label", "shortcut_key", "requires_note"})
    return SubReason(key=r.ident("key"), label=r.text("label"), shortcut_key=r.shortcut("shortcut_key") or "",
                     requires_note=r.boolean("requires_note", default=False))


def _parse_category(data: Any, path: str) -> Category:
    r = _Reader(data, path, {"key", "label", "description", "shortcut_key", "severity", "valid", "sub_reasons"})
    subs = tuple(_parse_sub_reason(d, p) for p, d in r.items("sub_reasons"))
    _unique(((f"{path}.sub_reasons[{i}].key", s.key) for i, s in enumerate(subs)), "sub-reason key")
    _unique_shortcuts(((f"{path}.sub_reasons[{i}].shortcut_key", s.shortcut_key) for i, s in enumerate(subs)),
                      "sub-reason level")
    return Category(key=r.ident("key"), label=r.text("label"), description=r.text("description", required=False),
                    shortcut_key=r.shortcut("shortcut_key") or "", severity=r.integer("severity"),
                    valid=r.boolean("valid"), sub_reasons=subs)


def _parse_scale(data: Any, path: str) -> Scale:
    r = _Reader(data, path, {"key", "label", "description", "min", "max", "shortcut_key", "anchors"})
    lo, hi = r.integer("min", default=1), r.integer("max", default=5)
    if lo >= hi:
        raise r.error("max", f"must exceed min ({lo}), got {hi}")
    raw = data.get("anchors") or {}
    if not isinstance(raw, Mapping):
        raise r.error("anchors", "must be an object mapping a scale value to its description")
    anchors: list[tuple[int, str]] = []
    for value, text in raw.items():
        try:
            point = int(value)
        except (TypeError, ValueError):
            raise r.error("anchors", f"key {value!r} is not an integer") from None
        if isinstance(value, bool) or str(point) != str(value).strip() or not lo <= point <= hi:
            raise r.error("anchors", f"key {value!r} is not an integer within [{lo}, {hi}]")
        if not isinstance(text, str):
            raise r.error(f"anchors.{value}", "must be a string")
        anchors.append((point, text))
    _unique(((f"{path}.anchors", str(p)) for p, _ in anchors), "anchor")
    return Scale(key=r.ident("key"), label=r.text("label"), description=r.text("description", required=False),
                 min=lo, max=hi, shortcut_key=r.shortcut("shortcut_key", required=False),
                 anchors=tuple(sorted(anchors)))


def _parse_check(data: Any, path: str) -> Check:
    r = _Reader(data, path, {"key", "label", "description", "shortcut_key"})
    return Check(key=r.ident("key"), label=r.text("label"), description=r.text("description", required=False),
                 shortcut_key=r.shortcut("shortcut_key", required=False))


def _parse_rubric(data: Mapping[str, Any]) -> Rubric:
    where = "rubric"
    if isinstance(data, Mapping):
        where = f"rubric {data.get('key')!r} v{data.get('version')}"
    try:
        return _parse_rubric_body(_Reader(data, "rubric", _RUBRIC_FIELDS))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _parse_decision_order(top: _Reader) -> list[DecisionStep]:
    steps: list[DecisionStep] = []
    for p, d in top.items("decision_order"):
        r = _Reader(d, p, {"question", "category"})
        cat = r.text("category", required=False) or None
        steps.append(DecisionStep(question=r.text("question"), category=cat))
    return steps


def _check_unique_keys(categories: tuple[Category, ...], scales: tuple[Any, ...], per_turn: tuple[Any, ...],
                       rejects: tuple[Any, ...]) -> None:
    _unique(((f"rubric.categories[{i}].key", c.key) for i, c in enumerate(categories)), "category key")
    _unique(((f"rubric.scales[{i}].key", s.key) for i, s in enumerate(scales)), "scale key")
    _unique(((f"rubric.per_turn_checks[{i}].key", c.key) for i, c in enumerate(per_turn)), "per-turn check key")
    _unique(((f"rubric.reject_flags[{i}].key", c.key) for i, c in enumerate(rejects)), "reject flag key")


def _check_shortcuts(categories: tuple[Category, ...], scales: tuple[Any, ...], per_turn: tuple[Any, ...],
                     rejects: tuple[Any, ...]) -> None:
    """Keyboard: one first-level namespace; sub-reasons distinct from it; digits kept for scales."""
    first_level: list[tuple[str, str | None]] = [
        *((f"rubric.categories[{i}].shortcut_key", c.shortcut_key) for i, c in enumerate(categories)),
        *((f"rubric.scales[{i}].shortcut_key", s.shortcut_key) for i, s in enumerate(scales)),
        *((f"rubric.per_turn_checks[{i}].shortcut_key", c.shortcut_key) for i, c in enumerate(per_turn)),
        *((f"rubric.reject_flags[{i}].shortcut_key", c.shortcut_key) for i, c in enumerate(rejects)),
    ]
    _unique_shortcuts(first_level, "first level")
    first_folded = {k.casefold(): p for p, k in first_level if k is not None}
    sub_level = [(f"rubric.categories[{i}].sub_reasons[{j}].shortcut_key", s.shortcut_key)
                 for i, c in enumerate(categories) for j, s in enumerate(c.sub_reasons)]
    for p, k in sub_level:
        if k.casefold() in first_folded:
            raise ValueError(f"{p}: {k!r} collides with the first-level key at {first_folded[k.casefold()]}")
    if scales:
        for p, k in first_level + sub_level:
            if k is not None and k.isdigit():
                raise ValueError(f"{p}: digit {k!r} is reserved for setting scale values")


def _check_session_rubric(top: _Reader, categories: tuple[Category, ...], scales: tuple[Any, ...]) -> None:
    if not scales:
        raise top.error("scales", "a session rubric needs at least one scale")
    if categories:
        raise top.error("categories", "a session rubric has no categories (use kind 'category')")
    if top.data.get("flags") is not None:
        raise top.error("flags", "only category rubrics have flag metadata")


def _parse_rubric_body(top: _Reader) -> Rubric:
    key = top.ident("key")
    version = top.integer("version")
    if version < 1:
        raise top.error("version", f"must be >= 1, got {version}")
    title = top.text("title")
    kind = top.text("kind")
    if kind not in KINDS:
        raise top.error("kind", f"must be one of {list(KINDS)}, got {kind!r}")

    categories = tuple(_parse_category(d, p) for p, d in top.items("categories"))
    scales = tuple(_parse_scale(d, p) for p, d in top.items("scales"))
    per_turn = tuple(_parse_check(d, p) for p, d in top.items("per_turn_checks"))
    rejects = tuple(_parse_check(d, p) for p, d in top.items("reject_flags"))
    steps = _parse_decision_order(top)
    _check_unique_keys(categories, scales, per_turn, rejects)
    _check_shortcuts(categories, scales, per_turn, rejects)
    for i, step in enumerate(steps):
        if step.category is not None and all(c.key != step.category for c in categories):
            raise ValueError(f"rubric.decision_order[{i}].category: unknown category {step.category!r}")

    flags: FlagSpec | None = None
    if kind == "category":
        flags = _check_category_rubric(top, categories, steps)
    else:
        _check_session_rubric(top, categories, scales)

    return Rubric(key=key, version=version, title=title, kind=kind,
                  description=top.text("description", required=False), decision_order=tuple(steps),
                  categories=categories, flags=flags, scales=scales, per_turn_checks=per_turn,
                  reject_flags=rejects)


def _check_category_set(top: _Reader, categories: tuple[Category, ...]) -> Category:
    """Two or more categories, exactly one valid and least severe; returns the valid one."""
    if len(categories) < 2:
        raise top.error("categories", "a category rubric needs at least two categories")
    valid = [c for c in categories if c.valid]
    if len(valid) != 1:
        raise top.error("categories", f"exactly one category must have valid = true, found {len(valid)}")
    _unique(((f"rubric.categories[{i}].severity", str(c.severity)) for i, c in enumerate(categories)), "severity")
    if any(c.severity <= valid[0].severity for c in categories if not c.valid):
        raise top.error("categories", f"the valid category {valid[0].key!r} must be the least severe")
    return valid[0]


def _check_category_steps(top: _Reader, categories: tuple[Category, ...], steps: Sequence[DecisionStep],
                          valid: Category) -> None:
    """The decision order names one category a step, reaches them all and ends with the valid one."""
    if not steps:
        raise top.error("decision_order", "a category rubric needs a decision order")
    step_cats = [s.category for s in steps]
    if None in step_cats:
        raise top.error(f"decision_order[{step_cats.index(None)}].category", "is required in a category rubric")
    _unique(((f"rubric.decision_order[{i}].category", str(c)) for i, c in enumerate(step_cats)), "decision step category")
    missing = [c.key for c in categories if c.key not in step_cats]
    if missing:
        raise top.error("decision_order", f"does not reach categories {missing}")
    if step_cats[-1] != valid.key:
        raise top.error("decision_order", f"must end with the valid category {valid.key!r}")


def _parse_flag_spec(raw: Any, invalid_keys: list[str]) -> FlagSpec:
    r = _Reader(raw, "rubric.flags", {"order", "validated_field", "note_field"})
    order_raw = raw.get("order")
    if not isinstance(order_raw, (list, tuple)) or not all(isinstance(k, str) for k in order_raw):
        raise r.error("order", "must be a list of category keys")
    if sorted(order_raw) != sorted(invalid_keys) or len(set(order_raw)) != len(order_raw):
        raise r.error("order", f"must list every invalid category exactly once: {sorted(invalid_keys)}")
    spec = FlagSpec(order=tuple(order_raw),
                    validated_field=r.ident("validated_field") if raw.get("validated_field") is not None
                    else "validated",
                    note_field=r.ident("note_field") if raw.get("note_field") is not None else "other")
    clash = {spec.validated_field, spec.note_field} & set(spec.order)
    if spec.validated_field == spec.note_field or clash:
        raise r.error("validated_field", "the validated and note fields must differ from each other and the flags")
    return spec


def _check_category_rubric(top: _Reader, categories: tuple[Category, ...],
                           steps: Sequence[DecisionStep]) -> FlagSpec:
    valid = _check_category_set(top, categories)
    _check_category_steps(top, categories, steps, valid)
    invalid_keys = [c.key for c in categories if not c.valid]
    raw = top.data.get("flags")
    if raw is None:
        return FlagSpec(order=tuple(invalid_keys))
    return _parse_flag_spec(raw, invalid_keys)


# --------------------------------------------------------------------------- built-ins

def _sub(key: str, label: str, shortcut: str, note: bool = False) -> dict[str, Any]:
    return {"key": key, "label": label, "shortcut_key": shortcut, "requires_note": note}


#: The CIRVal validity rubric, version 1 (DESIGN.md, "The validity rubric").
#:
#: INVALID_TARGET_IMAGE: DESIGN lists "cropped, low resolution, other (note required):
#: mismatch, identical to the reference, contradicts the text". The three named cases
#: after the colon are the usual ways a labelled target is *wrong* (the category means
#: "wrong or unreadable"); they are promoted to sub-reasons of their own
#: (``mismatch``, ``identical_to_reference``, ``contradicts_text``) so they are counted
#: without parsing notes, and need no note since the key already says what a note would.
#: ``other`` remains for anything else and requires a note, as for the other categories.
#: Sub-reasons are mandatory wherever a category has them (see :func:`validate_judgement`).
VALIDITY_RUBRIC_V1: dict[str, Any] = {
    "key": "validity",
    "version": 1,
    "title": "Validity of a composed image retrieval query",
    "kind": "category",
    "description": (
        "Pick exactly one category; when several apply, the most severe wins: "
        "INVALID_TARGET_IMAGE > INVALID_IMAGE_QUERY > INVALID_TEXT_QUERY > QUERY_TOO_BROAD > VALIDATED. "
        "Aim for 30-60 s an item; flag an item for adjudication after 2 min."
    ),
    "decision_order": [
        {"question": "Is the modification text understandable?", "category": "INVALID_TEXT_QUERY"},
        {"question": "Is the reference image readable for what the text needs?", "category": "INVALID_IMAGE_QUERY"},
        {"question": "Does the labelled target match the query?", "category": "INVALID_TARGET_IMAGE"},
        {"question": "Do many gallery images (10 or more) fit equally well?", "category": "QUERY_TOO_BROAD"},
        {"question": "Otherwise: the query is valid.", "category": "VALIDATED"},
    ],
    "categories": [
        {
            "key": "INVALID_TEXT_QUERY",
            "label": "Invalid text",
            "description": "The modification text itself is broken.",
            "shortcut_key": "1",
            "severity": 2,
            "valid": False,
            "sub_reasons": [
                _sub("ungrammatical_nonsensical", "Ungrammatical / nonsensical", "q"),
                _sub("underspecified", "Underspecified", "w"),
                _sub("other", "Other (note required)", "o", True),
            ],
        },
        {
            "key": "INVALID_IMAGE_QUERY",
            "label": "Invalid reference image",
            "description": "The reference image cannot be read for what the text needs.",
            "shortcut_key": "2",
            "severity": 3,
            "valid": False,
            "sub_reasons": [
                _sub("cropped", "Cropped", "q"),
                _sub("low_resolution", "Low resolution", "w"),
                _sub("other", "Other (note required)", "o", True),
            ],
        },
        {
            "key": "INVALID_TARGET_IMAGE",
            "label": "Invalid target image",
            "description": "The labelled target is wrong or unreadable.",
            "shortcut_key": "3",
            "severity": 4,
            "valid": False,
            "sub_reasons": [
                _sub("cropped", "Cropped", "q"),
                _sub("low_resolution", "Low resolution", "w"),
                _sub("mismatch", "Does not match the query", "e"),
                _sub("identical_to_reference", "Identical to the reference", "r"),
                _sub("contradicts_text", "Contradicts the text", "t"),
                _sub("other", "Other (note required)", "o", True),
            ],
        },
        {
            "key": "QUERY_TOO_BROAD",
            "label": "Query too broad",
            "description": "Well formed, but many gallery images fit equally well (rule of thumb: 10 or more).",
            "shortcut_key": "4",
            "severity": 1,
            "valid": False,
            "sub_reasons": [],
        },
        {
            "key": "VALIDATED",
            "label": "Validated",
            "description": "Clear, specific text; readable reference; correct target; both modalities needed.",
            "shortcut_key": "5",
            "severity": 0,
            "valid": True,
            "sub_reasons": [],
        },
    ],
    "flags": {"order": list(CIRCUS_FLAG_ORDER), "validated_field": "validated", "note_field": "other"},
    "scales": [],
    "per_turn_checks": [],
    "reject_flags": [],
}


def _scale(key: str, label: str, description: str, shortcut: str) -> dict[str, Any]:
    return {"key": key, "label": label, "description": description, "min": 1, "max": 5,
            "shortcut_key": shortcut, "anchors": {"1": "very poor", "3": "acceptable", "5": "excellent"}}


#: The CIRVal session rubric, version 1 (DESIGN.md, "The session rubric"). Scale focus
#: keys ``q w e r t`` then a digit 1-5; per-turn checks ``j k`` (for the focused turn);
#: reject flags ``z x c v``.
SESSION_RUBRIC_V1: dict[str, Any] = {
    "key": "session",
    "version": 1,
    "title": "Quality of a generated multi-turn session",
    "kind": "session",
    "description": "Look at the whole filmstrip (each turn's reference image and text, the target marked), "
                   "rate the session on 1-5 scales, answer the two checks for every turn, and tick any reject flag.",
    "decision_order": [],
    "categories": [],
    "flags": None,
    "scales": [
        _scale("naturalness", "Naturalness", "Do the texts read like requests a person would make?", "q"),
        _scale("coherence", "Coherence", "Does the dialogue hang together from turn to turn?", "w"),
        _scale("goal_progress", "Goal progress", "Does the session move toward the target?", "e"),
        _scale("low_redundancy", "Low redundancy", "Does each turn add new information?", "r"),
        _scale("overall", "Overall", "Overall quality of the session.", "t"),
    ],
    "per_turn_checks": [
        {"key": "real_difference_toward_target", "label": "Describes a real difference toward the target",
         "description": "The turn's text names a difference between its reference and the target.",
         "shortcut_key": "j"},
        {"key": "consistent_with_history", "label": "Reference consistent with the history",
         "description": "The turn's reference image is consistent with the earlier turns.",
         "shortcut_key": "k"},
    ],
    "reject_flags": [
        {"key": "duplicate", "label": "Duplicate", "description": "A turn repeats an image.", "shortcut_key": "z"},
        {"key": "inconsistency", "label": "Inconsistency",
         "description": "An attribute already reached is lost.", "shortcut_key": "x"},
        {"key": "conflict", "label": "Conflict", "description": "A turn contradicts an earlier one.",
         "shortcut_key": "c"},
        {"key": "circle", "label": "Circle", "description": "The session returns to an earlier image.",
         "shortcut_key": "v"},
    ],
}


def builtin_rubrics() -> dict[str, Rubric]:
    """The shipped rubrics by key: ``validity`` v1 and ``session`` v1 (fresh objects)."""
    rubrics = (Rubric.from_dict(copy.deepcopy(d)) for d in (VALIDITY_RUBRIC_V1, SESSION_RUBRIC_V1))
    return {r.key: r for r in rubrics}


# --------------------------------------------------------------------------- judgements


class JudgementError(ValueError):
    """A refused judgement payload; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class CleanJudgement:
    """A validated judgement, ready to store.

    Category rubrics fill ``category`` (the most severe of the chosen categories),
    ``sub_reason`` (that category's), ``categories`` (every chosen category, most severe
    first), ``sub_reasons`` (category -> sub-reason or ``None``), ``flags`` (one boolean
    per invalid category, canonical order) and ``validated``. Session rubrics fill
    ``scales``, ``per_turn_checks`` and ``reject_flags``; their ``validated`` is ``None``.
    """

    rubric_key: str
    rubric_version: int
    note: str
    flagged: bool
    time_spent_ms: int
    category: str | None = None
    sub_reason: str | None = None
    categories: tuple[str, ...] = ()
    sub_reasons: dict[str, str | None] = field(default_factory=dict)
    flags: dict[str, bool] = field(default_factory=dict)
    validated: bool | None = None
    scales: dict[str, int] = field(default_factory=dict)
    per_turn_checks: list[dict[str, bool]] = field(default_factory=list)
    reject_flags: tuple[str, ...] = ()

    @property
    def signature(self) -> str | None:
        """CIRCUS signature string (category rubrics), else ``None``."""
        if self.validated is None:
            return None
        return signature(self.flags, self.validated, order=tuple(self.flags))

    def circus_annotation(self, validated_field: str = "validated", note_field: str = "other") -> dict[str, Any]:
        """The CIRCUS per-assignment ``annotation`` object: validated, one bool per flag, note."""
        return {validated_field: self.validated, **self.flags, note_field: self.note}

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form for storage."""
        return {
            "rubric_key": self.rubric_key, "rubric_version": self.rubric_version, "note": self.note,
            "flagged": self.flagged, "time_spent_ms": self.time_spent_ms, "category": self.category,
            "sub_reason": self.sub_reason, "categories": list(self.categories),
            "sub_reasons": dict(self.sub_reasons), "flags": dict(self.flags), "validated": self.validated,
            "signature": self.signature, "scales": dict(self.scales),
            "per_turn_checks": [dict(t) for t in self.per_turn_checks], "reject_flags": list(self.reject_flags),
        }


def most_severe(rubric: Rubric, keys: Iterable[str]) -> str:
    """The most severe of the given category keys (``ValueError`` if empty or unknown)."""
    keys = list(keys)
    if not keys:
        raise ValueError("most_severe needs at least one category key")
    severity = {c.key: c.severity for c in rubric.categories}
    unknown = [k for k in keys if k not in severity]
    if unknown:
        raise ValueError(f"unknown category key(s) {unknown} for rubric {rubric.key!r}")
    return max(keys, key=lambda k: severity[k])


def signature(flags: Mapping[str, bool] | Iterable[str], validated: bool,
              order: Sequence[str] = CIRCUS_FLAG_ORDER) -> str:
    """CIRCUS signature: ``VALID`` when validated, else the true flags joined with ``+``
    in ``order`` (canonical CIRCUS order by default), or ``INVALID_UNSPECIFIED`` if none.

    ``flags`` is a mapping flag -> bool or an iterable of the set flags' names.
    """
    if validated:
        return VALID_SIGNATURE
    on = {k for k, v in flags.items() if v} if isinstance(flags, Mapping) else set(flags)
    unknown = on - set(order)
    if unknown:
        raise ValueError(f"unknown flag(s) {sorted(unknown)}; expected some of {list(order)}")
    if not on:
        return UNSPECIFIED_SIGNATURE
    return "+".join(k for k in order if k in on)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _clean_note(payload: Mapping[str, Any]) -> str:
    note = payload.get("note")
    if note is None:
        return ""
    if not isinstance(note, str):
        raise JudgementError("note", f"note must be a string, got {type(note).__name__}")
    note = note.strip()
    if len(note) > NOTE_MAX_CHARS:
        raise JudgementError("note", f"note is {len(note)} characters long; at most {NOTE_MAX_CHARS} allowed")
    return note


def _clean_bool(value: Any, name: str, *, default: bool | None = None) -> bool:
    if value is None and default is not None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE_STRINGS | _FALSE_STRINGS:
        return value.strip().lower() in _TRUE_STRINGS
    raise JudgementError(name, f"{name} must be true or false, got {value!r}")


def _clean_int(value: Any, name: str) -> int:
    """An integer from an int, an integral float or a string of digits (form posts)."""
    if isinstance(value, bool):
        raise JudgementError(name, f"{name} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise JudgementError(name, f"{name} must be an integer, got {value!r}")


def _clean_time(payload: Mapping[str, Any]) -> int:
    if "time_spent_ms" not in payload or payload["time_spent_ms"] is None:
        raise JudgementError("time_spent_ms", "time_spent_ms is required (milliseconds spent on the item)")
    t = _clean_int(payload["time_spent_ms"], "time_spent_ms")
    if t < 0:
        raise JudgementError("time_spent_ms", f"time_spent_ms must not be negative, got {t}")
    if t > TIME_SPENT_MAX_MS:
        raise JudgementError("time_spent_ms", f"time_spent_ms must be at most {TIME_SPENT_MAX_MS} (24 h), got {t}")
    return t


def _category_and_sub(rubric: Rubric, cat_value: Any, sub_value: Any, cat_field: str,
                      sub_field: str) -> tuple[Category, SubReason | None]:
    if _missing(cat_value):
        raise JudgementError(cat_field, f"{cat_field} is required: pick exactly one of "
                                        f"{[c.key for c in rubric.categories]}")
    if not isinstance(cat_value, str):
        raise JudgementError(cat_field, f"{cat_field} must be exactly one category key, got {cat_value!r}")
    category = rubric.category(cat_value)
    if category is None:
        raise JudgementError(cat_field, f"{cat_field}: unknown category {cat_value!r}; expected one of "
                                        f"{[c.key for c in rubric.categories]}")
    if not category.sub_reasons:
        if not _missing(sub_value):
            raise JudgementError(sub_field, f"{sub_field}: category {category.key} takes no sub-reason, "
                                            f"got {sub_value!r}")
        return category, None
    options = [s.key for s in category.sub_reasons]
    if _missing(sub_value):
        raise JudgementError(sub_field, f"{sub_field} is required for category {category.key}: one of {options}")
    sub = category.sub_reason(sub_value) if isinstance(sub_value, str) else None
    if sub is None:
        raise JudgementError(sub_field, f"{sub_field}: unknown sub-reason {sub_value!r} for category "
                                        f"{category.key}; expected one of {options}")
    return category, sub


def _also_categories(rubric: Rubric, also: Any, chosen: list[tuple[Category, Any]]) -> None:
    """Append the ``also`` categories (a key, an object or a list of them) to ``chosen``."""
    if isinstance(also, (str, Mapping)):
        also = [also]
    if not isinstance(also, (list, tuple)):
        raise JudgementError("also", f"also must be a list of categories, got {type(also).__name__}")
    for i, entry in enumerate(also):
        name = f"also[{i}]"
        if isinstance(entry, Mapping):
            extra = set(entry) - {"category", "sub_reason"}
            if extra:
                raise JudgementError(name, f"{name} has unknown field(s) {sorted(map(str, extra))}")
            chosen.append(_category_and_sub(rubric, entry.get("category"), entry.get("sub_reason"),
                                            f"{name}.category", f"{name}.sub_reason"))
        else:
            chosen.append(_category_and_sub(rubric, entry, None, name, f"{name}.sub_reason"))
        if any(c.key == chosen[-1][0].key for c, _ in chosen[:-1]):
            raise JudgementError(name, f"{name}: category {chosen[-1][0].key} is given twice")


def _validate_categories(rubric: Rubric, payload: Mapping[str, Any], note: str) -> dict[str, Any]:
    chosen = [_category_and_sub(rubric, payload.get("category"), payload.get("sub_reason"),
                                "category", "sub_reason")]
    if payload.get("also") is not None:
        _also_categories(rubric, payload.get("also"), chosen)

    needs_note = [f"{c.key}/{s.key}" for c, s in chosen if s is not None and s.requires_note]
    if needs_note and not note:
        raise JudgementError("note", f"note is required (non-blank) for sub-reason {', '.join(needs_note)}")

    subs = {c.key: (s.key if s else None) for c, s in chosen}
    top = most_severe(rubric, subs)
    ordered = tuple(sorted(subs, key=lambda k: -rubric.category(k).severity))  # type: ignore[union-attr]
    spec = rubric.flags or FlagSpec(order=tuple(c.key for c in rubric.categories if not c.valid))
    return {
        "category": top,
        "sub_reason": subs[top],
        "categories": ordered,
        "sub_reasons": {k: subs[k] for k in ordered},
        "flags": {k: k in subs for k in spec.order},
        "validated": rubric.category(top).valid,  # type: ignore[union-attr]
    }


def _validate_scales(rubric: Rubric, payload: Mapping[str, Any]) -> dict[str, int]:
    raw = payload.get("scales")
    if raw is None:
        raise JudgementError("scales", f"scales are required: {[s.key for s in rubric.scales]}")
    if not isinstance(raw, Mapping):
        raise JudgementError("scales", "scales must be an object mapping scale key to value")
    known = {s.key for s in rubric.scales}
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise JudgementError(f"scales.{unknown[0]}", f"scales.{unknown[0]} is not a scale of this rubric")
    out: dict[str, int] = {}
    for s in rubric.scales:
        name = f"scales.{s.key}"
        if _missing(raw.get(s.key)):
            raise JudgementError(name, f"{name} is required ({s.min}-{s.max})")
        value = _clean_int(raw[s.key], name)
        if not s.min <= value <= s.max:
            raise JudgementError(name, f"{name} must lie within [{s.min}, {s.max}], got {value}")
        out[s.key] = value
    return out


def _validate_per_turn(rubric: Rubric, payload: Mapping[str, Any], n_turns: int | None) -> list[dict[str, bool]]:
    if "per_turn_checks" in payload and "per_turn" in payload:
        raise JudgementError("per_turn_checks", "give per_turn_checks or its alias per_turn, not both")
    name = "per_turn_checks" if "per_turn_checks" in payload else "per_turn" if "per_turn" in payload \
        else "per_turn_checks"
    raw = payload.get(name)
    if raw is None:
        raise JudgementError(name, f"{name} is required: one object of booleans per turn")
    if not isinstance(raw, (list, tuple)):
        raise JudgementError(name, f"{name} must be a list with one object per turn")
    if n_turns is not None and len(raw) != n_turns:
        raise JudgementError(name, f"{name} has {len(raw)} entries; the session has {n_turns} turns")
    if not raw:
        raise JudgementError(name, f"{name} must not be empty")
    keys = [c.key for c in rubric.per_turn_checks]
    out: list[dict[str, bool]] = []
    for i, turn in enumerate(raw):
        where = f"{name}[{i}]"
        if not isinstance(turn, Mapping):
            raise JudgementError(where, f"{where} must be an object of booleans {keys}")
        unknown = sorted(str(k) for k in turn if k not in keys)
        if unknown:
            raise JudgementError(f"{where}.{unknown[0]}", f"{where}.{unknown[0]} is not a per-turn check")
        clean: dict[str, bool] = {}
        for k in keys:
            if turn.get(k) is None:
                raise JudgementError(f"{where}.{k}", f"{where}.{k} is required (true or false)")
            if not isinstance(turn[k], bool):
                raise JudgementError(f"{where}.{k}", f"{where}.{k} must be true or false, got {turn[k]!r}")
            clean[k] = turn[k]
        out.append(clean)
    return out


def _validate_reject_flags(rubric: Rubric, payload: Mapping[str, Any]) -> tuple[str, ...]:
    raw = payload.get("reject_flags")
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, (list, tuple)):
        raise JudgementError("reject_flags", "reject_flags must be a list of flag keys")
    keys = [c.key for c in rubric.reject_flags]
    for i, k in enumerate(raw):
        if k not in keys:
            raise JudgementError(f"reject_flags[{i}]", f"reject_flags[{i}]: unknown reject flag {k!r}; "
                                                       f"expected some of {keys}")
        if k in raw[:i]:
            raise JudgementError(f"reject_flags[{i}]", f"reject_flags[{i}]: {k!r} is given twice")
    return tuple(k for k in keys if k in raw)


def validate_judgement(rubric: Rubric, payload: Mapping[str, Any], n_turns: int | None = None) -> CleanJudgement:
    """Check one annotator's payload against ``rubric``; raise :class:`JudgementError`.

    Common fields: ``note`` (optional string, stripped, at most :data:`NOTE_MAX_CHARS`),
    ``flagged`` (optional boolean; ``"on"``/``"true"``/``"1"`` etc. from forms accepted),
    ``time_spent_ms`` (required integer, 0 to 24 h). Unknown payload fields are ignored.

    Category rubrics: ``category`` (exactly one key), ``sub_reason`` (required when, and
    only when, that category has sub-reasons), optional ``also`` (further categories that
    apply: keys, or ``{"category", "sub_reason"}`` objects where a sub-reason is needed).
    The stored category is the most severe of all given; flags are set for all of them.
    A non-blank note is required when any chosen sub-reason requires one.

    Session rubrics: ``scales`` (every scale, an integer in its range),
    ``per_turn_checks`` (alias ``per_turn``: one object of every check's boolean per turn,
    exactly ``n_turns`` of them when given) and optional ``reject_flags`` (known keys).
    """
    if not isinstance(payload, Mapping):
        raise JudgementError("payload", f"payload must be an object, got {type(payload).__name__}")
    if n_turns is not None and (isinstance(n_turns, bool) or not isinstance(n_turns, int) or n_turns < 1):
        raise ValueError(f"n_turns must be a positive integer or None, got {n_turns!r}")
    note = _clean_note(payload)
    result: dict[str, Any] = {}
    if rubric.categories:
        result.update(_validate_categories(rubric, payload, note))
    if rubric.scales:
        result["scales"] = _validate_scales(rubric, payload)
    if rubric.per_turn_checks:
        result["per_turn_checks"] = _validate_per_turn(rubric, payload, n_turns)
    if rubric.reject_flags:
        result["reject_flags"] = _validate_reject_flags(rubric, payload)
    flagged = _clean_bool(payload.get("flagged"), "flagged", default=False)
    time_spent = _clean_time(payload)
    return CleanJudgement(rubric_key=rubric.key, rubric_version=rubric.version, note=note, flagged=flagged,
                          time_spent_ms=time_spent, **result)
