"""Ticked alternatives through the API: only the item's own candidates, in judgements,
revisions and drafts; anything else is refused with 400 and nothing is written."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from annotation.judging.panel_fill import fill_study_candidates
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
    fill_study_candidates(study.pk)  # a worker's task (the web tier never computes a panel)
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
    assert (
        api.put(f"/api/assignments/{asg}/draft/", {"alternatives": [panel[3], panel[1]]}, format="json").status_code
        == 200
    )
    assert api.get(f"/api/assignments/{asg}/").json()["draft"]["alternatives"] == [panel[1], panel[3]]
    url = f"/api/assignments/{asg}/judgements/"
    r = api.post(
        url, {"category": "VALIDATED", "time_spent_ms": 5, "alternatives": [panel[3], panel[1]]}, format="json"
    )
    assert r.status_code == 201 and r.json()["alternatives"] == [panel[1], panel[3]]
    r = api.post(url, {"category": "QUERY_TOO_BROAD", "time_spent_ms": 5, "alternatives": panel}, format="json")
    assert r.status_code == 201
    revs = list(
        Judgement.objects.filter(assignment_id=asg).order_by("revision").values_list("alternatives", "is_current")
    )
    assert revs == [([panel[1], panel[3]], False), (panel, True)]
    assert api.get(url).json()[0]["alternatives"] == [panel[1], panel[3]]


def test_none_fit_is_stored_in_drafts_and_judgements_and_never_with_ticks(served):
    api, body, item = served
    asg = body["assignment"]
    panel = [p["id"] for p in body["panel"]]
    draft_url, url = f"/api/assignments/{asg}/draft/", f"/api/assignments/{asg}/judgements/"
    saved = api.put(draft_url, {"none_fit": True, "alternatives": [], "edited_at": 10}, format="json")
    assert saved.status_code == 200 and saved.json()["edited_at"] == 10
    assert api.get(f"/api/assignments/{asg}/").json()["draft"]["none_fit"] is True
    for bad in ({"none_fit": True, "alternatives": [panel[0]]}, {"none_fit": "yes"}):
        assert api.put(draft_url, bad, format="json").json()["field"] == "none_fit", bad
        r = api.post(url, {"category": "VALIDATED", "time_spent_ms": 5, **bad}, format="json")
        assert r.status_code == 400 and r.json()["field"] == "none_fit", bad
    r = api.post(
        url, {"category": "VALIDATED", "time_spent_ms": 5, "none_fit": True, "client_token": "t1"}, format="json"
    )
    assert r.status_code == 201 and r.json()["none_fit"] is True and r.json()["alternatives"] == []
    # the same answer again is a retry; the same token with ticks instead is another answer
    again = api.post(
        url, {"category": "VALIDATED", "time_spent_ms": 5, "none_fit": True, "client_token": "t1"}, format="json"
    )
    assert again.status_code == 200 and again.json()["duplicate"] is True
    other = api.post(url, {"category": "VALIDATED", "time_spent_ms": 5, "client_token": "t1"}, format="json")
    assert other.status_code == 409
    assert list(Judgement.objects.filter(assignment_id=asg).values_list("none_fit", flat=True)) == [True]
    assert api.get(f"/api/assignments/{asg}/").json()["judgement"]["none_fit"] is True


def test_a_draft_save_older_than_the_stored_one_changes_nothing(served):
    """Saves of one page can arrive out of order (a debounced save and the keepalive one sent
    on leaving): the newest edit stays, and the answer names the edit the server holds."""
    api, body, item = served
    url = f"/api/assignments/{body['assignment']}/draft/"
    panel = [p["id"] for p in body["panel"]]
    assert (
        api.put(url, {"alternatives": [panel[0], panel[2]], "edited_at": 2000}, format="json").json()["edited_at"]
        == 2000
    )
    late = api.put(url, {"alternatives": [panel[0]], "edited_at": 1000}, format="json")
    assert late.status_code == 200 and late.json()["edited_at"] == 2000
    assert Draft.objects.get(assignment_id=body["assignment"]).payload["alternatives"] == [panel[0], panel[2]]
    assert (
        api.put(url, {"alternatives": [], "none_fit": True, "edited_at": 3000}, format="json").json()["edited_at"]
        == 3000
    )
    assert Draft.objects.get(assignment_id=body["assignment"]).payload["none_fit"] is True


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
    page = client.get(url).content.decode()
    assert "<b>accepted</b> (adjudicated)" in page
    # the decided candidate leads the table; the five nobody ticked are folded below it
    seen = page[page.index('id="candidates"') : page.index('id="candidates-untouched"')]
    assert seen.count('name="candidate"') == 1 and "5 candidates nobody ticked" in page
