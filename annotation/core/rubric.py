"""Annotation rubrics as data, and validation of one annotator's judgement against them.

No Django, no Celery. A rubric is a versioned, JSON-serialisable definition (stored in a
database JSON field): :meth:`Rubric.from_dict` validates it and raises
:class:`retrieval.records.ParseError` (a :class:`ValueError`) naming the rubric and the
offending path (``rubric.categories[2].key``); :meth:`Rubric.to_dict` gives the canonical
dictionary back. Both the definition and judgement payloads are read through
:class:`retrieval.validation.Record`, CIRVal's one validation approach; this module adds
the rubric's own rules (identifiers, shortcut keys, uniqueness, decision order).

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
offending payload field (``"category"``, ``"also[0].sub_reason"``, ``"scales.overall"``...);
unknown fields are refused.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from config.limits import fits_int64
from retrieval.records import ParseError
from retrieval.validation import Record, is_int, json_type

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
#: The label of a validated item in the CIRCUS format (an invalid one has its flags instead).
VALIDATED_LABEL = "VALIDATED"

#: CIRCUS's rule of thumb for QUERY_TOO_BROAD: 10 or more gallery images fit equally well
#: (a rubric's ``too_broad_threshold``, :attr:`Rubric.too_broad_threshold`, by default).
TOO_BROAD_THRESHOLD = 10
MAX_TOO_BROAD_THRESHOLD = 50

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
        return {
            "key": self.key,
            "label": self.label,
            "shortcut_key": self.shortcut_key,
            "requires_note": self.requires_note,
        }


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
        return {
            "key": self.key,
            "label": self.label,
            "description": self.description,
            "shortcut_key": self.shortcut_key,
            "severity": self.severity,
            "valid": self.valid,
            "sub_reasons": [s.to_dict() for s in self.sub_reasons],
        }


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
        return {"order": list(self.order), "validated_field": self.validated_field, "note_field": self.note_field}


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
        return {
            "key": self.key,
            "label": self.label,
            "description": self.description,
            "min": self.min,
            "max": self.max,
            "shortcut_key": self.shortcut_key,
            "anchors": {str(v): text for v, text in self.anchors},
        }


@dataclass(frozen=True)
class Check:
    """A named boolean (a per-turn check or a session reject flag)."""

    key: str
    label: str
    description: str = ""
    shortcut_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "description": self.description,
            "shortcut_key": self.shortcut_key,
        }


@dataclass(frozen=True)
class TurnVerdict:
    """A session rubric's per-turn verdict: every turn is answered valid or invalid
    (``valid_key`` / ``invalid_key`` set the focused turn). It is stored in each turn's
    object of ``per_turn_checks`` under ``key``; the session's own verdict is derived from
    the turns by :func:`annotation.core.turns.valid_prefix` (session rubric v2 on)."""

    key: str
    label: str
    description: str = ""
    valid_key: str = ""
    invalid_key: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "description": self.description,
            "valid_key": self.valid_key,
            "invalid_key": self.invalid_key,
        }


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
    turn_verdict: TurnVerdict | None = None
    #: QUERY_TOO_BROAD is suggested once this many candidates are ticked as fitting as well as
    #: the target (CIRCUS's rule of thumb: 10 or more images fit). One setting, read by the
    #: page's hint, the decision order's question and the agreement report.
    too_broad_threshold: int = TOO_BROAD_THRESHOLD

    # ---- accessors

    def category(self, key: str) -> Category | None:
        """The category with this key, or ``None``."""
        return next((c for c in self.categories if c.key == key), None)

    def verdict_label(self, category: str, sub_reason: str = "") -> str:
        """How an answer reads to a person: the category's label and its sub-reason's (the keys
        themselves for ones this rubric does not define)."""
        cat = self.category(category)
        sub = cat.sub_reason(sub_reason) if cat and sub_reason else None
        head = cat.label if cat else category
        return f"{head} / {sub.label if sub else sub_reason}" if sub_reason else head

    def session_answer_label(
        self, scales: dict[str, Any], per_turn: list[dict[str, Any]], reject_flags: list[str]
    ) -> str:
        """How a session answer reads to a person: each scale's label and rating (in the rubric's
        order; keys it does not define last), the turns' verdicts counted, and the reject flags'
        labels (``"Naturalness 4 · Coherence 3 · turns: 4 valid, 1 invalid · Duplicate"``)."""
        known = [(sc.label, scales[sc.key]) for sc in self.scales if sc.key in scales]
        known += [(k, v) for k, v in scales.items() if all(sc.key != k for sc in self.scales)]
        parts = [f"{label} {value}" for label, value in known]
        if self.turn_verdict is not None:
            said = [row.get(self.turn_verdict.key) for row in per_turn if isinstance(row, dict)]
            valid, invalid = sum(v is True for v in said), sum(v is False for v in said)
            if valid or invalid:
                parts.append(f"turns: {valid} valid, {invalid} invalid")
        labels = {c.key: c.label for c in self.reject_flags}
        parts += [labels.get(flag, flag) for flag in reject_flags]
        return " · ".join(parts)

    @property
    def valid_category(self) -> Category | None:
        """The single category with ``valid = True`` (category rubrics), else ``None``."""
        return next((c for c in self.categories if c.valid), None)

    def too_broad_rule(self, n_panel: int, n_wanted: int) -> dict[str, Any]:
        """What the item page says about :attr:`too_broad_threshold` for a candidate panel of
        ``n_panel`` images where the study asks for ``n_wanted``: the threshold, and
        ``too_small``, a sentence when the ticks cannot reach it on this panel (else ``None``).
        A panel shorter than the study's depth means the gallery itself ran short."""
        limit = self.too_broad_threshold
        note = None
        if n_panel < limit:
            note = (
                f"This gallery is too small for the too-broad rule: it has {n_panel} images besides the target "
                f"and the reference, fewer than the {limit} the rule counts."
                if n_panel < n_wanted
                else f"The panel shows {n_panel} candidates, fewer than the {limit} the too-broad rule counts: "
                "the ticks cannot reach it here."
            )
        return {"threshold": limit, "too_small": note}

    def by_severity(self) -> list[Category]:
        """Categories from most to least severe."""
        return sorted(self.categories, key=lambda c: -c.severity)

    # ---- (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON-serialisable definition (``from_dict`` round-trips it). A rubric
        without a turn verdict (every rubric before session v2) has no ``turn_verdict`` key."""
        out = {
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
        if self.turn_verdict is not None:
            out["turn_verdict"] = self.turn_verdict.to_dict()
        if self.too_broad_threshold != TOO_BROAD_THRESHOLD:  # stored definitions keep their bytes
            out["too_broad_threshold"] = self.too_broad_threshold
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rubric:
        """Parse and validate a definition; :class:`retrieval.records.ParseError` (a
        ValueError) names the rubric and the offending path."""
        return _parse_rubric(data)


# --------------------------------------------------------------------------- parsing

_RUBRIC_FIELDS = {
    "key",
    "version",
    "title",
    "kind",
    "description",
    "decision_order",
    "categories",
    "flags",
    "scales",
    "per_turn_checks",
    "reject_flags",
    "turn_verdict",
    "too_broad_threshold",
}
_CATEGORY_FIELDS = {"key", "label", "description", "shortcut_key", "severity", "valid", "sub_reasons"}
_SUB_REASON_FIELDS = {"key", "label", "shortcut_key", "requires_note"}
_SCALE_FIELDS = {"key", "label", "description", "min", "max", "shortcut_key", "anchors"}
_CHECK_FIELDS = {"key", "label", "description", "shortcut_key"}
_STEP_FIELDS = {"question", "category"}
_TURN_VERDICT_FIELDS = {"key", "label", "description", "valid_key", "invalid_key"}
_FLAG_SPEC_FIELDS = {"order", "validated_field", "note_field"}

# The definition is read through retrieval.validation.Record (one record, the root named
# ``rubric``, nested objects ``rubric.categories[2]``); what follows are the rubric's own
# rules on top of its typed accessors, failing through Record.fail like every other reader.


def _ident(rec: Record, name: str) -> str:
    """A required identifier: letters, digits and ``_``, starting with a letter."""
    value = rec.req_str(name, non_blank=True)
    if not _IDENT.match(value):
        rec.fail(name, f"{value!r} is not an identifier (letters, digits, '_', leading letter)")
    return value


def _text(rec: Record, name: str) -> str:
    """An optional free text (absent or null: empty)."""
    return rec.opt_str(name) or ""


def _shortcut(rec: Record, name: str, *, required: bool = True) -> str | None:
    """A shortcut key: one printable character the UI does not reserve."""
    value = rec.req_str(name) if required else rec.opt_str(name)
    if value is None:
        return None
    if len(value) != 1 or not value.isprintable() or value.isspace():
        rec.fail(name, f"must be a single printable character, got {value!r}")
    if value.casefold() in _RESERVED_FOLDED:
        action = next(a for k, a in RESERVED_KEYS.items() if k.casefold() == value.casefold())
        rec.fail(name, f"{value!r} is reserved by the UI for {action!r}")
    return value


def _unique(rec: Record, keys: Iterable[tuple[str, str]], what: str) -> None:
    """Fail on a repeated key; ``keys`` are (path relative to ``rec``, key) pairs."""
    seen: dict[str, str] = {}
    for path, key in keys:
        if key in seen:
            rec.fail(path, f"duplicate {what} {key!r} (also at {rec.prefix}.{seen[key]})")
        seen[key] = path


def _unique_shortcuts(rec: Record, keys: Iterable[tuple[str, str | None]], level: str) -> None:
    seen: dict[str, str] = {}
    for path, key in keys:
        if key is None:
            continue
        folded = key.casefold()
        if folded in seen:
            rec.fail(path, f"shortcut key {key!r} collides with {rec.prefix}.{seen[folded]} ({level})")
        seen[folded] = path


def _parse_sub_reason(r: Record) -> SubReason:
    return SubReason(
        key=_ident(r, "key"),
        label=r.req_str("label", non_blank=True),
        shortcut_key=_shortcut(r, "shortcut_key") or "",
        requires_note=bool(r.opt_bool("requires_note")),
    )


def _parse_category(r: Record) -> Category:
    subs = tuple(_parse_sub_reason(s) for s in r.objects("sub_reasons", "sub-reason", _SUB_REASON_FIELDS))
    _unique(r, ((f"sub_reasons[{i}].key", s.key) for i, s in enumerate(subs)), "sub-reason key")
    _unique_shortcuts(
        r, ((f"sub_reasons[{i}].shortcut_key", s.shortcut_key) for i, s in enumerate(subs)), "sub-reason level"
    )
    return Category(
        key=_ident(r, "key"),
        label=r.req_str("label", non_blank=True),
        description=_text(r, "description"),
        shortcut_key=_shortcut(r, "shortcut_key") or "",
        severity=r.req_int("severity"),
        valid=r.req_bool("valid"),
        sub_reasons=subs,
    )


def _parse_anchors(r: Record, lo: int, hi: int) -> tuple[tuple[int, str], ...]:
    """``anchors``: an object mapping a scale value (a string of digits) to its description."""
    anchors = r.nested("anchors", r.opt_obj("anchors") or {}, "anchors object")
    points: list[tuple[int, str]] = []
    for value in anchors.data:
        point = int(value) if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value) else None
        if point is None and is_int(value):
            point = value
        if point is None:
            r.fail("anchors", f"key {value!r} is not an integer")
        if str(point) != str(value).strip() or not lo <= point <= hi:
            r.fail("anchors", f"key {value!r} is not an integer within [{lo}, {hi}]")
        points.append((point, anchors.req_str(value)))
    _unique(r, (("anchors", str(p)) for p, _ in points), "anchor")
    return tuple(sorted(points))


def _parse_scale(r: Record) -> Scale:
    lo, hi = r.opt_int("min"), r.opt_int("max")
    lo, hi = 1 if lo is None else lo, 5 if hi is None else hi
    if lo >= hi:
        r.fail("max", f"must exceed min ({lo}), got {hi}")
    return Scale(
        key=_ident(r, "key"),
        label=r.req_str("label", non_blank=True),
        description=_text(r, "description"),
        min=lo,
        max=hi,
        shortcut_key=_shortcut(r, "shortcut_key", required=False),
        anchors=_parse_anchors(r, lo, hi),
    )


def _parse_check(r: Record) -> Check:
    return Check(
        key=_ident(r, "key"),
        label=r.req_str("label", non_blank=True),
        description=_text(r, "description"),
        shortcut_key=_shortcut(r, "shortcut_key", required=False),
    )


def _parse_turn_verdict(top: Record, kind: str, per_turn: tuple[Check, ...]) -> TurnVerdict | None:
    """The optional ``turn_verdict`` object (session rubrics only): a key distinct from the
    per-turn checks' and two shortcut keys, one per answer."""
    raw = top.opt_obj("turn_verdict")
    if raw is None:
        return None
    if kind != "session":
        top.fail("turn_verdict", "only session rubrics have a per-turn verdict")
    r = top.nested("turn_verdict", raw, "turn verdict object", _TURN_VERDICT_FIELDS)
    verdict = TurnVerdict(
        key=_ident(r, "key"),
        label=r.req_str("label", non_blank=True),
        description=_text(r, "description"),
        valid_key=_shortcut(r, "valid_key") or "",
        invalid_key=_shortcut(r, "invalid_key") or "",
    )
    if any(c.key == verdict.key for c in per_turn):
        r.fail("key", f"{verdict.key!r} is also a per-turn check key")
    return verdict


