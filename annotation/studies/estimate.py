"""A benchmark's defect rate from a stratified sample (issue 40, item 2): pure maths, no Django.

An *estimate* study judges a sample of the benchmark, not all of it, and estimates what share
of the whole benchmark has each defect kind. The design (Cochran, *Sampling Techniques*, 3rd
ed., 1977, chapter 5):

* **Strata** by suspicion score (:mod:`audit.suspicion`): :func:`cum_sqrt_f_bounds` draws the
  boundaries by the cumulative square-root-of-frequency rule (Dalenius and Hodges; Cochran
  5A.7) over :data:`BINS` equal-width bins of the scores; an item with score ``s`` is in the
  first stratum whose upper bound is at least ``s`` (:func:`stratum_of`). A stratum with fewer
  than :data:`MIN_PER_STRATUM` items is merged with its neighbour.
* **Allocation** (Neyman: ``n_h`` proportional to ``N_h S_h``) is run one item at a time
  (:func:`serving_plan`): every stratum first gets :data:`MIN_PER_STRATUM` items (a stratum
  variance needs two), then the next item goes to the stratum whose variance term
  ``N_h^2 S_h^2 (1/n_h - 1/N_h)`` falls most by one more item, ``N_h^2 S_h^2 / (n_h (n_h + 1))``
  (the finite population correction cancels in the difference). This greedy step gives the
  integer allocation of least variance at every sample size, so any prefix of the plan is a
  Neyman sample. ``S_h = sqrt(p_h (1 - p_h))`` with ``p_h`` :func:`planning_rate`: the
  stratum's mean suspicion score (the prior), or, re-planned from the data, the observed defect
  rate shrunk towards it with :data:`PRIOR_WEIGHT` pseudo-items. (Re-planning makes a stratum's
  sample size depend on its own outcomes: a stratum that showed few defects gets fewer items and
  its low rate stays, so the estimate leans low where strata are sampled nearly in full;
  bench/estimate.py measures both.) Within a stratum, items come in
  a seeded shuffle (:func:`stratum_order`), so the judged items of a stratum are a simple
  random sample of it.
* **Estimator** (:func:`stratified_estimate`): ``p_st = sum_h W_h p_h`` with ``W_h = N_h / N``;
  its variance (Cochran 5.47, with the finite population correction)
  ``v(p_st) = (1 / N^2) sum_h N_h (N_h - n_h) p_h q_h / (n_h - 1)``; each judged item of
  stratum ``h`` stands for ``N_h / n_h`` items of the benchmark (its design weight). The 95 %
  interval is Wilson's score interval at the design's effective sample size
  ``n_eff = p_st q_st / v~`` (Kish; ``n / (1 - n / N)`` when ``v~`` is 0), where ``v~``
  (:func:`interval_variance`) is the same sum with each stratum's rate read as
  ``p~_h = (x_h + 1/2) / (n_h + 1)`` (the Jeffreys prior's posterior mean) over ``n_h``: a
  stratum where no defect was seen yet (the low-suspicion strata, often) still adds its
  uncertainty, where 5.47 would add none. Unlike the Wald interval ``p_st +/- 1.96 sqrt(v)`` it
  stays inside [0, 1]. (bench/estimate.py measured the plain 5.47 variance in Wilson's interval
  at 92 % coverage on its beta benchmark, this one at 94-96 % on its large benchmarks.) A stratum judged in full
  contributes no variance; a benchmark judged in full has a point interval.
* **Stop rule** (:func:`stop_reached`): stop serving when the overall defect rate's interval
  has a half-width (half its length) at most the study's target.

Sample sizes to compare with (:func:`srs_sample_size`, :func:`neyman_sample_size`): simple
random sampling (Cochran 4.2) and Neyman allocation with the true stratum rates (Cochran 5.26,
with the strata that would be over-sampled taken in full, 5.9).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from annotation.core.study_settings import DEFAULT_ESTIMATE_STRATA
from annotation.quality.signals import Z95, wilson

#: Equal-width bins of the score range the cum sqrt(f) rule reads.
BINS = 50
#: Strata by default (Cochran 5A.8: little is gained beyond about six): the estimate settings' default.
DEFAULT_STRATA = DEFAULT_ESTIMATE_STRATA
#: Judged items every stratum gets first (a stratum's variance needs two), and the fewest a stratum may hold.
MIN_PER_STRATUM = 2
#: Pseudo-items of the prior rate (the stratum's mean score) the observed rate is shrunk towards when planning.
PRIOR_WEIGHT = 4.0
#: Planning rates are kept inside [FLOOR, 1 - FLOOR], so that no stratum is planned with a zero SD.
FLOOR = 0.02


# --------------------------------------------------------------------------- strata


def cum_sqrt_f_bounds(scores: Sequence[float], n_strata: int = DEFAULT_STRATA, bins: int = BINS) -> list[float]:
    """Upper bounds of the strata, ascending, the last one ``max(scores)``: the cumulative
    sqrt(f) rule over ``bins`` equal-width bins of ``[min, max]``. A cut falls at the bin edge
    where the cumulative sqrt(f) first reaches ``k / n_strata`` of its total; equal cuts are one.
    Strata with fewer than :data:`MIN_PER_STRATUM` scores are merged into the stratum below
    (the lowest into the one above)."""
    if n_strata < 1 or bins < 1:
        raise ValueError(f"n_strata and bins must be at least 1, got {n_strata} and {bins}")
    values = [float(s) for s in scores]
    if not values:
        raise ValueError("no scores to stratify")
    if any(math.isnan(v) for v in values):
        raise ValueError("a score is NaN")
    lo, hi = min(values), max(values)
    if hi == lo or n_strata == 1:
        return [hi]
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(int((v - lo) / width), bins - 1)] += 1
    roots = [math.sqrt(c) for c in counts]
    total = sum(roots)
    cuts: list[float] = []
    running = 0.0
    k = 1
    for j, r in enumerate(roots[:-1]):
        running += r
        while k < n_strata and running >= total * k / n_strata - 1e-12:
            edge = lo + (j + 1) * width
            if not cuts or edge > cuts[-1]:
                cuts.append(edge)
            k += 1
    return _merge_small(values, cuts + [hi])


def _merge_small(values: Sequence[float], bounds: list[float]) -> list[float]:
    """Drop bounds until every stratum holds at least :data:`MIN_PER_STRATUM` values (or one is left)."""
    bounds = list(bounds)
    while len(bounds) > 1:
        sizes = stratum_sizes(values, bounds)
        small = [h for h, n in enumerate(sizes) if n < MIN_PER_STRATUM]
        if not small:
            break
        h = small[0]
        # merge stratum h with the one below (drop the bound under it), the lowest with the one above
        del bounds[h - 1 if h > 0 else 0]
    return bounds


def stratum_of(score: float, bounds: Sequence[float]) -> int:
    """The stratum (0 = lowest scores) of ``score``: the first whose upper bound is at least it;
    a score above the last bound goes to the last stratum."""
    for h, upper in enumerate(bounds):
        if score <= upper:
            return h
    return len(bounds) - 1


def stratum_sizes(scores: Iterable[float], bounds: Sequence[float]) -> list[int]:
    """N_h: how many scores fall in each stratum."""
    sizes = [0] * len(bounds)
    for s in scores:
        sizes[stratum_of(s, bounds)] += 1
    return sizes


def stratum_order(item_ids: Iterable[Hashable], seed: int, stratum: int) -> list[Hashable]:
    """The stratum's items in their serving order: sorted, then shuffled by a stream seeded with
    the study's seed and the stratum (reproducible across processes: string seeds hash with SHA-512)."""
    ids = sorted(item_ids)
    random.Random(f"{seed!r}|estimate|{stratum!r}").shuffle(ids)
    return ids


