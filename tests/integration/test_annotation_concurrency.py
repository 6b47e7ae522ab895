"""20 annotators drain a study with overlap 3 at the same time (PostgreSQL row locks)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.core.management import call_command
from django.db import connection, connections

from annotation.assignment import queue as engine
from annotation.models import Assignment, Judgement, StudyItem
from annotation.sizes import fresh_sizes, stored_sizes
from annotation.studies.building import StudySpec, create_study
from tests.conftest import FIXTURES, make_annotator

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def race(study, annotators, answer) -> None:
    """Every annotator in a thread of their own, started together, takes and submits items
    (``answer(assignment, user)`` gives the payload) until the study has none left for them."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(annotators))

    def work(user):
        try:
            start.wait()
            while True:
                served = engine.next_assignment(study, user)
                if served.assignment is None:
                    if served.rule == "all_slots_reserved":
                        continue  # others hold the last slots; they will submit
                    break
                engine.submit(served.assignment, answer(served.assignment, user))
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=work, args=(u,)) for u in annotators]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors


def test_twenty_annotators_drain_a_study_with_overlap_three():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL's select_for_update(skip_locked=True): set DATABASE_URL=postgres://... (CI does)")
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    annotators = [make_annotator(f"racer{i:02d}", password="x") for i in range(20)]
    study, _ = create_study(
        StudySpec(
            name="race", datasets=["circo"], overlap=3, total=60, seed=11, annotators=[u.username for u in annotators]
        )
    )
    race(study, annotators, lambda assignment, user: {"category": "VALIDATED", "time_spent_ms": 1})
    per_item = Counter(
        Judgement.objects.filter(assignment__study=study, is_current=True).values_list("assignment__item_id", flat=True)
    )
    items = list(StudyItem.objects.filter(study=study).values_list("id", "completed", "taken"))
    assert len(items) == 60
    assert all(per_item[i] == 3 and c == 3 and t == 3 for i, c, t in items), (per_item, items)
    pairs = Counter(Assignment.objects.filter(study=study, status="done").values_list("item_id", "annotator_id"))
    assert max(pairs.values()) == 1  # nobody judged an item twice
    assert len({a for _, a in pairs}) > 1  # the work really was shared


def test_twelve_annotators_drain_an_adaptive_study_and_no_split_is_left_pending():
    """Adaptive overlap 2 -> 3 under racing submits: the item row is locked before its votes
    are read (annotation.verdicts.state.reopen_slots), so two racing second votes that
    disagree always open the third slot, and two that agree never do."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL's row locks: set DATABASE_URL=postgres://... (CI does)")
    from annotation.verdicts.state import study_counts

    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    annotators = [make_annotator(f"adapt{i:02d}", password="x") for i in range(12)]
    study, _ = create_study(
        StudySpec(
            name="race-adaptive",
            datasets=["circo"],
            overlap=2,
            adaptive_max=3,
            total=40,
            seed=5,
            annotators=[u.username for u in annotators],
        )
    )

    def answer(assignment, user):
        valid = (assignment.item_id * 7 + user.pk * 3) % 5 > 1  # about half the pairs split
        return (
            {"category": "VALIDATED", "time_spent_ms": 1}
            if valid
            else {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified", "time_spent_ms": 1}
        )

    race(study, annotators, answer)
    votes: dict[int, list[bool]] = {}
    for item, validated in Judgement.objects.filter(assignment__study=study, is_current=True).values_list(
        "assignment__item_id", "validated"
    ):
        votes.setdefault(item, []).append(validated)
    extra = dict(StudyItem.objects.filter(study=study).values_list("id", "extra_slots"))
    assert len(votes) == 40
    for item, got in votes.items():
        split = len(set(got)) == 2
        assert (len(got), extra[item]) == ((3, 1) if split else (2, 0)), (item, got, extra[item])
    counts = study_counts(study)
    assert counts["pending"] == 0 and counts["states"]["decided"] == 40
    assert 0 < sum(extra.values()) < 40 and counts["judgements"] == 80 + sum(extra.values())
    # the study's total of extra slots, kept by racing submits (F() updates), equals a fresh count
    assert stored_sizes(study.pk) == fresh_sizes(study.pk) and stored_sizes(study.pk)["n_extra_slots"] == sum(
        extra.values()
    )