def _parse_rubric(data: Mapping[str, Any]) -> Rubric:
    where = "rubric"
    if isinstance(data, Mapping):
        where = f"rubric {data.get('key')!r} v{data.get('version')}"
    return _parse_rubric_body(Record(where, None, data, "rubric", prefix="rubric", allowed=_RUBRIC_FIELDS))


def _parse_decision_order(top: Record) -> list[DecisionStep]:
    return [
        DecisionStep(question=r.req_str("question", non_blank=True), category=r.opt_str("category") or None)
        for r in top.objects("decision_order", "decision step", _STEP_FIELDS)
    ]


def _check_unique_keys(
    top: Record,
    categories: tuple[Category, ...],
    scales: tuple[Any, ...],
    per_turn: tuple[Any, ...],
    rejects: tuple[Any, ...],
) -> None:
    _unique(top, ((f"categories[{i}].key", c.key) for i, c in enumerate(categories)), "category key")
    _unique(top, ((f"scales[{i}].key", s.key) for i, s in enumerate(scales)), "scale key")
    _unique(top, ((f"per_turn_checks[{i}].key", c.key) for i, c in enumerate(per_turn)), "per-turn check key")
    _unique(top, ((f"reject_flags[{i}].key", c.key) for i, c in enumerate(rejects)), "reject flag key")


