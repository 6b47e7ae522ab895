"""Usage: python bench/estimate.py [--studies S] [--target D] [--strata H] [--seed N] [--demo-scores FILE] [--only B] [--json]

Issue 40, item 2: simulated "estimate" studies (annotation/studies/estimate.py, the app's own
functions: strata, serving plan, planning rates, estimator, stop rule) on three benchmarks:

* **demo**: the default demo's 160 single-turn queries (``make_demo``, seed 7), each with its
  planted kind (retrieval/demo.py; a human rejects vague, wrong_target and too_broad,
  retrieval.demo.HUMAN_EXPECTED, each its own defect kind) and the suspicion score the app
  computed for it from the demo's audit (the demo retrievers as ``make_demo`` trains them), read
  from --demo-scores (default bench/estimate_demo_scores.json; ``--dump-demo-scores`` adds the
  demo of a database where ``manage.py make_demo [--seed N]`` ran).
* **synthetic**: 4,000 items with another mix of the demo's planted kinds (14 % defective,
  wrong targets first; more text-only shortcuts, which are valid but score high), each item's
  score drawn from the scores the app gave the demos' queries of its kind (every seed in
  --demo-scores): the score as the audit gives it, on a benchmark large enough that +/-3 points
  is a sample, not a census.
* **beta (a weaker score)**: 4,000 items, four rubric kinds (16 % defective, a kind the demo
  never plants among them) whose scores are drawn from Beta(4, 3) for a defective item and
  Beta(2, 5) for a sound one, fixed a priori: how the design fares with a less informative score.

Each benchmark is run under the two designs a study may choose: the prior plan (Neyman
allocation from the strata's mean scores, the default) and the plan re-planned from the observed
rates every H items (a study's ``reallocate``; the app re-plans after every 10 completed
judgements). Each simulated study serves items one at a time in the app's plan, knows the
true kind of every served item (a perfect consensus), and stops when the 95 % interval of the
overall defect rate has a half-width at most D (default 0.03). Printed per benchmark:

* the coverage of the 95 % intervals at the stop (overall and per kind) over S studies
  (default 1,000; goal 93-97 %);
* the items judged at the stop (mean), against simple random sampling under the same interval
  and stop rule (simulated), Cochran's SRS size (4.2) and the Neyman bound from the true stratum
  rates (Cochran 5.26). Goal: at most 0.6x SRS and within 10 % of the bound. An item costs the
  study's overlap in judgements under every design, so the ratios are those of judgements.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from annotation.studies.estimate import (  # noqa: E402
    DEFAULT_STRATA,
    StratumCount,
    bernoulli_sd,
    cum_sqrt_f_bounds,
    next_stratum,
    neyman_sample_size,
    planning_rate,
    planning_rates,
    srs_sample_size,
    stop_reached,
    stratified_estimate,
    stratum_of,
    stratum_order,
)

DEFAULT_SCORES = Path(__file__).resolve().parent / "estimate_demo_scores.json"
#: The demo the "demo" benchmark is: make_demo's default seed (what ``./cirval up`` builds).
DEMO_SEED = 7
OVERALL = "any defect"
GOAL_COVERAGE = (0.93, 0.97)
GOAL_SRS_SHARE = 0.60
GOAL_BOUND = 1.10
#: The synthetic benchmark: items, and each planted demo kind's share (exclusive kinds; the
#: rest are sound compositions). Defects 14 % (the demo: 20 %), in another mix: wrong targets
#: first, few vague or too-broad texts; more text-only shortcuts (valid queries that the
#: suspicion score ranks high) than the demo has.
SYNTHETIC_ITEMS = 4000
SYNTHETIC_MIX = {
    "wrong_target": 0.08,
    "vague": 0.03,
    "too_broad": 0.03,
    "text_only": 0.12,
    "image_only": 0.06,
}
#: The weaker-score benchmark (the synthetic one of the earlier figures): rubric kinds, shares,
#: and scores drawn from Beta(4, 3) for a defective item and Beta(2, 5) for a sound one.
BETA_MIX = {
    "INVALID_TEXT_QUERY": 0.05,
    "INVALID_IMAGE_QUERY": 0.03,
    "INVALID_TARGET_IMAGE": 0.06,
    "QUERY_TOO_BROAD": 0.02,
}
SYNTHETIC_BETA = {"defect": (4.0, 3.0), "sound": (2.0, 5.0)}


# --------------------------------------------------------------------------- benchmarks


def load_demos(path: Path) -> list[dict]:
    """The demos of ``path`` (each ``seed``, ``made_with`` and ``queries``: external id ->
    ``score``, planted ``kind``), by seed."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return sorted(data["demos"], key=lambda d: d["seed"])


