"""Issue 25, items 3 and 4 together: adaptive overlap under reliability-weighted consensus. A
study of two annotators per item, a third (up to 3) only where the split of the first two is
uncertain under the annotators' reliability (Dawid-Skene on the study's judgements so far,
``Study.adaptive_confidence``). Two annotators of about equal reliability (wrong on one item
in twelve) and one who answers regardless of the item have judged a history of 36 items;
then a split between a reliable annotator and the unreliable one is decided by the weights
without a third, while a split between the two reliable ones is served to a third annotator.
The serving, the counts (judgements saved) and the export follow the same rule, and the same
votes under majority consensus reopen the first split.

Serving reads the study's stored fit, refitted in a worker after submits
(annotation/verdicts/refit.py): here Celery runs eagerly and each submit's commit callbacks run,
so the refit follows every submit as a worker's would."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db.models import F

from annotation.assignment import queue as engine
from annotation.core.consensus import DEFAULT_CONFIDENCE
from annotation.export.validated import export_study
from annotation.models import Study, StudyItem
from annotation.studies.building import StudySpec, create_study
from annotation.verdicts.readmodel import quorum_rule_of, study_reliability, votes_of
from annotation.verdicts.refit import run_refit
from annotation.verdicts.state import refresh_slots, study_counts
from tests.conftest import FIXTURES, make_annotator
from tests.integration.test_report_export import PAYLOADS, judge

pytestmark = pytest.mark.django_db
HISTORY = 36


def history_answer(name: str, n: int) -> str:
    valid = n % 4 != 0
    if name == "ann1":
        return "V" if valid != (n % 12 == 1) else "TEXT"  # wrong on one item in twelve
    if name == "ann2":
        return "V" if valid != (n % 12 == 7) else "TEXT"  # as reliable, wrong on others
    return "V" if n % 3 else "TEXT"  # the same answer whatever the item


@pytest.fixture
def study():
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    users = {n: make_annotator(n) for n in ("ann1", "ann2", "spam", "fourth")}
    study, _ = create_study(
        StudySpec(
            name="weighted-adaptive",
            datasets=["circo"],
            overlap=2,
            adaptive_max=3,
            consensus="reliability",
            total=HISTORY + 2,
            seed=5,
            candidates=0,
            annotators=list(users),
        )
    )
    history = list(StudyItem.objects.filter(study=study).order_by("order_key"))[:HISTORY]
    for n, item in enumerate(history):
        for name in ("ann1", "ann2", "spam"):
            judge(study, item, users[name], history_answer(name, n))
    # judge() stores without serving: the history items' slots are taken as if they had been served
    StudyItem.objects.filter(pk__in=[i.pk for i in history]).update(taken=F("completed"))
    run_refit(study.pk)  # what the worker does after the history's submits (their commits never come here)
    return Study.objects.get(pk=study.pk), users, {i.pk for i in history}


@pytest.fixture
def serve(eager_celery, django_capture_on_commit_callbacks):
    """Serve the user's next item and submit ``code``; the submit's commit callbacks run (the
    refit it asks for, eagerly)."""

    def serve(study, user, code):
        served = engine.next_assignment(study, user).assignment
        assert served is not None, f"nothing served to {user.username}"
        with django_capture_on_commit_callbacks(execute=True):
            engine.submit(served, {**PAYLOADS[code], "time_spent_ms": 4000, "flagged": False, "note": ""})
        return StudyItem.objects.get(pk=served.item_id)

    return serve


def test_a_third_annotator_only_where_the_weighted_split_is_uncertain(study, serve, tmp_path):
    study, users, history = study
    assert study.reliability_fit["judgements"] == 3 * HISTORY and study.refit_requested_at is None
    assert study.adaptive_confidence == DEFAULT_CONFIDENCE and study.quorum_rule.weighted
    first, second = serve(study, users["ann1"], "V"), serve(study, users["ann1"], "V")
    assert {first.pk, second.pk}.isdisjoint(history)
    by_spam = serve(study, users["spam"], "TEXT")  # the reliable one against the unreliable one
    between_equals = serve(study, users["ann2"], "TEXT")  # the reliable one against an equal
    assert {by_spam.pk, between_equals.pk} == {first.pk, second.pk}  # ann2 is not served the settled split

    model = study_reliability(study).model
    rule = quorum_rule_of(study)
    rows = {row.item_id: votes_of(row) for row in _rows(study, {by_spam.pk, between_equals.pk})}
    assert model.posterior(rows[by_spam.pk]) >= DEFAULT_CONFIDENCE > model.posterior(rows[between_equals.pk]) > 0.1
    assert rule.settled(rows[by_spam.pk]) and not rule.settled(rows[between_equals.pk])
    slots = dict(StudyItem.objects.filter(study=study).values_list("pk", "extra_slots"))
    assert slots[by_spam.pk] == 0 and slots[between_equals.pk] == 1

    counts = study_counts(study)
    assert counts["states"]["pending"] == 1 and counts["states"]["decided"] == HISTORY + 1
    assert counts["labour"]["saved"] == 1 and counts["labour"]["spent"] == 3 * HISTORY + 4
    assert "90% sure" in counts["labour"]["rule"]

    third = serve(study, users["fourth"], "V")
    assert third.pk == between_equals.pk  # the uncertain split only
    for name in ("ann1", "ann2", "spam", "fourth"):
        assert engine.next_assignment(study, users[name]).assignment is None
    counts = study_counts(study)
    assert counts["pending"] == 0 and counts["states"]["decided"] == HISTORY + 2 and counts["labour"]["saved"] == 1

    result = export_study(study, tmp_path / "out", policy=study.consensus)
    assert result.manifest["counts"]["validated"] == counts["status"]["validated"]
    trace = {
        t["item"]: t
        for f in (tmp_path / "out").rglob("*.trace.jsonl")
        for t in map(json.loads, f.read_text().splitlines())
    }
    assert trace[by_spam.pk]["consensus"]["n_votes"] == 2 and trace[by_spam.pk]["consensus"]["quorum"] == 2
    assert trace[by_spam.pk]["consensus"]["provenance"] == "reliability"
    assert "90% sure" in result.manifest["consensus"]["quorum_rule"]
    # the command's default policy is the study's own, as the export page preselects
    out = io.StringIO()
    call_command("export_validated", "--study", str(study.pk), "--out", str(tmp_path / "cmd"), stdout=out)
    assert "policy reliability" in out.getvalue()
    cmd_trace = {
        t["item"]: t
        for f in (tmp_path / "cmd").rglob("*.trace.jsonl")
        for t in map(json.loads, f.read_text().splitlines())
    }
    assert cmd_trace[by_spam.pk]["consensus"]["provenance"] == "reliability"

    # the same votes under majority consensus: the lead rule reopens the split the weights decided
    Study.objects.filter(pk=study.pk).update(consensus="majority")
    study.refresh_from_db()
    refresh_slots(study)
    assert StudyItem.objects.get(pk=by_spam.pk).extra_slots == 1
    assert study_counts(study)["labour"]["saved"] == 0


def _rows(study, ids):
    from annotation.verdicts.readmodel import iter_item_batches

    return [row for batch in iter_item_batches(study) for row in batch if row.item_id in ids]
