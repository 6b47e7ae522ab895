"""Issue 17: SQL queries per "next item" and per submit through the full request stack
(session authentication, API view, engine, payload with its stored candidate panel,
progress), with gold items mixed in. Each request is also checked for what it must still
do: a lease, the panel, the progress counts, the quorum counters."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import Client

from annotation.judging.panel_fill import fill_study_candidates
from annotation.models import Assignment, Draft, Judgement, Study, StudyItem
from annotation.sizes import recount
from annotation.verdicts.state import annotator_share
from tests.conftest import make_annotator

pytestmark = pytest.mark.django_db

NEXT_MAX = 10  # session, user, study (membership and role, leases, counts, gold count, the study's sizes: its
#                columns, annotation/sizes.py), begin, candidates or
#                gold (with the first turn and the items still open to the annotator for their share:
#                annotation/verdicts/state.py open_left), insert, taken, commit, targets, panel and turn images
SUBMIT_MAX = 8  # session, user, begin, locked read (access and role, revision, token, draft), insert, quorum,
#                 status, commit
ANSWER = {"category": "VALIDATED", "time_spent_ms": 900}


@pytest.fixture
def study(demo_db):
    """The demo study, made once for this module (tests/conftest.py demo_db); what a test
    changes rolls back with its transaction."""
    study = Study.objects.get(name="demo-validity")
    fill_study_candidates(study.pk)
    study.gold_rate, study.training_items = 0.25, 1
    study.save(update_fields=["gold_rate", "training_items"])
    StudyItem.objects.filter(pk__in=list(study.items.order_by("order_key").values_list("pk", flat=True)[:3])).update(
        gold=True, gold_answer={"validated": True}
    )
    return study


def _client(study, name="counted"):
    user = make_annotator(name, password="x")  # access needs the annotator role
    study.annotators.add(user)
    client = Client()
    client.force_login(user)
    return client, user


def test_next_item_and_submit_stay_within_their_query_budget(study, django_assert_max_num_queries):
    client, user = _client(study)
    served_gold = 0
    for _ in range(8):
        cache.clear()  # as after any cache's expiry: the budget holds on every request, none is warmed
        with django_assert_max_num_queries(NEXT_MAX):
            r = client.post(f"/api/studies/{study.pk}/next/")
        body = r.json()
        a = Assignment.objects.select_related("item").get(pk=body["assignment"])
        assert a.status == "reserved" and a.lease_expires is not None and a.annotator == user
        assert a.item.taken >= 1
        if a.item.query.n_turns == 1:
            assert [p["id"] for p in body["panel"]] == list(a.item.candidates) and len(
                body["panel"]
            ) == study.candidates
        assert body["judgement"] is None and body["draft"] is None
        assert body["progress"] == annotator_share(study, user)
        # the turn read with the served item is the turn read on its own (the item page's path)
        assert client.get(f"/api/assignments/{a.pk}/").json()["query"] == body["query"]
        served_gold += a.item.gold
        completed = a.item.completed
        with django_assert_max_num_queries(SUBMIT_MAX):
            r = client.post(f"/api/assignments/{a.pk}/judgements/", ANSWER, content_type="application/json")
        assert r.status_code == 201, r.content
        a.refresh_from_db()
        a.item.refresh_from_db()
        assert a.status == "done" and a.item.completed == completed + 1
    assert served_gold >= 2  # the training item and the gold rate both served gold


def test_resumed_lease_revisions_drafts_and_conflicts_keep_working(study, django_assert_max_num_queries):
    client, user = _client(study)
    first = client.post(f"/api/studies/{study.pk}/next/").json()
    with django_assert_max_num_queries(NEXT_MAX + 2):  # resumed: the lease is locked and renewed
        again = client.post(f"/api/studies/{study.pk}/next/").json()
    assert again["assignment"] == first["assignment"]
    url = f"/api/assignments/{first['assignment']}/"
    client.put(url + "draft/", {"note": "half"}, content_type="application/json")
    with django_assert_max_num_queries(SUBMIT_MAX + 1):  # the draft is deleted
        assert (
            client.post(
                url + "judgements/", {**ANSWER, "client_token": "t1"}, content_type="application/json"
            ).status_code
            == 201
        )
    assert not Draft.objects.filter(assignment_id=first["assignment"]).exists()
    same = client.post(url + "judgements/", {**ANSWER, "client_token": "t1"}, content_type="application/json")
    assert same.status_code == 200 and same.json()["duplicate"]
    other = {"category": "QUERY_TOO_BROAD", "time_spent_ms": 5}
    assert (
        client.post(url + "judgements/", {**other, "client_token": "t1"}, content_type="application/json").status_code
        == 409
    )
    with django_assert_max_num_queries(SUBMIT_MAX + 1):  # the earlier revision stops being current
        r = client.post(
            url + "judgements/", {**other, "client_token": "t2", "base_revision": 1}, content_type="application/json"
        )
    assert r.status_code == 201 and r.json()["revision"] == 2
    stale = client.post(
        url + "judgements/", {**ANSWER, "client_token": "t3", "base_revision": 1}, content_type="application/json"
    )
    assert stale.status_code == 409 and stale.json()["conflict"] == "stale" and stale.json()["stored"]["revision"] == 2
    assert Judgement.objects.filter(assignment_id=first["assignment"], is_current=True).count() == 1
    # another annotator's assignment stays a 404, whatever the body
    intruder, _ = _client(study, "intruder")
    assert intruder.post(url + "judgements/", ANSWER, content_type="application/json").status_code == 404
    assert (
        intruder.post(url + "judgements/", {**ANSWER, "base_revision": -1}, content_type="application/json").status_code
        == 404
    )
    assert (
        intruder.post(url + "judgements/", "x=1", content_type="application/x-www-form-urlencoded").status_code == 404
    )


def test_a_study_without_gold_items_never_pays_for_the_gold_query(study):
    """At a 5% gold rate gold falls due on an annotator's 20th item; in a study with no gold
    item the request must cost no more queries after that than before (issue 30: it ran a
    scan of every study item on each request)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    StudyItem.objects.filter(study=study).update(gold=False, gold_answer={})
    study.gold_rate, study.training_items, study.overlap = 0.05, 0, 1
    study.save(update_fields=["gold_rate", "training_items", "overlap"])
    client, user = _client(study, "no-gold")
    counts = []
    for _ in range(24):
        cache.clear()
        with CaptureQueriesContext(connection) as ctx:
            r = client.post(f"/api/studies/{study.pk}/next/")
        counts.append(len(ctx.captured_queries))
        body = r.json()
        assert body["assignment"] is not None, body
        assert (
            client.post(
                f"/api/assignments/{body['assignment']}/judgements/", ANSWER, content_type="application/json"
            ).status_code
            == 201
        )
    assert Assignment.objects.filter(annotator=user).count() == 24
    assert max(counts[19:]) <= max(counts[1:19]) <= NEXT_MAX, counts


def test_next_item_served_by_suspicion_keeps_the_budget(study, django_assert_max_num_queries):
    """Issue 25: serving by suspicion reads the score stored on the item (an indexed column),
    so "next item" costs what it costs in the seeded order."""
    study.serve_order = Study.ServeOrder.SUSPICION
    study.gold_rate, study.training_items = 0, 0
    study.save(update_fields=["serve_order", "gold_rate", "training_items"])
    StudyItem.objects.filter(study=study).update(agreement=False)
    recount(study)  # the flags were rewritten around the ORM
    client, user = _client(study, "by-suspicion")
    fresh = study.items.filter(gold=False)
    expected = list(fresh.order_by("-suspicion", "order_key").values_list("pk", flat=True)[:4])
    served = []
    for _ in range(4):
        cache.clear()
        with django_assert_max_num_queries(NEXT_MAX):
            body = client.post(f"/api/studies/{study.pk}/next/").json()
        a = Assignment.objects.get(pk=body["assignment"])
        served.append(a.item_id)
        with django_assert_max_num_queries(SUBMIT_MAX):
            client.post(f"/api/assignments/{a.pk}/judgements/", ANSWER, content_type="application/json")
    assert served == expected
