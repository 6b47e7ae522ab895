"""A study's settings in typed groups, each with its own rules (pure; no Django).

``annotation.models.Study`` keeps one column per setting (no migration); these groups name
which columns belong together and check them together, once, for every way a study is made
or changed: the study form and the REST API (``annotation.forms``, ``annotation.api``), the
``create_study`` command and building (``annotation.studies.building``), the settings page and
the admin (``Study.clean``). Each group lists its fields once (``FIELDS``, the dataclass's
fields, :meth:`SettingsGroup.field_names`); ``Study.quorum_settings`` etc. build a group from the columns.

Fields, by group (``Study`` columns unless said):

* :class:`QuorumSettings`: how many annotators judge an item and how their votes decide it
  (the quorum rule, :func:`annotation.core.consensus.study_quorum_rule`).
* :class:`GoldSettings`: gold items and the quality checks (training, too fast, straight-lining).
* :class:`ServingSettings`: how items are served (order, lease, candidate panel, blindness).
* :class:`EstimateSettings`: an estimate study's sampling target (``Study.estimate``).
* Interactive studies keep :class:`annotation.core.rounds.InteractiveSettings` (``Study.interactive``).

Building a group never raises (a stored study is always readable); :meth:`problems` says what
breaks the rules, setting by setting, and :meth:`validate` raises :class:`SettingsError`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from annotation.core.consensus import DEFAULT_CONFIDENCE, MAJORITY, RELIABILITY, QuorumRule, study_quorum_rule
from annotation.core.serving import SERVE_RANDOM, SERVE_SUSPICION
from retrieval.fusion import MAX_CANDIDATES

MAX_OVERLAP = 50  # annotators per item, and the adaptive overlap's maximum
CONSENSUS_POLICIES = (MAJORITY, RELIABILITY)
MIN_CONFIDENCE, MAX_CONFIDENCE = 0.5, 1.0
SERVE_ORDERS = (SERVE_RANDOM, SERVE_SUSPICION)
MAX_LEASE_MINUTES = 240
MIN_STRAIGHT_RUN = 2
MAX_ESTIMATE_HALF_WIDTH = 0.5
MAX_ESTIMATE_STRATA = 8
DEFAULT_ESTIMATE_HALF_WIDTH = 0.03
DEFAULT_ESTIMATE_STRATA = 4


class SettingsError(ValueError):
    """Settings that break their group's rules; ``problems``: setting name -> what is wrong."""

    def __init__(self, problems: Mapping[str, str]) -> None:
        self.problems = dict(problems)
        super().__init__("; ".join(self.problems.values()))


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def int_between(value: Any, low: int, high: int | None = None) -> bool:
    return is_int(value) and value >= low and (high is None or value <= high)


class SettingsGroup:
    """What every group does: list its fields, be built from columns or values, check itself."""

    @classmethod
    @functools.cache
    def field_names(cls) -> tuple[str, ...]:
        """The group's settings, in order: its dataclass fields (listed once, in the class)."""
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]

    @classmethod
    def of(cls, source: Any):
        """The group of an object holding its fields as attributes (a ``Study``, a ``StudySpec``);
        a field the object lacks takes its default."""
        return cls(**{name: getattr(source, name) for name in cls.field_names() if hasattr(source, name)})

    @classmethod
    def from_values(cls, values: Mapping[str, Any]):
        """The group from a mapping (a form's cleaned data); a missing field takes its default."""
        return cls(**{name: values[name] for name in cls.field_names() if name in values})

    def rules(self) -> Iterable[tuple[str, bool, str]]:
        """(setting, whether it keeps its rule, the rule in words) of each of the group's rules."""
        raise NotImplementedError

    def problems(self) -> dict[str, str]:
        """Setting -> what is wrong with it (empty: the group keeps its rules)."""
        return {name: f"{rule}, got {getattr(self, name)!r}" for name, ok, rule in self.rules() if not ok}

    def validate(self):
        """This group, if it keeps its rules; else :class:`SettingsError`."""
        problems = self.problems()
        if problems:
            raise SettingsError(problems)
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class QuorumSettings(SettingsGroup):
    """How many annotators judge an item and how their votes decide it."""

    overlap: int = 3  # annotators per item
    quorum: int | None = None  # current judgements before an item is decided; None: the overlap
    adaptive_max: int | None = None  # adaptive overlap: one more annotator while they disagree, up to this
    consensus: str = MAJORITY  # the consensus policy: majority or reliability (Dawid-Skene weighted)
    adaptive_confidence: float = DEFAULT_CONFIDENCE  # reliability-weighted adaptive overlap: settle a split this sure

    def rules(self) -> Iterable[tuple[str, bool, str]]:
        overlap_ok = int_between(self.overlap, 1, MAX_OVERLAP)
        quorum_ok = int_between(self.quorum, 1) and (not overlap_ok or self.quorum <= self.overlap)
        most_ok = int_between(self.adaptive_max, 2, MAX_OVERLAP) and (
            not overlap_ok or self.adaptive_max > self.overlap
        )
        return (
            ("overlap", overlap_ok, f"overlap must be between 1 and {MAX_OVERLAP}"),
            ("quorum", self.quorum is None or quorum_ok, f"quorum must lie between 1 and the overlap ({self.overlap})"),
            (
                "adaptive_max",
                self.adaptive_max is None or most_ok,
                f"More than the overlap ({self.overlap}), or empty: the adaptive overlap's maximum "
                f"(adaptive_max, at most {MAX_OVERLAP})",
            ),
            ("consensus", self.consensus in CONSENSUS_POLICIES, f"consensus must be {' or '.join(CONSENSUS_POLICIES)}"),
            (
                "adaptive_confidence",
                is_number(self.adaptive_confidence) and MIN_CONFIDENCE <= self.adaptive_confidence <= MAX_CONFIDENCE,
                f"adaptive_confidence must be between {MIN_CONFIDENCE} and {MAX_CONFIDENCE}",
            ),
        )

    @property
    def rule(self) -> QuorumRule:
        """THE quorum rule of these settings (``Study.quorum_rule``)."""
        return study_quorum_rule(self.overlap, self.quorum, self.adaptive_max, self.consensus, self.adaptive_confidence)


