"""Issue 25: staff read a study's labour (judgements spent and saved by adaptive overlap) and
each annotator's Dawid-Skene reliability with its interval on the study page, at 1366x768
and 1920x1080; the items where reliability-weighted consensus and the majority differ are listed."""

from __future__ import annotations

import random

import pytest

from annotation.models import Study, StudyItem
from annotation.studies.truth import defects_found, planted_kinds
from annotation.verdicts.readmodel import study_reliability
from annotation.verdicts.state import study_counts
from tests.browser.conftest import login
from tests.integration.test_report_export import judge

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def adaptive_demo(demo_world):
    """The demo validity study made adaptive (2 -> 3, reliability-weighted): annotator1 is
    careful, annotator2 fair, annotator3 answers at random; a third vote only after a split."""
    study = Study.objects.get(name="demo-validity")
    Study.objects.filter(pk=study.pk).update(overlap=2, adaptive_max=3, consensus="reliability")
    study.refresh_from_db()
    users = list(study.annotators.order_by("username"))
    rng = random.Random(9)
    skill = {users[0].username: 0.95, users[1].username: 0.85, users[2].username: 0.5}
    for n, item in enumerate(StudyItem.objects.filter(study=study, gold=False).order_by("id")[:60]):
        truth = n % 4 != 0
        order = rng.sample(users, 3)
        said = []
        for user in order:
            item.refresh_from_db()
            if len(said) >= 2 + item.extra_slots:
                break
            right = rng.random() < skill[user.username]
            valid = truth if right else not truth
            said.append(valid)
            judge(study, item, user, "V" if valid else "TEXT")
    return study


def test_staff_see_labour_and_reliability(page, live_server, adaptive_demo, shot):
    study = adaptive_demo
    counts = study_counts(study)
    reliability = study_reliability(study)
    assert counts["labour"]["saved"] > 0 and counts["judgements"] < 3 * 60
    login(page, live_server.url, "admin", "admin-demo")
    page.goto(f"{live_server.url}/studies/{study.pk}/progress/")
    assert page.inner_text("#count-spent") == str(counts["judgements"])
    assert page.inner_text("#count-saved") == str(counts["labour"]["saved"])
    assert "adaptive overlap" in page.inner_text("#labour")
    # the share of the demo's planted defects found so far (its truth file, staff only)
    defects = defects_found(study)
    assert defects is not None and defects["planted"] > 0 and planted_kinds("demo")
    assert page.inner_text("#defects-found") == f"{defects['found']} of {defects['planted']}"
    assert defects["found"] + defects["missed"] + defects["open"] == defects["planted"]
    rows = page.locator("#reliability tbody tr")
    assert rows.count() == 3
    by_name = reliability.by_annotator
    for k in range(3):
        cells = rows.nth(k).locator("td").all_inner_texts()
        r = by_name[cells[0]]
        assert cells[2] == f"{r.accuracy:.2f}" and cells[3].strip() == f"[{r.low:.2f}, {r.high:.2f}]"
    worst = min(reliability.annotators, key=lambda r: r.accuracy)
    assert worst.annotator == "annotator3"  # the random one
    assert page.inner_text("#consensus-policy") == "reliability-weighted"
    differs = page.inner_text("#reliability-differs")
    assert (str(len(reliability.differs)) in differs) if reliability.differs else "agree on every item" in differs
    for width, height in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": width, "height": height})
        shot(page, f"labour-{width}")
        page.locator("#reliability-title").scroll_into_view_if_needed()
        page.screenshot(path=str(shot(page, f"reliability-{width}").with_name(f"reliability-{width}-view.png")))
        box = page.locator("#reliability").bounding_box()
        assert box is not None and box["width"] <= width  # the table fits the window
