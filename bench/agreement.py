"""Usage: python bench/agreement.py [--judgements N] [--annotators A] [--per-item R] [--categories K]
[--repeat T] [--seed S]

Timing of annotation.agreement.maths on synthetic judgements (default 1,000,000: 200,000 items,
each judged by 5 of 12 annotators). Prints figures; asserts nothing.

* nominal variant: K = 5 categories, a latent true category per item, each annotator right
  with its own probability (0.55 to 0.9), otherwise a uniform random category;
* validity variant: the same design with validity signatures (VALID or a set of flags,
  17 signatures), timed as the whole validity report (binary, four flags, signature).

For each: table building (from integer codes, and from Python (item, annotator, label)
triples as the command builds it), Krippendorff's alpha, pairwise Cohen's kappa (target:
both together under 5 s for 1,000,000 judgements), the other coefficients, the cost of one
bootstrap replicate, and peak memory (tracemalloc per step; the process's peak RSS).
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from annotation.agreement.maths import (  # noqa: E402  (after the path set-up)
    FLAGS,
    Ratings,
    agreement_report,
    bootstrap_intervals,
    fleiss_kappa,
    gwet_ac1,
    krippendorff_alpha,
    label_from_signature,
    mean_pairwise_kappa,
    pairwise_cohen_kappa,
    percent_agreement,
    validity_ratings,
)


def design(
    n_judgements: int, n_annotators: int, per_item: int, n_categories: int, rng: np.random.Generator
) -> np.ndarray:
    """(annotators, items) array of category codes, -1 where an annotator did not judge."""
    if per_item > n_annotators:
        raise SystemExit("--per-item cannot exceed --annotators")
    n_items = n_judgements // per_item
    # per_item distinct annotators per item: the first columns of a random permutation.
    chosen = np.argsort(rng.random((n_items, n_annotators)), axis=1)[:, :per_item]
    truth = rng.integers(0, n_categories, size=n_items)
    accuracy = np.linspace(0.55, 0.9, n_annotators)[chosen]
    right = rng.random((n_items, per_item)) < accuracy
    noise = rng.integers(0, n_categories, size=(n_items, per_item))
    labels = np.where(right, truth[:, None], noise)
    codes = np.full((n_annotators, n_items), -1, dtype=np.int64)
    codes[chosen, np.arange(n_items)[:, None]] = labels
    return codes


def signature_names() -> tuple[str, ...]:
    """VALID, INVALID_UNSPECIFIED and the 15 non-empty flag sets (17 signatures, index 0 VALID)."""
    names = ["VALID", "INVALID_UNSPECIFIED"]
    for mask in range(1, 1 << len(FLAGS)):
        names.append("+".join(f for i, f in enumerate(FLAGS) if mask >> i & 1))
    return tuple(names)


def triples_of(codes: np.ndarray, categories: tuple[Any, ...], raters: list[str]) -> list[tuple[Any, ...]]:
    """Python ``(item, annotator, label)`` triples, as a JSONL file or a study would give them."""
    r, i = np.nonzero(codes >= 0)
    cats = list(categories)
    return [
        (f"q{item}", raters[rater], cats[code])
        for rater, item, code in zip(r.tolist(), i.tolist(), codes[r, i].tolist())
    ]


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Best wall time of ``repeat`` calls, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def traced_peak(fn: Callable[[], Any]) -> float:
    """Peak bytes allocated (tracemalloc, numpy included) during one call, in MiB."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2**20


def num(value: Any) -> str:
    """A coefficient for printing (``undefined`` for an Undefined result)."""
    return f"{value:.4f}" if isinstance(value, float) else "undefined"


def row(name: str, seconds: float | None, extra: str = "") -> None:
    value = "" if seconds is None else f"{seconds:8.3f} s"
    print(f"  {name:<46}{value:>10}  {extra}")