# --------------------------------------------------------------------------- allocation


def planning_rate(prior: float, defects: int = 0, judged: int = 0, weight: float = PRIOR_WEIGHT) -> float:
    """The defect rate a stratum's allocation is planned with: ``(weight * prior + defects) /
    (weight + judged)``, kept inside [FLOOR, 1 - FLOOR]. With nothing judged: the prior (the
    stratum's mean suspicion score)."""
    if judged < 0 or defects < 0 or defects > judged:
        raise ValueError(f"bad counts: {defects} defects of {judged} judged")
    rate = (weight * prior + defects) / (weight + judged) if weight + judged > 0 else prior
    return min(max(rate, FLOOR), 1 - FLOOR)


def planning_rates(
    priors: Sequence[float], defects: Sequence[int], judged: Sequence[int], reallocate: bool
) -> list[float]:
    """The rates a plan's SDs come from: the priors alone, or with ``reallocate`` the observed
    rates shrunk towards them (:func:`planning_rate`)."""
    if not reallocate:
        return [planning_rate(p) for p in priors]
    return [planning_rate(p, d, j) for p, d, j in zip(priors, defects, judged)]


def bernoulli_sd(rate: float) -> float:
    """sqrt(p (1 - p))."""
    return math.sqrt(max(rate * (1 - rate), 0.0))


