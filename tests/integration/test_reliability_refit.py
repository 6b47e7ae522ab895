"""Reliability-weighted adaptive overlap keeps a submit O(1): the submit decides its item by the
study's stored Dawid-Skene fit, and the refit on all judgements with every item's slots runs in
a worker, at most one pending per study (annotation/verdicts/refit.py). Here: a submit's queries
do not grow with the study; without a fit a split opens a third slot and the refit task settles
it; a second request while one is pending sends nothing; a broker outage loses no judgement."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import current_app
from django.conf import settings
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from kombu.exceptions import OperationalError

from annotation.assignment import queue as engine
from annotation.models import Judgement, Study, StudyItem
from annotation.studies.building import StudySpec, create_study
from annotation.verdicts import readmodel, state
from annotation.verdicts.refit import REFIT_STALE_SECONDS, REFIT_TASK, request_refit, run_refit, serving_lag
from tests.integration.test_adaptive_reliability import HISTORY, history_answer
from tests.integration.test_adaptive_reliability import study as weighted  # noqa: F401 (a fixture)
from tests.integration.test_report_export import PAYLOADS, judge

pytestmark = pytest.mark.django_db

#: A submit to a reliability-weighted adaptive study, engine and commit callbacks (no session or
#: API view): begin, locked read, insert, quorum, status, locked item row with its votes, slots,
#: commit, and once per refit cycle the refit's flag, the countdown's bounded count.
SUBMIT_MAX = 12


def _answer(code):
    return {**PAYLOADS[code], "time_spent_ms": 4000, "flagged": False, "note": ""}


def _submit_queries(study, user, code, capture, monkeypatch) -> int:
    """The queries of one submit and its commit callbacks (the refit task only sent, not run);
    no Dawid-Skene fit and no walk over the study's items may run in it."""
    served = engine.next_assignment(study, user).assignment
    assert served is not None
    with monkeypatch.context() as m:
        m.setattr(readmodel, "fit_votes", _forbidden)
        for name in ("iter_item_batches", "study_rows", "study_pass"):  # the read model's walks over the items
            m.setattr(readmodel, name, _forbidden)
        m.setattr(state, "iter_rows", _forbidden)
        with CaptureQueriesContext(connection) as queries, capture(execute=True):
            engine.submit(served, _answer(code))
    return len(queries)


def _forbidden(*args, **kwargs):
    raise AssertionError("O(study) work inside a submit")


def _sized(users, name: str, total: int, judged: int) -> Study:
    study, _ = create_study(
        StudySpec(
            name=name,
            datasets=["circo"],
            overlap=2,
            adaptive_max=3,
            consensus="reliability",
            total=total,
            seed=5,
            candidates=0,
            annotators=[u.username for u in users.values()],
        )
    )
    for n, item in enumerate(list(StudyItem.objects.filter(study=study).order_by("order_key"))[:judged]):
        for who in ("ann1", "ann2", "spam"):
            judge(study, item, users[who], history_answer(who, n))
    StudyItem.objects.filter(study=study).update(taken=F("completed"))  # judge() stores without serving
    run_refit(study.pk)
    return Study.objects.get(pk=study.pk)


def test_a_submit_costs_the_same_queries_whatever_the_study_size(
    weighted, django_capture_on_commit_callbacks, monkeypatch
):
    small, users, _ = weighted
    big = _sized(users, "weighted-big", total=200, judged=150)
    assert big.reliability_fit["judgements"] == 450 and small.reliability_fit["judgements"] == 3 * HISTORY
    counts = {}
    for study in (small, big):
        first = _submit_queries(
            study, users["fourth"], "V", django_capture_on_commit_callbacks, monkeypatch
        )  # asks for a refit
        assert Study.objects.get(pk=study.pk).refit_requested_at is not None  # sent to the (test) broker
        second = _submit_queries(
            study, users["fourth"], "TEXT", django_capture_on_commit_callbacks, monkeypatch
        )  # one pending
        counts[study.name] = (first, second)
    print("queries per submit (first: asks for a refit; second: one is pending):", counts)
    assert counts["weighted-big"] == counts["weighted-adaptive"]
    assert max(counts["weighted-big"]) <= SUBMIT_MAX


