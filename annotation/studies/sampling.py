"""Reproducible sampling of study item pools (no Django, no Celery).

As in the CIRCUS studies, a pool is drawn per stratum, typically
``(dataset, hidden_category)``, with a quota each, and every annotator of an agreement
study sees the same items in an individually shuffled order.

Reproducibility: every function sorts its input by item id first, so the result depends
on the seed and the *set* of inputs, never on their order. Random streams come from
:class:`random.Random` seeded with a string that combines the seed with the stratum
(or annotator); Python hashes string seeds with SHA-512, so they are stable across
processes and platforms. One stream per stratum makes each stratum's draw independent
of the others' quotas, and a draw is a prefix of a seeded shuffle, so raising a quota
only adds items (samples are nested).

Item ids must be mutually comparable (all ints or all strings, say); strata must be
hashable and mutually comparable (tuples of strings are).
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any, NamedTuple


class Sample(NamedTuple):
    """``items``: the selected ids, sorted; ``report``: per stratum ``population``,
    ``requested``, ``selected``, ``shortfall``; ``shortfall``: requested minus selected
    over the whole draw."""

    items: list[Any]
    report: dict[Any, dict[str, int]]
    shortfall: int


def _rng(seed: int, *scope: Any) -> random.Random:
    return random.Random("|".join([repr(seed), *map(repr, scope)]))


def _sorted_unique(item_ids: Iterable[Any], what: str) -> list[Any]:
    ids = list(item_ids)
    if len(set(ids)) != len(ids):
        seen: set[Any] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise ValueError(f"{what}: item id {dup!r} appears more than once")
    return sorted(ids)


def largest_remainder(populations: Mapping[Hashable, int], total: int) -> dict[Hashable, int]:
    """Split ``total`` over strata in proportion to their populations (Hamilton's method).

    Each stratum first gets ``floor(total * pop / sum(pop))``; the seats still missing go
    one each to the strata with the largest fractional remainders (ties: larger
    population, then stratum order). Exact arithmetic with fractions. The shares sum to
    ``min(total, sum(pop))`` and never exceed a stratum's population.
    """
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError(f"total must be a non-negative integer, got {total!r}")
    for stratum, pop in populations.items():
        if isinstance(pop, bool) or not isinstance(pop, int) or pop < 0:
            raise ValueError(f"population of stratum {stratum!r} must be a non-negative integer, got {pop!r}")
    whole = sum(populations.values())
    if whole == 0:
        return {s: 0 for s in populations}
    if total >= whole:
        return dict(populations)
    exact = {s: Fraction(total * pop, whole) for s, pop in populations.items()}
    shares = {s: int(q) for s, q in exact.items()}  # floor: q >= 0
    missing = total - sum(shares.values())
    position = {s: i for i, s in enumerate(sorted(populations))}
    ranked = sorted(position, key=lambda s: (-(exact[s] - shares[s]), -populations[s], position[s]))
    for s in ranked[:missing]:
        shares[s] += 1
    return {s: shares[s] for s in populations}


def stratified_sample(
    items: Sequence[tuple[Any, Hashable]], quotas: Mapping[Hashable, int] | None, seed: int, total: int | None = None
) -> Sample:
    """Draw a stratified sample of item ids, reproducibly.

    ``items``: ``(item_id, stratum)`` pairs, each id once. ``quotas``: items wanted per
    stratum (strata missing from it get 0; a quota larger than its stratum takes the whole
    stratum and the difference is reported as shortfall). With ``quotas=None``,
    ``total`` is split over the strata in proportion to their sizes with
    :func:`largest_remainder`. When both are given, the quotas must sum to ``total``.

    Returns a :class:`Sample` (unpacks as ``items, report, shortfall``).
    """
    if quotas is None and total is None:
        raise ValueError("give quotas per stratum, a total, or both")
    strata: dict[Hashable, list[Any]] = {}
    seen: dict[Any, Hashable] = {}
    for pair in items:
        if len(pair) != 2:
            raise ValueError(f"items must be (item_id, stratum) pairs, got {pair!r}")
        item_id, stratum = pair
        if item_id in seen:
            raise ValueError(f"item id {item_id!r} appears more than once (strata {seen[item_id]!r}, {stratum!r})")
        seen[item_id] = stratum
        strata.setdefault(stratum, []).append(item_id)
    populations = {s: len(v) for s, v in strata.items()}

    if quotas is None:
        assert total is not None
        wanted: dict[Hashable, int] = largest_remainder(populations, total)
    else:
        wanted = {s: 0 for s in populations}
        for stratum, q in quotas.items():
            if isinstance(q, bool) or not isinstance(q, int) or q < 0:
                raise ValueError(f"quota of stratum {stratum!r} must be a non-negative integer, got {q!r}")
            wanted[stratum] = q
        if total is not None and sum(wanted.values()) != total:
            raise ValueError(f"quotas sum to {sum(wanted.values())}, but total is {total}")

    selected: list[Any] = []
    report: dict[Any, dict[str, int]] = {}
    for stratum in sorted(wanted):
        pool = sorted(strata.get(stratum, []))
        take = min(wanted[stratum], len(pool))
        _rng(seed, "stratum", stratum).shuffle(pool)
        selected.extend(pool[:take])
        report[stratum] = {
            "population": len(pool),
            "requested": wanted[stratum],
            "selected": take,
            "shortfall": wanted[stratum] - take,
        }
    asked = total if quotas is None and total is not None else sum(wanted.values())
    return Sample(items=sorted(selected), report=report, shortfall=asked - len(selected))


def stratum_label(stratum: Hashable) -> str:
    """A JSON-friendly key for a stratum: tuples joined with ``"::"`` (CIRCUS style,
    e.g. ``"cirr::unresolved"``), anything else as ``str``."""
    if isinstance(stratum, tuple):
        return "::".join(map(str, stratum))
    return str(stratum)


def report_json(report: Mapping[Any, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """:attr:`Sample.report` with string keys (see :func:`stratum_label`)."""
    out: dict[str, dict[str, int]] = {}
    for stratum, row in report.items():
        label = stratum_label(stratum)
        if label in out:
            raise ValueError(f"strata {stratum!r} and another share the label {label!r}")
        out[label] = dict(row)
    return out


def shuffle_for_annotator(item_ids: Iterable[Any], seed: int, annotator: Hashable) -> list[Any]:
    """The same items in this annotator's own reproducible presentation order."""
    ids = _sorted_unique(item_ids, "shuffle_for_annotator")
    _rng(seed, "annotator", annotator).shuffle(ids)
    return ids


def agreement_subset(item_ids: Iterable[Any], size: int, seed: int) -> list[Any]:
    """``size`` items drawn reproducibly from the pool (sorted), to be judged by everyone.

    For a subset stratified like the pool, use :func:`stratified_sample` on the pool.
    """
    ids = _sorted_unique(item_ids, "agreement_subset")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"agreement subset size must be a non-negative integer, got {size!r}")
    if size > len(ids):
        raise ValueError(f"agreement subset size {size} exceeds the pool of {len(ids)} items")
    _rng(seed, "agreement").shuffle(ids)
    return sorted(ids[:size])
