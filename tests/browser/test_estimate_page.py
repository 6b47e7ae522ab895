"""Issue 40, item 2: staff read an estimate study's running estimate of the defect rate (each
kind's interval, the strata with their design weights, the stop rule) at 1366x768; the
annotator's item page shows none of it."""

from __future__ import annotations

import random

import pytest

from annotation.assignment import queue as engine
from annotation.models import Study, StudyItem
from annotation.studies.building import StudySpec, create_study
from annotation.studies.estimating import OVERALL, plan_estimate, running_estimate
from annotation.studies.truth import planted_kinds
from retrieval.demo import HUMAN_EXPECTED
from tests.browser.conftest import close_tab, login, open_tab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

#: The answer an annotator gives to each planted kind (a sound item: VALIDATED).
ANSWERS = {
    "INVALID_TEXT_QUERY": {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified"},
    "INVALID_TARGET_IMAGE": {"category": "INVALID_TARGET_IMAGE", "sub_reason": "mismatch"},
    "QUERY_TOO_BROAD": {"category": "QUERY_TOO_BROAD"},
}


@pytest.fixture
def estimate_demo(demo_world):
    """An estimate study over the demo's single-turn queries (target half-width 0.1), scored from
    seeded numbers (the demo here has no audit), with its first 40 items judged by the truth."""
    from django.contrib.auth import get_user_model

    study, _ = create_study(
        StudySpec(
            name="demo-estimate",
            datasets=["demo"],
            overlap=1,
            seed=2,
            annotators=["annotator1", "annotator2"],
            estimate={"target_half_width": 0.1, "strata": 4},
        )
    )
    kinds = planted_kinds("demo")
    rng = random.Random(3)
    items = list(study.items.select_related("query").order_by("id"))
    for item in items:  # an informative score: defects score higher
        defect = kinds.get(item.query.external_id) in HUMAN_EXPECTED
        item.suspicion = round(rng.betavariate(4, 3) if defect else rng.betavariate(2, 5), 4)
    StudyItem.objects.bulk_update(items, ["suspicion"])
    plan_estimate(study, score=False)
    user = get_user_model().objects.get(username="annotator1")
    for _ in range(40):
        served = engine.next_assignment(Study.objects.get(pk=study.pk), user)
        kind = HUMAN_EXPECTED.get(kinds.get(served.assignment.item.query.external_id, ""))
        engine.submit(served.assignment, {**ANSWERS.get(kind, {"category": "VALIDATED"}), "time_spent_ms": 3000})
    return Study.objects.get(pk=study.pk)


def test_staff_read_the_running_estimate(browser, live_server, estimate_demo, shot):
    study = estimate_demo
    est = running_estimate(study)
    page = open_tab(browser, 1366, 768)
    try:
        login(page, live_server.url, "admin", "admin-demo")
        page.goto(f"{live_server.url}/studies/{study.pk}/progress/")
        page.click("#estimate-link")
        page.wait_for_selector("#estimate-kinds")
        overall = est["overall"]
        # the page rounds half up (floatformat), so figures are read as numbers
        assert float(page.inner_text("#overall-value")) == pytest.approx(overall["value"], abs=6e-5)
        low, high = (float(x) for x in page.inner_text("#overall-interval").split(" – "))
        assert (low, high) == pytest.approx((overall["low"], overall["high"]), abs=6e-5)
        assert page.inner_text("#target-half") == "0.1000"
        stop = page.inner_text("#stop-rule")
        assert ("Stop" in stop) == bool(study.estimate_stopped) and ("Keep going" in stop) == (not est["reached"])
        rows = page.locator("#estimate-kinds tbody tr")
        assert (
            rows.count() == len(est["kinds"])
            and page.locator(f"#estimate-kinds tr[data-kind='{OVERALL}']").count() == 1
        )
        # the design weights N_h / n_h, one per stratum
        weights = page.eval_on_selector_all("#estimate-strata td.weight", "ts => ts.map(t => t.textContent.trim())")
        assert len(weights) == len(est["strata"]) and all(
            float(w) == pytest.approx(s["weight"], abs=0.006) if s["weight"] else w == "—"
            for w, s in zip(weights, est["strata"])
        )
        assert "Neyman allocation" in page.inner_text("#estimate-method")
        assert page.evaluate("document.documentElement.scrollWidth") <= 1366
        shot(page, "estimate-1366")
    finally:
        close_tab(page)
    # the annotator's item page: no score, stratum or estimate
    page = open_tab(browser, 1366, 768)
    try:
        login(page, live_server.url, "annotator2", "annotator2-demo")
        page.goto(f"{live_server.url}/annotate/{study.pk}/")
        page.wait_for_load_state("networkidle")
        html = page.content()
        assert not any(w in html for w in ("suspicion", "stratum", "Neyman", "estimate_", "defect rate")), page.url
        assert page.goto(f"{live_server.url}/studies/{study.pk}/estimate/").status in (403, 404) or "/login" in page.url
    finally:
        close_tab(page)
