"""Issue 25, item 2: a study served by suspicion gives out its most suspicious fresh item
first (run it over PostgreSQL with DATABASE_URL: the row locks and the ordering are SQL)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from annotation.assignment import queue as engine
from annotation.models import Study, StudyItem
from annotation.studies.building import StudySpec, create_study
from retrieval.models import Dataset
from tests.conftest import FIXTURES, make_annotator

pytestmark = pytest.mark.django_db


@pytest.fixture
def circo(db):
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    return Dataset.objects.get(name="circo")


def _study(name: str, serve_order: str, annotators, overlap: int = 1) -> Study:
    study, _ = create_study(
        StudySpec(
            name=name,
            datasets=["circo"],
            overlap=overlap,
            total=30,
            seed=3,
            annotators=[u.username for u in annotators],
            serve_order=serve_order,
        )
    )
    # scores as refresh_suspicion stores them, against the seeded order: the last item is the most suspicious
    items = list(study.items.order_by("order_key"))
    for n, item in enumerate(items):
        item.suspicion = round(n / len(items), 4)
    StudyItem.objects.bulk_update(items, ["suspicion"])
    return study


def test_suspicion_order_serves_the_highest_score_first(circo):
    users = [make_annotator(f"ann{i}", password="x") for i in range(3)]
    by_score = _study("by-score", Study.ServeOrder.SUSPICION, users)
    scores = sorted(by_score.items.values_list("suspicion", flat=True), reverse=True)
    api = APIClient()
    served = []
    for _ in range(3):  # overlap 1: each annotator takes the most suspicious item still free
        for user in users:
            api.force_authenticate(user)
            body = api.post(f"/api/studies/{by_score.pk}/next/").json()
            a = by_score.assignments.get(pk=body["assignment"])
            served.append(a.item.suspicion)
            engine.submit(a, {"category": "VALIDATED", "time_spent_ms": 900})
    assert served == scores[:9]
    # the guess of the next item (the page's prefetch) follows the same order
    user = make_annotator("late", password="x")
    by_score.annotators.add(user)
    nxt = by_score.items.filter(taken=0).order_by(*engine.queue_order(by_score)).first()
    assert nxt.suspicion == scores[9]

    # the same scores in a study served at random: its seeded order, not the score
    plain = _study("plain", Study.ServeOrder.RANDOM, users)
    api.force_authenticate(users[0])
    first = plain.assignments.get(pk=api.post(f"/api/studies/{plain.pk}/next/").json()["assignment"]).item
    assert first.order_key == min(plain.items.values_list("order_key", flat=True)) and first.suspicion == 0.0


def test_overlap_still_comes_before_the_score(circo):
    users = [make_annotator(f"o{i}", password="x") for i in range(2)]
    study = _study("overlap", Study.ServeOrder.SUSPICION, users, overlap=2)
    top = study.items.order_by("-suspicion").first()
    first = engine.next_assignment(study, users[0]).assignment
    assert first.item_id == top.pk
    engine.submit(first, {"category": "VALIDATED", "time_spent_ms": 900})
    # the second annotator completes that item before starting a fresh one
    assert engine.next_assignment(study, users[1]).assignment.item_id == top.pk


def test_staff_choose_the_order_when_creating_a_study(circo, admin_client):
    from django.contrib.auth import get_user_model

    api = APIClient()
    api.force_authenticate(get_user_model().objects.get(username="admin"))
    r = api.post(
        "/api/studies/",
        {"name": "api-by-score", "datasets": ["circo"], "total": 5, "serve_order": "suspicion"},
        format="json",
    )
    assert r.status_code == 201, r.content
    assert r.json()["serve_order"] == "suspicion" and Study.objects.get(name="api-by-score").serve_order == "suspicion"
    bad = api.post("/api/studies/", {"name": "x", "datasets": ["circo"], "serve_order": "loudest"}, format="json")
    assert bad.status_code == 400
    page = admin_client.get(f"/studies/{Study.objects.get(name='api-by-score').pk}/progress/").content.decode()
    assert "Served in suspicion order" in page


def test_the_queue_page_says_when_scores_have_not_seen_new_judgements(circo, admin_client):
    """A submit does not recompute an item's score: the staff page says when the scores were
    computed and which items have counted judgements since; Compute again catches them up."""
    from annotation.studies.suspicion_scores import refresh_suspicion

    users = [make_annotator(f"ann{i}", password="x") for i in range(2)]
    study = _study("stale", Study.ServeOrder.SUSPICION, users, overlap=2)
    refresh_suspicion(study.pk)
    page = admin_client.get(f"/studies/{study.pk}/suspicion/").content.decode()
    assert "Scores computed " in page and "Every score has seen its item" in page
    for user in users:
        a = engine.next_assignment(study, user).assignment
        engine.submit(a, {"category": "VALIDATED", "time_spent_ms": 900})
    item = a.item
    page = admin_client.get(f"/studies/{study.pk}/suspicion/").content.decode()
    assert "1 item has counted judgements the score has not seen" in page
    row = page[page.index(f'data-item="{item.pk}"') :]
    assert "2 / 0</td>" in row[: row.index("</tr>")]
    admin_client.post(f"/studies/{study.pk}/suspicion/")
    page = admin_client.get(f"/studies/{study.pk}/suspicion/").content.decode()
    assert "Every score has seen its item" in page
    assert StudyItem.objects.get(pk=item.pk).suspicion_parts["votes"] == 2
