"""The leaderboard's uncertainty (pure: numpy, no Django): one query bootstrap for every cell.

Every replicate draws the leaderboard's queries (the Full set) with replacement, once, and
every statistic of that replicate is computed on the same draw:

* a cell (entry, set): the entry's figure over the drawn queries that belong to the set
  (each as many times as it was drawn);
* a difference Full -> set: the two cells of the same replicate, so the interval is paired
  (the same resampled queries for both sets);
* Kendall's tau-b between the Full and the compared set's orderings of the entries.

Intervals are percentile intervals (2.5 % and 97.5 % by default) of the replicates where
the statistic is defined; the generator is ``numpy.random.default_rng(seed)``, so a seed
gives the same intervals every time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

Statistic = Callable[[Hashable, str, Sequence[int]], "float | None"]


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b of two paired sequences (ties in either corrected for, as
    ``scipy.stats.kendalltau``'s default); ``None`` when undefined (fewer than two pairs, or
    one sequence constant)."""
    if len(x) != len(y):
        raise ValueError("kendall_tau_b needs two sequences of the same length")
    n = len(x)
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denominator = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return None if denominator == 0 else (concordant - discordant) / denominator


def tau_of(a: Mapping[Hashable, float | None], b: Mapping[Hashable, float | None]) -> float | None:
    """:func:`kendall_tau_b` over the entries scored in both ``a`` and ``b``."""
    keys = [k for k in a if a[k] is not None and b.get(k) is not None]
    return kendall_tau_b([a[k] for k in keys], [b[k] for k in keys]) if len(keys) >= 2 else None


def ranks(scores: Mapping[Hashable, float | None]) -> dict[Hashable, int | None]:
    """Standard competition ranks (1 = best; ties share the better rank, as "1 2 2 4");
    an unscored entry has no rank."""
    scored = [v for v in scores.values() if v is not None]
    return {k: None if v is None else 1 + sum(1 for w in scored if w > v) for k, v in scores.items()}


def rank_changes(
    before: Mapping[Hashable, float | None], after: Mapping[Hashable, float | None]
) -> dict[Hashable, dict[str, int | None]]:
    """Per entry: its rank before and after, and the change (positive: it climbed)."""
    rb, ra = ranks(before), ranks(after)
    return {
        k: {
            "before": rb[k],
            "after": ra.get(k),
            "change": None if rb[k] is None or ra.get(k) is None else rb[k] - ra[k],
        }
        for k in before
    }


def interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The percentile interval of ``values`` (``None`` when there is none)."""
    if not values:
        return None
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(np.asarray(values, dtype=float), [tail, 1.0 - tail])
    return float(low), float(high)


@dataclass
class Uncertainty:
    """Intervals of every cell, of every Full -> set difference, and of tau-b."""

    cells: dict[tuple[Hashable, str], tuple[float, float] | None] = field(default_factory=dict)
    differences: dict[tuple[Hashable, str], tuple[float, float] | None] = field(default_factory=dict)
    tau: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    n_boot: int = 0
    seed: int = 0
    confidence: float = 0.95


def _replicate(
    entries: Sequence[Hashable],
    sets: Sequence[str],
    base: str,
    statistic: Statistic,
    drawn: Sequence[int],
    samples: dict,
) -> None:
    values = {(e, s): statistic(e, s, drawn) for e in entries for s in sets}
    for key, v in values.items():
        if v is not None and math.isfinite(v):
            samples["cells"].setdefault(key, []).append(v)
    for e in entries:
        full = values[(e, base)]
        for s in sets:
            if s != base and full is not None and values[(e, s)] is not None:
                samples["differences"].setdefault((e, s), []).append(values[(e, s)] - full)
    for s in sets:
        if s != base:
            t = tau_of({e: values[(e, base)] for e in entries}, {e: values[(e, s)] for e in entries})
            if t is not None:
                samples["tau"].setdefault(s, []).append(t)


def bootstrap(
    n_queries: int,
    entries: Sequence[Hashable],
    sets: Sequence[str],
    statistic: Statistic,
    *,
    base: str = "full",
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Uncertainty:
    """The intervals of :class:`Uncertainty` from ``n_boot`` query replicates.

    ``statistic(entry, set, drawn)`` is the entry's figure on the set over the drawn query
    positions (positions in the Full set's order, with repeats), ``None`` when undefined;
    ``base`` names the Full set."""
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must lie strictly between 0 and 1")
    out = Uncertainty(n_boot=n_boot, seed=seed, confidence=confidence)
    if n_boot <= 0 or n_queries == 0:
        return out
    rng = np.random.default_rng(seed)
    samples: dict[str, dict] = {"cells": {}, "differences": {}, "tau": {}}
    for _ in range(n_boot):
        _replicate(entries, sets, base, statistic, rng.integers(0, n_queries, size=n_queries).tolist(), samples)
    out.cells = {(e, s): interval(samples["cells"].get((e, s), []), confidence) for e in entries for s in sets}
    out.differences = {
        (e, s): interval(samples["differences"].get((e, s), []), confidence) for e in entries for s in sets if s != base
    }
    out.tau = {s: interval(samples["tau"].get(s, []), confidence) for s in sets if s != base}
    return out