def demo_benchmark(path: Path, seed: int = DEMO_SEED) -> dict:
    """The default demo's items: ``scores`` and ``kinds`` (the rubric's defect kind that a
    human gives the planted kind, retrieval.demo.HUMAN_EXPECTED; '' when sound)."""
    from retrieval.demo import HUMAN_EXPECTED

    demo = next((d for d in load_demos(path) if d["seed"] == seed), None)
    if demo is None:
        raise SystemExit(
            f"{path} holds no demo of seed {seed}: run --dump-demo-scores where make_demo --seed {seed} ran"
        )
    queries = demo["queries"]
    ids = sorted(queries)
    return {
        "name": "demo",
        "source": f"{path.name}, seed {seed}: {demo['made_with']}",
        "scores": [float(queries[q]["score"]) for q in ids],
        "kinds": [HUMAN_EXPECTED.get(queries[q]["kind"], "") for q in ids],
    }


def kind_scores(path: Path) -> dict[str, list[float]]:
    """Planted kind -> the suspicion scores the app gave the demo's queries of that kind, over
    every demo of ``path`` (each seed audited by its own trained retrievers)."""
    out: dict[str, list[float]] = {}
    for demo in load_demos(path):
        for q in demo["queries"].values():
            out.setdefault(q["kind"], []).append(float(q["score"]))
    return out


def synthetic_benchmark(path: Path, seed: int, n: int = SYNTHETIC_ITEMS) -> dict:
    """``n`` items in :data:`SYNTHETIC_MIX`; each item's score is drawn (with replacement) from
    the scores the app gave the demos' queries of its planted kind (:func:`kind_scores`): the
    score behaves per kind as it does on the demo, the mix and the size are another benchmark's."""
    from retrieval.demo import HUMAN_EXPECTED

    pool = kind_scores(path)
    missing = [k for k in (*SYNTHETIC_MIX, "composition") if not pool.get(k)]
    if missing:
        raise SystemExit(f"{path} has no scored demo query of kind {', '.join(missing)}")
    rng = random.Random(f"synthetic|{seed}")
    planted = [k for k, share in SYNTHETIC_MIX.items() for _ in range(round(n * share))]
    planted += ["composition"] * (n - len(planted))
    rng.shuffle(planted)
    seeds = ", ".join(str(d["seed"]) for d in load_demos(path))
    return {
        "name": "synthetic",
        "source": f"{n} items, mix {SYNTHETIC_MIX} (the rest sound compositions); scores drawn per kind "
        f"from the demos' scores (seeds {seeds})",
        "scores": [rng.choice(pool[k]) for k in planted],
        "kinds": [HUMAN_EXPECTED.get(k, "") for k in planted],
    }


def beta_benchmark(seed: int, n: int = SYNTHETIC_ITEMS) -> dict:
    """A weaker score: :data:`BETA_MIX`, scores from :data:`SYNTHETIC_BETA` (fixed a priori)."""
    rng = random.Random(f"synthetic|{seed}")
    kinds: list[str] = []
    for kind, share in BETA_MIX.items():
        kinds += [kind] * round(n * share)
    kinds += [""] * (n - len(kinds))
    rng.shuffle(kinds)
    scores = [rng.betavariate(*SYNTHETIC_BETA["defect" if k else "sound"]) for k in kinds]
    return {
        "name": "beta (a weaker score)",
        "source": f"{n} items, mix {BETA_MIX}, scores Beta{SYNTHETIC_BETA}",
        "scores": scores,
        "kinds": kinds,
    }


# --------------------------------------------------------------------------- one study


class Design:
    """A benchmark stratified as the app stratifies it: bounds, strata, priors, truth."""

    def __init__(self, bench: dict, n_strata: int):
        scores, kinds = bench["scores"], bench["kinds"]
        self.bounds = cum_sqrt_f_bounds(scores, n_strata) if n_strata > 1 else [max(scores)]
        self.strata: list[list[int]] = [[] for _ in self.bounds]
        for i, s in enumerate(scores):
            self.strata[stratum_of(s, self.bounds)].append(i)
        self.priors = [statistics.fmean(scores[i] for i in items) for items in self.strata]
        self.kinds = kinds
        self.names = sorted({k for k in kinds if k})
        self.truth = {
            OVERALL: sum(1 for k in kinds if k) / len(kinds),
            **{k: sum(1 for x in kinds if x == k) / len(kinds) for k in self.names},
        }

    @property
    def sizes(self) -> list[int]:
        return [len(s) for s in self.strata]

    def true_rates(self) -> list[float]:
        return [sum(1 for i in items if self.kinds[i]) / len(items) for items in self.strata]


