"""Issue 40, item 2: an estimate study samples the benchmark by suspicion strata in a Neyman
plan, estimates each defect kind's prevalence, stops serving at its target, and annotators see
nothing of the score, the strata or the estimate."""

from __future__ import annotations

import random

import pytest
from django.core.management import call_command
from django.test import Client

from annotation.assignment import queue as engine
from annotation.models import Study, StudyItem
from annotation.studies.building import StudyError, StudySpec, create_study
from annotation.studies.estimate import MIN_PER_STRATUM, StratumCount, stratified_estimate
from annotation.studies.estimating import OVERALL, card_lines, plan_estimate, running_estimate
from retrieval.models import Dataset
from tests.conftest import FIXTURES, make_annotator

pytestmark = pytest.mark.django_db

VALID = {"category": "VALIDATED", "time_spent_ms": 4000}
INVALID = {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified", "time_spent_ms": 4000}


@pytest.fixture
def estimate_study(db):
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    assert Dataset.objects.filter(name="circo").exists()
    user = make_annotator("ann", password="x")
    study, _ = create_study(
        StudySpec(
            name="est",
            datasets=["circo"],
            overlap=1,
            seed=5,
            annotators=["ann"],
            estimate={"target_half_width": 0.15, "strata": 3},
        )
    )
    # scores as refresh_suspicion stores them (the fixture has no audit), then the strata again
    rng = random.Random(1)
    items = list(study.items.order_by("id"))
    for item in items:
        item.suspicion = round(rng.random(), 4)
    StudyItem.objects.bulk_update(items, ["suspicion"])
    plan_estimate(study, score=False)
    study.refresh_from_db()
    return study, user


def _truth(item: StudyItem) -> bool:
    """Seeded truth: an item is defective with probability its score."""
    return random.Random(f"truth|{item.pk}").random() < item.suspicion


def test_a_study_that_samples_itself_refuses_quotas_and_a_suspicion_order(db):
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    for extra in ({"total": 5}, {"agreement_size": 2}, {"serve_order": "suspicion"}):
        with pytest.raises(StudyError):
            create_study(StudySpec(name="x", datasets=["circo"], estimate={"target_half_width": 0.05}, **extra))
    with pytest.raises(StudyError, match="half-width"):
        create_study(StudySpec(name="x", datasets=["circo"], estimate={"target_half_width": 0}))


def test_served_in_the_plan_estimated_and_stopped_at_the_target(estimate_study, django_capture_on_commit_callbacks):
    study, user = estimate_study
    stale = Study.objects.get(pk=study.pk)  # a copy read before the stop, saved after it (a settings form)
    n_strata = len(study.estimate["bounds"])
    assert n_strata == 3 and StudyItem.objects.filter(study=study, estimate_stratum__isnull=True).count() == 0
    served = []
    while True:
        got = engine.next_assignment(Study.objects.get(pk=study.pk), user)
        if got.assignment is None:
            assert got.rule == "queue_empty"
            break
        item = got.assignment.item
        served.append(item.estimate_stratum)
        with django_capture_on_commit_callbacks(execute=True):  # the submit's re-plan runs on commit
            engine.submit(got.assignment, INVALID if _truth(item) else VALID)
    stale.guidelines = "saved from an older copy"
    stale.save()
    study.refresh_from_db()
    # every stratum got its two items first, and serving stopped at the target, well before the end
    assert sorted(served[: MIN_PER_STRATUM * n_strata]) == sorted(list(range(n_strata)) * MIN_PER_STRATUM)
    assert study.estimate_stopped and len(served) < study.items.count()
    est = running_estimate(study)
    assert est["reached"] and est["overall"]["half_width"] <= 0.15
    # the page's figures are the estimator's on the stored counts
    counts = [StratumCount(s["size"], s["judged"], s["defects"]) for s in est["strata"]]
    again = stratified_estimate(counts)
    assert est["overall"]["value"] == pytest.approx(again.value) and est["overall"]["low"] == pytest.approx(again.low)
    assert sum(s["judged"] for s in est["strata"]) == len(served)
    assert [s["weight"] for s in est["strata"]] == [s["size"] / s["judged"] for s in est["strata"]]
    kinds = {r["key"]: r for r in est["kinds"]}
    assert kinds["INVALID_TEXT_QUERY"]["estimate"]["value"] == pytest.approx(kinds[OVERALL]["estimate"]["value"])
    assert kinds["INVALID_TARGET_IMAGE"]["estimate"]["value"] == 0
    lines = "\n".join(card_lines(study))
    assert "Method: Stratified sample by suspicion score" in lines and "Design weights" in lines


def test_annotators_see_no_score_stratum_or_estimate(estimate_study, client):
    study, user = estimate_study
    staff_words = ("suspicion", "stratum", "strata", "estimate", "Neyman")
    annotator = Client()
    annotator.force_login(user)
    body = annotator.post(f"/api/studies/{study.pk}/next/", content_type="application/json").content.decode()
    assert '"assignment"' in body and not any(w in body for w in staff_words), body
    for url in (
        f"/api/studies/{study.pk}/",
        "/api/studies/",
        "/api/assignments/",
        f"/api/studies/{study.pk}/progress/",
    ):
        answer = annotator.get(url)
        assert answer.status_code == 200 and not any(w in answer.content.decode() for w in staff_words), url
    page = annotator.post(f"/annotate/{study.pk}/", follow=True).content.decode()
    assert "data-assignment" in page or "assignment" in page
    assert not any(w in page for w in ("suspicion", "stratum", "Neyman", "estimate_")), page[:200]
    assert annotator.get(f"/studies/{study.pk}/estimate/").status_code in (302, 403, 404)
