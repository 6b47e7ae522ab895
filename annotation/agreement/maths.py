"""Inter-annotator agreement: pure maths over ``(item, annotator, label)`` triples.

No Django, no Celery. Ratings may be missing (not every annotator judges every item).
The judgements are held as a sparse :class:`Ratings` table (numpy arrays of integer
codes), so every coefficient is computed with array operations, not per-judgement loops.

Coefficients:

* pairwise Cohen's kappa on each annotator pair's shared items (optionally linear or
  quadratic weights for ordinal scales), from per-pair confusion matrices;
* Fleiss' kappa, only when every item has the same number of ratings;
* Krippendorff's alpha (``krippendorff`` package) at the nominal, ordinal, interval and
  ratio levels;
* Gwet's AC1 for several raters with missing ratings (Gwet, *Handbook of Inter-Rater
  Reliability*, the unweighted multi-rater formula);
* raw percent agreement and label prevalence;
* percentile bootstrap intervals over items.

A coefficient that the data cannot determine is returned as :class:`Undefined` (with a
reason) and serialised as ``null``, never as a silent 0 or NaN. :data:`CONVENTIONS`
states every convention; :func:`agreement_report` copies it into its output.

The validity rubric (CIRCUS / CIRVal) adds the binary valid/invalid view, one-vs-rest
flags and the full flag signature (see :func:`validity_signature`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Literal

import krippendorff
import numpy as np

from annotation.core.rubric import CIRCUS_FLAG_ORDER, UNSPECIFIED_SIGNATURE, VALID_SIGNATURE, VALIDATED_LABEL
from annotation.core.rubric import signature as circus_signature

Level = Literal["nominal", "ordinal", "interval", "ratio"]
KappaWeights = Literal["linear", "quadratic"] | None
LEVELS: tuple[str, ...] = ("nominal", "ordinal", "interval", "ratio")
ConstantPairs = Literal["undefined", "one"]
CONSTANT_PAIRS: tuple[str, ...] = ("undefined", "one")

# Above this many cells (pairable items x categories^2), alpha is computed from the
# coincidence matrix directly instead of through the krippendorff package, whose
# implementation materialises an (items, categories, categories) array.
_PACKAGE_CELL_LIMIT = 20_000_000


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Undefined:
    """A coefficient the data cannot determine. Serialises to ``null``; ``reason`` says why.

    ``not_applicable`` marks a coefficient whose design assumption fails (Fleiss' kappa
    with unequal numbers of ratings per item) rather than one with no variation.
    """

    reason: str
    not_applicable: bool = False


Value = float | Undefined


def to_json_value(value: Value | None) -> float | None:
    """``float`` for a defined coefficient, ``None`` for :class:`Undefined` or ``None``."""
    if value is None or isinstance(value, Undefined):
        return None
    return float(value)


@dataclass(frozen=True)
class PairKappa:
    """Cohen's kappa of one annotator pair on the items both of them rated."""

    rater_a: Hashable
    rater_b: Hashable
    kappa: float | None  # None: undefined (both raters constant on one label, constant_pairs="undefined")
    n_shared: int
    constant_identical: bool  # both raters gave one and the same label on every shared item


@dataclass(frozen=True)
class Interval:
    """A percentile bootstrap interval; ``n_valid`` replicates had a defined value."""

    low: float
    high: float
    n_valid: int
    n_boot: int

    def to_json(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "n_valid": self.n_valid, "n_boot": self.n_boot}


CONVENTIONS: tuple[str, ...] = (
    "Coefficients are computed over the items with two or more ratings; items rated "
    "once are left out (n_items_excluded).",
    "percent_agreement: for each item, the share of agreeing pairs among all pairs of "
    "its ratings, averaged over items (equals Fleiss' P-bar and Gwet's p_a). "
    "all_ratings_identical_rate: share of items whose ratings are all the same label.",
    "label_prevalence / valid_rate / positive_rate: share of all ratings (items x "
    "annotators actually rated) carrying the label.",
    "Cohen's kappa is computed for every annotator pair on the items both rated; pairs "
    "with no shared item are left out. Constant raters that disagree have p_e = 0 and "
    "kappa = 0.",
    "Pair keys are 'a__b' with a before b in annotator order.",
    "Fleiss' kappa is null (not applicable) unless every item has the same number of ratings.",
    "Fleiss' kappa, Krippendorff's alpha and Cohen's kappa summaries are null with a "
    "reason in 'undefined' when the data have no variation (a single label among all "
    "ratings) or no item with two or more ratings; never a silent 0 or NaN.",
    "Krippendorff's alpha uses the coincidence matrix over pairable values (missing "
    "ratings allowed); ordinal distances follow the category order, interval and ratio "
    "distances the numeric category values.",
    "Gwet's AC1: p_a over items with >= 2 ratings, class shares pi_k averaged over items "
    "with >= 1 rating, p_e = sum_k pi_k (1 - pi_k) / (Q - 1) with Q the number of "
    "categories of the scale (the rubric's: every declared category or, for validity "
    "signatures, all 17 possible signatures), so AC1 is defined when every rating agrees.",
    "Bootstrap: items resampled with replacement (seeded), percentile interval; "
    "replicates in which a coefficient is undefined are skipped (n_valid).",
)

CONSTANT_PAIR_CONVENTIONS: dict[str, str] = {
    "undefined": "When both raters of a pair give one and the same label on every shared item, p_e = 1 "
    "and Cohen's kappa = 0/0: the pair's kappa is undefined (null), left out of the pairwise "
    "mean, median, min and max; 'count' says how many pairs the summary covers and "
    "'n_undefined' how many were left out (constant_pairs = undefined, the default).",
    "one": "When both raters of a pair give one and the same label on every shared item, p_e = 1 and "
    "Cohen's kappa = 0/0: the pair counts as 1.0 (perfect agreement), the convention of the CIRCUS "
    "release (constant_pairs = one).",
}


def check_constant_pairs(constant_pairs: str) -> None:
    if constant_pairs not in CONSTANT_PAIRS:
        raise ValueError(f"constant_pairs must be one of {CONSTANT_PAIRS}, not {constant_pairs!r}")


VALIDITY_CONVENTIONS: tuple[str, ...] = (
    "Validity labels: 'VALIDATED' for valid, a list of flags for invalid ([] = invalid "
    "with no flag). Signature: 'VALID', else the flags joined with '+' in the order "
    "INVALID_TEXT_QUERY, INVALID_IMAGE_QUERY, INVALID_TARGET_IMAGE, QUERY_TOO_BROAD, "
    "else 'INVALID_UNSPECIFIED'. The top-level coefficients use the signature as a "
    "nominal label (krippendorff_alpha == signature_alpha_nominal).",
    "binary_valid_invalid: 1 for VALID, 0 for every other signature (including "
    "INVALID_UNSPECIFIED). per_flag_agreement.<F>: 1 when F is one of the signature's "
    "flags (VALID is 0 for every flag); Gwet's AC1 of these blocks uses Q = 2.",
    "exact_agreement_rate: share of items whose signatures are all identical; "
    "unanimous_valid_invalid_rate: share of items whose binary labels are all identical; "
    "exact_invalid_signature_rate: among the unanimously invalid items, the share whose "
    "signatures are all identical (null when no item is unanimously invalid).",
)


# --------------------------------------------------------------------------- ratings


def _is_missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _sorted_or_as_is(uniques: list[Any]) -> list[int]:
    """Positions of ``uniques`` in sorted order, or in first-seen order if unorderable."""
    try:
        return sorted(range(len(uniques)), key=uniques.__getitem__)
    except TypeError:
        return list(range(len(uniques)))


def _first_seen_codes(values: Sequence[Any], what: str) -> tuple[np.ndarray, list[Any]]:
    """Codes by first appearance and the distinct values (C-speed dict operations)."""
    try:
        uniques = list(dict.fromkeys(values))
    except TypeError as exc:
        raise ValueError(f"{what} must be hashable: {exc}") from None
    index = {v: i for i, v in enumerate(uniques)}
    codes = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
    return codes, uniques