def _check_shortcuts(
    top: Record,
    categories: tuple[Category, ...],
    scales: tuple[Any, ...],
    per_turn: tuple[Any, ...],
    rejects: tuple[Any, ...],
    extra: Sequence[tuple[str, str | None]] = (),
) -> None:
    """Keyboard: one first-level namespace; sub-reasons distinct from it; digits kept for scales."""
    first_level: list[tuple[str, str | None]] = [
        *((f"categories[{i}].shortcut_key", c.shortcut_key) for i, c in enumerate(categories)),
        *((f"scales[{i}].shortcut_key", s.shortcut_key) for i, s in enumerate(scales)),
        *((f"per_turn_checks[{i}].shortcut_key", c.shortcut_key) for i, c in enumerate(per_turn)),
        *((f"reject_flags[{i}].shortcut_key", c.shortcut_key) for i, c in enumerate(rejects)),
        *extra,
    ]
    _unique_shortcuts(top, first_level, "first level")
    first_folded = {k.casefold(): p for p, k in first_level if k is not None}
    sub_level = [
        (f"categories[{i}].sub_reasons[{j}].shortcut_key", s.shortcut_key)
        for i, c in enumerate(categories)
        for j, s in enumerate(c.sub_reasons)
    ]
    for p, k in sub_level:
        if k.casefold() in first_folded:
            top.fail(p, f"{k!r} collides with the first-level key at {top.prefix}.{first_folded[k.casefold()]}")
    if scales:
        for p, k in first_level + sub_level:
            if k is not None and k.isdigit():
                top.fail(p, f"digit {k!r} is reserved for setting scale values")


