"""20 annotators drain a study with overlap 3 at the same time (PostgreSQL row locks)."""
from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection, connections

from annotation.assignment import queue as engine
from annotation.models import Assignment, Judgement, StudyItem
from annotation.studies.building import StudySpec, create_study
from tests.conftest import FIXTURES, make_annotator

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_twenty_annotators_drain_a_study_with_overlap_three():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL's select_for_update(skip_locked=True): set DATABASE_URL=postgres://... (CI does)")
    call_command("import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"),
                 verbosity=0)
    User = get_user_model()
    annotators = [make_annotator(f"racer{i:02d}", password="x") for i in range(20)]
    study, _ = create_study(StudySpec(name="race", datasets=["circo"], overlap=3, total=60, seed=11,
                                      annotators=[u.username for u in annotators]))
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
                engine.submit(served.assignment, {"category": "VALIDATED", "time_spent_ms": 1})
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
    per_item = Counter(Judgement.objects.filter(assignment__study=study, is_current=True).values_list("assignment__item_id", flat=True))
    items = list(StudyItem.objects.filter(study=study).values_list("id", "completed", "taken"))
    assert len(items) == 60
    assert all(per_item[i] == 3 and c == 3 and t == 3 for i, c, t in items), (per_item, items)
    pairs = Counter(Assignment.objects.filter(study=study, status="done").values_list("item_id", "annotator_id"))
    assert max(pairs.values()) == 1  # nobody judged an item twice
    assert len({a for _, a in pairs}) > 1  # the work really was shared
