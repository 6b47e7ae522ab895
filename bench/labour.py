"""Usage: python bench/labour.py [--truth FILE] [--repeats R] [--seed S] [--json]

Issue 25, item 5: a simulated crowd on the demo world's truth (single-turn queries; a planted
defect a human should reject, i.e. vague, wrong target or too broad, makes an item invalid).
Seven annotators with known confusion matrices and one spammer (annotation/verdicts/crowd.py
TEAM) label every item under three strategies:

* fixed overlap 3 with majority;
* adaptive overlap 2->3 (a third annotator only where the first two disagree) with majority;
* adaptive overlap 2->3 with Dawid-Skene (reliability-weighted consensus): a third annotator
  only where the split of the first two is uncertain, i.e. the posterior of the annotators'
  reliability (Dawid-Skene on the judgements collected so far, refitted every BATCH items,
  never the truth) is below the study's confidence (DEFAULT_CONFIDENCE, Study.adaptive_confidence).

The strategies run the app's own rules (annotation.core.consensus: quorum_rule,
AdaptiveQuorumRule.settled and decide; annotation.verdicts.reliability: Dawid-Skene), over R
crowds (the same seeds for each strategy), and the figures are pooled. Prints the judgements
spent (and their share of fixed overlap 3's), the accuracy of the validated set (the share of
it that is truly valid), the accuracy of all decisions and the share of valid items validated.
Goal: the accuracy of fixed 3 with majority for at most 70% of its judgements. Asserts nothing.

Then two sensitivity tables: the Dawid-Skene strategy at other confidences, and with the team's
true confusion matrices instead of a fit (an oracle: a bound on what the rule can reach, not a
strategy the app can run); and how the shares move with the annotators' quality.

--truth: a demo truth file (manage.py make_demo writes var/demo/demo.truth.json); default:
the demo world is drawn afresh in a temporary folder with make_demo's default seed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from annotation.core.consensus import DEFAULT_CONFIDENCE  # noqa: E402
from annotation.verdicts.crowd import (  # noqa: E402
    STRATEGIES,
    TEAM,
    Strategy,
    compare,
    demo_truth_validity,
    labour_table,
    sharper,
)
from retrieval.demo import build_demo_world  # noqa: E402

GOAL_SHARE = 0.70


def load_truth(path: str | None) -> dict:
    if path:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        return build_demo_world(Path(tmp), seed=7)[1]


def render(rows: list[dict], n_items: int, repeats: int) -> str:
    out = [
        f"{n_items} demo items x {repeats} simulated crowds; team: "
        + ", ".join(f"{a.name} ({a.sensitivity:.2f}/{a.specificity:.2f})" for a in TEAM)
        + "  (sensitivity/specificity)",
        f"{'strategy':<30}{'judgements':>11}{'share':>7}{'per item':>9}{'validated':>10}"
        f"{'val. acc.':>10}{'accuracy':>9}{'valid recall':>13}",
    ]
    for r in rows:
        out.append(
            f"{r['strategy']:<30}{r['judgements']:>11}{r['judgements_share']:>7.0%}{r['per_item']:>9.2f}"
            f"{r['validated']:>10}{r['validated_accuracy']:>10.4f}{r['accuracy']:>9.4f}{r['valid_recall']:>13.4f}"
        )
    base = rows[0]
    for r in rows[1:]:
        meets = r["judgements_share"] <= GOAL_SHARE and r["validated_accuracy"] >= base["validated_accuracy"]
        out.append(
            f"{r['strategy']}: {r['judgements_share']:.0%} of fixed 3's judgements, validated-set accuracy "
            f"{r['validated_accuracy']:.4f} vs {base['validated_accuracy']:.4f}: goal "
            f"{'met' if meets else 'NOT met'} (<= {GOAL_SHARE:.0%} and at least the same accuracy)"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--truth", default=None)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    truth = demo_truth_validity(load_truth(args.truth))
    rows = labour_table(compare(truth, repeats=args.repeats, seed=args.seed))
    sweep = quality_sweep(truth, args.repeats, args.seed)
    confidence = confidence_sweep(truth, args.repeats, args.seed)
    if args.json:
        print(json.dumps({"strategies": rows, "confidence_sweep": confidence, "quality_sweep": sweep}, indent=2))
        return 0
    print(render(rows, len(truth), args.repeats))
    print(
        f"\nAdaptive 2->3 with Dawid-Skene at other confidences (the goal row above: {DEFAULT_CONFIDENCE:g}); "
        "oracle: the team's true matrices instead of a fit:"
    )
    print(render(confidence, len(truth), args.repeats).split("\n", 1)[1])
    print("\nHow adaptive overlap's share moves with the crowd (every annotator's error rates times the factor):")
    print(
        f"{'factor':>7}{'spammer':>9}{'adaptive share':>16}{'fixed 3 val. acc.':>19}{'adaptive val. acc.':>20}"
        f"{'DS val. acc.':>14}"
    )
    for r in sweep:
        print(
            f"{r['factor']:>7.2f}{'yes' if r['spammer'] else 'no':>9}{r['adaptive_share']:>16.0%}"
            f"{r['fixed_accuracy']:>19.4f}{r['adaptive_accuracy']:>20.4f}{r['ds_accuracy']:>14.4f}"
        )
    return 0


CONFIDENCES = (0.7, 0.8, 0.9, 0.95)


def confidence_sweep(truth: dict, repeats: int, seed: int) -> list[dict]:
    """Fixed overlap 3 (the base of the shares), then the Dawid-Skene strategy at each confidence,
    estimated and oracle (the team's true matrices)."""
    fixed = STRATEGIES[0]
    rows = [
        Strategy(f"DS {'oracle' if oracle else 'fitted'}, confidence {c:g}", 2, 3, "reliability", c, oracle)
        for oracle in (False, True)
        for c in CONFIDENCES
    ]
    return labour_table(compare(truth, (fixed, *rows), TEAM, repeats, seed))


def quality_sweep(truth: dict, repeats: int, seed: int) -> list[dict]:
    out = []
    for factor, spammer in ((1.0, True), (0.5, True), (0.25, True), (1.0, False), (0.5, False), (0.25, False)):
        team = [a for a in sharper(TEAM, factor) if spammer or a.name != "spammer"]
        fixed, adaptive, ds = labour_table(compare(truth, STRATEGIES, team, repeats, seed))
        out.append(
            {
                "factor": factor,
                "spammer": spammer,
                "adaptive_share": adaptive["judgements_share"],
                "fixed_accuracy": fixed["validated_accuracy"],
                "adaptive_accuracy": adaptive["validated_accuracy"],
                "ds_accuracy": ds["validated_accuracy"],
            }
        )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