def serving_plan(items: Sequence[Sequence[Hashable]], taken: Sequence[int], sds: Sequence[float]) -> list[int]:
    """The strata of the next items to serve, in order, until every stratum is exhausted.

    ``items[h]``: how many items stratum ``h`` has (its sequence's length is N_h, the ids are
    not read); ``taken[h]``: how many of them were served already; ``sds[h]``: its planning SD.
    First every stratum is brought to :data:`MIN_PER_STRATUM` (lowest stratum index first),
    then each step serves the stratum of largest ``N_h^2 S_h^2 / (n_h (n_h + 1))`` (ties: the
    higher stratum)."""
    if not len(items) == len(taken) == len(sds):
        raise ValueError("items, taken and sds must have one entry per stratum")
    sizes = [len(s) for s in items]
    n = list(taken)
    if any(t < 0 or t > size for t, size in zip(n, sizes)):
        raise ValueError(f"taken {list(taken)} must lie between 0 and the stratum sizes {sizes}")
    plan: list[int] = []
    for h, size in enumerate(sizes):
        while n[h] < min(MIN_PER_STRATUM, size):
            plan.append(h)
            n[h] += 1
    heap = [(-_gain(sizes[h], sds[h], n[h]), -h) for h in range(len(sizes)) if n[h] < sizes[h]]
    heapq.heapify(heap)
    while heap:
        _, neg_h = heapq.heappop(heap)
        h = -neg_h
        plan.append(h)
        n[h] += 1
        if n[h] < sizes[h]:
            heapq.heappush(heap, (-_gain(sizes[h], sds[h], n[h]), -h))
    return plan


def next_stratum(sizes: Sequence[int], taken: Sequence[int], sds: Sequence[float]) -> int | None:
    """The stratum of the next item :func:`serving_plan` would serve (None: every stratum exhausted)."""
    open_ = [h for h in range(len(sizes)) if taken[h] < sizes[h]]
    short = [h for h in open_ if taken[h] < MIN_PER_STRATUM]
    if short:
        return short[0]
    if not open_:
        return None
    return max(open_, key=lambda h: (_gain(sizes[h], sds[h], taken[h]), h))


def _gain(size: int, sd: float, n: int) -> float:
    """How much one more item in a stratum lowers ``N^2 S^2 (1/n - 1/N)``: ``N^2 S^2 / (n (n + 1))``."""
    return math.inf if n == 0 else (size * sd) ** 2 / (n * (n + 1))


def plan_items(strata: Sequence[Sequence[Hashable]], taken: Sequence[int], sds: Sequence[float]) -> list[Hashable]:
    """The item ids still to serve, in serving order: :func:`serving_plan` over the strata, each
    stratum's items (already in their seeded order, :func:`stratum_order`) taken from ``taken[h]`` on."""
    nxt = list(taken)
    out: list[Hashable] = []
    for h in serving_plan(strata, taken, sds):
        out.append(strata[h][nxt[h]])
        nxt[h] += 1
    return out


# --------------------------------------------------------------------------- estimator


@dataclass(frozen=True)
class StratumCount:
    """One stratum: ``size`` (N_h), ``judged`` (n_h, decided items) and ``hits`` (items with the defect)."""

    size: int
    judged: int
    hits: int

    def __post_init__(self) -> None:
        if not 0 <= self.hits <= self.judged <= self.size:
            raise ValueError(f"need 0 <= hits <= judged <= size, got {self.hits}, {self.judged}, {self.size}")

    @property
    def rate(self) -> float | None:
        return self.hits / self.judged if self.judged else None

    @property
    def weight(self) -> float | None:
        """The design weight N_h / n_h: benchmark items each judged item stands for."""
        return self.size / self.judged if self.judged else None


@dataclass(frozen=True)
class Estimate:
    """``value`` (p_st), ``variance`` (v(p_st)), the interval ``low``-``high``, ``half_width``
    (half its length), ``n_eff`` (the effective sample size the interval is read at; None when the
    benchmark was judged in full), ``judged`` (n) and ``size`` (N)."""

    value: float
    variance: float
    low: float
    high: float
    n_eff: float | None
    judged: int
    size: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "value": self.value,
            "variance": self.variance,
            "low": self.low,
            "high": self.high,
            "half_width": self.half_width,
            "n_eff": self.n_eff,
            "judged": self.judged,
            "size": self.size,
        }


def _variance(strata: Sequence[StratumCount], smoothed: bool) -> float:
    """``(1/N^2) sum_h N_h (N_h - n_h) r_h (1 - r_h) / m_h`` over the strata not judged in full:
    ``r_h = p_h``, ``m_h = n_h - 1`` (Cochran 5.47), or ``smoothed``: ``r_h = (x_h + 1/2) / (n_h + 1)``,
    ``m_h = n_h``. ValueError when such a stratum has fewer judged items than the formula needs."""
    total = sum(s.size for s in strata)
    need = 1 if smoothed else 2
    acc = 0.0
    for h, s in enumerate(strata):
        if s.judged == s.size:
            continue
        if s.judged < need:
            raise ValueError(f"stratum {h}: {s.judged} judged of {s.size}; this variance needs {need}")
        rate = (s.hits + 0.5) / (s.judged + 1) if smoothed else s.hits / s.judged
        acc += s.size * (s.size - s.judged) * rate * (1 - rate) / (s.judged - (0 if smoothed else 1))
    return acc / total**2


