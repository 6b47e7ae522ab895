"""Writes after access ends, reservations by POST only, two tabs, late submits, progress at
the end of a share (issues 14 and 15)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from annotation.assignment import queue as engine
from annotation.models import Assignment, Draft, Judgement, Study, StudyItem
from annotation.studies.building import StudySpec, create_study
from annotation.verdicts.state import annotator_share
from tests.conftest import FIXTURES, make_annotator

pytestmark = pytest.mark.django_db

ANSWER = {"category": "VALIDATED", "time_spent_ms": 5}


@pytest.fixture
def world(db):
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    a, b = make_annotator("a"), make_annotator("b")
    study, _ = create_study(StudySpec(name="w", datasets=["circo"], overlap=1, total=3, annotators=["a", "b"]))
    asg = engine.next_assignment(study, a).assignment
    return {"a": a, "b": b, "study": study, "asg": asg}


def api(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def writes(client, asg) -> list[int]:
    return [
        client.post(f"/api/assignments/{asg.pk}/judgements/", ANSWER, format="json").status_code,
        client.put(f"/api/assignments/{asg.pk}/draft/", {"note": "x"}, format="json").status_code,
        client.post(f"/api/assignments/{asg.pk}/lease/").status_code,
        client.post(f"/api/assignments/{asg.pk}/skip/").status_code,
    ]


def nothing_written(asg, status=Assignment.Status.RESERVED) -> bool:
    """No judgement, no draft, and the assignment as the test left it (a removal from the study
    releases it: annotation/assignment/membership.py)."""
    asg.refresh_from_db()
    return not Judgement.objects.exists() and not Draft.objects.exists() and asg.status == status


def test_a_removed_annotator_can_no_longer_write(world):
    world["study"].annotators.remove(world["a"])
    client = api(world["a"])
    assert writes(client, world["asg"]) == [403] * 4
    assert (
        "no longer an annotator"
        in client.post(f"/api/assignments/{world['asg'].pk}/judgements/", ANSWER, format="json").json()["detail"]
    )
    assert nothing_written(world["asg"], Assignment.Status.RELEASED)


def test_a_closed_study_takes_no_writes(world):
    Study.objects.filter(pk=world["study"].pk).update(status=Study.Status.CLOSED)
    client = api(world["a"])
    assert writes(client, world["asg"]) == [403] * 4
    assert nothing_written(world["asg"])
    # and no new reservation, by the API or the page
    assert client.post(f"/api/studies/{world['study'].pk}/next/").json()["assignment"] is None
    Study.objects.filter(pk=world["study"].pk).update(status=Study.Status.OPEN)
    assert writes(client, world["asg"])[0] == 201  # reopened: writes again


def test_a_paused_study_takes_answers_to_held_items_but_serves_nothing_new(world, client):
    study, asg = world["study"], world["asg"]
    Study.objects.filter(pk=study.pk).update(status=Study.Status.PAUSED)
    a = api(world["a"])
    # the item a holds: draft, heartbeat and submit all go through, and count
    assert (
        a.put(f"/api/assignments/{asg.pk}/draft/", {"note": "typing", "edited_at": 5}, format="json").status_code == 200
    )
    assert a.post(f"/api/assignments/{asg.pk}/lease/").json()["held"] is True
    done = a.post(f"/api/assignments/{asg.pk}/judgements/", ANSWER, format="json")
    assert done.status_code == 201 and done.json()["late"] is False
    assert StudyItem.objects.get(pk=asg.item_id).completed == 1 and not Draft.objects.exists()
    # a revision of it too
    again = a.post(f"/api/assignments/{asg.pk}/judgements/", {**ANSWER, "note": "on second thought"}, format="json")
    assert again.status_code == 201 and again.json()["revision"] == 2
    # no new item, by the API or the page
    assert a.post(f"/api/studies/{study.pk}/next/").json() == {
        "assignment": None,
        "served_by": "study_closed",
        "progress": annotator_share(study, world["a"]),
    }
    client.force_login(world["a"])
    resp = client.post(f"/annotate/{study.pk}/", follow=True)
    assert b"This study is paused" in resp.content and Assignment.objects.filter(annotator=world["a"]).count() == 1


def test_a_paused_study_refuses_an_item_no_longer_held(world):
    study, asg = world["study"], world["asg"]
    engine.skip(asg)
    Study.objects.filter(pk=study.pk).update(status=Study.Status.PAUSED)
    refused = api(world["a"]).post(f"/api/assignments/{asg.pk}/judgements/", ANSWER, format="json")
    assert refused.status_code == 403 and "only the items you hold" in refused.json()["detail"]
    assert not Judgement.objects.exists()


def test_get_never_reserves_post_does(world, client):
    b = world["b"]
    client.force_login(b)
    page = client.get(f"/annotate/{world['study'].pk}/")
    assert page.status_code == 200 and b'id="next-item-form"' in page.content and b'method="post"' in page.content
    assert not Assignment.objects.filter(annotator=b).exists()
    resp = client.post(f"/annotate/{world['study'].pk}/")
    held = Assignment.objects.get(annotator=b)
    assert resp.status_code == 302 and f"/item/{held.pk}/" in resp["Location"]
    expires = held.lease_expires
    again = client.get(f"/annotate/{world['study'].pk}/")  # resumes the held item, renews nothing
    assert again.status_code == 302 and f"/item/{held.pk}/" in again["Location"]
    held.refresh_from_db()
    assert held.lease_expires == expires and Assignment.objects.filter(annotator=b).count() == 1


def test_second_tab_same_token_different_answer_is_a_conflict_not_a_duplicate(world):
    client, asg = api(world["a"]), world["asg"]
    url = f"/api/assignments/{asg.pk}/judgements/"
    first = client.post(url, {**ANSWER, "client_token": "tab-1", "base_revision": 0}, format="json")
    assert first.status_code == 201
    same = client.post(url, {**ANSWER, "client_token": "tab-1", "base_revision": 0}, format="json")
    assert same.status_code == 200 and same.json()["duplicate"] is True  # a real retry
    other = {"category": "INVALID_TEXT_QUERY", "sub_reason": "other", "note": "mine", "time_spent_ms": 9}
    reused = client.post(url, {**other, "client_token": "tab-1", "base_revision": 0}, format="json")
    assert reused.status_code == 409 and reused.json()["conflict"] == "token_reused"
    assert reused.json()["stored"]["category"] == "VALIDATED" and reused.json()["yours"]["note"] == "mine"
    assert Judgement.objects.count() == 1


def test_second_tab_stale_base_revision_gets_409_with_both_versions_then_may_overwrite(world):
    client, asg = api(world["a"]), world["asg"]
    url = f"/api/assignments/{asg.pk}/judgements/"
    assert client.post(url, {**ANSWER, "client_token": "tab-1", "base_revision": 0}, format="json").status_code == 201
    other = {"category": "INVALID_TEXT_QUERY", "sub_reason": "other", "note": "tab two", "time_spent_ms": 9}
    stale = client.post(url, {**other, "client_token": "tab-2", "base_revision": 0}, format="json")
    assert stale.status_code == 409
    body = stale.json()
    assert body["conflict"] == "stale" and body["stored"]["revision"] == 1 and body["yours"]["note"] == "tab two"
    assert Judgement.objects.count() == 1
    chosen = client.post(url, {**other, "client_token": "tab-2b", "base_revision": 1}, format="json")
    assert chosen.status_code == 201 and chosen.json()["revision"] == 2
    current = Judgement.objects.get(is_current=True)
    assert current.note == "tab two" and Judgement.objects.count() == 2


def expire(asg) -> None:
    Assignment.objects.filter(pk=asg.pk).update(lease_expires=timezone.now() - timedelta(seconds=1))


def test_late_submit_after_the_item_went_to_someone_else_is_kept_marked_late_and_counted_once(world):
    study, asg = world["study"], world["asg"]
    expire(asg)
    taken_by_b = engine.next_assignment(study, world["b"]).assignment  # releases a's lease, may serve the item
    while taken_by_b.item_id != asg.item_id:  # b judges until a's item comes round
        engine.submit(taken_by_b, ANSWER)
        taken_by_b = engine.next_assignment(study, world["b"]).assignment
    lease = api(world["a"]).post(f"/api/assignments/{asg.pk}/lease/").json()
    assert lease["held"] is False and lease["late"] is True
    late = api(world["a"]).post(f"/api/assignments/{asg.pk}/judgements/", ANSWER, format="json")
    assert late.status_code == 201 and late.json()["late"] is True
    engine.submit(taken_by_b, ANSWER)
    item = StudyItem.objects.get(pk=asg.item_id)
    assert item.completed == 1 and item.taken == 1  # overlap 1: one judgement counts
    assert Judgement.objects.filter(assignment__item=item).count() == 2  # both stored
    assert Judgement.objects.counted().filter(assignment__item=item).count() == 1


def test_a_submit_after_expiry_whose_slot_is_still_free_counts_normally(world):
    study, asg = world["study"], world["asg"]
    expire(asg)
    engine.release_expired(study)
    resp = api(world["a"]).post(f"/api/assignments/{asg.pk}/judgements/", ANSWER, format="json")
    assert resp.status_code == 201 and resp.json()["late"] is False
    assert StudyItem.objects.get(pk=asg.item_id).completed == 1


def test_heartbeat_renews_a_held_lease(world):
    asg = world["asg"]
    Assignment.objects.filter(pk=asg.pk).update(lease_expires=timezone.now() + timedelta(seconds=30))
    body = api(world["a"]).post(f"/api/assignments/{asg.pk}/lease/").json()
    asg.refresh_from_db()
    assert body["held"] is True and asg.lease_expires > timezone.now() + timedelta(minutes=9)
    assert 590 <= body["lease_seconds"] <= 600


def test_progress_at_the_end_of_a_share(world):
    """overlap 1, 3 items, 2 annotators: a's share is 2. Serving a third item must read
    '2 of 3', and once nothing is left the count is exactly what was done (no flag needed:
    nothing is open to them any more)."""
    study, a = world["study"], world["a"]
    asg = world["asg"]
    for _ in range(2):
        engine.submit(asg, ANSWER)
        asg = engine.next_assignment(study, a).assignment
    progress = annotator_share(study, a)
    assert progress["done"] == 2 and progress["reserved"] == 1 and progress["total"] == 3
    engine.submit(asg, ANSWER)
    assert engine.next_assignment(study, a).rule == "queue_empty"
    done = annotator_share(study, a)
    assert done["done"] == done["total"] == 3 and done["remaining"] == 0


def test_queue_done_page_counts_what_was_done(world, client):
    """'All done… 1 of 2 judged' was the bug: the page says N of N."""
    study, b = world["study"], world["b"]
    asg = world["asg"]
    engine.submit(asg, ANSWER)
    while (served := engine.next_assignment(study, world["a"])).assignment is not None:
        engine.submit(served.assignment, ANSWER)
    client.force_login(b)
    resp = client.post(f"/annotate/{study.pk}/", follow=True)
    assert b"All done" in resp.content and b"0 of 0 judged" in resp.content


def _shown_image(client, asg) -> int:
    payload = client.get(f"/api/assignments/{asg.pk}/").json()
    return payload["query"]["turns"][0]["reference"]["id"]


@pytest.mark.parametrize("how", ["role revoked", "removed from the study", "account deactivated"])
def test_access_ends_with_the_role_or_the_membership_reads_and_image_grants_included(world, how):
    """Issue 29: revoking the annotator role stopped neither next nor submit, a removed
    annotator could still read their old assignment, and image grants lasted 24 h."""
    from django.contrib.auth.models import Group

    client = api(world["a"])
    study, asg = world["study"], world["asg"]
    image = _shown_image(client, asg)  # the served item grants its images
    assert client.get(f"/images/{image}/", {"size": 160}).status_code == 200
    if how == "role revoked":
        world["a"].groups.remove(Group.objects.get(name="annotator"))
    elif how == "removed from the study":
        study.annotators.remove(world["a"])
    else:
        type(world["a"]).objects.filter(pk=world["a"].pk).update(is_active=False)
    client = api(type(world["a"]).objects.get(pk=world["a"].pk))  # a fresh request: the role is read again
    if how == "account deactivated":
        client = APIClient()  # a deactivated account's session is refused by Django itself
        client.force_authenticate(type(world["a"]).objects.get(pk=world["a"].pk))
    assert client.post(f"/api/studies/{study.pk}/next/").status_code in (403, 404)
    assert writes(client, asg)[:2] in ([403, 403], [404, 404])
    assert client.get(f"/api/assignments/{asg.pk}/").status_code == 404
    assert client.get(f"/api/assignments/{asg.pk}/judgements/").status_code == 404
    assert asg.pk not in [row["id"] for row in client.get("/api/assignments/").json()]
    # the grant ended with it (a deactivated account is not even signed in on the image view: login)
    assert client.get(f"/images/{image}/", {"size": 160}).status_code == (302 if how == "account deactivated" else 404)
    assert nothing_written(
        asg, Assignment.Status.RELEASED if how == "removed from the study" else Assignment.Status.RESERVED
    )