@dataclass(frozen=True)
class GoldSettings(SettingsGroup):
    """Gold items in each annotator's queue and the quality checks staff are shown."""

    gold_rate: float = 0.05  # share of each annotator's queue drawn from gold items
    training_items: int = 0  # gold items (with feedback) before real items
    too_fast_seconds: float = 5.0  # judgements faster than this are flagged
    straight_run: int = 8  # this many identical answers in a row are flagged

    def rules(self) -> Iterable[tuple[str, bool, str]]:
        return (
            (
                "gold_rate",
                is_number(self.gold_rate) and 0 <= self.gold_rate <= 1,
                "gold_rate must be a rate between 0 and 1",
            ),
            (
                "training_items",
                int_between(self.training_items, 0),
                "training_items must be a whole number, at least 0",
            ),
            (
                "too_fast_seconds",
                is_number(self.too_fast_seconds) and self.too_fast_seconds >= 0,
                "too_fast_seconds must be at least 0 seconds",
            ),
            (
                "straight_run",
                int_between(self.straight_run, MIN_STRAIGHT_RUN),
                f"straight_run must be at least {MIN_STRAIGHT_RUN}",
            ),
        )


@dataclass(frozen=True)
class ServingSettings(SettingsGroup):
    """How items are served: which fresh item first, how long it is held, what the page shows."""

    serve_order: str = SERVE_RANDOM  # the seeded shuffle, or the most suspicious first
    lease_minutes: int = 10  # how long a served item stays reserved
    candidates: int = 20  # candidate images per single-turn item
    blind: bool = True  # hide audit ranks from annotators

    def rules(self) -> Iterable[tuple[str, bool, str]]:
        return (
            ("serve_order", self.serve_order in SERVE_ORDERS, f"serve order must be one of {', '.join(SERVE_ORDERS)}"),
            (
                "lease_minutes",
                int_between(self.lease_minutes, 1, MAX_LEASE_MINUTES),
                f"lease_minutes must be between 1 and {MAX_LEASE_MINUTES}",
            ),
            (
                "candidates",
                int_between(self.candidates, 0, MAX_CANDIDATES),
                f"candidates must be between 0 and {MAX_CANDIDATES}",
            ),
            ("blind", isinstance(self.blind, bool), "blind must be true or false"),
        )


@dataclass(frozen=True)
class EstimateSettings(SettingsGroup):
    """An estimate study's sampling target (``Study.estimate`` also keeps its plan and stop)."""

    target_half_width: float = DEFAULT_ESTIMATE_HALF_WIDTH  # stop once the overall rate's 95 % interval is this narrow
    strata: int = DEFAULT_ESTIMATE_STRATA  # suspicion strata
    reallocate: bool = False  # re-plan the allocation from the observed rates

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None) -> EstimateSettings:
        """From stored or asked-for settings (numbers as text accepted); unknown keys (the plan,
        the stop) are left out. :class:`SettingsError` when a number does not parse."""
        data = dict(data or {})
        try:
            target = float(data.get("target_half_width", DEFAULT_ESTIMATE_HALF_WIDTH))
            strata = int(data.get("strata", DEFAULT_ESTIMATE_STRATA))
        except (TypeError, ValueError):
            raise SettingsError(
                {"estimate": "estimate: target_half_width must be a number and strata an integer"}
            ) from None
        return cls(target, strata, bool(data.get("reallocate", False)))

    def rules(self) -> Iterable[tuple[str, bool, str]]:
        return (
            (
                "target_half_width",
                is_number(self.target_half_width) and 0 < self.target_half_width <= MAX_ESTIMATE_HALF_WIDTH,
                f"estimate: the target half-width must lie in (0, {MAX_ESTIMATE_HALF_WIDTH}]",
            ),
            (
                "strata",
                int_between(self.strata, 1, MAX_ESTIMATE_STRATA),
                f"estimate: strata must lie between 1 and {MAX_ESTIMATE_STRATA}",
            ),
        )


#: The groups checked whenever a study's columns are (``Study.clean``, building a study).
COLUMN_GROUPS: tuple[type[SettingsGroup], ...] = (QuorumSettings, GoldSettings, ServingSettings)


def column_problems(source: Any) -> dict[str, str]:
    """Every column group's problems, setting by setting, of an object holding the columns."""
    out: dict[str, str] = {}
    for group in COLUMN_GROUPS:
        out.update(group.of(source).problems())
    return out
