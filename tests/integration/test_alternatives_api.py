"""Ticked alternatives through the API: only the item's own candidates, in judgements,
revisions and drafts; anything else is refused with 400 and nothing is written."""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from annotation.models import Draft, Judgement, StudyItem
from annotation.studies.building import StudySpec, create_study
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from retrieval.models import Image, Target

pytestmark = pytest.mark.django_db


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=40, n_single=3, n_sessions=1), "demo", images_root=root)
    user = get_user_model().objects.create_user("ann", password="pw")
    user.groups.add(Group.objects.get(name="annotator"))
    study, _ = create_study(StudySpec(name="alt", datasets=["demo"], overlap=1, annotators=["ann"], candidates=6))
    api = APIClient()
    api.force_authenticate(user)
    body = api.post(f"/api/studies/{study.pk}/next/").json()
    return api, body, StudyItem.objects.get(assignments__pk=body["assignment"])


def test_ticks_outside_the_candidates_are_refused_and_nothing_is_written(served):
    api, body, item = served
    asg = body["assignment"]
    panel = [p["id"] for p in body["panel"]]
    assert len(panel) == 6 and panel == item.candidates
    target = Target.objects.filter(query=item.query).values_list("image_id", flat=True).first()
    stranger = Image.objects.exclude(pk__in=panel).exclude(pk=target).values_list("pk", flat=True).first()
    url = f"/api/assignments/{asg}/judgements/"
    for bad in ([stranger], [target], [panel[0], panel[0]], "all", [str(panel[0])]):
        r = api.post(url, {"category": "VALIDATED", "time_spent_ms": 5, "alternatives": bad}, format="json")
        assert r.status_code == 400 and r.json()["field"] == "alternatives", bad
        d = api.put(f"/api/assignments/{asg}/draft/", {"category": "VALIDATED", "alternatives": bad}, format="json")
        assert d.status_code == 400, bad
    assert not Judgement.objects.filter(assignment_id=asg).exists()
    assert not Draft.objects.filter(assignment_id=asg).exists()


def test_ticks_go_into_drafts_judgements_and_revisions(served):
    api, body, item = served
    asg = body["assignment"]
    panel = [p["id"] for p in body["panel"]]
    assert api.put(f"/api/assignments/{asg}/draft/", {"alternatives": [panel[3], panel[1]]},
                   format="json").status_code == 200
    assert api.get(f"/api/assignments/{asg}/").json()["draft"]["alternatives"] == [panel[1], panel[3]]
    url = f"/api/assignments/{asg}/judgements/"
    r = api.post(url, {"category": "VALIDATED", "time_spent_ms": 5, "alternatives": [panel[3], panel[1]]}, format="json")
    assert r.status_code == 201 and r.json()["alternatives"] == [panel[1], panel[3]]
    r = api.post(url, {"category": "QUERY_TOO_BROAD", "time_spent_ms": 5, "alternatives": panel}, format="json")
    assert r.status_code == 201
    revs = list(Judgement.objects.filter(assignment_id=asg).order_by("revision").values_list("alternatives", "is_current"))
    assert revs == [([panel[1], panel[3]], False), (panel, True)]
    assert api.get(url).json()[0]["alternatives"] == [panel[1], panel[3]]


def test_an_adjudicator_accepts_or_refuses_a_candidate(served, client):
    from annotation.models import AlternativeDecision

    _api, body, item = served
    get_user_model().objects.create_superuser("boss", password="pw")
    client.login(username="boss", password="pw")
    url = f"/studies/{item.study_id}/adjudication/{item.pk}/"
    page = client.get(url).content.decode()
    assert 'id="candidates"' in page and page.count('name="candidate"') == 6
    assert client.post(url, {"candidate": item.candidates[2], "accept": "1"}).status_code == 302
    assert client.post(url, {"candidate": 999999, "accept": "1"}).status_code == 400
    assert list(AlternativeDecision.objects.values_list("image_id", "accepted")) == [(item.candidates[2], True)]
    assert "<b>accepted</b> (adjudicated)" in client.get(url).content.decode()
