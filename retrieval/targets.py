"""Which targets of a query count for evaluation: one rule per dataset format (pure).

The audit (eligibility, ranks, labels), every metric, the reports and the validated
export call :func:`positive_targets`; nothing else decides it. A target is anything with
``relevance``, ``is_primary`` and ``role`` attributes (a ``retrieval.models.Target``, a
``retrieval.records.TargetRecord`` or a :class:`TargetFacts`).

* ``cirr``: the hard target only (role ``hard``). CIRR's protocol scores ``target_hard``;
  the soft targets (``target_soft``, role ``soft``) feed only the graded gains
  (:func:`graded_targets`, nDCG) and never count as hits.
* ``fashioniq``, ``lasco``: the target (the primary target).
* ``circo``: every ground truth (``gt_img_ids``).
* ``mbeir``: the qrels positives (role ``pos``: ``pos_cand_list`` and positive qrels lines).
* sessions, ``mtfiq``: the final target; ``circled``: its ``ground_truth_ids`` (the final
  targets: one for CIRR/FashionIQ sessions, all ground truths for CIRCO sessions). A
  turn's intermediate target is never a positive.
* any other format (``demo``, hand-made data): relevance > 0 and role not ``neg``.

Targets with role ``neg`` never count, whatever the format. Accepted alternatives (role
``alternative``: images that annotators judged to fit as well as the labelled target, added
by ``manage.py apply_alternatives``) count for every format, after the format's own positives.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class TargetLike(Protocol):
    relevance: float
    is_primary: bool
    role: str


@dataclass(frozen=True)
class TargetFacts:
    """The fields the rule reads, plus an identifier (image id) for the caller."""

    image: Any
    relevance: float = 1.0
    is_primary: bool = False
    role: str = "gt"


#: One line per format, shown in reports and the README.
RULES: dict[str, str] = {
    "cirr": "the hard target only (soft targets feed graded nDCG, never hits)",
    "fashioniq": "the target",
    "lasco": "the target",
    "circo": "every ground truth",
    "mbeir": "the qrels positives",
    "circled": "the session's final ground truths",
    "mtfiq": "the session's final target",
}
DEFAULT_RULE = "every target with relevance > 0 that is not a negative"
ALTERNATIVE = "alternative"  # the role of an accepted alternative (an extra ground truth)


def _any_positive(t: TargetLike) -> bool:
    return t.role not in ("neg", ALTERNATIVE) and t.relevance > 0


def _primary_or_all(targets: Sequence[TargetLike]) -> list[TargetLike]:
    """The primary target; when no target is marked primary, every positive one."""
    primary = [t for t in targets if t.is_primary and t.role != "neg"]
    return primary or [t for t in targets if _any_positive(t)]


def _cirr(targets: Sequence[TargetLike]) -> list[TargetLike]:
    hard = [t for t in targets if t.role == "hard"]
    return hard or [t for t in targets if t.is_primary and t.role != "neg"]


def _by_role(role: str):
    return lambda targets: [t for t in targets if t.role == role and t.relevance > 0]


_RULE_FUNCS = {
    "cirr": _cirr,
    "fashioniq": _primary_or_all,
    "lasco": _primary_or_all,
    "mtfiq": _primary_or_all,
    "circo": _by_role("gt"),
    "circled": _by_role("gt"),
    "mbeir": _by_role("pos"),
}


def rule_text(fmt: str) -> str:
    """The rule of ``fmt`` in words."""
    return RULES.get(fmt, DEFAULT_RULE)


def positive_targets(fmt: str, targets: Iterable[TargetLike]) -> list[Any]:
    """The targets of one query that count as positives for ``fmt``, in input order."""
    items = list(targets)
    rule = _RULE_FUNCS.get(fmt)
    labelled = [t for t in items if _any_positive(t)] if rule is None else rule(items)
    chosen = {id(t) for t in labelled}
    return labelled + [t for t in items if t.role == ALTERNATIVE and id(t) not in chosen]


def graded_targets(fmt: str, targets: Iterable[TargetLike]) -> list[tuple[Any, float]]:
    """``(target, gain)`` for graded nDCG: the positives (gain 1), then for CIRR every
    other target with a soft score > 0 (gain = that score). Input order within each part."""
    items = list(targets)
    positives = positive_targets(fmt, items)
    out = [(t, 1.0) for t in positives]
    if fmt == "cirr":
        chosen = {id(t) for t in positives}
        out.extend((t, float(t.relevance)) for t in items
                   if id(t) not in chosen and t.role == "soft" and t.relevance > 0)
    return out