def _check_session_rubric(top: Record, categories: tuple[Category, ...], scales: tuple[Any, ...]) -> None:
    if not scales:
        top.fail("scales", "a session rubric needs at least one scale")
    if categories:
        top.fail("categories", "a session rubric has no categories (use kind 'category')")
    if top.data.get("flags") is not None:
        top.fail("flags", "only category rubrics have flag metadata")


def _parse_rubric_body(top: Record) -> Rubric:
    key = _ident(top, "key")
    version = top.req_int("version")
    if version < 1:
        top.fail("version", f"must be >= 1, got {version}")
    title = top.req_str("title", non_blank=True)
    kind = top.req_str("kind", non_blank=True)
    if kind not in KINDS:
        top.fail("kind", f"must be one of {list(KINDS)}, got {kind!r}")

    categories = tuple(_parse_category(r) for r in top.objects("categories", "category", _CATEGORY_FIELDS))
    scales = tuple(_parse_scale(r) for r in top.objects("scales", "scale", _SCALE_FIELDS))
    per_turn = tuple(_parse_check(r) for r in top.objects("per_turn_checks", "per-turn check", _CHECK_FIELDS))
    rejects = tuple(_parse_check(r) for r in top.objects("reject_flags", "reject flag", _CHECK_FIELDS))
    steps = _parse_decision_order(top)
    verdict = _parse_turn_verdict(top, kind, per_turn)
    _check_unique_keys(top, categories, scales, per_turn, rejects)
    _check_shortcuts(
        top,
        categories,
        scales,
        per_turn,
        rejects,
        ()
        if verdict is None
        else (("turn_verdict.valid_key", verdict.valid_key), ("turn_verdict.invalid_key", verdict.invalid_key)),
    )
    for i, step in enumerate(steps):
        if step.category is not None and all(c.key != step.category for c in categories):
            top.fail(f"decision_order[{i}].category", f"unknown category {step.category!r}")

    flags: FlagSpec | None = None
    if kind == "category":
        flags = _check_category_rubric(top, categories, steps)
    else:
        _check_session_rubric(top, categories, scales)

    broad = TOO_BROAD_THRESHOLD if top.data.get("too_broad_threshold") is None else top.req_int("too_broad_threshold")
    if not 1 <= broad <= MAX_TOO_BROAD_THRESHOLD:
        top.fail("too_broad_threshold", f"must be between 1 and {MAX_TOO_BROAD_THRESHOLD}, got {broad}")
    return Rubric(
        key=key,
        version=version,
        title=title,
        kind=kind,
        description=_text(top, "description"),
        decision_order=tuple(steps),
        categories=categories,
        flags=flags,
        scales=scales,
        per_turn_checks=per_turn,
        reject_flags=rejects,
        turn_verdict=verdict,
        too_broad_threshold=broad,
    )


