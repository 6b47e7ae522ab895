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

Negatives are decided here too (:func:`negative_targets`), and the M-BEIR candidate lists
of an export are placed from both (:func:`mbeir_candidates`), as UniIR's converters place
them (``src/data/preprocessing/cirr_data_preprocessor.py``, ``cirr_to_mbeir_entry``): a
CIRR target whose ``target_soft`` score is 1.0 goes to ``pos_cand_list``, one scored 0.5, 0.2
or -1 to ``neg_cand_list`` (the hard target too: CIRR val's pairid 29045 scores its own
``target_hard`` -1.0, so it is a negative there). A soft target scored 1.0 is therefore never a
negative (it is a gain-1.0 target of graded nDCG), although CIRR's own protocol does not count
it as a hit. A query left with no positive candidate is not exported as M-BEIR, as UniIR's
converters leave it out (:data:`MBEIR_NO_POSITIVE`; the export counts and names them). One
documented departure from UniIR, where CIRR's file is inconsistent: a hard target that
``target_soft`` does not list (37 val records, which score the reference 1.0 instead) is a
positive (UniIR leaves it out; the importer gives it relevance 1.0).
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


#: One line per format, shown in reports and the docs (docs/how-it-works/audit.md).
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
#: Why an M-BEIR export leaves a query out (:func:`mbeir_candidates` gives it no positive).
MBEIR_NO_POSITIVE = (
    "no positive candidate, every known target a negative (e.g. a CIRR query whose target_soft "
    "scores its target_hard below 1.0): UniIR's M-BEIR converters need a positive and leave such a "
    "query out (a query whose targets are not known, as in a hidden test split, is kept)"
)


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


def negative_targets(fmt: str, targets: Iterable[TargetLike]) -> list[Any]:
    """The targets of one query that are negatives for ``fmt``, in input order: role ``neg``
    (M-BEIR's ``neg_cand_list``), CIRR's soft targets scored below 1.0 (UniIR's rule), and,
    for formats other than CIRR, every target that is not a positive (relevance <= 0)."""
    items = list(targets)
    chosen = {id(t) for t in positive_targets(fmt, items)}
    if fmt == "cirr":
        return [t for t in items if id(t) not in chosen and (t.role == "neg" or t.relevance < 1.0)]
    return [t for t in items if id(t) not in chosen]


def mbeir_candidates(fmt: str, targets: Iterable[TargetLike]) -> tuple[list[Any], list[Any]]:
    """``(pos_cand_list, neg_cand_list)`` targets of one query in an M-BEIR export (module
    docstring): the positives (input order; the primary first where it comes first), then for
    CIRR the other targets scored 1.0; and :func:`negative_targets`. A target is in at most one.
    For CIRR, as UniIR's converter: a target scored below 1.0 is a negative, the hard one too;
    an empty ``pos_cand_list`` beside a non-empty ``neg_cand_list`` means the query is left out
    (:data:`MBEIR_NO_POSITIVE`); with no target known at all it is kept."""
    items = list(targets)
    if fmt == "cirr":
        return _cirr_mbeir(items)
    return positive_targets(fmt, items), negative_targets(fmt, items)


def _cirr_mbeir(items: list[TargetLike]) -> tuple[list[Any], list[Any]]:
    """UniIR's placement of CIRR's targets: scored 1.0 (the hard target first) positive, the
    others negative; accepted alternatives positive."""
    pos = [t for t in positive_targets("cirr", items) if t.role == ALTERNATIVE or t.relevance >= 1.0]
    taken = {id(t) for t in pos}
    pos += [t for t in items if id(t) not in taken and t.role not in ("neg", ALTERNATIVE) and t.relevance >= 1.0]
    taken = {id(t) for t in pos}
    return pos, [t for t in items if id(t) not in taken and (t.role == "neg" or t.relevance < 1.0)]


def graded_targets(fmt: str, targets: Iterable[TargetLike]) -> list[tuple[Any, float]]:
    """``(target, gain)`` for graded nDCG: the positives (gain 1), then for CIRR every
    other target with a soft score > 0 (gain = that score). Input order within each part."""
    items = list(targets)
    positives = positive_targets(fmt, items)
    out = [(t, 1.0) for t in positives]
    if fmt == "cirr":
        chosen = {id(t) for t in positives}
        out.extend(
            (t, float(t.relevance)) for t in items if id(t) not in chosen and t.role == "soft" and t.relevance > 0
        )
    return out