def test_the_refit_task_sets_the_slots_the_stored_fit_did_not(weighted, eager_celery):
    study, users, history = weighted
    Study.objects.filter(pk=study.pk).update(reliability_fit={})  # no fit yet: the lead rule alone
    study.refresh_from_db()
    item = StudyItem.objects.filter(study=study).exclude(pk__in=history).order_by("order_key").first()
    judge(study, item, users["ann1"], "V")
    judge(study, item, users["spam"], "TEXT")  # commit callbacks do not run here: no refit yet
    item.refresh_from_db()
    assert item.extra_slots == 1  # conservative: a split opens a third without a fit
    assert request_refit(study)  # what the submit's commit does; eager: the worker's refit runs now
    item.refresh_from_db()
    study.refresh_from_db()
    assert item.extra_slots == 0  # the reliable annotator against the unreliable one: settled by the fit
    assert study.reliability_fit["judgements"] == 3 * HISTORY + 2 and study.refit_requested_at is None


def test_one_refit_pending_per_study(weighted, monkeypatch):
    study, _, _ = weighted
    sent = []
    monkeypatch.setattr(current_app.tasks[REFIT_TASK], "apply_async", lambda args, **kw: sent.append(args))
    assert request_refit(Study.objects.get(pk=study.pk))
    assert not request_refit(Study.objects.get(pk=study.pk))  # pending: nothing sent again
    assert len(sent) == 1 and sent[0][0] == study.pk  # (study, the flag it is sent for)
    run_refit(study.pk)  # the worker: done, the flag cleared
    assert request_refit(Study.objects.get(pk=study.pk)) and len(sent) == 2