def _check_category_set(top: Record, categories: tuple[Category, ...]) -> Category:
    """Two or more categories, exactly one valid and least severe; returns the valid one."""
    if len(categories) < 2:
        top.fail("categories", "a category rubric needs at least two categories")
    valid = [c for c in categories if c.valid]
    if len(valid) != 1:
        top.fail("categories", f"exactly one category must have valid = true, found {len(valid)}")
    _unique(top, ((f"categories[{i}].severity", str(c.severity)) for i, c in enumerate(categories)), "severity")
    if any(c.severity <= valid[0].severity for c in categories if not c.valid):
        top.fail("categories", f"the valid category {valid[0].key!r} must be the least severe")
    return valid[0]


def _check_category_steps(
    top: Record, categories: tuple[Category, ...], steps: Sequence[DecisionStep], valid: Category
) -> None:
    """The decision order names one category a step, reaches them all and ends with the valid one."""
    if not steps:
        top.fail("decision_order", "a category rubric needs a decision order")
    step_cats = [s.category for s in steps]
    if None in step_cats:
        top.fail(f"decision_order[{step_cats.index(None)}].category", "is required in a category rubric")
    _unique(top, ((f"decision_order[{i}].category", str(c)) for i, c in enumerate(step_cats)), "decision step category")
    missing = [c.key for c in categories if c.key not in step_cats]
    if missing:
        top.fail("decision_order", f"does not reach categories {missing}")
    if step_cats[-1] != valid.key:
        top.fail("decision_order", f"must end with the valid category {valid.key!r}")


def _parse_flag_spec(r: Record, invalid_keys: list[str]) -> FlagSpec:
    order = r.req_str_list("order")
    if sorted(order) != sorted(invalid_keys) or len(set(order)) != len(order):
        r.fail("order", f"must list every invalid category exactly once: {sorted(invalid_keys)}")
    spec = FlagSpec(
        order=tuple(order),
        validated_field=_ident(r, "validated_field") if r.data.get("validated_field") is not None else "validated",
        note_field=_ident(r, "note_field") if r.data.get("note_field") is not None else "other",
    )
    clash = {spec.validated_field, spec.note_field} & set(spec.order)
    if spec.validated_field == spec.note_field or clash:
        r.fail("validated_field", "the validated and note fields must differ from each other and the flags")
    return spec


def _check_category_rubric(top: Record, categories: tuple[Category, ...], steps: Sequence[DecisionStep]) -> FlagSpec:
    valid = _check_category_set(top, categories)
    _check_category_steps(top, categories, steps, valid)
    invalid_keys = [c.key for c in categories if not c.valid]
    raw = top.opt_obj("flags")
    if raw is None:
        return FlagSpec(order=tuple(invalid_keys))
    return _parse_flag_spec(top.nested("flags", raw, "flags object", _FLAG_SPEC_FIELDS), invalid_keys)


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
    return {
        "key": key,
        "label": label,
        "description": description,
        "min": 1,
        "max": 5,
        "shortcut_key": shortcut,
        "anchors": {"1": "very poor", "3": "acceptable", "5": "excellent"},
    }


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
        {
            "key": "real_difference_toward_target",
            "label": "Describes a real difference toward the target",
            "description": "The turn's text names a difference between its reference and the target.",
            "shortcut_key": "j",
        },
        {
            "key": "consistent_with_history",
            "label": "Reference consistent with the history",
            "description": "The turn's reference image is consistent with the earlier turns.",
            "shortcut_key": "k",
        },
    ],
    "reject_flags": [
        {"key": "duplicate", "label": "Duplicate", "description": "A turn repeats an image.", "shortcut_key": "z"},
        {
            "key": "inconsistency",
            "label": "Inconsistency",
            "description": "An attribute already reached is lost.",
            "shortcut_key": "x",
        },
        {
            "key": "conflict",
            "label": "Conflict",
            "description": "A turn contradicts an earlier one.",
            "shortcut_key": "c",
        },
        {
            "key": "circle",
            "label": "Circle",
            "description": "The session returns to an earlier image.",
            "shortcut_key": "v",
        },
    ],
}


