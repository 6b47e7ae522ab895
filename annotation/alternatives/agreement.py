"""Agreement on ticked alternatives. Pure: no Django.

Every (item, candidate) pair is one binary unit: 1 when an annotator ticked the candidate,
0 when an annotator with a current judgement of the item saw it and did not (a candidate on
a page that never opened for that annotator, :mod:`.paging`, is no rating). Over those
units: Krippendorff's alpha (nominal), raw (pairwise) agreement and the prevalence of ticks,
each with a percentile bootstrap interval (units resampled, seeded). Beside them: how many
alternatives each query gained under the study's consensus rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from annotation.agreement.maths import (
    Ratings,
    Undefined,
    bootstrap_intervals,
    krippendorff_alpha,
    percent_agreement,
    to_json_value,
)
from annotation.alternatives.paging import shown_candidates

CONVENTIONS: tuple[str, ...] = (
    "Units: every (item, candidate) pair of the item's fixed candidate panel; each annotator "
    "with a current judgement of the item rates every candidate shown to them 1 (ticked) or 0 "
    "(not ticked); pages open one by one while a page brings a tick, so the candidates of pages "
    "that never opened for an annotator are not rated by them.",
    "Krippendorff's alpha: nominal, over the units with two or more ratings. Raw agreement: "
    "the share of agreeing rating pairs per unit, averaged over units. Prevalence: the share "
    "of ratings that are ticks.",
    "Bootstrap: units resampled with replacement (seeded), percentile 95 % interval; units of "
    "one item are not independent, so the intervals are somewhat narrow.",
)


def candidate_units(
    panels: Mapping[Any, Sequence[int]],
    ticks: Mapping[Any, Mapping[str, Sequence[int]]],
    page_size: int | None = None,
) -> list[tuple[str, str, int]]:
    """(unit, annotator, 0/1) triples: ``panels`` item -> candidates, ``ticks`` item ->
    annotator -> ticked candidates (every annotator with a current judgement). With
    ``page_size``, only the candidates each annotator was shown (:func:`.paging.shown_candidates`)."""
    triples: list[tuple[str, str, int]] = []
    for item, by in ticks.items():
        panel = list(panels.get(item, ()))
        for annotator, ticked in by.items():
            chosen = set(ticked)
            shown = panel if page_size is None else shown_candidates(panel, chosen, page_size)
            triples.extend((f"{item}:{c}", annotator, int(c in chosen)) for c in shown)
    return triples


def _prevalence(r: Ratings) -> float | Undefined:
    if not len(r.label):
        return Undefined("no ratings")
    ones = sum(1 for code in r.label if r.categories[int(code)] == 1)
    return ones / len(r.label)


def unit_agreement(triples: Iterable[tuple[str, str, int]], n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """alpha (nominal), raw agreement and prevalence of ticks with bootstrap intervals."""
    triples = list(triples)
    if not triples:
        return {
            "n_units": 0,
            "n_ratings": 0,
            "alpha_nominal": None,
            "raw_agreement": None,
            "prevalence": None,
            "intervals": {},
            "undefined": {"all": "no candidate was shown to a judging annotator"},
        }
    r = Ratings.from_triples(triples, categories=[0, 1])
    stats = {
        "alpha_nominal": lambda x: krippendorff_alpha(x, "nominal"),
        "raw_agreement": percent_agreement,
        "prevalence": _prevalence,
    }
    values = {k: fn(r) for k, fn in stats.items()}
    intervals = bootstrap_intervals(r, stats, n_boot=n_boot, seed=seed)
    return {
        "n_units": r.n_items,
        "n_ratings": len(triples),
        **{k: to_json_value(v) for k, v in values.items()},
        "intervals": {k: (v.to_json() if not isinstance(v, Undefined) else None) for k, v in intervals.items()},
        "undefined": {k: v.reason for k, v in values.items() if isinstance(v, Undefined)},
    }


def per_candidate(
    panels: Mapping[Any, Sequence[int]], ticks: Mapping[Any, Mapping[str, Sequence[int]]]
) -> list[dict[str, Any]]:
    """One row per ticked (item, candidate): votes of annotators."""
    rows = []
    for item, by in ticks.items():
        for c in panels.get(item, ()):
            who = sorted(a for a, t in by.items() if c in set(t))
            if who:
                rows.append({"item": item, "image": c, "votes": len(who), "of": len(by), "ticked_by": who})
    return rows


def distribution(accepted_per_item: Iterable[int]) -> dict[str, Any]:
    """How many alternatives each query gained: histogram and mean."""
    counts = list(accepted_per_item)
    hist = Counter(counts)
    return {
        "histogram": {str(k): hist[k] for k in sorted(hist)},
        "n_items": len(counts),
        "mean": (sum(counts) / len(counts)) if counts else None,
        "items_with_alternatives": sum(1 for c in counts if c),
    }