def test_a_broker_outage_during_a_submit_keeps_the_judgement(weighted, monkeypatch, django_capture_on_commit_callbacks):
    study, users, _ = weighted

    def down(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(current_app.tasks[REFIT_TASK], "apply_async", down)
    served = engine.next_assignment(study, users["fourth"]).assignment
    with django_capture_on_commit_callbacks(execute=True):
        judgement = engine.submit(served, _answer("V"))
    assert Judgement.objects.filter(pk=judgement.pk, is_current=True).exists()
    held = Study.objects.get(pk=study.pk).refit_requested_at
    # not a long lock: stale (free for a later submit) after RELIABILITY_REFIT_SECONDS, not REFIT_STALE_SECONDS
    assert held is not None and held <= timezone.now() - timedelta(
        seconds=REFIT_STALE_SECONDS - settings.RELIABILITY_REFIT_SECONDS
    )
    Study.objects.filter(pk=study.pk).update(
        refit_requested_at=held - timedelta(seconds=settings.RELIABILITY_REFIT_SECONDS)
    )
    monkeypatch.setattr(current_app.tasks[REFIT_TASK], "apply_async", lambda args, **kw: None)  # the broker is back
    assert request_refit(Study.objects.get(pk=study.pk))  # that period over: the next submit's request is sent


def test_the_staff_page_says_how_far_serving_is_behind_the_exact_fit(weighted, eager_celery, admin_client):
    study, users, history = weighted
    Study.objects.filter(pk=study.pk).update(reliability_fit={})  # no fit yet: a split opens a third slot
    study.refresh_from_db()
    item = StudyItem.objects.filter(study=study).exclude(pk__in=history).order_by("order_key").first()
    judge(study, item, users["ann1"], "V")
    judge(study, item, users["spam"], "TEXT")
    lag = serving_lag(Study.objects.get(pk=study.pk))
    # the exact fit settles the reliable annotator against the unreliable one; serving still has a third open
    assert (lag["stored"], lag["to_close"], lag["to_open"]) == (False, 1, 0)
    page = admin_client.get(f"/studies/{study.pk}/progress/").content.decode()
    assert (
        "No fit is stored yet: serving opens a further annotator on every split" in page
        and 'id="serving-behind">1</b> item:' in page
    )
    assert "1 still open to a further annotator although this fit settles the split" in page
    assert request_refit(study)  # eager: the worker's refit stores the fit and sets the slots
    lag = serving_lag(Study.objects.get(pk=study.pk))
    assert (lag["stored"], lag["judgements"], lag["newer"], lag["to_close"], lag["to_open"]) == (
        True,
        3 * HISTORY + 2,
        0,
        0,
        0,
    )
    page = admin_client.get(f"/studies/{study.pk}/progress/").content.decode()
    assert f"on {3 * HISTORY + 2} judgements" in page and "Serving is in step with this fit." in page


def test_a_delayed_refit_is_brought_forward_once_the_fit_is_far_behind(weighted, monkeypatch, settings):
    study, users, history = weighted
    settings.RELIABILITY_REFIT_JUDGEMENTS = 3
    sent = []
    monkeypatch.setattr(
        current_app.tasks[REFIT_TASK], "apply_async", lambda args, **kw: sent.append((args, kw.get("countdown")))
    )
    items = list(StudyItem.objects.filter(study=study).exclude(pk__in=history).order_by("order_key"))
    judge(study, items[0], users["ann1"], "V")  # the fit was stored just now: a refit when it is 30 s old
    assert request_refit(Study.objects.get(pk=study.pk)) and 0 < sent[-1][1] <= settings.RELIABILITY_REFIT_SECONDS
    due = Study.objects.get(pk=study.pk).refit_requested_at
    assert due > timezone.now() and sent[-1][0] == (study.pk, due.isoformat())  # the flag: when it is due
    judge(study, items[0], users["ann2"], "V")
    assert not request_refit(Study.objects.get(pk=study.pk)) and len(sent) == 1  # 2 behind: it waits
    judge(study, items[1], users["ann1"], "TEXT")
    assert request_refit(Study.objects.get(pk=study.pk)) and sent[-1][1] is None  # 3 behind: now
    now_due = Study.objects.get(pk=study.pk).refit_requested_at
    assert now_due <= timezone.now()
    assert not request_refit(Study.objects.get(pk=study.pk)) and len(sent) == 2  # one due now is pending
    run_refit(*sent[0][0])  # the delayed task, if it ran first, leaves the flag of the one brought forward
    assert Study.objects.get(pk=study.pk).refit_requested_at == now_due
    run_refit(*sent[1][0])  # the immediate task clears its own
    assert Study.objects.get(pk=study.pk).refit_requested_at is None
    assert Study.objects.get(pk=study.pk).reliability_fit["judgements"] == 3 * HISTORY + 3


def test_a_refit_leaves_the_flag_of_one_asked_for_later(weighted):
    study, _, _ = weighted
    mine, later = timezone.now(), timezone.now() + timedelta(seconds=20)
    Study.objects.filter(pk=study.pk).update(refit_requested_at=later)  # a delayed refit asked for since
    run_refit(study.pk, mine.isoformat())  # an earlier task ends
    assert Study.objects.get(pk=study.pk).refit_requested_at == later
    run_refit(study.pk)  # a task sent before tasks carried their flag: it clears whatever is there
    assert Study.objects.get(pk=study.pk).refit_requested_at is None


def test_an_annotator_with_nothing_left_waits_while_a_refit_is_pending(weighted, client):
    from rest_framework.test import APIClient

    study, users, history = weighted
    for item in StudyItem.objects.filter(study=study).exclude(pk__in=history):
        judge(study, item, users["ann1"], "V")  # ann1 has judged every item
    api = APIClient()
    api.force_authenticate(users["ann1"])
    Study.objects.filter(pk=study.pk).update(refit_requested_at=timezone.now())  # a submit asked for a refit
    resp = api.post(f"/api/studies/{study.pk}/next/")
    body = resp.json()
    assert body["assignment"] is None and body["served_by"] == "refit_pending"
    assert body["retry_after"] == settings.RELIABILITY_REFIT_SECONDS and resp["Retry-After"] == str(body["retry_after"])
    client.force_login(users["ann1"])
    page = client.post(f"/annotate/{study.pk}/", follow=True).content.decode()
    assert "Nothing for you right now" in page and "All done" not in page and "checkagain.js" in page
    run_refit(study.pk)  # the refit ran (its flag cleared): nothing reopened for ann1, so done
    body = api.post(f"/api/studies/{study.pk}/next/").json()
    assert body["served_by"] == "queue_empty" and "retry_after" not in body
    stale = timezone.now() - timedelta(seconds=REFIT_STALE_SECONDS + 1)
    Study.objects.filter(pk=study.pk).update(refit_requested_at=stale)  # a refit lost with its worker
    assert api.post(f"/api/studies/{study.pk}/next/").json()["served_by"] == "queue_empty"
