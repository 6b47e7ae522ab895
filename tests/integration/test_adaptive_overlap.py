"""Issue 25, item 3: adaptive overlap through the API (run it over PostgreSQL with
DATABASE_URL). Three annotators drive a study of two annotators per item, a third only where
the two disagree: the third annotator is served exactly the disagreeing items; the counts,
the annotator's "N of M", consensus and the export follow the rule; judgements saved are counted."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from annotation.export.validated import export_study
from annotation.models import Judgement, StudyItem
from annotation.verdicts.state import study_counts
from tests.conftest import FIXTURES
from tests.integration.test_query_counts import NEXT_MAX, SUBMIT_MAX

pytestmark = pytest.mark.django_db

VALID = {"category": "VALIDATED", "time_spent_ms": 4000}
INVALID = {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified", "time_spent_ms": 4000}
ITEMS = 8
#: what an adaptive study's submit adds to SUBMIT_MAX: the item locked and read, its counted
#: votes, its adjudication, and the update of its extra slots (annotation.verdicts.state.reopen_slots)
ADAPTIVE_SUBMIT_EXTRA = 4


def _user(name, group):
    user = get_user_model().objects.create_user(name, password="pw", is_staff=group == "admin")
    user.groups.add(Group.objects.get_or_create(name=group)[0])
    api = APIClient()
    api.force_authenticate(user)
    return user, api


@pytest.fixture
def study():
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    _, admin = _user("boss", "admin")
    for n in (1, 2, 3):
        _user(f"ann{n}", "annotator")
    r = admin.post(
        "/api/studies/",
        {
            "name": "adaptive",
            "datasets": ["circo"],
            "overlap": 2,
            "adaptive_max": 3,
            "total": ITEMS,
            "seed": 4,
            "candidates": 0,
            "annotators": ["ann1", "ann2", "ann3"],
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["overlap"], body["adaptive_max"], body["quorum"]) == (2, 3, 2)
    return StudyItem.objects.get(pk=StudyItem.objects.filter(study_id=body["id"]).first().pk).study, admin


def _api(name):
    api = APIClient()
    api.force_authenticate(get_user_model().objects.get(username=name))
    return api


def answer(name, item):
    """ann1 says valid to everything; ann2 disagrees on every third item; ann3 says invalid."""
    if name == "ann1":
        return VALID
    if name == "ann2":
        return INVALID if item.order_key % 3 == 0 else VALID
    return INVALID


def work(study, name, limit=100):
    """Judge through the API until nothing is served; the items judged, in order."""
    api, judged = _api(name), []
    for _ in range(limit):
        with CaptureQueriesContext(connection) as next_q:
            body = api.post(f"/api/studies/{study.pk}/next/").json()
        assert len(next_q) <= NEXT_MAX, [q["sql"] for q in next_q]
        if body["assignment"] is None:
            assert body["served_by"] == "queue_empty" and body["progress"]["remaining"] == 0
            return judged
        item = StudyItem.objects.get(assignments__pk=body["assignment"])
        with CaptureQueriesContext(connection) as submit_q:
            r = api.post(f"/api/assignments/{body['assignment']}/judgements/", answer(name, item), format="json")
        assert r.status_code == 201, r.content
        assert len(submit_q) <= SUBMIT_MAX + ADAPTIVE_SUBMIT_EXTRA, [q["sql"] for q in submit_q]
        judged.append(item)
    raise AssertionError("the queue never ended")


def test_the_third_annotator_gets_only_the_disagreements(study, tmp_path):
    study, admin = study
    first, second = work(study, "ann1"), work(study, "ann2")
    assert len(first) == len(second) == ITEMS
    split = {i.pk for i in first if i.order_key % 3 == 0}
    assert 0 < len(split) < ITEMS
    assert dict(StudyItem.objects.filter(study=study).values_list("pk", "extra_slots")) == {
        pk: (1 if pk in split else 0) for pk in (i.pk for i in first)
    }

    # before the third annotator: the split items are pending, the others decided, 1 judgement saved on each
    counts = study_counts(study)
    assert counts["states"]["pending"] == len(split) and counts["states"]["decided"] == ITEMS - len(split)
    assert counts["labour"] == {**counts["labour"], "adaptive": True, "spent": 2 * ITEMS, "saved": ITEMS - len(split)}
    progress = _api("ann3").get(f"/api/studies/{study.pk}/progress/").json()
    assert (progress["done"], progress["remaining"], progress["total"]) == (0, len(split), len(split))

    third = work(study, "ann3")
    assert {i.pk for i in third} == split  # only the disagreements, each once
    assert len(third) == len(split)
    # nobody is served anything more
    for name in ("ann1", "ann2", "ann3"):
        assert _api(name).post(f"/api/studies/{study.pk}/next/").json()["assignment"] is None

    counts = study_counts(study)
    assert (
        counts["judgements"]
        == 2 * ITEMS + len(split)
        == Judgement.objects.filter(assignment__study=study, is_current=True).count()
    )
    assert counts["states"]["decided"] == ITEMS and counts["pending"] == 0 and counts["complete"] == ITEMS
    assert counts["labour"]["saved"] == ITEMS - len(split)
    # ann3 said invalid: the split items are rejected by a 2-1 majority, the rest validated unanimously
    assert counts["status"]["rejected"] == len(split) and counts["status"]["validated"] == ITEMS - len(split)
    assert counts["provenance"]["majority"] == len(split) and counts["provenance"]["unanimous"] == ITEMS - len(split)
    staff = admin.get(f"/api/studies/{study.pk}/progress/").json()
    assert json.dumps(staff)  # the staff progress reads the same counts

    result = export_study(study, tmp_path / "out")
    manifest = result.manifest
    assert manifest["counts"]["validated"] == ITEMS - len(split) and manifest["counts"]["rejected"] == len(split)
    assert manifest["counts"]["pending"] == 0
    trace = [json.loads(line) for f in (tmp_path / "out").rglob("*.trace.jsonl") for line in f.read_text().splitlines()]
    assert {t["item"] for t in trace} == {i.pk for i in first} - split
    assert all(t["consensus"]["n_votes"] == 2 and t["consensus"]["quorum"] == 2 for t in trace)
    assert "adaptive overlap" in manifest["consensus"]["quorum_rule"]
    assert (manifest["study"]["overlap"], manifest["study"]["adaptive_max"]) == (2, 3)
    assert manifest["study"]["adaptive_confidence"] is None  # majority: no confidence settles a split


def test_a_revision_that_agrees_closes_the_third_slot(study):
    study, _ = study
    api1, api2 = _api("ann1"), _api("ann2")
    a1 = api1.post(f"/api/studies/{study.pk}/next/").json()
    item = StudyItem.objects.get(assignments__pk=a1["assignment"])
    api1.post(f"/api/assignments/{a1['assignment']}/judgements/", VALID, format="json")
    a2 = api2.post(f"/api/studies/{study.pk}/next/").json()
    assert StudyItem.objects.get(assignments__pk=a2["assignment"]) == item  # closest to its overlap first
    r = api2.post(f"/api/assignments/{a2['assignment']}/judgements/", INVALID, format="json")
    item.refresh_from_db()
    assert item.extra_slots == 1
    revision = api2.post(
        f"/api/assignments/{a2['assignment']}/judgements/",
        {**VALID, "base_revision": r.json()["revision"]},
        format="json",
    )
    assert revision.status_code == 201, revision.content
    item.refresh_from_db()
    assert item.extra_slots == 0


def test_staff_page_shows_labour_and_reliability_and_the_reliability_export(study, tmp_path):
    from django.test import Client

    from annotation.verdicts.readmodel import study_reliability

    study, _ = study
    for name in ("ann1", "ann2", "ann3"):
        work(study, name)
    staff = Client()
    staff.force_login(get_user_model().objects.get(username="boss"))
    html = staff.get(f"/studies/{study.pk}/progress/").content.decode()
    counts = study_counts(study)
    assert f'<dd id="count-spent">{counts["judgements"]}</dd>' in html
    assert f'<dd id="count-saved">{counts["labour"]["saved"]}</dd>' in html and counts["labour"]["saved"] > 0
    reliability = study_reliability(study)
    assert reliability.answers == counts["judgements"] and reliability.items == ITEMS
    for r in reliability.annotators:
        assert f'data-annotator="{r.annotator}"' in html and 0 <= r.low <= r.accuracy <= r.high <= 1
        assert f"[{r.low:.2f}, {r.high:.2f}]" in html
    # annotators see none of it
    ann = Client()
    ann.force_login(get_user_model().objects.get(username="ann1"))
    assert ann.get(f"/studies/{study.pk}/progress/").status_code in (302, 403, 404)

    result = export_study(study, tmp_path / "rel", policy="reliability")
    block = result.manifest["consensus"]["reliability"]
    assert set(block["annotators"]) == {"annotator_01", "annotator_02", "annotator_03"}  # pseudonymised
    assert block["differs_from_majority"] == len(block["differing_items"]) == len(reliability.differs)
    majority = export_study(study, tmp_path / "maj").manifest
    assert majority["consensus"]["reliability"] is None
    shift = result.manifest["counts"]["validated"] - majority["counts"]["validated"]
    assert shift == sum(
        1 if d["reliability"] == "validated" else -1 if d["majority"] == "validated" else 0
        for d in block["differing_items"]
    )


def test_the_studys_consensus_option_drives_its_counts(study, tmp_path):
    from annotation.models import Study

    study, _ = study
    for name in ("ann1", "ann2", "ann3"):
        work(study, name)
    majority = study_counts(study)
    Study.objects.filter(pk=study.pk).update(consensus="reliability")
    study.refresh_from_db()
    weighted = study_counts(study)  # a setting change makes a new study version: not the cached counts
    exported = export_study(study, tmp_path / "rel", policy="reliability").manifest["counts"]
    assert weighted["status"]["validated"] == exported["validated"]
    assert weighted["status"]["rejected"] == exported["rejected"]
    differs = (
        exported["validated"] - export_study(study, tmp_path / "maj", policy="majority").manifest["counts"]["validated"]
    )
    assert weighted["status"]["validated"] - majority["status"]["validated"] == differs
    assert (
        weighted["provenance"]["reliability"] + weighted["provenance"]["majority"] == majority["provenance"]["majority"]
    )


def test_the_late_rule_counts_the_opened_slot(study):
    """A third annotator whose lease ran out still holds the slot the split opened while nobody
    took it (not late); once someone else took it, their submit is late."""
    from datetime import timedelta

    from django.utils import timezone

    from annotation.assignment import queue as engine
    from annotation.models import Assignment

    study, _ = study
    users = {n: get_user_model().objects.get(username=n) for n in ("ann1", "ann2", "ann3")}
    first = engine.next_assignment(study, users["ann1"]).assignment
    engine.submit(first, VALID)
    second = engine.next_assignment(study, users["ann2"]).assignment
    assert second.item_id == first.item_id
    engine.submit(second, INVALID)
    third = engine.next_assignment(study, users["ann3"]).assignment
    assert third.item_id == first.item_id  # the split item comes first (closest to its slots)
    Assignment.objects.filter(pk=third.pk).update(lease_expires=timezone.now() - timedelta(seconds=1))
    engine.release_expired(study)
    judgement = engine.submit(Assignment.objects.get(pk=third.pk), INVALID)
    assert not judgement.late  # the opened slot was still free: counted
    assert study_counts(study)["status"]["rejected"] == 1


def test_changing_the_maximum_in_the_settings_recomputes_the_opened_slots(study):
    from django.forms.models import model_to_dict
    from django.test import Client
    from django.urls import reverse

    from annotation.room.forms import StudySettingsForm

    study, _ = study
    api1, api2 = _api("ann1"), _api("ann2")
    a1 = api1.post(f"/api/studies/{study.pk}/next/").json()
    api1.post(f"/api/assignments/{a1['assignment']}/judgements/", VALID, format="json")
    a2 = api2.post(f"/api/studies/{study.pk}/next/").json()
    api2.post(f"/api/assignments/{a2['assignment']}/judgements/", INVALID, format="json")
    item = StudyItem.objects.get(assignments__pk=a1["assignment"])
    item.refresh_from_db()
    assert item.extra_slots == 1
    staff = Client()
    staff.force_login(get_user_model().objects.get(username="boss"))
    url = reverse("room:study_settings", kwargs={"study_id": study.pk})
    fields = {
        k: ("" if v is None else v) for k, v in model_to_dict(study, fields=StudySettingsForm.Meta.fields).items()
    }
    r = staff.post(url, {**fields, "adaptive_max": ""})
    assert r.status_code == 302 and r.url.endswith(f"/{study.pk}/"), r.url  # a fixed overlap of 2
    item.refresh_from_db()
    study.refresh_from_db()
    assert item.extra_slots == 0 and not study.quorum_rule.adaptive
    assert study_counts(study)["status"]["adjudication"] == 1  # a 1-1 split under a fixed overlap of 2: a tie
    refused = staff.post(url, {**fields, "adaptive_max": "2"})
    assert refused.status_code == 200 and b"More than the overlap" in refused.content
    assert staff.post(url, {**fields, "adaptive_max": "3"}).status_code == 302
    item.refresh_from_db()
    study.refresh_from_db()
    assert item.extra_slots == 1 and study_counts(study)["pending"] == 1, (study.adaptive_max, study_counts(study))
