"""A researcher reads a study's agreement report in the browser: both heatmaps render (inline
SVG, a value in every off-diagonal cell) with its weights, intervals and conventions; an admin
sees the pending items and adjudicates a flagged item; an annotator is refused."""

from __future__ import annotations

import random

import pytest

from annotation.models import Study, StudyItem
from tests.browser.conftest import login
from tests.integration.test_report_export import judge

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def judged_demo(demo_world):
    """The demo validity study with three annotators' judgements on 60 items (seeded)."""
    study = Study.objects.get(name="demo-validity")
    users = list(study.annotators.order_by("username"))
    rng = random.Random(4)
    for n, item in enumerate(StudyItem.objects.filter(study=study).order_by("id")[:60]):
        StudyItem.objects.filter(pk=item.pk).update(hidden_category=("composition_required", "unresolved")[n % 2])
        if n % 20 == 5:
            continue  # left for later: no vote yet
        for k, user in enumerate(users[: 2 if n % 20 == 15 else 3]):  # every 20th item: two votes, pending
            code = rng.choice(["V", "V", "V", "TEXT", "BROAD", "TARGET"])
            judge(study, item, user, code + ("!" if n % 10 == 0 and k == 2 else ""))  # every tenth: flagged
    return study


def test_researcher_sees_the_heatmaps(page, live_server, judged_demo, shot):
    from annotation.agreement.intervals import compute_intervals, interval_options

    study = judged_demo
    compute_intervals(study, interval_options(study))  # what the worker does after the judgements
    login(page, live_server.url, "researcher", "researcher-demo")
    page.click("text=Agreement reports")
    page.wait_for_url("**/reports/")
    page.click(f"a[href='/studies/{study.pk}/report/']")
    page.wait_for_selector("#heatmap-kappa")
    for selector in ("#heatmap-kappa", "#heatmap-signature"):
        box = page.locator(selector).bounding_box()
        assert box is not None and box["width"] > 150 and box["height"] > 150
        # 3 annotators: 9 cells, 6 of them off the diagonal with a number printed
        cells = page.locator(f"{selector} rect[stroke='#ffffff']")
        assert cells.count() == 9
        texts = page.eval_on_selector_all(f"{selector} g > g > text", "ts => ts.map(t => t.textContent)")
        assert len([t for t in texts if t.replace("-", "").replace(".", "").isdigit()]) == 6
    body = page.inner_text("main")
    assert "annotator_01" in body and "annotator1" not in body  # pseudonyms for researchers
    assert "Per category" in body and "By dataset" in body and "By hidden audit category" in body
    assert page.locator("#confusion tbody tr").count() == 6
    # weights, bootstrap intervals with their n, and the constant-pair conventions are stated
    assert "Brackets: 95% percentile bootstrap intervals" in body and "n = 1000 replicates" in body
    assert page.locator("#headline .ci").count() >= 4
    # every headline figure is explained where it is shown, with how to read a coefficient
    labels = page.eval_on_selector_all("#headline dt", "ds => ds.map(d => d.textContent)")
    explained = page.eval_on_selector_all("#figures-help dl.glossary dt", "ds => ds.map(d => d.textContent)")
    assert labels == explained and all(page.eval_on_selector_all("#headline > div", "ds => ds.map(d => d.title)"))
    help_text = page.inner_text("#figures-help")
    assert "Krippendorff (2004)" in help_text and "17 signatures" in help_text
    assert "unweighted" in body and "pending" in body
    page.click("#constant-pairs summary")
    assert "CIRCUS" in page.inner_text("#constant-pairs")
    for width, height in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": width, "height": height})
        path = shot(page, f"report-researcher-{width}")
        assert path.stat().st_size > 20_000