def _factorize(
    values: Sequence[Any], order: Sequence[Any] | None, what: str, *, sort: bool
) -> tuple[np.ndarray, tuple[Any, ...]]:
    """Integer codes for ``values``: positions in ``order`` if given, else sorted / first seen."""
    if order is not None:
        index = {v: i for i, v in enumerate(order)}
        if len(index) != len(order):
            raise ValueError(f"the given {what} list has duplicates")
        try:
            codes = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
        except KeyError as exc:
            raise ValueError(f"{exc.args[0]!r} is not in the given {what} list") from None
        except TypeError as exc:
            raise ValueError(f"{what} must be hashable: {exc}") from None
        return codes, tuple(order)
    codes, uniques = _first_seen_codes(values, what)
    if any(_is_missing(u) for u in uniques):
        raise ValueError(f"{what} may not be None or NaN")
    if not sort:
        return codes, tuple(uniques)
    order_idx = _sorted_or_as_is(uniques)
    perm = np.empty(len(uniques), dtype=np.int64)
    perm[order_idx] = np.arange(len(uniques))
    return perm[codes], tuple(uniques[i] for i in order_idx)


@dataclass(frozen=True, eq=False)
class Ratings:
    """Sparse rater x item table of categorical ratings.

    ``item``, ``rater`` and ``label`` are parallel int64 arrays of codes into ``items``,
    ``raters`` and ``categories``, one entry per (item, rater) judgement, sorted by
    (item, rater). Missing ratings are simply absent. ``categories`` is the scale in its
    order (ordinal levels use this order; interval/ratio levels its numeric values).
    """

    item: np.ndarray
    rater: np.ndarray
    label: np.ndarray
    items: tuple[Any, ...]
    raters: tuple[Any, ...]
    categories: tuple[Any, ...]

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_triples(
        cls,
        triples: Iterable[tuple[Any, Any, Any]],
        *,
        raters: Sequence[Any] | None = None,
        categories: Sequence[Any] | None = None,
    ) -> Ratings:
        """Build from ``(item, annotator, label)`` triples; a ``None``/NaN label is missing.

        ``raters`` fixes the annotator order (pair order in reports); default: sorted.
        ``categories`` declares the scale and its order; default: the observed labels,
        sorted when they are orderable. An (item, annotator) pair given twice is an error.
        """
        rows = triples if isinstance(triples, list) else list(triples)
        if rows and set(map(len, rows)) != {3}:
            raise ValueError("every triple must be (item, annotator, label)")
        items = list(map(itemgetter(0), rows))
        rater_ids = list(map(itemgetter(1), rows))
        labels = list(map(itemgetter(2), rows))
        return cls.from_columns(items, rater_ids, labels, raters=raters, categories=categories)

    @classmethod
    def from_columns(
        cls,
        items: Sequence[Any],
        annotators: Sequence[Any],
        labels: Sequence[Any],
        *,
        raters: Sequence[Any] | None = None,
        categories: Sequence[Any] | None = None,
    ) -> Ratings:
        """Like :meth:`from_triples`, from three parallel sequences."""
        if not len(items) == len(annotators) == len(labels):
            raise ValueError("items, annotators and labels must have the same length")
        # Labels first, so that rows with a missing label can be dropped.
        raw, uniques = _first_seen_codes(labels, "labels")
        missing = [_is_missing(u) for u in uniques]
        present = [u for u, m in zip(uniques, missing) if not m]
        if categories is None:
            cat_tuple = tuple(present[i] for i in _sorted_or_as_is(present))
        else:
            cat_tuple = tuple(categories)
            cat_set = set(cat_tuple)
            if len(cat_set) != len(cat_tuple):
                raise ValueError("the given categories have duplicates")
            unknown = [u for u in present if u not in cat_set]
            if unknown:
                raise ValueError(f"label {unknown[0]!r} is not among the given categories")
        cat_index = {c: i for i, c in enumerate(cat_tuple)}
        remap = np.array([-1 if m else cat_index[u] for u, m in zip(uniques, missing)], dtype=np.int64)
        return cls._assemble(items, annotators, remap[raw] if len(raw) else raw, cat_tuple, raters)

    @classmethod
    def _assemble(
        cls,
        items: Sequence[Any],
        annotators: Sequence[Any],
        label_codes: np.ndarray,
        categories: tuple[Any, ...],
        raters: Sequence[Any] | None,
    ) -> Ratings:
        """Drop rows whose label code is -1 (missing), factorize items and raters."""
        keep = label_codes >= 0
        if not keep.all():
            idx = np.flatnonzero(keep)
            items = [items[i] for i in idx]
            annotators = [annotators[i] for i in idx]
            label_codes = label_codes[keep]
        item_codes, item_tuple = _factorize(items, None, "items", sort=False)
        rater_codes, rater_tuple = _factorize(annotators, raters, "raters", sort=True)
        return cls._from_codes(item_codes, rater_codes, label_codes, item_tuple, rater_tuple, categories)

    @classmethod
    def _from_codes(
        cls,
        item: np.ndarray,
        rater: np.ndarray,
        label: np.ndarray,
        items: tuple[Any, ...],
        raters: tuple[Any, ...],
        categories: tuple[Any, ...],
    ) -> Ratings:
        """Sort by (item, rater) and reject duplicated (item, rater) pairs."""
        order = np.lexsort((rater, item))
        item, rater, label = item[order], rater[order], label[order]
        if len(item) > 1:
            dup = (item[1:] == item[:-1]) & (rater[1:] == rater[:-1])
            if dup.any():
                k = int(np.flatnonzero(dup)[0])
                raise ValueError(f"annotator {raters[rater[k]]!r} rated item {items[item[k]]!r} more than once")
        return cls(item, rater, label, items, raters, categories)

    @classmethod
    def from_dense(
        cls,
        codes: np.ndarray,
        *,
        raters: Sequence[Any] | None = None,
        categories: Sequence[Any] | None = None,
    ) -> Ratings:
        """Build from a (raters, items) array of category codes, -1 for missing."""
        codes = np.asarray(codes, dtype=np.int64)
        n_r, n_i = codes.shape
        cats = tuple(categories) if categories is not None else tuple(range(int(codes.max(initial=-1)) + 1))
        if codes.max(initial=-1) >= len(cats) or codes.min(initial=-1) < -1:
            raise ValueError("codes must lie in -1 .. len(categories) - 1")
        r, i = np.nonzero(codes >= 0)
        rater_tuple = tuple(raters) if raters is not None else tuple(range(n_r))
        if len(rater_tuple) != n_r:
            raise ValueError("one rater name per row is required")
        return cls._from_codes(
            i.astype(np.int64), r.astype(np.int64), codes[r, i], tuple(range(n_i)), rater_tuple, cats
        )

    # ------------------------------------------------------------------ views

    @property
    def n_items(self) -> int:
        return len(self.items)

    @property
    def n_raters(self) -> int:
        return len(self.raters)

    @property
    def n_categories(self) -> int:
        return len(self.categories)

    @property
    def n_ratings(self) -> int:
        return int(self.label.shape[0])

    def ratings_per_item(self) -> np.ndarray:
        """Number of ratings of each item."""
        return np.bincount(self.item, minlength=self.n_items)

    def counts(self) -> np.ndarray:
        """(items, categories) table: how many raters gave each category to each item."""
        k = self.n_categories
        flat = np.bincount(self.item * k + self.label, minlength=self.n_items * k)
        return flat.reshape(self.n_items, k)

    def active_raters(self) -> list[Any]:
        """Raters with at least one rating, in rater order."""
        used = np.bincount(self.rater, minlength=self.n_raters) > 0
        return [r for r, u in zip(self.raters, used) if u]

    def dense(self) -> np.ndarray:
        """(raters, items) array of category codes, -1 where a rating is missing."""
        out = np.full((self.n_raters, self.n_items), -1, dtype=np.int64)
        out[self.rater, self.item] = self.label
        return out

    def take_items(self, idx: np.ndarray) -> Ratings:
        """The ratings of items ``idx`` (repeats allowed: a bootstrap resample), renumbered."""
        idx = np.asarray(idx, dtype=np.int64)
        per_item = self.ratings_per_item()
        starts = np.concatenate(([0], np.cumsum(per_item)[:-1])) if self.n_items else per_item
        lengths = per_item[idx]
        total = int(lengths.sum())
        new_item = np.repeat(np.arange(len(idx), dtype=np.int64), lengths)
        offsets = np.repeat(starts[idx] - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
        pos = offsets + np.arange(total, dtype=np.int64)
        items = tuple(self.items[i] for i in idx)
        return Ratings(new_item, self.rater[pos], self.label[pos], items, self.raters, self.categories)

    def min_ratings(self, k: int = 2) -> Ratings:
        """Only the items with at least ``k`` ratings."""
        keep = np.flatnonzero(self.ratings_per_item() >= k)
        if len(keep) == self.n_items:
            return self
        return self.take_items(keep)

    def relabel(self, mapping: Sequence[int] | np.ndarray, categories: Sequence[Any]) -> Ratings:
        """Map every category code ``c`` to ``mapping[c]`` (codes into ``categories``)."""
        mapping = np.asarray(mapping, dtype=np.int64)
        if mapping.shape != (self.n_categories,):
            raise ValueError("mapping needs one entry per category")
        return Ratings(self.item, self.rater, mapping[self.label], self.items, self.raters, tuple(categories))


# --------------------------------------------------------------------------- simple rates


def _pairable_counts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.asarray(counts, dtype=np.int64)
    m = counts.sum(axis=1)
    keep = m >= 2
    return counts[keep], m[keep]


def percent_agreement_from_counts(counts: np.ndarray) -> Value:
    """Mean over items (>= 2 ratings) of the share of agreeing pairs of ratings."""
    c, m = _pairable_counts(counts)
    if c.shape[0] == 0:
        return Undefined("no item has two or more ratings")
    return float(np.mean((c * (c - 1)).sum(axis=1) / (m * (m - 1))))


def percent_agreement(ratings: Ratings) -> Value:
    """Mean over items with >= 2 ratings of the share of rater pairs that agree."""
    return percent_agreement_from_counts(ratings.counts())


def all_identical_rate(ratings: Ratings) -> Value:
    """Share of items (>= 2 ratings) on which every rating is the same label."""
    c, m = _pairable_counts(ratings.counts())
    if c.shape[0] == 0:
        return Undefined("no item has two or more ratings")
    return float(np.mean(c.max(axis=1) == m))


def label_prevalence(ratings: Ratings) -> dict[str, float]:
    """Share of all ratings that carry each category (keys are ``str(category)``)."""
    totals = np.bincount(ratings.label, minlength=ratings.n_categories)
    n = int(totals.sum())
    return {str(c): (float(t) / n if n else 0.0) for c, t in zip(ratings.categories, totals)}


# --------------------------------------------------------------------------- Fleiss


def fleiss_kappa_from_counts(counts: np.ndarray) -> Value:
    """Fleiss' kappa from an (items, categories) count table (Fleiss 1971).

    Items without ratings are ignored; all others must have the same number ``n >= 2``
    of ratings, otherwise the result is :class:`Undefined` with ``not_applicable``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    m = counts.sum(axis=1)
    counts, m = counts[m > 0], m[m > 0]
    if counts.shape[0] == 0:
        return Undefined("no ratings")
    if (m != m[0]).any():
        return Undefined(
            f"not applicable: items have different numbers of ratings ({int(m.min())} to {int(m.max())})",
            not_applicable=True,
        )
    n = int(m[0])
    if n < 2:
        return Undefined("each item has fewer than two ratings")
    totals = counts.sum(axis=0)
    if int((totals > 0).sum()) < 2:
        return Undefined("no variation: every rating has the same label")
    n_items = counts.shape[0]
    p = totals / (n_items * n)
    p_i = ((counts * counts).sum(axis=1) - n) / (n * (n - 1))
    p_bar = float(p_i.mean())
    p_e = float((p * p).sum())
    return (p_bar - p_e) / (1.0 - p_e)


def fleiss_kappa(ratings: Ratings) -> Value:
    """Fleiss' kappa over the items that have ratings (see :func:`fleiss_kappa_from_counts`)."""
    return fleiss_kappa_from_counts(ratings.counts())


# --------------------------------------------------------------------------- Krippendorff


def _alpha_distances(level: str, domain: np.ndarray, n_v: np.ndarray) -> np.ndarray:
    """Krippendorff's squared distance between every pair of categories."""
    k = len(n_v)
    if level == "nominal":
        return 1.0 - np.eye(k)
    if level == "ordinal":
        cum = np.concatenate(([0.0], np.cumsum(n_v, dtype=np.float64)))
        lo = np.minimum.outer(np.arange(k), np.arange(k))
        hi = np.maximum.outer(np.arange(k), np.arange(k))
        between = cum[hi + 1] - cum[lo]
        return (between - (n_v[:, None] + n_v[None, :]) / 2.0) ** 2
    v = domain.astype(np.float64)
    diff = v[:, None] - v[None, :]
    if level == "interval":
        return diff**2
    total = v[:, None] + v[None, :]
    return np.divide(diff, total, out=np.zeros_like(diff), where=total != 0) ** 2


def _alpha_internal(pairable: np.ndarray, level: str, domain: np.ndarray) -> float:
    """Alpha from the coincidence matrix, with memory linear in items x categories."""
    c = pairable.astype(np.float64)
    w = c / (c.sum(axis=1, keepdims=True) - 1.0)
    o = w.T @ c - np.diag(w.sum(axis=0))
    n_v = o.sum(axis=0)
    d = _alpha_distances(level, domain, n_v)
    expected = (np.outer(n_v, n_v) - np.diag(n_v)) / (n_v.sum() - 1.0)
    return float(1.0 - (o * d).sum() / (expected * d).sum())


def krippendorff_alpha_from_counts(
    counts: np.ndarray,
    level: Level = "nominal",
    value_domain: Sequence[float] | np.ndarray | None = None,
    *,
    method: Literal["auto", "package", "internal"] = "auto",
) -> Value:
    """Krippendorff's alpha from an (items, categories) count table.

    Columns follow the scale order. ``value_domain`` gives the numeric value of each
    column for the interval and ratio levels (default ``0..K-1``). ``method="auto"``
    uses the ``krippendorff`` package unless the table is very large.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, not {level!r}")
    counts = np.asarray(counts, dtype=np.int64)
    k = counts.shape[1]
    domain = np.arange(k, dtype=np.float64) if value_domain is None else np.asarray(value_domain, dtype=np.float64)
    if domain.shape != (k,):
        raise ValueError("value_domain needs one value per category")
    if level in ("ordinal", "interval", "ratio") and value_domain is not None and (np.diff(domain) <= 0).any():
        raise ValueError("value_domain must be strictly increasing for ordinal, interval and ratio levels")
    pairable, _ = _pairable_counts(counts)
    if pairable.shape[0] == 0:
        return Undefined("no item has two or more ratings")
    n_v = pairable.sum(axis=0)
    if int((n_v > 0).sum()) < 2:
        return Undefined("no variation: every pairable rating has the same value")
    use_package = method == "package" or (method == "auto" and pairable.shape[0] * k * k <= _PACKAGE_CELL_LIMIT)
    if use_package:
        with np.errstate(divide="ignore", invalid="ignore"):
            value = float(
                krippendorff.alpha(
                    value_counts=pairable,
                    value_domain=domain if level in ("interval", "ratio") else np.arange(k),
                    level_of_measurement=level,
                )
            )
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            value = _alpha_internal(pairable, level, domain)
    if not math.isfinite(value):
        return Undefined("expected disagreement is zero")
    return value


def _numeric_domain(categories: Sequence[Any], level: str) -> np.ndarray | None:
    if level not in ("interval", "ratio"):
        return None
    try:
        return np.asarray([float(c) for c in categories], dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"the {level} level needs numeric categories, got {list(categories)!r}") from None


def krippendorff_alpha(ratings: Ratings, level: Level = "nominal") -> Value:
    """Krippendorff's alpha of ``ratings`` at ``level`` (missing ratings allowed)."""
    return krippendorff_alpha_from_counts(ratings.counts(), level, _numeric_domain(ratings.categories, level))


# --------------------------------------------------------------------------- Gwet


def gwet_ac1_from_counts(counts: np.ndarray, n_categories: int | None = None) -> Value:
    """Gwet's AC1 for several raters with missing ratings, from an (items, categories) table.

    ``p_a`` is the mean over items with ``r_i >= 2`` ratings of
    ``sum_k r_ik (r_ik - 1) / (r_i (r_i - 1))``; ``pi_k`` is the mean over items with
    ``r_i >= 1`` of ``r_ik / r_i``; ``p_e = sum_k pi_k (1 - pi_k) / (Q - 1)``;
    ``AC1 = (p_a - p_e) / (1 - p_e)``. ``Q`` defaults to the number of columns.
    """
    counts = np.asarray(counts, dtype=np.int64)
    q = counts.shape[1] if n_categories is None else int(n_categories)
    if q < 2:
        return Undefined("fewer than two categories on the scale")
    m = counts.sum(axis=1)
    rated = counts[m >= 1]
    pair_c, pair_m = _pairable_counts(counts)
    if pair_c.shape[0] == 0:
        return Undefined("no item has two or more ratings")
    p_a = float(np.mean((pair_c * (pair_c - 1)).sum(axis=1) / (pair_m * (pair_m - 1))))
    pi = (rated / rated.sum(axis=1, keepdims=True)).mean(axis=0)
    p_e = float((pi * (1.0 - pi)).sum() / (q - 1))
    return (p_a - p_e) / (1.0 - p_e)


def gwet_ac1(ratings: Ratings) -> Value:
    """Gwet's AC1 with ``Q`` = the number of categories of ``ratings``."""
    return gwet_ac1_from_counts(ratings.counts(), ratings.n_categories)


# --------------------------------------------------------------------------- Cohen


def kappa_weight_matrix(n_categories: int, weights: KappaWeights = None) -> np.ndarray:
    """Disagreement weights: 0/1 (unweighted), ``|i-j|`` (linear) or ``(i-j)^2`` (quadratic)."""
    idx = np.arange(n_categories)
    d = np.abs(idx[:, None] - idx[None, :]).astype(np.float64)
    if weights is None:
        return (d > 0).astype(np.float64)
    if weights == "linear":
        return d
    if weights == "quadratic":
        return d**2
    raise ValueError(f"weights must be None, 'linear' or 'quadratic', not {weights!r}")


def _kappas(
    confusions: np.ndarray, weights: KappaWeights, constant_pairs: ConstantPairs = "undefined"
) -> tuple[np.ndarray, np.ndarray]:
    """Cohen's kappa of each (pairs, K, K) confusion matrix (NaN where undefined); also a
    constant-identical mask. ``constant_pairs``: such pairs are NaN (undefined) or 1.0 (one)."""
    check_constant_pairs(constant_pairs)
    conf = np.asarray(confusions, dtype=np.float64)
    k = conf.shape[-1]
    w = kappa_weight_matrix(k, weights)
    n = conf.sum(axis=(1, 2))
    rows = conf.sum(axis=2)
    cols = conf.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = rows[:, :, None] * cols[:, None, :] / n[:, None, None]
    observed_d = (w * conf).sum(axis=(1, 2))
    expected_d = (w * expected).sum(axis=(1, 2))
    # Expected disagreement is exactly 0 only when both raters put every shared item in
    # one and the same category (all off-diagonal products are exact zeros).
    constant = (expected_d == 0) & (n > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        fill = 1.0 if constant_pairs == "one" else np.nan
        kappa = np.where(constant, fill, 1.0 - observed_d / np.where(expected_d == 0, 1.0, expected_d))
    return kappa, constant


def cohen_kappa_from_confusion(
    confusion: np.ndarray, weights: KappaWeights = None, constant_pairs: ConstantPairs = "undefined"
) -> Value:
    """Cohen's kappa of one K x K confusion matrix (rows: rater a, columns: rater b).

    Both raters constant on the same label (p_e = 1): :class:`Undefined`, or 1.0 with
    ``constant_pairs="one"`` (:data:`CONSTANT_PAIR_CONVENTIONS`).
    """
    conf = np.asarray(confusion, dtype=np.float64)
    if conf.ndim != 2 or conf.shape[0] != conf.shape[1]:
        raise ValueError("confusion must be a square matrix")
    if conf.sum() == 0:
        return Undefined("no shared items")
    kappa, _ = _kappas(conf[None], weights, constant_pairs)
    if math.isnan(kappa[0]):
        return Undefined("both raters gave one and the same label on every shared item (p_e = 1)")
    return float(kappa[0])


def pair_confusions(ratings: Ratings) -> tuple[np.ndarray, np.ndarray]:
    """Confusion matrices of every annotator pair with at least one shared item.

    Returns ``(pairs, confusions)``: ``pairs`` is (P, 2) rater codes with a < b in rater
    order (lexicographic), ``confusions`` is (P, K, K) int64 (rows: a, columns: b).
    Computed at once as the co-occurrence of a sparse one-hot (rater x label, item) matrix.
    """
    from scipy import sparse  # here, where it is used: every process imports this module, few compute this

    k, n_r = ratings.n_categories, ratings.n_raters
    if ratings.n_ratings == 0 or k == 0:
        return np.zeros((0, 2), dtype=np.int64), np.zeros((0, k, k), dtype=np.int64)
    one_hot = sparse.csr_matrix(
        (np.ones(ratings.n_ratings, dtype=np.int64), (ratings.rater * k + ratings.label, ratings.item)),
        shape=(n_r * k, ratings.n_items),
    )
    co = (one_hot @ one_hot.T).tocoo()
    ra, la = np.divmod(co.row.astype(np.int64), k)
    rb, lb = np.divmod(co.col.astype(np.int64), k)
    keep = ra < rb
    key = ra[keep] * n_r + rb[keep]
    uniq, inv = np.unique(key, return_inverse=True)
    cells = inv * (k * k) + la[keep] * k + lb[keep]
    conf = np.bincount(cells, weights=co.data[keep].astype(np.float64), minlength=len(uniq) * k * k)
    pairs = np.stack(np.divmod(uniq, n_r), axis=1)
    return pairs, np.rint(conf).astype(np.int64).reshape(len(uniq), k, k)


def pairwise_cohen_kappa(
    ratings: Ratings, weights: KappaWeights = None, constant_pairs: ConstantPairs = "undefined"
) -> list[PairKappa]:
    """Cohen's kappa for every annotator pair on their shared items, in pair order.

    Weights index the categories in their order (``ratings.categories``), so absent
    intermediate categories still count in the distance. Pairs with no shared item are
    omitted. A pair whose raters are both constant on one label has kappa ``None``
    (undefined), or 1.0 with ``constant_pairs="one"``.
    """
    pairs, conf = pair_confusions(ratings)
    if len(pairs) == 0:
        return []
    kappa, constant = _kappas(conf, weights, constant_pairs)
    n_shared = conf.sum(axis=(1, 2))
    return [
        PairKappa(ratings.raters[a], ratings.raters[b], None if math.isnan(kv) else float(kv), int(ns), bool(cst))
        for (a, b), kv, ns, cst in zip(pairs.tolist(), kappa, n_shared, constant)
    ]


def cohen_kappa(
    labels_a: Sequence[Any],
    labels_b: Sequence[Any],
    *,
    weights: KappaWeights = None,
    categories: Sequence[Any] | None = None,
    constant_pairs: ConstantPairs = "undefined",
) -> Value:
    """Cohen's kappa of two aligned label sequences; positions where either is missing are skipped."""
    if len(labels_a) != len(labels_b):
        raise ValueError("the two label sequences must have the same length")
    n = len(labels_a)
    ratings = Ratings.from_columns(
        list(range(n)) * 2,
        ["a"] * n + ["b"] * n,
        list(labels_a) + list(labels_b),
        raters=["a", "b"],
        categories=categories,
    )
    result = pairwise_cohen_kappa(ratings, weights, constant_pairs)
    if not result:
        return Undefined("no shared items")
    if result[0].kappa is None:
        return Undefined("both raters gave one and the same label on every shared item (p_e = 1)")
    return result[0].kappa


def summarize(values: Sequence[float | None]) -> dict[str, Any]:
    """count, mean, median, min, max of the defined ``values`` (``None`` statistics when none);
    ``n_undefined``: the ``None`` values left out."""
    defined = [v for v in values if v is not None]
    arr = np.asarray(defined, dtype=np.float64)
    n_undefined = len(values) - len(defined)
    if arr.size == 0:
        return {"count": 0, "n_undefined": n_undefined, "mean": None, "median": None, "min": None, "max": None}
    return {
        "count": int(arr.size),
        "n_undefined": n_undefined,
        "mean": float(arr.mean()),
        "median": float(np.median(arr)),
        "min": float(arr.min()),
        "max": float(arr.max()),
    }


def pair_key(rater_a: Any, rater_b: Any) -> str:
    """Report key of a pair: ``"a__b"``."""
    return f"{rater_a}__{rater_b}"


def mean_pairwise_kappa(
    ratings: Ratings, weights: KappaWeights = None, constant_pairs: ConstantPairs = "undefined"
) -> Value:
    """Mean of the defined pairwise Cohen's kappas (undefined when no pair shares an item or
    every pair is undefined)."""
    result = [p.kappa for p in pairwise_cohen_kappa(ratings, weights, constant_pairs) if p.kappa is not None]
    if not result:
        return Undefined("no annotator pair with a defined kappa")
    return float(np.mean(result))


# --------------------------------------------------------------------------- bootstrap


def _no_bootstrap(
    ratings: Ratings, statistics: Mapping[str, Any], n_boot: int, confidence: float
) -> dict[str, Interval | Undefined] | None:
    """Every statistic's :class:`Undefined` when there is no bootstrap to run (``n_boot = 0``, no
    items), else ``None``; a confidence outside (0, 1) is an error."""
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must lie strictly between 0 and 1")
    if n_boot <= 0:
        return {name: Undefined("bootstrap disabled (n_boot = 0)") for name in statistics}
    if ratings.n_items == 0:
        return {name: Undefined("no items to resample") for name in statistics}
    return None


def bootstrap_intervals(
    ratings: Ratings,
    statistics: Mapping[str, Callable[[Ratings], Value]],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Interval | Undefined]:
    """Percentile bootstrap intervals of several statistics over the same item resamples.

    Each replicate draws ``n_items`` items with replacement (``numpy`` generator seeded
    with ``seed``) and evaluates every statistic on it; undefined or non-finite values
    are skipped. A statistic with no defined replicate gets :class:`Undefined`.
    """
    refused = _no_bootstrap(ratings, statistics, n_boot, confidence)
    if refused is not None:
        return refused
    rng = np.random.default_rng(seed)
    samples: dict[str, list[float]] = {name: [] for name in statistics}
    for _ in range(n_boot):
        replicate = ratings.take_items(rng.integers(0, ratings.n_items, size=ratings.n_items))
        for name, fn in statistics.items():
            value = fn(replicate)
            if not isinstance(value, Undefined) and math.isfinite(value):
                samples[name].append(float(value))
    tail = (1.0 - confidence) / 2.0
    out: dict[str, Interval | Undefined] = {}
    for name, values in samples.items():
        if not values:
            out[name] = Undefined("undefined in every bootstrap replicate")
            continue
        low, high = np.quantile(np.asarray(values), [tail, 1.0 - tail])
        out[name] = Interval(float(low), float(high), len(values), n_boot)
    return out


def bootstrap_ci(
    ratings: Ratings,
    statistic: Callable[[Ratings], Value],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Interval | Undefined:
    """Percentile bootstrap interval of one statistic, resampling items (seeded)."""
    return bootstrap_intervals(ratings, {"value": statistic}, n_boot=n_boot, seed=seed, confidence=confidence)["value"]


# --------------------------------------------------------------------------- vectorised bootstrap
#
# The report's percentile bootstrap, vectorised: pure maths (numpy, scipy.sparse), no Django.
#
# :func:`annotation.agreement.maths.bootstrap_intervals` builds each replicate's ratings and
# evaluates every coefficient on it, one replicate at a time (2.2 s of CPU for 1,000 replicates
# of 59 items). Every coefficient of the report is a function of sums over items (the count
# table, the coincidence matrix, the pair confusions), and a replicate only repeats items: so
# here a replicate is a row of item multiplicities ``W`` (the very draws of that function:
# ``numpy.random.default_rng(seed)``, one ``integers(0, n, size=n)`` per replicate, in order) and
# each coefficient is evaluated on all replicates at once from ``W @ per-item sums``. Same figures
# for the same seed (the intervals agree to rounding, ~1e-15; tests/unit/test_resampling.py checks
# them against the loop).
#
# :class:`Statistic` names a coefficient (kind, view of the ratings, level, weights); its
# :meth:`Statistic.on` is the coefficient on one :class:`Ratings` (the loop's callable).

KINDS = ("percent", "alpha", "gwet", "fleiss", "cohen")

#: Cells (replicates x columns) of one block of replicates evaluated together: bounds memory.
_BLOCK_CELLS = 20_000_000


@dataclass(frozen=True)
class Statistic:
    """One coefficient of the report's bootstrap. ``view``: ``None`` (the ratings), ``"binary"``
    (valid / invalid of validity signatures) or ``"flag:<FLAG>"`` (one flag raised or not);
    ``n_categories``: Q of Gwet's AC1 (``None``: the view's categories)."""

    kind: str
    view: str | None = None
    level: str = "nominal"
    weights: KappaWeights = None
    constant_pairs: ConstantPairs = "undefined"
    n_categories: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.kind!r}")

    def viewed(self, ratings: Ratings) -> Ratings:
        if self.view is None:
            return ratings
        if self.view == "binary":
            return binary_valid_ratings(ratings)
        return flag_ratings(ratings, self.view.split(":", 1)[1])

    def on(self, ratings: Ratings) -> Value:
        """The coefficient of ``ratings`` (the functions of :mod:`annotation.agreement.maths`)."""
        r = self.viewed(ratings)
        if self.kind == "percent":
            return percent_agreement(r)
        if self.kind == "alpha":
            return krippendorff_alpha(r, self.level)  # type: ignore[arg-type]
        if self.kind == "gwet":
            return gwet_ac1_from_counts(r.counts(), self.n_categories or r.n_categories)
        if self.kind == "fleiss":
            return fleiss_kappa(r)
        return mean_pairwise_kappa(r, self.weights, self.constant_pairs)


def replicate_blocks(n_items: int, n_boot: int, seed: int, block: int) -> Iterator[np.ndarray]:
    """Item multiplicities of each replicate, ``block`` replicates at a time ((b, n_items) int32):
    the draws of :func:`annotation.agreement.maths.bootstrap_intervals`, in its order."""
    rng = np.random.default_rng(seed)
    for start in range(0, n_boot, block):
        rows = min(block, n_boot - start)
        w = np.empty((rows, n_items), dtype=np.float64)
        for b in range(rows):
            w[b] = np.bincount(rng.integers(0, n_items, size=n_items), minlength=n_items)
        yield w


def _weighted_mean(w: np.ndarray, values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Per replicate, the mean of ``values`` over the items ``keep`` with multiplicities (NaN: none)."""
    total = w[:, keep].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, w[:, keep] @ values[keep] / np.where(total > 0, total, 1.0), np.nan)


class _Evaluator:
    """Per-item sums of one coefficient on one view, evaluated on blocks of replicates."""

    def __init__(self, stat: Statistic, ratings: Ratings) -> None:
        self.stat = stat
        r = stat.viewed(ratings)
        self.r = r
        self.c = r.counts().astype(np.float64)
        self.m = self.c.sum(axis=1)
        self.pairable = self.m >= 2
        with np.errstate(divide="ignore", invalid="ignore"):
            self.p_agree = np.where(
                self.pairable,
                (self.c * (self.c - 1)).sum(axis=1) / np.where(self.pairable, self.m * (self.m - 1), 1.0),
                0.0,
            )
        self.columns = self.c.shape[1] ** 2 if stat.kind == "alpha" else self.c.shape[1]
        if stat.kind == "cohen":
            self._pairs()
        if stat.kind == "alpha":  # each pairable item's part of the coincidence matrix
            c, k = self.c[self.pairable], self.c.shape[1]
            self.coincidence = (
                (c[:, :, None] * c[:, None, :] - np.eye(k)[None] * c[:, None, :]) / (c.sum(axis=1) - 1.0)[:, None, None]
            ).reshape(len(c), k * k)

    # ------------------------------------------------------------------ per kind

    def __call__(self, w: np.ndarray) -> np.ndarray:
        return getattr(self, f"_{self.stat.kind}")(w)

    def _percent(self, w: np.ndarray) -> np.ndarray:
        return _weighted_mean(w, self.p_agree, self.pairable)

    def _gwet(self, w: np.ndarray) -> np.ndarray:
        q = self.stat.n_categories or self.r.n_categories
        if q < 2:
            return np.full(len(w), np.nan)
        rated = self.m >= 1
        p_a = _weighted_mean(w, self.p_agree, self.pairable)
        share = self.c[rated] / self.m[rated, None]
        total = w[:, rated].sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            pi = (w[:, rated] @ share) / total
            p_e = (pi * (1.0 - pi)).sum(axis=1) / (q - 1)
            return (p_a - p_e) / (1.0 - p_e)

    def _fleiss(self, w: np.ndarray) -> np.ndarray:
        rated = self.m > 0
        if not rated.any():
            return np.full(len(w), np.nan)
        c, sizes, wr = self.c[rated], self.m[rated], w[:, rated]
        present = np.where(wr > 0, sizes[None, :], np.nan)  # each replicate's items: all as many ratings?
        n = np.nanmin(present, axis=1)
        equal = (n == np.nanmax(present, axis=1)) & (n >= 2)
        n_items = wr.sum(axis=1)
        totals = wr @ c
        with np.errstate(divide="ignore", invalid="ignore"):
            p = totals / (n_items * n)[:, None]
            p_bar = wr @ (((c * c).sum(axis=1) - sizes) / (sizes * (sizes - 1))) / n_items
            p_e = (p * p).sum(axis=1)
            kappa = (p_bar - p_e) / (1.0 - p_e)
        return np.where(equal & ((totals > 0).sum(axis=1) >= 2), kappa, np.nan)

    def _alpha(self, w: np.ndarray) -> np.ndarray:
        c = self.c[self.pairable]
        k = c.shape[1]
        if not len(c):
            return np.full(len(w), np.nan)
        wp = w[:, self.pairable]
        o = (wp @ self.coincidence).reshape(len(w), k, k)
        n_v = wp @ c
        d = self._alpha_distances(n_v)
        total = n_v.sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            expected = (n_v[:, :, None] * n_v[:, None, :] - n_v[:, :, None] * np.eye(k)[None]) / (total - 1.0)[
                :, None, None
            ]
            alpha = 1.0 - (o * d).sum(axis=(1, 2)) / (expected * d).sum(axis=(1, 2))
        return np.where((n_v > 0).sum(axis=1) >= 2, alpha, np.nan)

    def _alpha_distances(self, n_v: np.ndarray) -> np.ndarray:
        """:func:`annotation.agreement.maths._alpha_distances` of every replicate ((b, k, k))."""
        k, level = n_v.shape[1], self.stat.level
        if level != "ordinal":
            domain = _numeric_domain(self.r.categories, level)
            d = _alpha_distances(level, np.arange(k, dtype=np.float64) if domain is None else domain, n_v[0])
            return np.broadcast_to(d, (len(n_v), k, k))
        cum = np.concatenate((np.zeros((len(n_v), 1)), np.cumsum(n_v, axis=1)), axis=1)
        lo = np.minimum.outer(np.arange(k), np.arange(k))
        hi = np.maximum.outer(np.arange(k), np.arange(k))
        between = cum[:, hi + 1] - cum[:, lo]
        return (between - (n_v[:, :, None] + n_v[:, None, :]) / 2.0) ** 2

    def _pairs(self) -> None:
        """One sparse (items, pairs x k x k) incidence: item i adds 1 to cell (a's label, b's
        label) of pair (a, b) when both rated it (the pairs of :func:`maths.pair_confusions`)."""
        from scipy import sparse

        dense, k, n_r = self.r.dense(), self.r.n_categories, self.r.n_raters
        rows, cols, pairs = [], [], []
        for a in range(n_r):
            for b in range(a + 1, n_r):
                both = np.flatnonzero((dense[a] >= 0) & (dense[b] >= 0))
                if len(both):
                    rows.append(both)
                    cols.append(len(pairs) * k * k + dense[a, both] * k + dense[b, both])
                    pairs.append((a, b))
        self.n_pairs = len(pairs)
        self.columns = max(1, self.n_pairs * k * k)
        self.incidence = sparse.csc_matrix(
            (
                np.ones(sum(map(len, rows))),
                (np.concatenate(rows) if rows else [], np.concatenate(cols) if cols else []),
            ),
            shape=(self.r.n_items, self.columns),
        )

    def _cohen(self, w: np.ndarray) -> np.ndarray:
        if not self.n_pairs:
            return np.full(len(w), np.nan)
        k = self.r.n_categories
        conf = np.asarray((self.incidence.T @ w.T).T).reshape(len(w) * self.n_pairs, k, k)
        kappa, _ = _kappas(conf, self.stat.weights, self.stat.constant_pairs)
        kappa = kappa.reshape(len(w), self.n_pairs)
        defined = ~np.isnan(kappa)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(defined.any(axis=1), np.nansum(kappa, axis=1) / defined.sum(axis=1), np.nan)


def bootstrap_statistics(
    ratings: Ratings,
    statistics: Mapping[str, Statistic],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Interval | Undefined]:
    """Percentile bootstrap intervals of ``statistics`` over the same item resamples, all
    replicates at once: the figures of :func:`annotation.agreement.maths.bootstrap_intervals`
    with ``{name: stat.on}`` (same draws, same skipping of undefined or non-finite values)."""
    refused = _no_bootstrap(ratings, statistics, n_boot, confidence)
    if refused is not None:
        return refused
    evaluators = {name: _Evaluator(stat, ratings) for name, stat in statistics.items()}
    widest = max([ratings.n_items, *(e.columns for e in evaluators.values())])
    block = max(1, min(n_boot, _BLOCK_CELLS // widest))
    values: dict[str, list[np.ndarray]] = {name: [] for name in statistics}
    for w in replicate_blocks(ratings.n_items, n_boot, seed, block):
        for name, evaluate in evaluators.items():
            values[name].append(evaluate(w))
    return _percentiles(values, n_boot, confidence)


def _percentiles(values: dict[str, list[np.ndarray]], n_boot: int, confidence: float) -> dict[str, Any]:
    tail = (1.0 - confidence) / 2.0
    out: dict[str, Interval | Undefined] = {}
    for name, blocks in values.items():
        v = np.concatenate(blocks)
        v = v[np.isfinite(v)]
        if not len(v):
            out[name] = Undefined("undefined in every bootstrap replicate")
            continue
        low, high = np.quantile(v, [tail, 1.0 - tail])
        out[name] = Interval(float(low), float(high), len(v), n_boot)
    return out


# --------------------------------------------------------------------------- validity rubric

# The CIRCUS flags and signature strings are defined once, with the rubric (FLAGS is
# re-exported here under its agreement name).
FLAGS = CIRCUS_FLAG_ORDER
VALIDATED = VALIDATED_LABEL
_FLAG_INDEX = {f: i for i, f in enumerate(FLAGS)}


def validity_signature(label: Any) -> str | None:
    """Signature string of a validity label; ``None`` for a missing label.

    ``"VALIDATED"`` -> ``"VALID"``; a list (tuple, set) of flags -> the flags joined with
    ``'+'`` in canonical order; an empty list -> ``"INVALID_UNSPECIFIED"``.
    """
    if _is_missing(label):
        return None
    if isinstance(label, str):
        if label == VALIDATED:
            return VALID_SIGNATURE
        raise ValueError(f"validity label must be {VALIDATED!r} or a list of flags, not the string {label!r}")
    if not isinstance(label, (list, tuple, set, frozenset)):
        raise ValueError(f"validity label must be {VALIDATED!r} or a list of flags, not {label!r}")
    flags = set(label)
    unknown = flags - set(FLAGS)
    if unknown:
        raise ValueError(f"unknown flag(s) {sorted(map(str, unknown))}; expected a subset of {list(FLAGS)}")
    return circus_signature(flags, False)


def signature_flags(signature: str) -> frozenset[str]:
    """The flags of a signature string (empty for VALID and INVALID_UNSPECIFIED)."""
    if signature in (VALID_SIGNATURE, UNSPECIFIED_SIGNATURE):
        return frozenset()
    parts = signature.split("+")
    unknown = [p for p in parts if p not in _FLAG_INDEX]
    if unknown or len(set(parts)) != len(parts):
        raise ValueError(f"malformed signature {signature!r}")
    return frozenset(parts)


def label_from_signature(signature: str) -> str | list[str]:
    """Inverse of :func:`validity_signature`: ``"VALIDATED"`` or a list of flags."""
    if signature == VALID_SIGNATURE:
        return VALIDATED
    flags = signature_flags(signature)
    return [f for f in FLAGS if f in flags]


def _signature_sort_key(signature: str) -> tuple[int, tuple[int, ...]]:
    if signature == VALID_SIGNATURE:
        return (0, ())
    if signature == UNSPECIFIED_SIGNATURE:
        return (1, ())
    return (2, tuple(sorted(_FLAG_INDEX[f] for f in signature_flags(signature))))


def validity_ratings(triples: Iterable[tuple[Any, Any, Any]], *, raters: Sequence[Any] | None = None) -> Ratings:
    """Ratings whose categories are signature strings, from validity-label triples."""
    rows = triples if isinstance(triples, list) else list(triples)
    if rows and set(map(len, rows)) != {3}:
        raise ValueError("every triple must be (item, annotator, label)")
    # Lists are unhashable: key each label by a tuple, then sign each distinct key once.
    keys = [tuple(t[2]) if isinstance(t[2], (list, set)) else t[2] for t in rows]
    raw, uniques = _first_seen_codes(keys, "validity labels")
    signatures = [validity_signature(u) for u in uniques]
    categories = tuple(sorted({s for s in signatures if s is not None}, key=_signature_sort_key))
    index = {c: i for i, c in enumerate(categories)}
    remap = np.array([-1 if s is None else index[s] for s in signatures], dtype=np.int64)
    return Ratings._assemble(
        list(map(itemgetter(0), rows)),
        list(map(itemgetter(1), rows)),
        remap[raw] if len(raw) else raw,
        categories,
        raters,
    )


def binary_valid_ratings(signatures: Ratings) -> Ratings:
    """1 for VALID, 0 for any other signature; categories ``(0, 1)``."""
    mapping = [1 if c == VALID_SIGNATURE else 0 for c in signatures.categories]
    return signatures.relabel(mapping, (0, 1))


def flag_ratings(signatures: Ratings, flag: str) -> Ratings:
    """1 when ``flag`` is one of the signature's flags, else 0; categories ``(0, 1)``."""
    if flag not in _FLAG_INDEX:
        raise ValueError(f"unknown flag {flag!r}")
    mapping = [1 if flag in signature_flags(c) else 0 for c in signatures.categories]
    return signatures.relabel(mapping, (0, 1))


def validity_rates(signatures: Ratings) -> dict[str, Value]:
    """exact_agreement_rate, unanimous_valid_invalid_rate, exact_invalid_signature_rate.

    Over items with >= 2 ratings; see :data:`VALIDITY_CONVENTIONS`.
    """
    counts, m = _pairable_counts(signatures.counts())
    if counts.shape[0] == 0:
        reason = Undefined("no item has two or more ratings")
        return {
            "exact_agreement_rate": reason,
            "unanimous_valid_invalid_rate": reason,
            "exact_invalid_signature_rate": reason,
        }
    exact = counts.max(axis=1) == m
    if VALID_SIGNATURE in signatures.categories:
        valid = counts[:, signatures.categories.index(VALID_SIGNATURE)]
    else:
        valid = np.zeros_like(m)
    unanimous_invalid = valid == 0
    unanimous = unanimous_invalid | (valid == m)
    invalid_rate: Value
    if unanimous_invalid.any():
        invalid_rate = float(exact[unanimous_invalid].mean())
    else:
        invalid_rate = Undefined("no item is unanimously invalid")
    return {
        "exact_agreement_rate": float(exact.mean()),
        "unanimous_valid_invalid_rate": float(unanimous.mean()),
        "exact_invalid_signature_rate": invalid_rate,
    }


# --------------------------------------------------------------------------- report


N_SIGNATURES = 2 ** len(FLAGS) + 1  # VALID, INVALID_UNSPECIFIED and every non-empty set of flags


def default_kappa_weights(level: str) -> KappaWeights:
    """THE default weights of Cohen's kappa, stated once: none at the nominal level, quadratic
    at the ordinal, interval and ratio levels (rubric scales, ``manage.py agreement FILE``
    and ``--study`` all take it from here; ``--weights`` overrides it for a file)."""
    return None if level == "nominal" else "quadratic"


class _Recorder:
    """Turns values into JSON numbers and records why any of them is null."""

    def __init__(self) -> None:
        self.undefined: dict[str, str] = {}

    def __call__(self, path: str, value: Value) -> float | None:
        if isinstance(value, Undefined):
            self.undefined[path] = value.reason
            return None
        return float(value)


def _pairwise_block(
    ratings: Ratings, weights: KappaWeights, constant_pairs: ConstantPairs, rec: _Recorder, path: str
) -> dict[str, Any]:
    """Summary (over the defined pairs), weights, kappa and shared items of every pair."""
    pairs = pairwise_cohen_kappa(ratings, weights, constant_pairs)
    summary = summarize([p.kappa for p in pairs])
    if not pairs:
        rec.undefined[path] = "no annotator pair shares an item"
    elif summary["count"] == 0:
        rec.undefined[path] = "every annotator pair is constant on one label (kappa undefined)"
    undefined = [pair_key(p.rater_a, p.rater_b) for p in pairs if p.kappa is None]
    if undefined:
        rec.undefined[f"{path}.by_pair"] = "both raters constant on one label (p_e = 1): " + ", ".join(undefined)
    return {
        **summary,
        "n_pairs": len(pairs),
        "weights": weights or "none",
        "constant_pairs": constant_pairs,
        "by_pair": {pair_key(p.rater_a, p.rater_b): p.kappa for p in pairs},
        "shared_items_by_pair": {pair_key(p.rater_a, p.rater_b): p.n_shared for p in pairs},
    }


def _binary_block(ratings: Ratings, rec: _Recorder, path: str, constant_pairs: ConstantPairs) -> dict[str, Any]:
    pairwise = _pairwise_block(ratings, None, constant_pairs, rec, f"{path}.pairwise_cohen")
    by_pair = pairwise.pop("by_pair")
    pairwise.pop("shared_items_by_pair")
    return {
        "fleiss_kappa": rec(f"{path}.fleiss_kappa", fleiss_kappa(ratings)),
        "krippendorff_alpha_nominal": rec(f"{path}.krippendorff_alpha_nominal", krippendorff_alpha(ratings, "nominal")),
        "gwet_ac1": rec(f"{path}.gwet_ac1", gwet_ac1(ratings)),
        "percent_agreement": rec(f"{path}.percent_agreement", percent_agreement(ratings)),
        "pairwise_cohen": pairwise,
        "pairwise_cohen_by_pair": by_pair,
    }


@dataclass(frozen=True)
class _Options:
    rubric: str | None
    level: str
    weights: KappaWeights
    constant_pairs: ConstantPairs
    n_categories: int | None  # Q of Gwet's AC1 (None: the ratings' categories)


def _check_options(rubric: str | None, level: str, constant_pairs: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, not {level!r}")
    if rubric not in (None, "validity"):
        raise ValueError(f"unknown rubric {rubric!r}")
    if rubric == "validity" and level != "nominal":
        raise ValueError("the validity rubric is nominal")
    check_constant_pairs(constant_pairs)


def _ratings_of(
    data: Iterable[tuple[Any, Any, Any]] | Ratings,
    rubric: str | None,
    raters: Sequence[Any] | None,
    categories: Sequence[Any] | None,
) -> Ratings:
    if isinstance(data, Ratings):
        all_ratings = data
    elif rubric == "validity":
        all_ratings = validity_ratings(data, raters=raters)
    else:
        all_ratings = Ratings.from_triples(data, raters=raters, categories=categories)
    if rubric == "validity":
        bad = [c for c in all_ratings.categories if not isinstance(c, str)]
        if bad:
            raise ValueError("validity ratings must have signature strings as categories")
        for c in all_ratings.categories:
            if c != VALID_SIGNATURE:
                signature_flags(c)
    return all_ratings


def _headline(ratings: Ratings, all_ratings: Ratings, opts: _Options, rec: _Recorder) -> dict[str, Any]:
    annotators = ratings.active_raters()
    return {
        "rubric": opts.rubric or "generic",
        "level": opts.level,
        "annotators": [str(a) for a in annotators],
        "n_items": ratings.n_items,
        "n_annotators": len(annotators),
        "n_judgements": ratings.n_ratings,
        "n_items_excluded": all_ratings.n_items - ratings.n_items,
        "n_categories": opts.n_categories or ratings.n_categories,
        "percent_agreement": rec("percent_agreement", percent_agreement(ratings)),
        "all_ratings_identical_rate": rec("all_ratings_identical_rate", all_identical_rate(ratings)),
        "label_prevalence": label_prevalence(ratings),
        "krippendorff_alpha": rec("krippendorff_alpha", krippendorff_alpha(ratings, opts.level)),  # type: ignore[arg-type]
        "fleiss_kappa": rec("fleiss_kappa", fleiss_kappa(ratings)),
        "gwet_ac1": rec("gwet_ac1", gwet_ac1_from_counts(ratings.counts(), opts.n_categories or ratings.n_categories)),
        "pairwise_cohen": _pairwise_block(ratings, opts.weights, opts.constant_pairs, rec, "pairwise_cohen"),
    }


def _statistics(report: dict[str, Any], opts: _Options) -> dict[str, Statistic]:
    """The coefficients the report's bootstrap resamples (:class:`Statistic`)."""
    level, weights, cp, q = opts.level, opts.weights, opts.constant_pairs, opts.n_categories
    statistics = {
        "percent_agreement": Statistic("percent"),
        "krippendorff_alpha": Statistic("alpha", level=level),
        "gwet_ac1": Statistic("gwet", n_categories=q),
        "pairwise_cohen_mean": Statistic("cohen", weights=weights, constant_pairs=cp),
    }
    if report["fleiss_kappa"] is not None:
        statistics["fleiss_kappa"] = Statistic("fleiss")
    if opts.rubric == "validity":
        statistics["binary_valid_invalid.krippendorff_alpha_nominal"] = Statistic("alpha", "binary")
        statistics["binary_valid_invalid.gwet_ac1"] = Statistic("gwet", "binary")
        statistics["binary_valid_invalid.pairwise_cohen_mean"] = Statistic("cohen", "binary", constant_pairs=cp)
        if report["binary_valid_invalid"]["fleiss_kappa"] is not None:
            statistics["binary_valid_invalid.fleiss_kappa"] = Statistic("fleiss", "binary")
        for flag in FLAGS:
            statistics[f"per_flag_agreement.{flag}.krippendorff_alpha_nominal"] = Statistic("alpha", f"flag:{flag}")
    return statistics


def _validity_blocks(ratings: Ratings, rec: _Recorder, constant_pairs: ConstantPairs) -> dict[str, Any]:
    binary = binary_valid_ratings(ratings)
    rates = validity_rates(ratings)
    block = {
        "n_items": ratings.n_items,
        "n_raters": len(ratings.active_raters()),
        **{name: rec(f"binary_valid_invalid.{name}", value) for name, value in rates.items()},
        "valid_rate": label_prevalence(binary)["1"],
    }
    block.update(_binary_block(binary, rec, "binary_valid_invalid", constant_pairs))
    per_flag: dict[str, Any] = {}
    for flag in FLAGS:
        fr = flag_ratings(ratings, flag)
        fb = _binary_block(fr, rec, f"per_flag_agreement.{flag}", constant_pairs)
        fb["positive_rate"] = label_prevalence(fr)["1"]
        per_flag[flag] = fb
    return {
        "binary_valid_invalid": block,
        "per_flag_agreement": per_flag,
        "signature_alpha_nominal": rec("signature_alpha_nominal", krippendorff_alpha(ratings, "nominal")),
    }


def _intervals(
    ratings: Ratings, statistics: dict[str, Statistic], rec: _Recorder, *, n_boot: int, seed: int, confidence: float
) -> dict[str, Any]:
    intervals = bootstrap_statistics(ratings, statistics, n_boot=n_boot, seed=seed, confidence=confidence)
    for name, iv in intervals.items():
        if isinstance(iv, Undefined):
            rec.undefined[f"confidence_intervals.{name}"] = iv.reason
    return {
        "method": "percentile bootstrap, items resampled with replacement",
        "n_boot": n_boot,
        "n_items": ratings.n_items,
        "seed": seed,
        "confidence": confidence,
        "intervals": {name: (None if isinstance(iv, Undefined) else iv.to_json()) for name, iv in intervals.items()},
    }


def agreement_report(
    data: Iterable[tuple[Any, Any, Any]] | Ratings,
    *,
    rubric: Literal["validity"] | None = None,
    level: Level = "nominal",
    raters: Sequence[Any] | None = None,
    categories: Sequence[Any] | None = None,
    kappa_weights: KappaWeights | Literal["auto"] = "auto",
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    constant_pairs: ConstantPairs = "undefined",
    n_categories: int | None = None,
) -> dict[str, Any]:
    """The whole agreement report as a JSON-ready dict.

    ``data``: ``(item, annotator, label)`` triples (or a prepared :class:`Ratings`; for
    ``rubric="validity"`` its categories must be signature strings). With
    ``rubric="validity"`` labels are ``"VALIDATED"`` or a list of flags, the level is
    nominal, and the report adds ``binary_valid_invalid``, ``per_flag_agreement`` and
    ``signature_alpha_nominal`` shaped as in the CIRCUS ``agreement_report.json``.
    ``categories``: the scale (the rubric's, so unused values count). ``kappa_weights="auto"``:
    :func:`default_kappa_weights` (none for nominal, quadratic otherwise).
    ``constant_pairs``: Cohen's kappa of a pair constant on one label is ``"undefined"``
    (default) or ``"one"`` (CIRCUS). ``n_categories``: Q of Gwet's AC1 (default: the
    categories; validity: all :data:`N_SIGNATURES` signatures). ``n_boot=0`` skips the
    bootstrap (its cost grows with items). Null values are explained in ``undefined``;
    conventions are listed in ``conventions``.
    """
    _check_options(rubric, level, constant_pairs)
    weights: KappaWeights = default_kappa_weights(level) if kappa_weights == "auto" else kappa_weights
    if rubric == "validity" and n_categories is None:
        n_categories = N_SIGNATURES
    opts = _Options(rubric, level, weights, constant_pairs, n_categories)
    all_ratings = _ratings_of(data, rubric, raters, categories)
    ratings = all_ratings.min_ratings(2)
    rec = _Recorder()
    report = _headline(ratings, all_ratings, opts, rec)
    conventions = list(CONVENTIONS) + [CONSTANT_PAIR_CONVENTIONS[constant_pairs]]
    if rubric == "validity":
        conventions += VALIDITY_CONVENTIONS
        report.update(_validity_blocks(ratings, rec, constant_pairs))
    report["confidence_intervals"] = _intervals(
        ratings, _statistics(report, opts), rec, n_boot=n_boot, seed=seed, confidence=confidence
    )
    report["undefined"] = rec.undefined
    report["conventions"] = conventions
    return report
