"""Issue 26 in the browser: the annotator's filmstrip names a turn's effective reference (a
FashionMT-style rollback of the demo: "refers back to turn k"), never the automatic checks;
staff read the checks' counts and flagged turns in the audit's Sessions section. 1366x768."""

from __future__ import annotations

import json

import pytest
from django.db.models import F

from annotation.models import Study, StudyItem
from retrieval.models import Turn
from retrieval.sessions import CONSISTENCY_CHECKS, REFERENCE_CHECKS
from tests.browser.conftest import login
from tests.browser.test_audit_sessions_page import audited_demo  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_filmstrip_names_the_effective_reference_and_staff_see_the_checks(page, live_server, audited_demo, shot):
    run = audited_demo
    page.set_viewport_size({"width": 1366, "height": 768})
    # the annotator is served a session with a rollback turn first
    rollback = (
        Turn.objects.filter(query__dataset__name="demo").exclude(reference_turns=[]).order_by("query_id", "index")
    )
    turn = next(t for t in rollback if len(t.reference_turns) == 1)
    study = Study.objects.get(name="demo-sessions")
    StudyItem.objects.filter(study=study).update(agreement=False, gold=False, order_key=F("order_key") + 1000)
    StudyItem.objects.filter(study=study, query_id=turn.query_id).update(order_key=0)
    login(page, live_server.url, "annotator3", "annotator3-demo")
    page.goto(f"{live_server.url}/annotate/{study.pk}/")
    page.wait_for_selector(".filmstrip")
    frame = page.locator(f".filmstrip .frame[data-turn='{turn.index - 1}']")
    label = frame.locator(".refers")
    assert label.inner_text().strip() == f"↩ refers back to turn {turn.reference_turns[0]}"
    assert label.get_attribute("data-reference-turns") == str(turn.reference_turns[0])
    assert label.is_visible()
    assert (
        page.locator(".filmstrip .refers").count()
        == Turn.objects.filter(query_id=turn.query_id).exclude(reference_turns=[]).count()
    )
    # blind: no check of either kind on the annotator's page
    html = page.content()
    assert page.locator(".turnflag").count() == 0
    for check in (*CONSISTENCY_CHECKS, *REFERENCE_CHECKS):
        assert f'data-check="{check}"' not in html
    frame.scroll_into_view_if_needed()
    shot(page, "session-effective-reference")

    # staff: the Sessions section counts every check and lists the flagged turns
    checks = run.summary["sessions"]["checks"]
    assert checks["retrospective_turns"] >= 3 and checks["flagged_turns"] > 0
    page.context.clear_cookies()
    login(page, live_server.url, "researcher", "researcher-demo")
    page.goto(f"{live_server.url}/audits/{run.pk}/#session-checks")
    table = page.locator("#session-checks")
    table.wait_for()
    assert table.locator("tbody tr").count() == len(CONSISTENCY_CHECKS) + len(REFERENCE_CHECKS)
    for key, counts in checks["consistency"].items():
        row = table.locator(f"tr[data-check='{key}']")
        assert row.locator("td.num").first.inner_text() == str(counts["turns"])
    flagged = page.locator("#session-flagged tbody tr")
    assert flagged.count() == min(checks["flagged_turns"], len(checks["flagged"]))
    first = checks["flagged"][0]
    assert (
        page.locator(f"#session-flagged tr[data-session='{first['external_id']}'][data-turn='{first['turn']}']").count()
        == 1
    )
    assert f"cosine ≥ {checks['thresholds']['noop']}" in table.inner_text()
    page.evaluate("""() => {
        for (const el of document.querySelectorAll('main > *')) { if (el.id !== 'sessions') el.style.display = 'none'; }
        document.getElementById('session-flagged').open = true;
    }""")
    page.locator("#session-checks").scroll_into_view_if_needed()
    assert page.locator("#session-flagged tbody tr").first.is_visible()
    full = shot(page, "audit-session-checks")
    # the 1366x768 view itself: the checks' heading, table and the first flagged turns
    page.locator("#session-checks").evaluate("el => el.previousElementSibling.previousElementSibling.scrollIntoView()")
    page.screenshot(path=str(full.with_name("audit-session-checks-1366x768.png")))
    assert json.dumps(checks)  # the summary is JSON (the export reads it)