def test_admin_adjudicates_a_flagged_item(page, live_server, judged_demo, shot):
    study = judged_demo
    login(page, live_server.url, "admin", "admin-demo")
    page.goto(f"{live_server.url}/studies/{study.pk}/progress/")
    # items below the quorum are counted and the export form warns about them
    assert "pending" in page.inner_text("#export-pending")
    # the CIRCO layout is offered beside M-BEIR JSONL (issue 28)
    page.select_option("#export-format", "circo")
    assert page.locator("#export-format").input_value() == "circo"
    for width, height in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": width, "height": height})
        shot(page, f"progress-pending-{width}")
    page.click("text=Adjudication")
    page.wait_for_selector("#queue")
    waiting = page.locator("#queue a.button.primary")
    assert waiting.count() > 0, "the seeded votes must leave an item to adjudicate"
    before = waiting.count()
    waiting.first.click()
    page.wait_for_selector("#votes")
    assert "annotator1" in page.inner_text("#votes")  # staff see who voted
    shot(page, "adjudication-item")
    page.fill("textarea[name=note]", "clear enough")
    page.click("button[value=validated]")
    page.wait_for_load_state()
    page.goto(f"{live_server.url}/studies/{study.pk}/adjudication/")
    assert page.locator("#queue a.button.primary").count() == before - 1


def test_annotator_is_refused(page, live_server, judged_demo):
    login(page, live_server.url, "annotator1", "annotator1-demo")
    resp = page.goto(f"{live_server.url}/studies/{judged_demo.pk}/report/")
    assert resp.status == 403
    assert page.locator("svg.heatmap").count() == 0
    assert page.goto(f"{live_server.url}/reports/").status == 403


def test_session_report_states_its_weights(page, live_server, demo_world, shot):
    """A session study's report: ordinal scales with quadratic weights over the whole 1..5
    range, in the headline and in every per-scale row; the session rule's consensus."""
    from tests.integration.test_verdicts_agreement import rate

    study = Study.objects.get(name="demo-sessions")
    users = list(study.annotators.order_by("username"))[:2]
    rng = random.Random(2)
    for item in StudyItem.objects.filter(study=study).order_by("id").select_related("query")[:8]:
        for user in users:
            rate(study, item, user, rng.choice([2, 3, 4, 5]), ["circle"] if rng.random() < 0.2 else [])
    login(page, live_server.url, "admin", "admin-demo")
    page.goto(f"{live_server.url}/studies/{study.pk}/report/")
    page.wait_for_selector("#headline")
    body = page.inner_text("main")
    assert "quadratic weights" in page.inner_text("#headline") and "categories 1, 2, 3, 4, 5" in body
    assert body.count("Cohen's kappa quadratic weights") >= 5  # one per scale row
    assert "Consensus (session)" in body
    # session rubric v2: agreement per turn position and per session, with each turn's consensus
    rows = page.locator("#turn-agreement tbody tr")
    assert rows.count() >= 3 and rows.first.inner_text().startswith("Session (derived verdict)")
    assert rows.nth(1).inner_text().startswith("Turn 1") and "validated" in rows.nth(1).inner_text()
    page.locator("#turns").scroll_into_view_if_needed()
    for width, height in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": width, "height": height})
        shot(page, f"report-sessions-{width}")


def test_progress_page_counts_are_the_study_counts(page, live_server, judged_demo, shot):
    """Issue 28 at 1366x768: the progress page's item states and judgement counts are those of
    annotation.verdicts.state.study_counts; pending (below the quorum) and unjudged are apart."""
    from annotation.verdicts.state import study_counts

    study = judged_demo
    counts = study_counts(study)
    assert counts["pending"] == 3 and counts["unjudged"] == counts["items"] - 57  # 3 items left unjudged
    page.set_viewport_size({"width": 1366, "height": 768})
    login(page, live_server.url, "admin", "admin-demo")
    page.goto(f"{live_server.url}/studies/{study.pk}/progress/")
    shown = {
        k: int(page.inner_text(f"#count-{k}"))
        for k in ("items", "judgements", "late", "pending", "unjudged", "validated", "rejected", "awaiting")
    }
    assert shown == {
        "items": counts["items"],
        "judgements": counts["judgements"],
        "late": 0,
        "pending": counts["pending"],
        "unjudged": counts["unjudged"],
        "validated": counts["status"]["validated"],
        "rejected": counts["status"]["rejected"],
        "awaiting": counts["status"]["adjudication"],
    }
    box = page.locator("#count-unjudged").bounding_box()
    assert box is not None and box["x"] + box["width"] <= 1366  # the stats wrap inside the window
    shot(page, "progress-counts-1366")
