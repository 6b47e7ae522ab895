"""Agreement on the session rubric: ordinal alpha and quadratic kappa per scale, reject flags nominal."""

from __future__ import annotations

import krippendorff
import numpy as np
import pytest
from django.core.management import call_command
from sklearn.metrics import cohen_kappa_score

from annotation.agreement.reports import study_report
from annotation.assignment import queue as engine
from annotation.studies.building import StudySpec, create_study
from tests.conftest import FIXTURES, make_annotator

pytestmark = pytest.mark.django_db

SCALES = ("naturalness", "coherence", "goal_progress", "low_redundancy", "overall")


def session_payload(value_a: int, overall: int, rejects: list[str], n_turns: int) -> dict:
    scales = {k: value_a for k in SCALES}
    scales["overall"] = overall
    return {
        "scales": scales,
        "per_turn_checks": [{"real_difference_toward_target": True, "consistent_with_history": True, "valid": True}]
        * n_turns,
        "reject_flags": rejects,
        "time_spent_ms": 1000,
    }


def test_scales_and_reject_flags(tmp_path):
    call_command(
        "import_dataset",
        "--format",
        "mtfiq",
        "--name",
        "mt",
        str(FIXTURES / "datasets/mtfiq/dress.val.sample.json"),
        verbosity=0,
    )
    a, b = make_annotator("a"), make_annotator("b")
    study, _ = create_study(
        StudySpec(name="sess", datasets=["mt"], rubric="session", overlap=2, total=4, seed=3, annotators=["a", "b"])
    )
    overall_a, overall_b = [1, 3, 5, 4], [2, 3, 4, 4]
    circle_a, circle_b = [True, False, True, False], [True, False, False, False]
    for n in range(4):
        for user, overall, circle in ((a, overall_a[n], circle_a[n]), (b, overall_b[n], circle_b[n])):
            asg = engine.next_assignment(study, user).assignment
            # both annotators are served items in the same order (closest to overlap first)
            engine.submit(asg, session_payload(3, overall, ["circle"] if circle else [], asg.item.query.n_turns))
    report = study_report(study)
    rows = {r["category"]: r for r in report["categories"]}
    assert set(rows) == set(SCALES) | {"reject:duplicate", "reject:inconsistency", "reject:conflict", "reject:circle"}

    # overall: quadratic-weighted Cohen's kappa and ordinal alpha, against the reference libraries
    items = sorted({j for j in range(4)})
    pairs = {}
    from annotation.agreement.reports import study_triples

    for item, user, value in study_triples(study, "overall"):
        pairs.setdefault(item, {})[user] = value
    xa = [pairs[i]["a"] for i in sorted(pairs)]
    xb = [pairs[i]["b"] for i in sorted(pairs)]
    assert sorted(zip(xa, xb)) == sorted(zip(overall_a, overall_b))
    expected_kappa = cohen_kappa_score(xa, xb, weights="quadratic", labels=[1, 2, 3, 4, 5])
    expected_alpha = krippendorff.alpha(
        np.array([xa, xb], dtype=float), level_of_measurement="ordinal", value_domain=[1, 2, 3, 4, 5]
    )
    assert rows["overall"]["pairwise_cohen_mean"] == pytest.approx(expected_kappa, abs=1e-12)
    assert rows["overall"]["krippendorff_alpha"] == pytest.approx(expected_alpha, abs=1e-12)
    assert report["agreement"]["pairwise_cohen"]["mean"] == pytest.approx(expected_kappa, abs=1e-12)
    assert len(items) == 4

    # a scale nobody varied has no variation to work with: reported as undefined, never 0/NaN
    assert rows["naturalness"]["krippendorff_alpha"] is None
    # the circle flag: nominal agreement on 0/1 votes
    ca = [1 if circle_a[i] else 0 for i in range(4)]
    cb = [1 if circle_b[i] else 0 for i in range(4)]
    assert rows["reject:circle"]["mean"] == pytest.approx((sum(ca) + sum(cb)) / 8)
    assert rows["reject:circle"]["pairwise_cohen_mean"] == pytest.approx(cohen_kappa_score(ca, cb), abs=1e-12)
