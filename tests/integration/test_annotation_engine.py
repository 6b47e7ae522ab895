"""Studies, the assignment engine and judgements over the database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from annotation.assignment import queue as engine
from annotation.core.rubric import JudgementError
from annotation.models import Assignment, Draft, Judgement, Study, StudyItem
from annotation.studies.building import StudyError, StudySpec, create_study
from retrieval.models import Dataset, Query, QuerySubset
from tests.conftest import FIXTURES, make_annotator

pytestmark = pytest.mark.django_db

VALID = {"category": "VALIDATED", "time_spent_ms": 1200}


@pytest.fixture
def circo(db):
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    return Dataset.objects.get(name="circo")


def users(n: int, prefix: str = "ann"):
    return [make_annotator(f"{prefix}{i}", password="x") for i in range(n)]


def make_study(names, overlap=2, **kw) -> Study:
    study, _ = create_study(
        StudySpec(
            name=kw.pop("name", "s"), datasets=["circo"], overlap=overlap, annotators=[u.username for u in names], **kw
        )
    )
    return study


def test_study_pool_sampling_is_reproducible(circo):
    labels = ["composition_required", "unresolved", "shortcut_solvable"]
    for i, name in enumerate(labels):
        subset = QuerySubset.objects.create(dataset=circo, name=name)
        subset.queries.set(
            Query.objects.filter(dataset=circo, ordinal__lt=220).filter(ordinal__gte=i * 70, ordinal__lt=(i + 1) * 70)
        )
    spec = dict(
        datasets=["circo"],
        hidden_categories=["composition_required", "unresolved"],
        quotas={"circo::composition_required": 20, "circo::unresolved": 15},
        seed=5,
    )
    a, ra = create_study(StudySpec(name="a", **spec))
    b, rb = create_study(StudySpec(name="b", **spec))
    ids_a = list(a.items.order_by("order_key").values_list("query_id", "hidden_category"))
    assert ids_a == list(b.items.order_by("order_key").values_list("query_id", "hidden_category"))
    assert len(ids_a) == 35 and {c for _, c in ids_a} == {"composition_required", "unresolved"}
    assert ra["strata"]["circo::composition_required"]["selected"] == 20
    c, _ = create_study(StudySpec(name="c", **{**spec, "seed": 6}))
    assert set(c.items.values_list("query_id", flat=True)) != {q for q, _ in ids_a}


def test_category_filter_needs_an_audit(circo):
    with pytest.raises(StudyError, match="no audit labels"):
        create_study(StudySpec(name="x", datasets=["circo"], hidden_categories=["unresolved"]))


def test_never_the_same_item_twice_and_overlap_respected(circo):
    anns = users(4)
    study = make_study(anns, overlap=2, total=10, seed=1)
    seen: dict[int, set[int]] = {}
    for _ in range(20):
        for u in anns:
            served = engine.next_assignment(study, u)
            if served.assignment is None:
                continue
            assert served.assignment.item_id not in seen.setdefault(u.pk, set())
            seen[u.pk].add(served.assignment.item_id)
            engine.submit(served.assignment, VALID)
    for item in StudyItem.objects.filter(study=study):
        assert Judgement.objects.filter(assignment__item=item, is_current=True).count() == 2
        assert item.completed == item.taken == 2
    assert engine.next_assignment(study, anns[0]).rule == "queue_empty"


def test_closest_to_overlap_first_and_rule_reported(circo):
    a, b = users(2)
    study = make_study([a, b], overlap=2, total=5, seed=2)
    first = engine.next_assignment(study, a)
    assert first.rule == "fresh_item"
    engine.submit(first.assignment, VALID)
    second = engine.next_assignment(study, b)
    # b gets the item a already judged: it is the closest to completing its overlap
    assert second.rule == "closest_to_overlap" and second.assignment.item_id == first.assignment.item_id
    again = engine.next_assignment(study, b)
    assert again.rule == "resume_own_lease" and again.assignment.pk == second.assignment.pk


def test_abandoned_lease_returns_to_the_pool(circo):
    a, b = users(2)
    study = make_study([a, b], overlap=1, total=1, seed=3)
    held = engine.next_assignment(study, a).assignment
    assert engine.next_assignment(study, b).rule == "all_slots_reserved"
    later = timezone.now() + timedelta(minutes=study.lease_minutes + 1)
    served = engine.next_assignment(study, b, now=later)
    assert served.assignment is not None and served.assignment.item_id == held.item_id
    held.refresh_from_db()
    assert held.status == Assignment.Status.RELEASED
    # the late annotator's work is still kept when they submit after all
    engine.submit(held, VALID)
    assert Judgement.objects.filter(assignment=held).count() == 1


def test_skip_comes_back_last(circo):
    (a,) = users(1)
    study = make_study([a], overlap=1, total=2, seed=4)
    first = engine.next_assignment(study, a).assignment
    engine.skip(first)
    second = engine.next_assignment(study, a)
    assert second.assignment.item_id != first.item_id
    engine.submit(second.assignment, VALID)
    back = engine.next_assignment(study, a)
    assert back.rule == "skipped_item" and back.assignment.pk == first.pk


def test_invalid_judgement_names_the_field(circo):
    (a,) = users(1)
    study = make_study([a], overlap=1, total=1)
    asg = engine.next_assignment(study, a).assignment
    cases = [
        ({"time_spent_ms": 5}, "category"),
        ({"category": "NOPE", "time_spent_ms": 5}, "category"),
        ({"category": "QUERY_TOO_BROAD", "sub_reason": "cropped", "time_spent_ms": 5}, "sub_reason"),
        ({"category": "INVALID_TEXT_QUERY", "sub_reason": "other", "note": "  ", "time_spent_ms": 5}, "note"),
    ]
    for payload, field in cases:
        with pytest.raises(JudgementError) as err:
            engine.submit(asg, payload)
        assert err.value.field == field
    assert not Judgement.objects.exists()


def test_same_token_is_stored_once_and_revisions_are_kept(circo):
    (a,) = users(1)
    study = make_study([a], overlap=1, total=1)
    asg = engine.next_assignment(study, a).assignment
    engine.save_draft(asg, {"category": "VALIDATED"})
    j1 = engine.submit(asg, VALID, client_token="tok-1")
    with pytest.raises(engine.DuplicateSubmission) as dup:
        engine.submit(asg, VALID, client_token="tok-1")
    assert dup.value.judgement.pk == j1.pk
    # a second tab revises: the later revision wins, both are in the history
    j2 = engine.submit(asg, {"category": "QUERY_TOO_BROAD", "time_spent_ms": 10}, client_token="tok-2")
    revs = list(
        Judgement.objects.filter(assignment=asg).order_by("revision").values_list("revision", "category", "is_current")
    )
    assert revs == [(1, "VALIDATED", False), (2, "QUERY_TOO_BROAD", True)]
    assert j2.revision == 2 and not Draft.objects.filter(assignment=asg).exists()
    item = StudyItem.objects.get(pk=asg.item_id)
    assert item.completed == 1 and item.taken == 1


def test_create_study_command(circo, capsys):
    anns = users(2)
    call_command(
        "create_study",
        "--name",
        "cli",
        "--dataset",
        "circo",
        "--overlap",
        "2",
        "--total",
        "12",
        "--agreement-size",
        "3",
        "--seed",
        "9",
        *sum((["--annotator", u.username] for u in anns), []),
    )
    study = Study.objects.get(name="cli")
    assert study.items.count() == 12 and study.items.filter(agreement=True).count() == 3
    assert set(study.annotators.values_list("username", flat=True)) == {u.username for u in anns}