def bench_nominal(codes: np.ndarray, raters: list[str], k: int, repeat: int) -> None:
    cats = tuple(f"c{j}" for j in range(k))
    print(f"\nNominal, {k} categories")
    t_codes, ratings = timed(lambda: Ratings.from_dense(codes, raters=raters, categories=cats), repeat)
    row("table from integer codes", t_codes)
    triples = triples_of(codes, cats, raters)
    t_triples, _ = timed(lambda: Ratings.from_triples(triples), 1)
    row(f"table from {len(triples):,} Python triples", t_triples)
    triples = None  # free the list before the timings below (the lambda above has run)
    t_alpha, alpha = timed(lambda: krippendorff_alpha(ratings, "nominal"), repeat)
    row("Krippendorff's alpha (nominal)", t_alpha, f"alpha = {num(alpha)}")
    t_kappa, pairs = timed(lambda: pairwise_cohen_kappa(ratings), repeat)
    defined = [p.kappa for p in pairs if p.kappa is not None]  # None: a pair constant on one label
    mean = float(np.mean(defined)) if defined else None
    row(f"pairwise Cohen's kappa ({len(pairs)} pairs)", t_kappa, f"mean kappa = {num(mean)}")
    row("alpha + pairwise kappa", t_alpha + t_kappa, "(target < 5 s)")
    t_other, other = timed(lambda: (fleiss_kappa(ratings), gwet_ac1(ratings), percent_agreement(ratings)), repeat)
    row("Fleiss + Gwet's AC1 + percent agreement", t_other, "fleiss = {}, ac1 = {}, pa = {}".format(*map(num, other)))
    t_ordinal, ordinal = timed(lambda: krippendorff_alpha(ratings, "ordinal"), repeat)
    row("Krippendorff's alpha (ordinal, same codes)", t_ordinal, f"alpha = {num(ordinal)}")
    t_weighted, _ = timed(lambda: pairwise_cohen_kappa(ratings, "linear"), repeat)
    row("pairwise Cohen's kappa, linear weights", t_weighted)
    stats = {"alpha": lambda r: krippendorff_alpha(r), "kappa": lambda r: mean_pairwise_kappa(r)}
    t_boot, _ = timed(lambda: bootstrap_intervals(ratings, stats, n_boot=2, seed=0), 1)
    row("one bootstrap replicate (alpha + mean kappa)", t_boot / 2)
    t_report, _ = timed(lambda: agreement_report(ratings, n_boot=0), 1)
    row("whole report, no bootstrap", t_report)
    print(
        f"  peak memory (tracemalloc): alpha {traced_peak(lambda: krippendorff_alpha(ratings)):.0f} MiB, "
        f"pairwise kappa {traced_peak(lambda: pairwise_cohen_kappa(ratings)):.0f} MiB, "
        f"table from codes {traced_peak(lambda: Ratings.from_dense(codes, raters=raters, categories=cats)):.0f} MiB"
    )


def bench_validity(codes: np.ndarray, raters: list[str], repeat: int) -> None:
    names = signature_names()
    print(f"\nValidity rubric, {len(names)} signatures (binary + {len(FLAGS)} flags + signature)")
    t_codes, ratings = timed(lambda: Ratings.from_dense(codes, raters=raters, categories=names), repeat)
    row("table from integer codes", t_codes)
    labels = tuple(label_from_signature(s) for s in names)
    triples = triples_of(codes, labels, raters)
    t_triples, _ = timed(lambda: validity_ratings(triples), 1)
    row(f"table from {len(triples):,} validity triples", t_triples)
    triples = None  # free the list before the timings below (the lambda above has run)
    t_alpha, alpha = timed(lambda: krippendorff_alpha(ratings, "nominal"), repeat)
    row("Krippendorff's alpha (signature)", t_alpha, f"alpha = {num(alpha)}")
    t_kappa, pairs = timed(lambda: pairwise_cohen_kappa(ratings), repeat)
    row(f"pairwise Cohen's kappa (signature, {len(pairs)} pairs)", t_kappa)
    row("alpha + pairwise kappa", t_alpha + t_kappa, "(target < 5 s)")
    t_report, report = timed(lambda: agreement_report(ratings, rubric="validity", n_boot=0), repeat)
    b = report["binary_valid_invalid"]
    row(
        "whole validity report, no bootstrap",
        t_report,
        f"binary alpha = {num(b['krippendorff_alpha_nominal'])}, valid rate = {b['valid_rate']:.3f}",
    )
    print(
        f"  peak memory (tracemalloc): whole report "
        f"{traced_peak(lambda: agreement_report(ratings, rubric='validity', n_boot=0)):.0f} MiB"
    )


def validity_codes(codes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Signatures from the nominal design: code % 5 picks VALID or one single flag; 10% of the
    invalid judgements get a random other invalid signature (flag combinations)."""
    n_sig = len(signature_names())
    # indices into signature_names(): VALID, INVALID_TEXT_QUERY, INVALID_IMAGE_QUERY,
    # INVALID_TARGET_IMAGE, QUERY_TOO_BROAD
    base = np.array([0, 2, 3, 5, 9], dtype=np.int64)
    out = np.where(codes >= 0, base[codes % 5], -1)
    odd = (codes > 0) & (rng.random(codes.shape) < 0.1)
    out[odd] = rng.integers(1, n_sig, size=int(odd.sum()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="Time annotation.agreement.maths on synthetic judgements.")
    parser.add_argument("--judgements", type=int, default=1_000_000)
    parser.add_argument("--annotators", type=int, default=12)
    parser.add_argument("--per-item", type=int, default=5)
    parser.add_argument("--categories", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="timed repeats; the best is shown")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    raters = [f"annotator_{j + 1:02d}" for j in range(args.annotators)]
    start = time.perf_counter()
    codes = design(args.judgements, args.annotators, args.per_item, args.categories, rng)
    t_design = time.perf_counter() - start
    n_items = codes.shape[1]
    print(
        f"{int((codes >= 0).sum()):,} judgements: {n_items:,} items x {args.per_item} of {args.annotators} "
        f"annotators (synthetic, seed {args.seed}; generated in {t_design:.2f} s)"
    )
    print(f"Python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, best of {args.repeat}")

    bench_nominal(codes, raters, args.categories, args.repeat)
    bench_validity(validity_codes(codes, rng), raters, args.repeat)

    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    print(f"\nPeak resident memory of the process: {peak_rss:.0f} MiB")


if __name__ == "__main__":
    main()
