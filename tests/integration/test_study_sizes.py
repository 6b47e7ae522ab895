"""Issue 30, item 3: a study's sizes live on its row (``Study.n_items``, ``n_agreement``,
``n_extra_slots``, ``n_annotators``; annotation/sizes.py) and stay equal to a fresh
count of its rows after every kind of change: items added, an adaptive third slot opened and
closed, annotators added and removed (either side, a deleted account), items deleted, the
quorum rule changed, a plain save of an old copy of the study. The PostgreSQL test races
writers (run it with DATABASE_URL=postgres://...)."""

from __future__ import annotations

import importlib
import threading

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection, connections
from django.forms.models import model_to_dict
from rest_framework.test import APIClient

from annotation.assignment import queue as engine
from annotation.models import Study, StudyItem
from annotation.room.forms import StudySettingsForm
from annotation.sizes import add_items, fresh_sizes, recount, stored_sizes
from annotation.studies.building import StudySpec, add_annotators, create_study
from annotation.verdicts.state import study_sizes
from retrieval.models import Query
from tests.conftest import FIXTURES, make_annotator

VALID = {"category": "VALIDATED", "time_spent_ms": 4000}
INVALID = {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified", "time_spent_ms": 4000}


def assert_kept(study) -> dict:
    """The stored sizes equal a fresh count (and are not all zero, which would prove little)."""
    stored, fresh = stored_sizes(study.pk), fresh_sizes(study.pk)
    assert stored == fresh
    return stored


def _circo():
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )


def _study(name="sizes", total=12, **spec):
    annotators = [make_annotator(f"{name}-a{i}") for i in range(3)]
    study, _ = create_study(
        StudySpec(
            name=name,
            datasets=["circo"],
            total=total,
            seed=3,
            candidates=0,
            annotators=[u.username for u in annotators],
            **spec,
        )
    )
    return study, annotators


@pytest.mark.django_db
def test_the_sizes_follow_every_kind_of_change():
    _circo()
    study, annotators = _study(overlap=2, adaptive_max=3, agreement_size=3)
    assert assert_kept(study) == {"n_items": 12, "n_agreement": 3, "n_extra_slots": 0, "n_annotators": 3}
    assert study_sizes(Study.objects.get(pk=study.pk)) == {"agreement": 3, "other": 9, "annotators": 3, "extra": 0}

    # items added: in bulk, and one through the ORM (the admin's way)
    free = list(Query.objects.exclude(study_items__study=study).order_by("pk")[:3])
    add_items(
        study, [StudyItem(study=study, query=q, order_key=100 + n, agreement=n == 0) for n, q in enumerate(free[:2])]
    )
    assert assert_kept(study)["n_items"] == 14
    single = StudyItem.objects.create(study=study, query=free[2], order_key=200, agreement=True)
    assert assert_kept(study)["n_agreement"] == 5
    single.agreement = False
    single.save()
    assert assert_kept(study)["n_agreement"] == 4

    # an adaptive third slot opened by two disagreeing votes, closed again by a revision that agrees
    first, second = annotators[0], annotators[1]
    a1 = engine.next_assignment(study, first).assignment
    while a1.item.agreement:  # a plain item: agreement items never get extra slots
        engine.submit(a1, VALID)
        a1 = engine.next_assignment(study, first).assignment
    engine.submit(a1, VALID)
    a2 = engine.next_assignment(study, second).assignment
    while a2.item_id != a1.item_id:
        engine.submit(a2, VALID)
        a2 = engine.next_assignment(study, second).assignment
    engine.submit(a2, INVALID)
    assert StudyItem.objects.get(pk=a1.item_id).extra_slots == 1
    assert assert_kept(study)["n_extra_slots"] == 1
    engine.submit(a2, VALID, base_revision=1)
    assert StudyItem.objects.get(pk=a1.item_id).extra_slots == 0
    assert assert_kept(study)["n_extra_slots"] == 0
    engine.submit(a2, INVALID, base_revision=2)
    assert assert_kept(study)["n_extra_slots"] == 1

    # the quorum rule changed in the settings page: the opened slots are counted again
    boss = get_user_model().objects.create_user("boss", password="pw", is_staff=True)
    api = APIClient()
    api.force_login(boss)
    form = {k: "" if v is None else v for k, v in model_to_dict(study, fields=StudySettingsForm._meta.fields).items()}
    form.update(overlap=3, adaptive_max="")
    r = api.post(f"/room/studies/{study.pk}/settings/", form)
    assert r.status_code == 302, r.content
    assert Study.objects.get(pk=study.pk).quorum_rule.adaptive is False
    assert assert_kept(study)["n_extra_slots"] == 0

    # annotators: added and removed from the study's side, the user's side, and the room's page
    extra = make_annotator("sizes-late")
    add_annotators(study, ["sizes-late"])
    assert assert_kept(study)["n_annotators"] == 4
    study.annotators.add(extra)  # already in: nothing changes
    assert assert_kept(study)["n_annotators"] == 4
    study.annotators.remove(extra, annotators[2])
    assert assert_kept(study)["n_annotators"] == 2
    extra.studies.add(study)
    assert assert_kept(study)["n_annotators"] == 3
    extra.studies.clear()
    assert assert_kept(study)["n_annotators"] == 2
    r = api.post(f"/room/studies/{study.pk}/annotators/", {"username": "sizes-late"})
    assert r.status_code == 302 and assert_kept(study)["n_annotators"] == 3
    r = api.post(f"/room/studies/{study.pk}/annotators/", {"username": "sizes-late", "action": "remove"})
    assert r.status_code == 302 and assert_kept(study)["n_annotators"] == 2
    extra.studies.add(study)
    extra.delete()  # a member's account deleted: the membership rows go with it
    assert assert_kept(study)["n_annotators"] == 2

    # items deleted: one, and a queryset
    single.delete()
    assert assert_kept(study)["n_items"] == 14
    StudyItem.objects.filter(study=study, agreement=True)[:1].get().delete()
    StudyItem.objects.filter(
        pk__in=StudyItem.objects.filter(study=study, assignments=None).values_list("pk", flat=True)[:2]
    ).delete()
    assert assert_kept(study)["n_items"] == 11


