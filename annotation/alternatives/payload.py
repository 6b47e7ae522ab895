"""The ``alternatives`` field of a judgement: the candidates an annotator ticked as fitting the
query as well as the labelled target. Pure: no Django."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from annotation.core.rubric import JudgementError

FIELD = "alternatives"
NONE_FIT = "none_fit"


def clean_alternatives(value: Any, candidates: Sequence[int]) -> list[int]:
    """The ticked image ids in panel order; raise :class:`JudgementError` unless ``value`` is
    absent/None or a list of distinct integer ids taken from the item's own ``candidates``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise JudgementError(FIELD, "must be a list of candidate image ids")
    allowed = {c: n for n, c in enumerate(candidates)}
    seen: set[int] = set()
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise JudgementError(FIELD, f"{v!r} is not an image id")
        if v not in allowed:
            raise JudgementError(FIELD, f"image {v} is not one of this item's candidates")
        if v in seen:
            raise JudgementError(FIELD, f"image {v} is ticked twice")
        seen.add(v)
    return sorted(seen, key=allowed.__getitem__)


def clean_none_fit(value: Any, alternatives: Sequence[int]) -> bool:
    """Whether the annotator said that none of the candidates fits (the page's "None fit",
    key 0): a boolean, absent/None meaning no; it cannot go with ticked ``alternatives``.
    Stored so that "looked, none fits" is told apart from "ticked nothing"."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise JudgementError(NONE_FIT, "must be true or false")
    if value and alternatives:
        raise JudgementError(NONE_FIT, "“None fit” cannot go with ticked candidates")
    return value


def too_broad(n_ticked: int, threshold: int) -> bool:
    """Whether so many ticks suggest QUERY_TOO_BROAD (CIRCUS's rule of thumb: 10 or more)."""
    return threshold > 0 and n_ticked >= threshold
