"""Removing an annotator from a study: the items they hold go back to the pool at once, and
their counted judgements, which still count, stay listed on the staff progress (marked removed)
so that the rows add up to the study's totals."""

from __future__ import annotations

import pytest

from annotation.assignment import queue as engine
from annotation.assignment.progress import study_progress
from annotation.models import Assignment, StudyItem
from tests.integration.test_adaptive_reliability import study  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def test_a_removed_annotator_gives_back_their_lease_and_stays_counted(study, admin_client):  # noqa: F811
    study, users, history = study
    held = engine.next_assignment(study, users["fourth"]).assignment
    taken = StudyItem.objects.get(pk=held.item_id).taken
    resp = admin_client.post(
        f"/room/studies/{study.pk}/annotators/", {"action": "remove", "username": ["fourth", "spam"]}
    )
    assert resp.status_code == 302
    held.refresh_from_db()
    assert held.status == Assignment.Status.RELEASED  # not blocked until the lease runs out
    assert StudyItem.objects.get(pk=held.item_id).taken == taken - 1
    progress = study_progress(study)
    rows = {r["annotator"]: r for r in progress["annotators"]}
    assert rows["spam"]["removed"] and rows["spam"]["judged"] == len(history) and rows["spam"]["remaining"] == 0
    assert "fourth" not in rows  # removed with nothing counted: nothing to list
    assert sum(r["judged"] for r in rows.values()) == progress["judgements"]
    page = admin_client.get(f"/studies/{study.pk}/progress/").content.decode()
    assert ">removed</span>" in page


def test_removal_from_the_users_side_and_clear_release_too(study):  # noqa: F811
    study, users, _ = study
    first = engine.next_assignment(study, users["fourth"]).assignment
    users["fourth"].studies.remove(study)  # from the user's side (reverse)
    first.refresh_from_db()
    assert first.status == Assignment.Status.RELEASED
    second = engine.next_assignment(study, users["ann1"]).assignment
    assert second is not None
    study.annotators.clear()
    second.refresh_from_db()
    assert second.status == Assignment.Status.RELEASED