def stratified_variance(strata: Sequence[StratumCount]) -> float:
    """Cochran 5.47: ``(1/N^2) sum_h N_h (N_h - n_h) p_h q_h / (n_h - 1)``; a stratum judged in
    full adds nothing. ValueError when a stratum not judged in full has fewer than two judged items."""
    return _variance(strata, smoothed=False)


def interval_variance(strata: Sequence[StratumCount]) -> float:
    """The variance the interval is read at: 5.47 with each stratum's rate smoothed,
    ``(1/N^2) sum_h N_h (N_h - n_h) p~_h q~_h / n_h`` with ``p~_h = (x_h + 1/2) / (n_h + 1)``;
    a stratum judged in full adds nothing, one with nothing judged is an error."""
    return _variance(strata, smoothed=True)


def stratified_estimate(strata: Sequence[StratumCount], z: float = Z95) -> Estimate | None:
    """The stratified estimate of a proportion over the whole population, with its variance and
    Wilson interval at the effective sample size (module docstring). None while a stratum
    has fewer than two judged items (and is not judged in full)."""
    size = sum(s.size for s in strata)
    if size == 0 or any(s.judged < min(2, s.size) for s in strata):
        return None
    value = sum(s.size * (s.hits / s.judged) for s in strata if s.judged) / size
    variance = stratified_variance(strata)
    judged = sum(s.judged for s in strata)
    if judged == size:
        return Estimate(value, 0.0, value, value, None, judged, size)
    smoothed = interval_variance(strata)
    n_eff = value * (1 - value) / smoothed if smoothed > 0 and 0 < value < 1 else judged / (1 - judged / size)
    low, high = wilson(value, n_eff, z)
    return Estimate(value, variance, min(low, value), max(high, value), n_eff, judged, size)


def stop_reached(estimate: Estimate | None, target_half_width: float) -> bool:
    """The stop rule: the interval's half-width is at most the target."""
    return estimate is not None and estimate.half_width <= target_half_width + 1e-12


# --------------------------------------------------------------------------- sample sizes


def srs_sample_size(size: int, rate: float, half_width: float, z: float = Z95) -> int:
    """Simple random sampling without replacement, Cochran 4.2: ``n0 = z^2 P Q / d^2``,
    ``n = n0 / (1 + (n0 - 1) / N)``, rounded up."""
    if half_width <= 0:
        raise ValueError("the half-width must be positive")
    n0 = z * z * rate * (1 - rate) / half_width**2
    return min(size, math.ceil(n0 / (1 + (n0 - 1) / size) - 1e-9))


def population_sd(size: int, rate: float) -> float:
    """S_h of a 0/1 variable: ``sqrt(N/(N-1) P Q)`` (0 for a stratum of one)."""
    return math.sqrt(size / (size - 1) * rate * (1 - rate)) if size > 1 else 0.0


def neyman_sample_size(sizes: Sequence[int], rates: Sequence[float], half_width: float, z: float = Z95) -> int:
    """The least total sample of Neyman allocation with the true stratum rates that gives the
    overall rate a Wald half-width ``z sqrt(V)`` of at most ``half_width`` (Cochran 5.26,
    ``n = (sum W_h S_h)^2 / (V + (1/N) sum W_h S_h^2)`` with ``V = (d/z)^2``); a stratum whose
    Neyman share would exceed its size is taken in full and the rest allocated again (5.9)."""
    if half_width <= 0:
        raise ValueError("the half-width must be positive")
    total = sum(sizes)
    sds = [population_sd(n, p) for n, p in zip(sizes, rates)]
    target = (half_width / z) ** 2
    full: set[int] = set()
    while True:
        rest = [h for h in range(len(sizes)) if h not in full]
        ws = sum(sizes[h] * sds[h] for h in rest) / total
        ws2 = sum(sizes[h] * sds[h] ** 2 for h in rest) / total
        if ws == 0:
            return sum(sizes[h] for h in full)
        n_rest = ws**2 / (target + ws2 / total)
        over = {h for h in rest if n_rest * sizes[h] * sds[h] / (total * ws) > sizes[h]}
        if not over:
            return min(total, sum(sizes[h] for h in full) + math.ceil(n_rest - 1e-9))
        full |= over