def run_study(design: Design, seed: int, target: float, replan_every: int, reallocate: bool = False) -> dict:
    """One simulated study: serve in plan order until the stop rule; the final estimates. The
    plan's rates: the priors, or with ``reallocate`` the observed rates every ``replan_every``
    items (annotation.studies.estimate.planning_rates)."""
    orders = [stratum_order(items, seed, h) for h, items in enumerate(design.strata)]
    sizes, n_strata = design.sizes, len(design.strata)
    taken, defects = [0] * n_strata, [0] * n_strata
    hits = {k: [0] * n_strata for k in design.names}
    sds = [bernoulli_sd(planning_rate(p)) for p in design.priors]
    estimate = None
    served = 0
    while True:
        h = next_stratum(sizes, taken, sds)
        if h is None:
            break
        kind = design.kinds[orders[h][taken[h]]]
        taken[h] += 1
        served += 1
        if kind:
            defects[h] += 1
            hits[kind][h] += 1
        if reallocate and served % replan_every == 0:
            sds = [bernoulli_sd(r) for r in planning_rates(design.priors, defects, taken, True)]
        estimate = stratified_estimate([StratumCount(n, j, d) for n, j, d in zip(sizes, taken, defects)])
        if stop_reached(estimate, target):
            break
    kinds = {
        k: stratified_estimate([StratumCount(n, j, d) for n, j, d in zip(sizes, taken, hits[k])]) for k in design.names
    }
    return {"served": served, OVERALL: estimate, **kinds}


def simulate(bench: dict, studies: int, target: float, n_strata: int, seed: int, reallocate: bool = False) -> dict:
    design = Design(bench, n_strata)
    srs = Design(bench, 1)
    runs = [run_study(design, seed + s, target, max(1, len(design.strata)), reallocate) for s in range(studies)]
    srs_runs = [run_study(srs, seed + s, target, 1) for s in range(studies)]
    coverage = {}
    for key, truth in design.truth.items():
        inside = [r[key].low - 1e-12 <= truth <= r[key].high + 1e-12 for r in runs if r[key] is not None]
        coverage[key] = sum(inside) / len(inside) if inside else None
    mean_n = statistics.fmean(r["served"] for r in runs)
    srs_n = statistics.fmean(r["served"] for r in srs_runs)
    total = len(bench["scores"])
    bound = neyman_sample_size(design.sizes, design.true_rates(), target)
    return {
        "benchmark": bench["name"],
        "design": "re-planned from the observed rates" if reallocate else "prior plan",
        "source": bench["source"],
        "items": total,
        "studies": studies,
        "target": target,
        "bounds": design.bounds,
        "sizes": design.sizes,
        "true_rates": design.true_rates(),
        "priors": design.priors,
        "truth": design.truth,
        "coverage": coverage,
        "srs_coverage": sum(r[OVERALL].low <= design.truth[OVERALL] <= r[OVERALL].high for r in srs_runs) / studies,
        "judged": {
            "estimate_mean": mean_n,
            "estimate_median": statistics.median(r["served"] for r in runs),
            "srs_simulated_mean": srs_n,
            "srs_cochran": srs_sample_size(total, design.truth[OVERALL], target),
            "neyman_bound": bound,
        },
        "mean_half_width": statistics.fmean(r[OVERALL].half_width for r in runs),
    }


# --------------------------------------------------------------------------- report


