"""Annotators see only their own work; hidden labels and others' answers never reach them."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from annotation.assignment import queue as engine
from annotation.models import StudyItem
from annotation.studies.building import StudySpec, create_study
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db
HIDDEN = ("composition_required", "unresolved", "shortcut_solvable", "hidden_category")
SECRET = "SECRET-NOTE-OF-B"


@pytest.fixture
def world(db):
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    User = get_user_model()
    group = Group.objects.get(name="annotator")
    a, b, outsider = (User.objects.create_user(n, password="pw") for n in ("alice", "bob", "carol"))
    for u in (a, b, outsider):
        u.groups.add(group)
    study, _ = create_study(
        StudySpec(name="perm", datasets=["circo"], overlap=2, total=6, seed=1, annotators=["alice", "bob"])
    )
    for n, item in enumerate(StudyItem.objects.filter(study=study)):
        item.hidden_category = HIDDEN[n % 3]
        item.save()
    asg_b = engine.next_assignment(study, b).assignment
    engine.submit(asg_b, {"category": "INVALID_TEXT_QUERY", "sub_reason": "other", "note": SECRET, "time_spent_ms": 3})
    asg_b2 = engine.next_assignment(study, b).assignment
    return {"study": study, "a": a, "b": b, "outsider": outsider, "asg_b": asg_b, "asg_b2": asg_b2}


def api_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    return client


def test_another_annotators_assignment_is_404(world, client):
    api = api_for(world["a"])
    for asg in (world["asg_b"], world["asg_b2"]):
        assert api.get(f"/api/assignments/{asg.pk}/").status_code == 404
        assert api.get(f"/api/assignments/{asg.pk}/judgements/").status_code == 404
        assert (
            api.post(
                f"/api/assignments/{asg.pk}/judgements/", {"category": "VALIDATED", "time_spent_ms": 1}, format="json"
            ).status_code
            == 404
        )
        assert api.put(f"/api/assignments/{asg.pk}/draft/", {"x": 1}, format="json").status_code == 404
        assert api.post(f"/api/assignments/{asg.pk}/skip/").status_code == 404
    client.login(username="alice", password="pw")
    study = world["study"]
    assert client.get(f"/annotate/{study.pk}/item/{world['asg_b'].pk}/").status_code == 404


def test_a_study_you_are_not_in_is_404(world, client):
    api = api_for(world["outsider"])
    study = world["study"]
    assert api.get("/api/studies/").json() == []
    for url in (f"/api/studies/{study.pk}/", f"/api/studies/{study.pk}/progress/"):
        assert api.get(url).status_code == 404
    assert api.post(f"/api/studies/{study.pk}/next/").status_code == 404
    client.login(username="carol", password="pw")
    assert client.get(f"/annotate/{study.pk}/").status_code == 404


def test_only_staff_create_studies_and_see_study_pages(world, client):
    api = api_for(world["a"])
    resp = api.post("/api/studies/", {"name": "x", "datasets": ["circo"]}, format="json")
    assert resp.status_code == 403
    client.login(username="alice", password="pw")
    for url in ("/studies/", "/studies/new/", f"/studies/{world['study'].pk}/progress/", "/datasets/import/"):
        resp = client.get(url)
        assert resp.status_code == 403, url


def test_hidden_labels_and_other_answers_never_reach_an_annotator(world, client):
    study = world["study"]
    api = api_for(world["a"])
    bodies = []
    nxt = api.post(f"/api/studies/{study.pk}/next/")
    assert nxt.status_code == 200 and "served_by" not in nxt.json() and "staff" not in nxt.json()
    asg = nxt.json()["assignment"]
    bodies.append(nxt.content)
    for url in (
        "/api/studies/",
        f"/api/studies/{study.pk}/",
        f"/api/studies/{study.pk}/progress/",
        "/api/assignments/",
        f"/api/assignments/{asg}/",
        f"/api/assignments/{asg}/judgements/",
    ):
        r = api.get(url)
        assert r.status_code == 200, url
        bodies.append(r.content)
    r = api.post(
        f"/api/assignments/{asg}/judgements/",
        {"category": "VALIDATED", "time_spent_ms": 5, "client_token": "t1"},
        format="json",
    )
    assert r.status_code == 201
    bodies.append(r.content)
    # alice now gets the item bob judged (closest to overlap): its page must not show bob's note
    nxt = api.post(f"/api/studies/{study.pk}/next/")
    bodies.append(nxt.content)
    client.login(username="alice", password="pw")
    for url in (
        "/",
        "/annotate/",
        f"/annotate/{study.pk}/item/{asg}/",
        f"/annotate/{study.pk}/history/",
        f"/annotate/{study.pk}/upcoming/",
    ):
        r = client.get(url)
        assert r.status_code == 200, url
        bodies.append(r.content)
    r = client.get(f"/annotate/{study.pk}/", follow=True)
    bodies.append(r.content)
    for body in bodies:
        text = body.decode()
        for word in HIDDEN + (SECRET, "bob"):
            assert word not in text, (word, text[:300])


def test_api_submit_refusal_names_the_field_and_token_makes_retries_safe(world):
    study = world["study"]
    api = api_for(world["a"])
    asg = api.post(f"/api/studies/{study.pk}/next/").json()["assignment"]
    bad = api.post(
        f"/api/assignments/{asg}/judgements/",
        {"category": "INVALID_IMAGE_QUERY", "sub_reason": "other", "time_spent_ms": 5},
        format="json",
    )
    assert bad.status_code == 400 and bad.json()["field"] == "note"
    body = {"category": "VALIDATED", "time_spent_ms": 5, "client_token": "retry-1"}
    first = api.post(f"/api/assignments/{asg}/judgements/", body, format="json")
    second = api.post(f"/api/assignments/{asg}/judgements/", body, format="json")
    assert first.status_code == 201 and second.status_code == 200 and second.json()["duplicate"] is True
    history = api.get(f"/api/assignments/{asg}/judgements/").json()
    assert len(history) == 1


def test_schema_lists_the_annotation_api_to_researchers_only(world):
    assert api_for(world["a"]).get("/api/schema/", HTTP_ACCEPT="application/json").status_code == 403
    nobody = get_user_model().objects.create_user("norole", password="pw")
    assert api_for(nobody).get("/api/schema/", HTTP_ACCEPT="application/json").status_code == 403
    researcher = get_user_model().objects.create_user("res", password="pw")
    researcher.groups.add(Group.objects.get_or_create(name="researcher")[0])
    resp = api_for(researcher).get("/api/schema/", HTTP_ACCEPT="application/json")
    assert resp.status_code == 200
    paths = {p.replace("{id}", "{pk}") for p in json.loads(resp.content)["paths"]}
    for p in (
        "/api/studies/",
        "/api/studies/{pk}/next/",
        "/api/assignments/{pk}/judgements/",
        "/api/assignments/{pk}/draft/",
    ):
        assert p in paths


def test_a_researcher_reads_each_study_as_the_list_shows_it(world):
    """The study list shows researchers every study; its detail answers the same (it was 404),
    while the annotation endpoints stay closed to them."""
    User = get_user_model()
    reader = User.objects.create_user("reader", password="pw")
    reader.groups.add(Group.objects.get(name="researcher"))
    api = api_for(reader)
    listed = {s["id"]: s for s in api.get("/api/studies/").json()}
    study = world["study"]
    detail = api.get(f"/api/studies/{study.pk}/")
    assert detail.status_code == 200 and detail.json() == listed[study.pk]
    assert api.get(f"/api/studies/{study.pk + 999}/").status_code == 404
    # a study the researcher reads is not denied to exist by its work endpoints: 403, saying why
    # (an API pass found 404 "no such study" beside the detail's 200)
    for answer in (api.post(f"/api/studies/{study.pk}/next/"), api.get(f"/api/studies/{study.pk}/progress/")):
        assert answer.status_code == 403 and answer.json() == {"detail": "You are not an annotator of this study."}
    assert api.post(f"/api/studies/{study.pk + 999}/next/").status_code == 404
    assert api.get(f"/api/studies/{study.pk + 999}/progress/").status_code == 404
