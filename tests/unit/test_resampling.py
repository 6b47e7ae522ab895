"""The vectorised bootstrap (annotation.agreement.maths: bootstrap_statistics) gives the figures of the loop it
replaces (annotation.agreement.maths.bootstrap_intervals, one replicate at a time) for the same
seed: same draws, same skipped replicates, intervals equal to rounding. Pure: no database."""

from __future__ import annotations

import random

import numpy as np
import pytest

from annotation.agreement import maths
from annotation.agreement.maths import Statistic, bootstrap_statistics, replicate_blocks


def _triples(
    n_items: int, labels: list, raters: int = 6, per_item=(2, 3, 4), seed: int = 1, skill: float = 0.7
) -> list[tuple]:
    """Seeded judgements: each item judged by 2-4 of ``raters``, right (its latent label) with ``skill``."""
    rng = random.Random(seed)
    out = []
    for item in range(n_items):
        truth = rng.choice(labels)
        for r in rng.sample(range(raters), rng.choice(per_item)):
            out.append((item, f"r{r}", truth if rng.random() < skill else rng.choice(labels)))
    return out


def _loop(ratings, stats, n_boot, seed):
    return maths.bootstrap_intervals(ratings, {n: s.on for n, s in stats.items()}, n_boot=n_boot, seed=seed)


def _same(old: dict, new: dict) -> None:
    assert old.keys() == new.keys()
    for name in old:
        if isinstance(old[name], maths.Undefined):
            assert new[name] == old[name], name
            continue
        assert (new[name].n_valid, new[name].n_boot) == (old[name].n_valid, old[name].n_boot), name
        assert new[name].low == pytest.approx(old[name].low, abs=1e-12), name
        assert new[name].high == pytest.approx(old[name].high, abs=1e-12), name


ALL = {
    "percent": Statistic("percent"),
    "alpha": Statistic("alpha"),
    "gwet": Statistic("gwet"),
    "fleiss": Statistic("fleiss"),
    "cohen": Statistic("cohen"),
}


@pytest.mark.parametrize("seed", [0, 7])
def test_nominal_with_missing_ratings(seed) -> None:
    ratings = maths.Ratings.from_triples(_triples(60, ["a", "b", "c"]), categories=["a", "b", "c", "d"])
    _same(_loop(ratings, ALL, 300, seed), bootstrap_statistics(ratings, ALL, n_boot=300, seed=seed))


def test_ordinal_and_interval_scales_with_weights() -> None:
    triples = _triples(50, [1, 2, 3, 4, 5], per_item=(2, 3), skill=0.5, seed=3)
    ratings = maths.Ratings.from_triples(triples, categories=[1, 2, 3, 4, 5]).min_ratings(2)
    stats = {
        "alpha_ordinal": Statistic("alpha", level="ordinal"),
        "alpha_interval": Statistic("alpha", level="interval"),
        "alpha_ratio": Statistic("alpha", level="ratio"),
        "quadratic": Statistic("cohen", weights="quadratic"),
        "linear": Statistic("cohen", weights="linear"),
        "gwet_q": Statistic("gwet", n_categories=7),
    }
    _same(_loop(ratings, stats, 250, 2), bootstrap_statistics(ratings, stats, n_boot=250, seed=2))


def test_equal_ratings_fleiss_and_constant_pairs() -> None:
    """Every item rated 3 times (Fleiss defined); two raters constant on one label (a pair's kappa
    undefined, or 1.0 with constant_pairs='one'); a tiny study (many degenerate replicates)."""
    triples = [
        (i, r, "x" if r in ("p", "q") else ("x" if (i + j) % 3 else "y"))
        for i in range(8)
        for j, r in enumerate(("p", "q", "s"))
    ]
    ratings = maths.Ratings.from_triples(triples)
    stats = {**ALL, "one": Statistic("cohen", constant_pairs="one")}
    _same(_loop(ratings, stats, 400, 5), bootstrap_statistics(ratings, stats, n_boot=400, seed=5))


def test_validity_views_as_the_report_uses_them() -> None:
    flags = list(maths.FLAGS)
    labels = ["VALIDATED", [flags[0]], [flags[1]], [flags[0], flags[2]], []]
    triples = _triples(70, list(range(len(labels))), raters=5, seed=11)
    ratings = maths.validity_ratings([(i, a, labels[v]) for i, a, v in triples]).min_ratings(2)
    stats = {
        "sig": Statistic("alpha"),
        "ac1": Statistic("gwet", n_categories=maths.N_SIGNATURES),
        "bin_alpha": Statistic("alpha", "binary"),
        "bin_gwet": Statistic("gwet", "binary"),
        "bin_cohen": Statistic("cohen", "binary"),
        **{f: Statistic("alpha", f"flag:{f}") for f in flags},
    }
    _same(_loop(ratings, stats, 200, 0), bootstrap_statistics(ratings, stats, n_boot=200, seed=0))


def test_the_report_block_is_unchanged() -> None:
    """agreement_report's confidence_intervals through the vectorised path equal the loop's."""
    triples = _triples(40, ["a", "b"], raters=4, seed=2)
    report = maths.agreement_report(triples, n_boot=150, seed=3)
    ratings = maths.Ratings.from_triples(triples).min_ratings(2)
    opts = maths._Options(None, "nominal", None, "undefined", None)
    old = _loop(ratings, maths._statistics(report, opts), 150, 3)
    for name, iv in report["confidence_intervals"]["intervals"].items():
        assert iv["low"] == pytest.approx(old[name].low, abs=1e-12) and iv["n_valid"] == old[name].n_valid, name


def test_blocks_draw_what_the_loop_draws() -> None:
    """Blocks of any size give the loop's draws, replicate by replicate, in order."""
    rng = np.random.default_rng(4)
    expected = np.stack([np.bincount(rng.integers(0, 13, size=13), minlength=13) for _ in range(10)])
    for block in (1, 3, 10):
        assert (np.concatenate(list(replicate_blocks(13, 10, 4, block))) == expected).all()
    with pytest.raises(ValueError):
        Statistic("median")
    assert (
        bootstrap_statistics(maths.Ratings.from_triples([(1, "a", "x")]), ALL, n_boot=0)["alpha"].reason
        == "bootstrap disabled (n_boot = 0)"
    )