#: The CIRVal session rubric, version 2 (issue 26, "a turn-by-turn verdict"): version 1 plus a
#: valid / invalid verdict on every turn (``a`` valid, ``d`` invalid, for the focused turn).
#: A session is valid when every turn is and no reject flag holds; its longest valid prefix
#: is kept too (:mod:`annotation.core.turns`). The scales are still rated (reports) but
#: no longer decide a session. Version 1 stays readable: its studies keep their rule.
SESSION_RUBRIC_V2: dict[str, Any] = {
    **copy.deepcopy(SESSION_RUBRIC_V1),
    "version": 2,
    "title": "Quality of a multi-turn session, turn by turn",
    "description": "Look at the whole filmstrip (each turn's reference image and text, the target marked). "
    "Give every turn a verdict: valid (a) when it is a sound step of the session, invalid (d) "
    "otherwise; answer the two checks for every turn, rate the session on 1-5 scales and tick any "
    "reject flag. The session is valid when every turn is valid and no reject flag holds; "
    "its valid turns before the first invalid one are kept as a valid prefix.",
    "turn_verdict": {
        "key": "valid",
        "label": "Turn valid",
        "description": "The turn is a sound step of the session: a clear request, a correct "
        "reference and a change toward the target.",
        "valid_key": "a",
        "invalid_key": "d",
    },
}

#: Every shipped rubric definition, oldest version first.
BUILTIN_DEFINITIONS: tuple[dict[str, Any], ...] = (VALIDITY_RUBRIC_V1, SESSION_RUBRIC_V1, SESSION_RUBRIC_V2)


def builtin_rubric(key: str, version: int | None = None) -> Rubric:
    """A shipped rubric (a fresh object): ``version`` or, by default, the newest of ``key``.
    ``KeyError`` for an unknown key or version."""
    found = [d for d in BUILTIN_DEFINITIONS if d["key"] == key and (version is None or d["version"] == version)]
    if not found:
        raise KeyError(f"{key} v{version}" if version is not None else key)
    return Rubric.from_dict(copy.deepcopy(max(found, key=lambda d: d["version"])))


def builtin_rubrics() -> dict[str, Rubric]:
    """The shipped rubrics by key, the newest version of each: ``validity`` v1 and
    ``session`` v2 (fresh objects); :func:`builtin_rubric` gives older versions."""
    return {d["key"]: builtin_rubric(d["key"]) for d in BUILTIN_DEFINITIONS}


# --------------------------------------------------------------------------- judgements


#: How a judgement payload is named as the source of a :class:`JudgementError`.
PAYLOAD = "judgement payload"


