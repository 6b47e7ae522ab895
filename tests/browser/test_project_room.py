"""The project room in the browser: a user invited and added to a study from the staff
pages, then working in it; a gold item scored; the study paused and resumed."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from annotation.models import Assignment, Judgement, Study, StudyItem
from audit.labels import LABELS
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_invite_a_user_and_add_them_to_a_study(page, live_server, demo_world, shot):
    study = Study.objects.get(name="demo-validity")
    base = live_server.url
    login(page, base, "admin", "admin-demo")
    page.click("nav >> text=Users")
    page.fill("#user-form input[name=username]", "newbie")
    page.check("#user-form input[name=roles][value=annotator]")
    page.click("#user-form button[type=submit]")
    link = page.input_value("#invite-link")
    assert "/room/invite/" in link
    shot(page, "room-users-invited")
    user = get_user_model().objects.get(username="newbie")
    assert not user.has_usable_password() and user.groups.filter(name="annotator").exists()

    page.goto(f"{base}/room/studies/{study.pk}/")
    page.select_option("#add-annotator", "newbie")
    page.click("#team button[value=add]")
    page.wait_for_selector("#team li:has-text('newbie')")
    assert study.annotators.filter(username="newbie").exists()
    shot(page, "room-study")

    # pause: the new annotator sees the study but is served nothing
    page.click("button[value=pause]")
    page.wait_for_selector("#study-status:has-text('paused')")
    page.context.clear_cookies()

    page.goto(link)
    page.fill("input[name=new_password1]", "a-long-new-password-42")
    page.fill("input[name=new_password2]", "a-long-new-password-42")
    page.click("button[type=submit]")
    login(page, base, "newbie", "a-long-new-password-42")
    page.goto(f"{base}/annotate/")
    assert "Paused" in page.inner_text(f"section.studycard:has-text('{study.name}')")
    page.goto(f"{base}/annotate/{study.pk}/")
    assert page.locator("#judgement-form").count() == 0

    Study.objects.filter(pk=study.pk).update(status=Study.Status.OPEN)
    page.goto(f"{base}/annotate/{study.pk}/")
    page.wait_for_selector("#judgement-form")


def test_gold_item_scored_with_training_feedback(page, live_server, demo_world, shot):
    study = Study.objects.get(name="demo-validity")
    base = live_server.url
    item = StudyItem.objects.filter(study=study, agreement=False).order_by("id").first()

    login(page, base, "admin", "admin-demo")
    page.goto(f"{base}/room/studies/{study.pk}/")
    page.fill("#settings input[name=training_items]", "1")
    page.click("#settings button[type=submit]")
    page.wait_for_selector(".messages li.success")
    page.fill("#gold input[name=item]", str(item.pk))
    page.select_option("#gold select[name=answer]", "valid")
    page.click("#gold button[value=hand]")
    page.wait_for_selector(f"#gold td:text-is('{item.pk}')")
    item.refresh_from_db()
    assert item.gold and item.gold_answer == {"validated": True} and item.gold_source == "hand"
    page.context.clear_cookies()

    # the training phase serves the gold item first; a wrong answer gets feedback
    login(page, base, "annotator2", "annotator2-demo")
    page.goto(f"{base}/annotate/{study.pk}/")
    page.wait_for_selector("#judgement-form")
    assert page.locator("#served-by").count() == 0  # annotators never see the serving rule
    served = Assignment.objects.get(item=item, annotator__username="annotator2")
    assert served.served_by == "training_item"
    page.keyboard.press("1")
    page.keyboard.press("q")
    page.keyboard.press("Enter")
    page.wait_for_selector(".messages li:has-text('Training item #1: not quite')")
    feedback = page.inner_text(".messages li")
    # the expected category, the annotator's own answer, and a link back to the item
    assert "expected “Validated”, you answered “Invalid text”" in feedback
    assert not any(label in feedback for label in LABELS)  # never the audit's label
    page.set_viewport_size({"width": 1366, "height": 768})
    shot(page, "gold-training-feedback")
    judged = Judgement.objects.get(assignment__item=item, assignment__annotator__username="annotator2")
    assert judged.validated is False
    page.click(".messages a.training-item")
    page.wait_for_url(f"**/annotate/{study.pk}/item/{served.pk}/")
    assert page.is_checked("input[name=category][value=INVALID_TEXT_QUERY]")  # the item as answered

    page.context.clear_cookies()
    login(page, base, "admin", "admin-demo")
    page.goto(f"{base}/studies/{study.pk}/progress/")
    row = page.locator("#quality tr[data-annotator=annotator2] td.gold")
    assert row.inner_text().startswith("0 of 1 · 0 %")
    assert "[0.00, 0.79]" in row.inner_text()  # Wilson 95 % of 0/1: [0, 0.7935]
    shot(page, "gold-progress")