def render(r: dict) -> str:
    j = r["judged"]
    out = [
        f"== {r['benchmark']}, {r['design']}: {r['items']} items ({r['source']})",
        f"strata (upper score bounds): {', '.join(f'{b:.3f}' for b in r['bounds'])}; sizes {r['sizes']}; "
        f"true defect rates {', '.join(f'{p:.3f}' for p in r['true_rates'])}; "
        f"priors (mean score) {', '.join(f'{p:.3f}' for p in r['priors'])}",
        f"coverage of the 95% intervals at the stop (half-width <= {r['target']}), {r['studies']} studies:",
    ]
    for key, cov in r["coverage"].items():
        ok = cov is not None and GOAL_COVERAGE[0] <= cov <= GOAL_COVERAGE[1]
        out.append(
            f"  {key:<22} true {r['truth'][key]:.4f}  coverage {cov if cov is None else f'{cov:.3f}'}"
            f"  {'met' if ok else 'NOT met'}"
        )
    out.append(f"  (simple random sampling, same interval and stop: coverage {r['srs_coverage']:.3f})")
    share = j["estimate_mean"] / j["srs_simulated_mean"]
    share_c = j["estimate_mean"] / j["srs_cochran"]
    to_bound = j["estimate_mean"] / j["neyman_bound"]
    out += [
        f"items judged for +/-{r['target'] * 100:.0f} points on the overall rate: estimate mean "
        f"{j['estimate_mean']:.1f} (median {j['estimate_median']:.0f}); SRS simulated {j['srs_simulated_mean']:.1f}, "
        f"Cochran SRS {j['srs_cochran']}; Neyman bound {j['neyman_bound']}",
        f"  vs SRS (simulated): {share:.2f}x, vs Cochran SRS {share_c:.2f}x: goal <= {GOAL_SRS_SHARE}x "
        f"{'met' if share <= GOAL_SRS_SHARE else 'NOT met'}",
        f"  vs the Neyman bound: {to_bound:.2f}x: goal <= {GOAL_BOUND}x {'met' if to_bound <= GOAL_BOUND else 'NOT met'}",
        f"  mean half-width at the stop {r['mean_half_width']:.4f}",
    ]
    return "\n".join(out)


def dump_demo_scores(path: Path, dataset: str = "demo") -> None:
    """Add (or replace) in ``path`` the demo of this database: every single-turn query's suspicion
    score and planted kind. Builds (once) an estimate study over the whole demo dataset in the
    database of CIRVAL_VAR_DIR / DATABASE_URL, where ``manage.py make_demo [--seed N]`` ran (the
    audit's trained retrievers), which scores every item with the app's refresh_suspicion."""
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from annotation.management.commands.train_demo_retriever import caption_steps, default_steps
    from annotation.models import Study
    from annotation.studies.building import StudySpec, create_study
    from annotation.studies.truth import planted_kinds, truth_path

    seed = json.loads(truth_path(dataset).read_text(encoding="utf-8"))["seed"]
    name = f"{dataset}-estimate-bench"
    study = (
        Study.objects.filter(name=name).first()
        or create_study(StudySpec(name=name, datasets=[dataset], overlap=1, estimate={"target_half_width": 0.03}))[0]
    )
    kinds = planted_kinds(dataset)
    rows = study.items.values_list("query__external_id", "suspicion", "suspicion_parts")
    queries = {q: {"score": round(s, 6), "kind": kinds[q], "scored": bool((p or {}).get("scored"))} for q, s, p in rows}
    made_with = (
        f"make_demo --seed {seed} (demo retrievers: compose {default_steps()}, caption "
        f"{caption_steps(default_steps())} steps), "
        f"then refresh_suspicion over its {len(queries)} single-turn queries (study {name!r})"
    )
    demos = [d for d in (load_demos(path) if path.exists() else []) if d["seed"] != seed]
    demos.append({"seed": seed, "made_with": made_with, "queries": queries})
    path.write_text(
        json.dumps({"demos": sorted(demos, key=lambda d: d["seed"])}, indent=0, sort_keys=True) + "\n",
        encoding="utf-8",
    )
    print(f"demo seed {seed}: {len(queries)} queries written to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=int, default=1000)
    parser.add_argument("--target", type=float, default=0.03)
    parser.add_argument("--strata", type=int, default=DEFAULT_STRATA)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--demo-scores", default=str(DEFAULT_SCORES))
    parser.add_argument("--only", choices=["demo", "synthetic", "beta"], default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--dump-demo-scores",
        action="store_true",
        help="Write --demo-scores from the database where make_demo ran, then stop.",
    )
    args = parser.parse_args(argv)
    if args.dump_demo_scores:
        dump_demo_scores(Path(args.demo_scores))
        return 0
    scores = Path(args.demo_scores)
    makers = {
        "demo": lambda: demo_benchmark(scores),
        "synthetic": lambda: synthetic_benchmark(scores, args.seed),
        "beta": lambda: beta_benchmark(args.seed),
    }
    benches = [make() for name, make in makers.items() if args.only in (None, name)]
    results = [
        simulate(b, args.studies, args.target, args.strata, args.seed, reallocate)
        for b in benches
        for reallocate in (False, True)
    ]
    if args.json:
        print(json.dumps(results, indent=1, default=float))
    else:
        print("\n\n".join(render(r) for r in results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