class JudgementError(ParseError):
    """A refused judgement payload; ``field`` names the offending field by its path in the
    payload (``"category"``, ``"also[0].sub_reason"``, ``"scales.overall"``; ``"payload"``
    for the payload itself). A :class:`retrieval.records.ParseError` from :data:`PAYLOAD`;
    ``str()`` gives the message, prefixed with the field unless the message starts with it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(PAYLOAD, None, field, message)
        self.args = (message if message.startswith(field) else f"{field}: {message}",)

    @classmethod
    def of(cls, exc: ParseError) -> JudgementError:
        """The error a payload Record raised, as a JudgementError naming the field path."""
        name = exc.field or "payload"
        return cls(name, f"{name}: {exc.message}")


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
            "rubric_key": self.rubric_key,
            "rubric_version": self.rubric_version,
            "note": self.note,
            "flagged": self.flagged,
            "time_spent_ms": self.time_spent_ms,
            "category": self.category,
            "sub_reason": self.sub_reason,
            "categories": list(self.categories),
            "sub_reasons": dict(self.sub_reasons),
            "flags": dict(self.flags),
            "validated": self.validated,
            "signature": self.signature,
            "scales": dict(self.scales),
            "per_turn_checks": [dict(t) for t in self.per_turn_checks],
            "reject_flags": list(self.reject_flags),
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


def signature(
    flags: Mapping[str, bool] | Iterable[str], validated: bool, order: Sequence[str] = CIRCUS_FLAG_ORDER
) -> str:
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


#: The fields a judgement payload may hold (whatever the rubric kind); others are ignored.
#: ``alternatives`` is checked by :mod:`annotation.alternatives.payload`.
PAYLOAD_FIELDS = frozenset(
    {
        "note",
        "flagged",
        "time_spent_ms",
        "category",
        "sub_reason",
        "also",
        "scales",
        "per_turn_checks",
        "per_turn",
        "reject_flags",
        "alternatives",
    }
)
_ALSO_FIELDS = frozenset({"category", "sub_reason"})
_DIGITS = re.compile(r"\s*[+-]?\d+\s*")


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _clean_note(rec: Record) -> str:
    note = (rec.opt_str("note") or "").strip()
    if len(note) > NOTE_MAX_CHARS:
        rec.fail("note", f"{len(note)} characters long; at most {NOTE_MAX_CHARS} allowed")
    return note


def _form_bool(rec: Record, name: str, *, default: bool) -> bool:
    """A boolean; also 0/1 and the strings of form posts (``"on"``, ``"true"``, ``"1"``...)."""
    value = rec.data.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if is_int(value) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE_STRINGS | _FALSE_STRINGS:
        return value.strip().lower() in _TRUE_STRINGS
    rec.fail(name, f"expected true or false, got {json_type(value)} ({value!r})")


def _form_int(rec: Record, name: str) -> int:
    """A present integer, an integral number (``1500.0``: JavaScript clients send those) or
    a string of digits (form posts); booleans and fractional numbers are refused."""
    value = rec.data.get(name)
    if is_int(value):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        if not fits_int64(int(value)):  # 1e300 is integral too: never echoed in full
            rec.fail(name, f"out of range ({value:.3g})")
        return int(value)
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        if len(value.strip().lstrip("+-")) > 18:  # never converted: Python refuses 4,300 digits
            rec.fail(name, f"out of range ({len(value.strip())} digits)")
        return int(value)
    rec.fail(name, f"expected an integer, got {json_type(value)} ({value!r})")


def _clean_time(rec: Record) -> int:
    if rec.data.get("time_spent_ms") is None:
        rec.fail("time_spent_ms", "required (milliseconds spent on the item)")
    t = _form_int(rec, "time_spent_ms")
    if t < 0:
        rec.fail("time_spent_ms", f"must not be negative, got {t}")
    if t > TIME_SPENT_MAX_MS:
        rec.fail("time_spent_ms", f"must be at most {TIME_SPENT_MAX_MS} (24 h), got {t}")
    return t


def _category_and_sub(
    rubric: Rubric, rec: Record, cat_field: str, sub_field: str, cat_value: Any, sub_value: Any
) -> tuple[Category, SubReason | None]:
    """The category ``cat_value`` (field ``cat_field`` of ``rec``) and its sub-reason."""
    if _missing(cat_value):
        rec.fail(cat_field, f"required: pick exactly one of {[c.key for c in rubric.categories]}")
    if not isinstance(cat_value, str):
        rec.fail(cat_field, f"expected exactly one category key, got {json_type(cat_value)} ({cat_value!r})")
    category = rubric.category(cat_value)
    if category is None:
        rec.fail(cat_field, f"unknown category {cat_value!r}; expected one of {[c.key for c in rubric.categories]}")
    if not category.sub_reasons:
        if not _missing(sub_value):
            rec.fail(sub_field, f"category {category.key} takes no sub-reason, got {sub_value!r}")
        return category, None
    options = [s.key for s in category.sub_reasons]
    if _missing(sub_value):
        rec.fail(sub_field, f"required for category {category.key}: one of {options}")
    sub = category.sub_reason(sub_value) if isinstance(sub_value, str) else None
    if sub is None:
        rec.fail(sub_field, f"unknown sub-reason {sub_value!r} for category {category.key}; expected one of {options}")
    return category, sub


def _also_categories(rubric: Rubric, rec: Record, chosen: list[tuple[Category, Any]]) -> None:
    """Append the ``also`` categories (a key, an object or a list of them) to ``chosen``."""
    also = rec.data.get("also")
    if isinstance(also, (str, Mapping)):
        also = [also]
    if not isinstance(also, list):
        rec.fail("also", f"expected a list of categories, got {json_type(also)}")
    for i, entry in enumerate(also):
        name = f"also[{i}]"
        if isinstance(entry, Mapping):
            obj = rec.nested(name, entry, "also entry", _ALSO_FIELDS)
            chosen.append(
                _category_and_sub(rubric, obj, "category", "sub_reason", entry.get("category"), entry.get("sub_reason"))
            )
        else:
            chosen.append(_category_and_sub(rubric, rec, name, f"{name}.sub_reason", entry, None))
        if any(c.key == chosen[-1][0].key for c, _ in chosen[:-1]):
            rec.fail(name, f"category {chosen[-1][0].key} is given twice")


def _validate_categories(rubric: Rubric, rec: Record, note: str) -> dict[str, Any]:
    chosen = [
        _category_and_sub(rubric, rec, "category", "sub_reason", rec.data.get("category"), rec.data.get("sub_reason"))
    ]
    if rec.data.get("also") is not None:
        _also_categories(rubric, rec, chosen)

    needs_note = [f"{c.key}/{s.key}" for c, s in chosen if s is not None and s.requires_note]
    if needs_note and not note:
        rec.fail("note", f"required (non-blank) for sub-reason {', '.join(needs_note)}")

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


def _validate_scales(rubric: Rubric, rec: Record) -> dict[str, int]:
    keys = [s.key for s in rubric.scales]
    if rec.data.get("scales") is None:
        rec.fail("scales", f"required: {keys}")
    scales = rec.nested("scales", rec.req_obj("scales"), "scales object", keys)
    out: dict[str, int] = {}
    for s in rubric.scales:
        if _missing(scales.data.get(s.key)):
            scales.fail(s.key, f"required ({s.min}-{s.max})")
        value = _form_int(scales, s.key)
        if not s.min <= value <= s.max:
            scales.fail(s.key, f"must lie within [{s.min}, {s.max}], got {value}")
        out[s.key] = value
    return out


def _validate_per_turn(rubric: Rubric, rec: Record, n_turns: int | None) -> list[dict[str, bool]]:
    if rec.has("per_turn_checks") and rec.has("per_turn"):
        rec.fail("per_turn_checks", "give per_turn_checks or its alias per_turn, not both")
    name = "per_turn" if rec.has("per_turn") else "per_turn_checks"
    if rec.data.get(name) is None:
        rec.fail(name, "required: one object of booleans per turn")
    raw = rec.req_list(name)
    if n_turns is not None and len(raw) != n_turns:
        rec.fail(name, f"has {len(raw)} entries; the session has {n_turns} turns")
    if not raw:
        rec.fail(name, "must not be empty")
    keys = [c.key for c in rubric.per_turn_checks] + ([rubric.turn_verdict.key] if rubric.turn_verdict else [])
    turns = (rec.nested(f"{name}[{i}]", turn, f"turn (booleans {keys})", keys) for i, turn in enumerate(raw))
    return [{k: turn.req_bool(k) for k in keys} for turn in turns]


def _validate_reject_flags(rubric: Rubric, rec: Record) -> tuple[str, ...]:
    raw = rec.data.get("reject_flags")
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        rec.fail("reject_flags", f"expected a list of flag keys, got {json_type(raw)}")
    keys = [c.key for c in rubric.reject_flags]
    for i, k in enumerate(raw):
        if k not in keys:
            rec.fail(f"reject_flags[{i}]", f"unknown reject flag {k!r}; expected some of {keys}")
        if k in raw[:i]:
            rec.fail(f"reject_flags[{i}]", f"{k!r} is given twice")
    return tuple(k for k in keys if k in raw)


def validate_judgement(rubric: Rubric, payload: Mapping[str, Any], n_turns: int | None = None) -> CleanJudgement:
    """Check one annotator's payload against ``rubric``; raise :class:`JudgementError`.

    The payload is read through :class:`retrieval.validation.Record`. Top-level fields
    outside :data:`PAYLOAD_FIELDS` are ignored, as the API has always done (clients may send
    their own bookkeeping); unknown fields of its nested objects are refused.

    Common fields: ``note`` (optional string, stripped, at most :data:`NOTE_MAX_CHARS`),
    ``flagged`` (optional boolean; ``"on"``/``"true"``/``"1"`` etc. from forms accepted),
    ``time_spent_ms`` (required integer, or a string of digits, 0 to 24 h; booleans and
    floats are refused).

    Category rubrics: ``category`` (exactly one key), ``sub_reason`` (required when, and
    only when, that category has sub-reasons), optional ``also`` (further categories that
    apply: keys, or ``{"category", "sub_reason"}`` objects where a sub-reason is needed).
    The stored category is the most severe of all given; flags are set for all of them.
    A non-blank note is required when any chosen sub-reason requires one.

    Session rubrics: ``scales`` (every scale, an integer in its range),
    ``per_turn_checks`` (alias ``per_turn``: one object of every check's boolean per turn,
    exactly ``n_turns`` of them when given; with a turn verdict (session v2) each object
    also holds the turn's valid / invalid boolean under the verdict's key, e.g.
    ``{"valid": true, ...}``) and optional ``reject_flags`` (known keys).
    """
    if n_turns is not None and (isinstance(n_turns, bool) or not isinstance(n_turns, int) or n_turns < 1):
        raise ValueError(f"n_turns must be a positive integer or None, got {n_turns!r}")
    try:
        return _validate_payload(rubric, Record(PAYLOAD, None, payload, PAYLOAD), n_turns)
    except JudgementError:
        raise
    except ParseError as exc:
        raise JudgementError.of(exc) from None


def _validate_payload(rubric: Rubric, rec: Record, n_turns: int | None) -> CleanJudgement:
    note = _clean_note(rec)
    result: dict[str, Any] = {}
    if rubric.categories:
        result.update(_validate_categories(rubric, rec, note))
    if rubric.scales:
        result["scales"] = _validate_scales(rubric, rec)
    if rubric.per_turn_checks or rubric.turn_verdict is not None:
        result["per_turn_checks"] = _validate_per_turn(rubric, rec, n_turns)
    if rubric.reject_flags:
        result["reject_flags"] = _validate_reject_flags(rubric, rec)
    flagged = _form_bool(rec, "flagged", default=False)
    time_spent = _clean_time(rec)
    return CleanJudgement(
        rubric_key=rubric.key,
        rubric_version=rubric.version,
        note=note,
        flagged=flagged,
        time_spent_ms=time_spent,
        **result,
    )
