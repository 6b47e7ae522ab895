"""Gold items are mixed into each annotator's queue at the study rate, silently."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command

from annotation.assignment import queue as engine
from annotation.judging.payloads import item_payload
from annotation.models import StudyItem
from annotation.quality.gold import gold_scores, mark_gold, promote_unanimous
from annotation.studies.building import StudySpec, create_study
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db


@pytest.fixture
def study():
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    for name in ("ann", "bea"):
        get_user_model().objects.create_user(name, password="pw").groups.add(Group.objects.get(name="annotator"))
    s, _ = create_study(StudySpec(name="g", datasets=["circo"], overlap=1, total=8, annotators=["ann", "bea"]))
    return s


def test_gold_at_the_rate_and_never_in_the_normal_pool(study):
    study.gold_rate = 0.5
    study.save()
    golds = list(StudyItem.objects.filter(study=study).order_by("id")[:2])
    for g in golds:
        mark_gold(g, True)
    ann = get_user_model().objects.get(username="ann")
    rules, items = [], []
    for _ in range(6):
        served = engine.next_assignment(study, ann)
        rules.append(served.rule)
        items.append(served.assignment.item_id)
        payload = item_payload(served.assignment, served.rule)
        assert "served_by" not in payload  # silent: annotators never see the serving rule
        engine.submit(served.assignment, {"category": "VALIDATED", "time_spent_ms": 10})
    assert [r == "gold_item" for r in rules] == [False, True, False, True, False, False]
    assert {items[1], items[3]} == {g.pk for g in golds}
    # overlap 1 does not stop another annotator from getting the same gold items
    bea = get_user_model().objects.get(username="bea")
    engine.submit(engine.next_assignment(study, bea).assignment, {"category": "VALIDATED", "time_spent_ms": 10})
    second = engine.next_assignment(study, bea)
    assert second.rule == "gold_item" and second.assignment.item_id in {g.pk for g in golds}
    engine.submit(
        second.assignment, {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified", "time_spent_ms": 10}
    )
    scores = gold_scores(study)
    assert scores["ann"]["right"] == 2 and scores["ann"]["n"] == 2
    assert (
        scores["bea"]["right"] == 0
        and scores["bea"]["n"] == 1
        and scores["bea"]["high"] == pytest.approx(0.7935, abs=1e-4)
    )


def test_promote_unanimous_items(study):
    study.gold_rate, study.overlap = 0, 2
    study.save()
    ann, bea = (get_user_model().objects.get(username=n) for n in ("ann", "bea"))
    served = engine.next_assignment(study, ann).assignment
    engine.submit(served, {"category": "VALIDATED", "time_spent_ms": 10})
    assert promote_unanimous(study) == 0  # one vote is not unanimous
    for _ in range(8):  # bea works until she has judged ann's item too, always VALIDATED
        other = engine.next_assignment(study, bea).assignment
        engine.submit(other, {"category": "VALIDATED", "time_spent_ms": 10})
        if other.item_id == served.item_id:
            break
    assert promote_unanimous(study) == 1  # two agreeing votes: unanimous; bea's other items have one
    item = StudyItem.objects.get(pk=served.item_id)
    assert item.gold and item.gold_source == "unanimous"
    assert item.gold_answer == {"validated": True, "made_by": ["ann", "bea"]}  # their votes made it: not scored


def test_training_feedback_names_the_expected_category_and_links_to_the_item(study, client):
    """Staff mark a gold item by hand with its expected category (the room's form); the
    annotator's wrong answer on it during training gets feedback naming that category, their
    own answer and the item's page, in the submit's answer and on the next page."""
    from rest_framework.test import APIClient

    study.training_items, study.gold_rate = 1, 0.05
    study.save()
    gold = StudyItem.objects.filter(study=study).order_by("id").first()
    boss = get_user_model().objects.create_superuser("boss", password="pw")
    client.force_login(boss)
    # a gold rate with no gold item measures nobody: the room says so until one is added
    assert 'id="gold-none"' in client.get(f"/room/studies/{study.pk}/").content.decode()
    study.gold_rate = 0
    study.save()
    refused = client.post(
        f"/room/studies/{study.pk}/gold/",
        {"item": gold.pk, "answer": "valid", "category": "QUERY_TOO_BROAD"},
        follow=True,
    )
    assert "A category goes with “not valid” only." in refused.content.decode()
    client.post(
        f"/room/studies/{study.pk}/gold/", {"item": gold.pk, "answer": "invalid", "category": "QUERY_TOO_BROAD"}
    )
    gold.refresh_from_db()
    assert gold.gold_answer == {"validated": False, "category": "QUERY_TOO_BROAD"}
    assert "not valid (QUERY_TOO_BROAD)" in client.get(f"/room/studies/{study.pk}/").content.decode()

    ann = get_user_model().objects.get(username="ann")
    api = APIClient()
    api.force_login(ann)
    served = api.post(f"/api/studies/{study.pk}/next/").json()
    assert "gold" not in str(served) and "training" not in str(served)  # silent until answered
    r = api.post(
        f"/api/assignments/{served['assignment']}/judgements/",
        {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified", "time_spent_ms": 9},
        format="json",
    )
    url = f"/annotate/{study.pk}/item/{served['assignment']}/"
    assert r.status_code == 201 and r.json()["training"] == {
        "correct": False,
        "expected": "Query too broad",
        "yours": "Invalid text",
        "position": 1,
        "url": url,
    }
    page = api.get(f"/annotate/{study.pk}/").content.decode()  # the next page shows it once
    assert (
        "Training item #1: not quite — expected “Query too broad”, you answered “Invalid text”. "
        f'<a href="{url}" class="training-item">Look at item #1 again</a>'
    ) in page
    # a right answer (a revision) is told as right; an invalid gold without a category asks only "not valid"
    r = api.post(
        f"/api/assignments/{served['assignment']}/judgements/",
        {"category": "QUERY_TOO_BROAD", "time_spent_ms": 9},
        format="json",
    )
    assert r.json()["training"]["correct"] is True
    mark_gold(gold, False)
    r = api.post(
        f"/api/assignments/{served['assignment']}/judgements/",
        {"category": "VALIDATED", "time_spent_ms": 9},
        format="json",
    )
    assert r.json()["training"]["expected"] == "not valid (any invalid category)"
