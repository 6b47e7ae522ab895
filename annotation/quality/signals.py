"""Quality signals over one annotator's judgements (pure: no Django).

* :func:`wilson_interval`: the Wilson score interval of a binomial proportion (accuracy
  on gold items), Wilson (1927), with z = 1.959964 for 95 %; :func:`wilson` reads it for a
  proportion at any sample size (the estimate studies' effective one).
* :func:`too_fast`: how many judgements took less than a threshold.
* :func:`straight_runs`: runs of at least N identical answers in a row (straight-lining).
* :func:`disagreement`: how often an annotator's vote differs from the item's eventual
  consensus (decided items only; the consensus itself comes from
  :func:`annotation.core.consensus.decide`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import NamedTuple

Z95 = 1.959963984540054


def wilson(p: float, n: float, z: float = Z95) -> tuple[float, float]:
    """(low, high) of Wilson's score interval for a proportion ``p`` read at sample size ``n``
    (a real ``n`` too: an effective sample size, as the estimate studies read theirs).
    ``n <= 0`` gives (0.0, 1.0): nothing is known."""
    if n <= 0:
        return 0.0, 1.0
    z2 = z * z
    centre = p + z2 / (2 * n)
    margin = z * math.sqrt(max(p * (1 - p), 0.0) / n + z2 / (4 * n * n))
    denom = 1 + z2 / n
    return max(0.0, (centre - margin) / denom), min(1.0, (centre + margin) / denom)


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """(low, high) of the Wilson score interval for ``successes`` out of ``n``.

    ``n = 0`` gives (0.0, 1.0): nothing is known.
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if z <= 0:
        raise ValueError(f"z must be positive, got {z}")
    return wilson(successes / n, n, z) if n else (0.0, 1.0)


def too_fast(times_ms: Iterable[int], threshold_seconds: float) -> int:
    """Judgements that took strictly less than ``threshold_seconds``."""
    limit = threshold_seconds * 1000
    return sum(1 for t in times_ms if t < limit)


class Runs(NamedTuple):
    """``runs``: how many maximal runs reached the length; ``longest``: the longest run;
    ``items``: judgements inside those runs."""

    runs: int
    longest: int
    items: int


def straight_runs(answers: Sequence[Hashable], length: int) -> Runs:
    """Maximal runs of at least ``length`` identical consecutive answers (in the order given)."""
    if length < 2:
        raise ValueError(f"a straight-lining run is at least 2 answers long, got {length}")
    runs = items = longest = 0
    i = 0
    while i < len(answers):
        j = i
        while j + 1 < len(answers) and answers[j + 1] == answers[i]:
            j += 1
        size = j - i + 1
        longest = max(longest, size)
        if size >= length:
            runs += 1
            items += size
        i = j + 1
    return Runs(runs, longest, items)


def disagreement(votes: Mapping[Hashable, bool], consensus: Mapping[Hashable, bool]) -> tuple[int, int]:
    """(disagreements, compared): the annotator's votes against decided items' consensus.

    ``votes``: item -> the annotator's validated vote; ``consensus``: item -> the decided
    outcome (undecided items are simply absent).
    """
    compared = [item for item in votes if item in consensus]
    return sum(1 for item in compared if votes[item] != consensus[item]), len(compared)


GOLD_KEYS = ("validated", "category")


def gold_correct(answer: Mapping[str, object], gold: Mapping[str, object]) -> bool | None:
    """Whether a judgement matches a gold answer: every answer key of the gold answer
    (:data:`GOLD_KEYS`: ``validated``, and ``category`` when the gold answer names one) must
    match; other keys (``made_by``: who made the gold) are not answers. ``None`` when the
    gold answer holds no answer (nothing to score)."""
    keys = [k for k in GOLD_KEYS if k in gold]
    if not keys:
        return None
    return all(answer.get(key) == gold[key] for key in keys)
