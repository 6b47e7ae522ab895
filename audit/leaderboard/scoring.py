"""A leaderboard's table from its entries' ranks (pure: no Django).

Every figure is :func:`retrieval.protocols.figures`, the function the audit's protocol table
calls, over the queries of one set; the Composition Gap is :func:`retrieval.metrics.modality_scores`'
``comp_gap_ndcg`` (``1 - max(image, text) / multimodal`` on nDCG, the audit report's), for
the entries with text-only and image-only ranks. The sets (:data:`SETS`):

* ``full``: every query of the leaderboard's split;
* ``shortcut_free``: the queries the audit labels shortcut-free (:data:`audit.labels.SHORTCUT_FREE`);
* ``validated``: the validated export's queries (the dataset's ``validated`` subset);
* ``validated_alternatives``: the same queries, the accepted alternatives counted as extra
  positives (their ranks appended to the labelled positives').

Uncertainty: :func:`audit.leaderboard.stats.bootstrap` (one query resample for every cell,
difference and tau-b).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from retrieval.metrics import MODALITIES, modality_scores
from retrieval.protocols import AS_AUDITED, Protocol, QueryRanks, figures

from ..labels import SHORTCUT_FREE_NAME
from .stats import Uncertainty, bootstrap, rank_changes, tau_of

FULL, SHORTCUT_FREE_SET, VALIDATED, VALIDATED_ALTERNATIVES = (
    "full",
    SHORTCUT_FREE_NAME,
    "validated",
    "validated_alternatives",
)
#: The sets, in the table's order, with their column titles.
SETS: dict[str, str] = {
    FULL: "Full",
    SHORTCUT_FREE_SET: "Shortcut-free",
    VALIDATED: "Validated",
    VALIDATED_ALTERNATIVES: "Validated + accepted alternatives",
}
#: The sets of the Composition Gap table (CIRCUS's).
GAP_SETS: tuple[str, ...] = (FULL, SHORTCUT_FREE_SET, VALIDATED)
#: The protocol of a format without a published one (the demo, hand-made data): Recall@K
#: of any positive, the ranks as given.
GENERIC = Protocol(
    "generic",
    "CIRVal",
    AS_AUDITED,
    "Recall@K of the best positive; the format has no published protocol",
    recall_ks=(1, 5, 10, 50),
)


@dataclass
class EntryRanks:
    """One method's ranks: per query, its :class:`QueryRanks` (the labelled positives),
    the ranks of the query's accepted alternatives (``None``: not in its list), and, when
    known, the best text-only and image-only ranks (the Composition Gap's)."""

    queries: dict[Hashable, QueryRanks]
    alternatives: dict[Hashable, list[int | None]] = field(default_factory=dict)
    text: dict[Hashable, int | None] | None = None
    image: dict[Hashable, int | None] | None = None
    audited_removed: bool = True
    alternatives_known: bool = True  # False: some alternative's place is not known (a rank file without top lists)


def with_alternatives(q: QueryRanks, alternatives: Sequence[int | None]) -> QueryRanks:
    """``q`` with the alternatives' ranks appended to its positives (unknown reference order)."""
    if not alternatives:
        return q
    ahead = list(q.ahead) + [None] * len(alternatives) if len(q.ahead) == len(q.positives) else ()
    return replace(q, positives=[*q.positives, *alternatives], ahead=ahead)


MISSED = QueryRanks([None])


def set_ranks(entry: EntryRanks, set_name: str, queries: Sequence[Hashable]) -> list[QueryRanks]:
    """The entry's ranks of ``queries`` as the set counts them (a query it did not rank is a miss)."""
    out = [entry.queries.get(q, MISSED) for q in queries]
    if set_name == VALIDATED_ALTERNATIVES:
        out = [with_alternatives(r, entry.alternatives.get(q, [])) for r, q in zip(out, queries)]
    return out


def entry_figures(protocol: Protocol, entry: EntryRanks, set_name: str, queries: Sequence[Hashable]) -> dict[str, Any]:
    """:func:`retrieval.protocols.figures` of the entry over ``queries`` (one set); none on the
    alternatives' set when the entry does not know where the alternatives are."""
    if set_name == VALIDATED_ALTERNATIVES and not entry.alternatives_known:
        return {}
    return figures(protocol, set_ranks(entry, set_name, queries), entry.audited_removed)


def comp_gap(entry: EntryRanks, queries: Sequence[Hashable]) -> float | None:
    """The audit report's Composition Gap on nDCG of the entry over ``queries`` (``None``
    without text-only and image-only ranks)."""
    if entry.text is None or entry.image is None or not queries:
        return None
    best = [min((r for r in entry.queries.get(q, MISSED).positives if r is not None), default=None) for q in queries]
    by_modality = dict(
        zip(MODALITIES, (best, [entry.text.get(q) for q in queries], [entry.image.get(q) for q in queries]))
    )
    return modality_scores(by_modality)["comp_gap_ndcg"]


@dataclass
class Table:
    """Everything the page, the command's files and the release card show."""

    protocol: Protocol
    metric: str
    sets: dict[str, list[Hashable]]
    values: dict[tuple[str, str], float | None]
    full_figures: dict[str, dict[str, Any]]
    gaps: dict[tuple[str, str], float | None]
    changes: dict[str, dict[str, int | None]]
    tau: float | None
    uncertainty: Uncertainty


def per_query(
    protocol: Protocol, entry: EntryRanks, set_name: str, queries: Sequence[Hashable], metric: str
) -> list[float | None]:
    """The metric of each query alone: :func:`retrieval.protocols.figures` over that one query.
    Every protocol figure is a mean over queries (FashionIQ's: over each category's, then over
    the categories), so the figure of any multiset of queries is the (per-category) mean of
    these; :func:`resampled` relies on it and a test checks it against :func:`entry_figures`."""
    if set_name == VALIDATED_ALTERNATIVES and not entry.alternatives_known:
        return [None] * len(queries)
    return [figures(protocol, [r], entry.audited_removed).get(metric) for r in set_ranks(entry, set_name, queries)]


def resampled(values: np.ndarray, categories: np.ndarray, counts: np.ndarray, per_category: bool) -> float | None:
    """The figure of a resample (``counts``: how often each query was drawn) from the
    per-query values (:func:`per_query`); the mean of the category means when ``per_category``."""
    if counts.sum() == 0:
        return None
    if not per_category:
        return float(np.dot(counts, values) / counts.sum())
    means = [
        np.dot(counts[categories == c], values[categories == c]) / counts[categories == c].sum()
        for c in np.unique(categories[counts > 0])
    ]
    return float(np.mean(means))


def _statistic(
    protocol: Protocol, metric: str, sets: Mapping[str, Sequence[Hashable]], entries: Mapping[str, EntryRanks]
):
    """The bootstrap's statistic: each (entry, set) from its per-query values, as positions of the Full set."""
    full = list(sets[FULL])
    position = {q: n for n, q in enumerate(full)}
    categories = np.array(
        [next((en.queries[q].category for en in entries.values() if q in en.queries), "") for q in full], dtype=object
    )
    arrays: dict[tuple[Hashable, str], tuple[np.ndarray, np.ndarray] | None] = {}
    for e, entry in entries.items():
        for s, qs in sets.items():
            values = per_query(protocol, entry, s, list(qs), metric)
            member = np.zeros(len(full), dtype=bool)
            member[[position[q] for q in qs]] = True
            dense = np.zeros(len(full))
            dense[[position[q] for q in qs]] = [0.0 if v is None else v for v in values]
            arrays[(e, s)] = None if any(v is None for v in values) else (dense, member)

    def statistic(e: Hashable, s: str, drawn: Sequence[int]) -> float | None:
        found = arrays[(e, s)]
        if found is None:
            return None
        dense, member = found
        counts = np.bincount(np.asarray(drawn, dtype=int), minlength=len(full)) * member
        return resampled(dense, categories, counts, protocol.per_category)

    return statistic


def build_table(
    protocol: Protocol,
    metric: str,
    sets: Mapping[str, Sequence[Hashable]],
    entries: Mapping[str, EntryRanks],
    n_boot: int = 1000,
    seed: int = 0,
) -> Table:
    """Score every entry on every set, with the bootstrap of :mod:`audit.leaderboard.stats`.

    ``sets`` maps each of :data:`SETS` to its queries (``full`` first: the others are
    subsets of it; the positions of the bootstrap are positions in ``full``)."""
    full = list(sets[FULL])
    values = {
        (e, s): entry_figures(protocol, entry, s, list(sets[s])).get(metric)
        for e, entry in entries.items()
        for s in sets
    }
    uncertainty = bootstrap(
        len(full),
        list(entries),
        list(sets),
        _statistic(protocol, metric, sets, entries),
        base=FULL,
        n_boot=n_boot,
        seed=seed,
    )
    return Table(
        protocol=protocol,
        metric=metric,
        sets={s: list(qs) for s, qs in sets.items()},
        values=values,
        full_figures={e: entry_figures(protocol, entry, FULL, full) for e, entry in entries.items()},
        gaps={(e, s): comp_gap(entry, list(sets[s])) for e, entry in entries.items() for s in GAP_SETS if s in sets},
        changes=rank_changes({e: values[(e, FULL)] for e in entries}, {e: values[(e, VALIDATED)] for e in entries}),
        tau=tau_of({e: values[(e, FULL)] for e in entries}, {e: values[(e, VALIDATED)] for e in entries}),
        uncertainty=uncertainty,
    )