@pytest.mark.django_db
def test_a_plain_save_of_an_old_copy_keeps_the_sizes():
    """A settings form saves the copy it loaded; the sizes counted since must stand."""
    _circo()
    study, _ = _study(total=4)
    old = Study.objects.get(pk=study.pk)
    add_items(
        study,
        [StudyItem(study=study, query=q, order_key=50) for q in Query.objects.exclude(study_items__study=study)[:2]],
    )
    old.guidelines = "be careful"
    old.save()
    assert Study.objects.get(pk=study.pk).guidelines == "be careful"
    assert assert_kept(study)["n_items"] == 6


@pytest.mark.django_db
def test_a_plain_save_of_an_old_copy_keeps_the_workers_reliability_fit():
    """The refit worker writes the stored fit and clears its flag by targeted UPDATEs; a
    settings form saving the copy it loaded before must not put the old ones back."""
    _circo()
    study, _ = _study(total=4)
    old = Study.objects.get(pk=study.pk)
    Study.objects.filter(pk=study.pk).update(reliability_fit={"n": 7}, refit_requested_at=None)
    old.reliability_fit, old.refit_requested_at = {"n": 1}, old.created_at  # what the old copy held
    old.guidelines = "be careful"
    old.save()
    fresh = Study.objects.get(pk=study.pk)
    assert fresh.guidelines == "be careful"
    assert (fresh.reliability_fit, fresh.refit_requested_at) == ({"n": 7}, None)


@pytest.mark.django_db
def test_recount_repairs_what_was_written_around_the_orm_and_the_migration_backfills():
    _circo()
    study, _ = _study(total=5, agreement_size=2)
    StudyItem.objects.filter(study=study).update(agreement=True)  # around the ORM's signals
    Study.objects.filter(pk=study.pk).update(n_items=0, n_annotators=99)
    call_command("recount_study_sizes", "--study", str(study.pk), stdout=(out := _Out()))
    assert f"study {study.pk}: n_items 0 -> 5, n_agreement 2 -> 5, n_annotators 99 -> 3" in out.text
    assert assert_kept(study) == {"n_items": 5, "n_agreement": 5, "n_extra_slots": 0, "n_annotators": 3}
    assert recount(study) == stored_sizes(study.pk) and study.n_agreement == 5

    Study.objects.update(n_items=0, n_agreement=0, n_annotators=0)
    importlib.import_module("annotation.migrations.0023_study_sizes").backfill(apps, None)
    assert_kept(study)


class _Out:
    def __init__(self):
        self.text = ""

    def write(self, s, *args, **kwargs):
        self.text += s

    def flush(self):
        pass


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_racing_writers_lose_no_change_on_postgresql():
    """Items added, annotators added and removed, and adaptive slots opened, all at once from
    several connections: every increment lands (F() updates; recounts under the study's lock)."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL's row locks: set DATABASE_URL=postgres://... (CI does)")
    _circo()
    study, annotators = _study(name="sizes-race", total=40, overlap=2, adaptive_max=3)
    free = list(Query.objects.exclude(study_items__study=study).order_by("pk")[:60])
    newcomers = [make_annotator(f"sizes-new{i}") for i in range(6)]
    errors: list[BaseException] = []
    start = threading.Barrier(12)

    def run(fn):
        def wrapped():
            try:
                start.wait()
                fn()
            except BaseException as exc:  # surfaced below
                errors.append(exc)
            finally:
                connections.close_all()

        return threading.Thread(target=wrapped)

    def adder(chunk):
        return lambda: [
            add_items(study, [StudyItem(study=study, query=q, order_key=1000 + q.pk, agreement=q.pk % 2 == 0)])
            for q in chunk
        ]

    def member(user, leave):
        def go():
            Study.objects.get(pk=study.pk).annotators.add(user)
            if leave:
                user.studies.remove(study)

        return go

    def judge(user, answer):
        def go():
            while (served := engine.next_assignment(study, user)).assignment is not None:
                engine.submit(served.assignment, answer)

        return go

    threads = [run(adder(free[i::3])) for i in range(3)]
    threads += [run(member(u, leave=i % 2 == 0)) for i, u in enumerate(newcomers)]
    threads += [run(judge(annotators[0], VALID)), run(judge(annotators[1], INVALID)), run(judge(annotators[2], VALID))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    sizes = assert_kept(study)
    assert sizes["n_items"] == 100 and sizes["n_annotators"] == 6 and sizes["n_extra_slots"] > 0, sizes
