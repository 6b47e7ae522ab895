"""The explicit SQL of "next item"'s study row and of a submit's locked row
(annotation/assignment/hot_rows.py) against the ORM rules they restate (permissions.member_study,
membership and writable_rows, queue.lease_state and submit_rows, the read model's
assignment_counts), on generated studies: members and not, revoked roles, inactive accounts,
assignments in every status with expired, live and missing leases, gold or not, revisions
(current, late), client tokens and drafts."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import F
from django.http import Http404
from django.test import override_settings
from django.utils import timezone
from rest_framework.exceptions import PermissionDenied

from annotation.assignment.hot_rows import (
    EXTRA,
    SUBMIT_EXTRA,
    TURN1_COLUMNS,
    assignment_row,
    study_for_next,
    study_row,
    submit_row,
)
from annotation.assignment.queue import candidate_items, candidate_query, lease_state, next_assignment, submit_rows
from annotation.models import Assignment, Draft, Judgement, RubricVersion, Study, StudyItem
from annotation.permissions import member_study_rows, writable_rows
from annotation.roles import ANNOTATOR
from retrieval.models import Dataset, Query, Turn
from tests.conftest import make_annotator

pytestmark = pytest.mark.django_db

STATUSES = [s for s, _ in Assignment.Status.choices]


def _world(seed: int):
    rng = random.Random(seed)
    now = timezone.now()
    ds = Dataset.objects.create(name=f"rows-{seed}", format="demo")
    users = [make_annotator(f"u{seed}-{i}") for i in range(6)]
    users[4].groups.remove(Group.objects.get(name=ANNOTATOR))  # a member whose role was revoked
    users[5].is_active = False  # a member whose account was deactivated
    users[5].save()
    studies = []
    for s in range(3):
        study = Study.objects.create(name=f"rows-{seed}-{s}", rubric=RubricVersion.builtin("validity"), overlap=3)
        study.annotators.set([u for u in users if rng.random() < 0.7])
        items = [
            StudyItem.objects.create(
                study=study,
                order_key=k,
                gold=rng.random() < 0.3,
                query=Query.objects.create(dataset=ds, external_id=f"q{s}-{k}", split="val", ordinal=k),
            )
            for k in range(8)
        ]
        for user in users:
            for position, item in enumerate(rng.sample(items, rng.randint(0, 6)), 1):
                lease = rng.choice([None, now - timedelta(minutes=1), now + timedelta(minutes=5), now])
                Assignment.objects.create(
                    study=study,
                    item=item,
                    annotator=user,
                    status=rng.choice(STATUSES),
                    position=position * 3,
                    lease_expires=lease,
                )
        studies.append(study)
    return studies, users, now


def _orm_row(user, study_id, now):
    rows = list(member_study_rows(user, study_id, lease_state(user, now)))
    return rows[0] if rows else None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_raw_study_row_equals_the_orm_rule(seed):
    studies, users, now = _world(seed)
    checked = 0
    for study in studies:
        for user in users:
            orm, raw = _orm_row(user, study.pk, now), study_row(user, study.pk, now)
            for name in EXTRA:
                want = getattr(orm, name)
                assert getattr(raw, name) == (bool(want) if name in ("is_annotator", "has_expired") else want), (
                    name,
                    seed,
                    study.pk,
                    user.username,
                )
            assert raw.mine_user == user.pk
            for field in Study._meta.concrete_fields:
                assert getattr(raw, field.attname) == getattr(orm, field.attname), field.name
            for field in RubricVersion._meta.concrete_fields:
                assert getattr(raw.rubric, field.attname) == getattr(orm.rubric, field.attname), field.name
            checked += 1
    assert checked == 18
    assert study_row(users[0], max(s.pk for s in studies) + 1, now) is None


def test_study_for_next_refuses_as_member_study_does():
    studies, users, now = _world(7)
    study = studies[0]
    study.annotators.set(users)
    assert study_for_next(users[0], study.pk, now).is_annotator
    for refused in (users[4], users[5]):  # role revoked, account deactivated
        with pytest.raises(Http404):
            study_for_next(refused, study.pk, now)
    study.annotators.remove(users[0])
    with pytest.raises(Http404):
        study_for_next(users[0], study.pk, now)
    with pytest.raises(Http404):
        study_for_next(users[1], max(s.pk for s in studies) + 1, now)


def _submit_world(seed: int):
    """:func:`_world` with revisions (one current, some late), client tokens and drafts."""
    rng = random.Random(seed)
    studies, users, now = _world(seed)
    for a in Assignment.objects.filter(study__in=studies).select_related("study"):
        for revision in range(1, rng.randint(0, 3) + 1):
            Judgement.objects.create(
                assignment=a,
                rubric_id=a.study.rubric_id,
                revision=revision,
                is_current=False,
                late=rng.random() < 0.3,
                client_token=rng.choice(["", f"tok{a.pk}-{revision}"]),
            )
        last = a.revisions.order_by("-revision").first()
        if last is not None and rng.random() < 0.8:
            Judgement.objects.filter(pk=last.pk).update(is_current=True)
        if rng.random() < 0.3:
            Draft.objects.create(assignment=a, payload={"category": "VALIDATED"})
    return studies, users


@pytest.mark.parametrize("seed", [4, 5])
def test_the_raw_submit_row_equals_the_orm_rule(seed):
    studies, users = _submit_world(seed)
    assignments = list(Assignment.objects.filter(study__in=studies))
    checked = 0
    for a in assignments:
        tokens = ["", f"tok{a.pk}-1", f"tok{a.pk}-2", "absent"]
        for user in users:
            for token in tokens:
                rows = list(writable_rows(user, a.pk, submit_rows(token)))
                orm, raw = (rows[0] if rows else None), assignment_row(user, a.pk, token, lock=False)
                assert (orm is None) == (raw is None)
                if orm is None:
                    continue
                for name in SUBMIT_EXTRA:
                    want = getattr(orm, name)
                    assert getattr(raw, name) == (bool(want) if name in ("is_member", "has_draft") else want), name
                for obj, other in (
                    (raw, orm),
                    (raw.study, orm.study),
                    (raw.study.rubric, orm.study.rubric),
                    (raw.item, orm.item),
                    (raw.item.query, orm.item.query),
                    (raw.annotator, orm.annotator),
                ):
                    for field in type(obj)._meta.concrete_fields:
                        assert getattr(obj, field.attname) == getattr(other, field.attname), field.name
                checked += 1
    assert checked >= len(assignments) * len(tokens)


def test_submit_row_refuses_as_writable_assignment_does():
    studies, users, now = _world(8)
    study = studies[0]
    study.annotators.set(users)
    query = Query.objects.create(
        dataset=Dataset.objects.get(name="rows-8"), external_id="fresh", split="val", ordinal=99
    )
    item = StudyItem.objects.create(study=study, order_key=99, query=query)
    mine = {u: Assignment.objects.create(study=study, item=item, annotator=u, lease_expires=now) for u in users}
    assert submit_row(users[0], mine[users[0]].pk).pk == mine[users[0]].pk
    with pytest.raises(Http404):  # someone else's
        submit_row(users[0], mine[users[1]].pk)
    for refused in (users[4], users[5]):  # role revoked, account deactivated
        with pytest.raises(PermissionDenied):
            submit_row(refused, mine[refused].pk)
    Study.objects.filter(pk=study.pk).update(status=Study.Status.CLOSED)
    with pytest.raises(PermissionDenied):
        submit_row(users[0], mine[users[0]].pk)


def test_an_id_no_key_column_holds_is_no_row_not_a_server_error():
    """A URL may carry an id of any length: one outside the 64-bit range is simply not found
    (SQLite's driver would refuse the parameter with an OverflowError, a 500)."""
    user = make_annotator("huge-id")
    for huge in (2**63, -(2**63) - 1, 10**4000):
        assert study_row(user, huge) is None and assignment_row(user, huge) is None
        with pytest.raises(Http404):
            study_for_next(user, huge)
        with pytest.raises(Http404):
            submit_row(user, huge)


# --------------------------------------------------------------------------- next item's candidates

CANDIDATE_COLUMNS = ("pk", "taken", "completed", "extra_slots", "agreement", "order_key", "suspicion", "open_left")


def _candidates(items) -> list[tuple]:
    return [
        tuple(getattr(i, c) for c in CANDIDATE_COLUMNS)
        + (i.earlier_id, i.query.external_id, i.query.n_turns, i.query.dataset.name)
        + tuple(getattr(i, f"turn1_{c}") for c in TURN1_COLUMNS)
        for i in items
    ]


def _serving_world(seed: int, users, **settings) -> Study:
    rng = random.Random(seed)
    ds = Dataset.objects.create(name=f"cand-{seed}", format="demo")
    settings = {"overlap": 2, "candidates": 5, **settings}
    study = Study.objects.create(name=f"cand-{seed}", rubric=RubricVersion.builtin("validity"), **settings)
    study.annotators.set(users)
    for k in range(16):
        q = Query.objects.create(dataset=ds, external_id=f"q{k}", split="val", ordinal=k, n_turns=1 + (k % 5 == 0))
        if k % 3:
            Turn.objects.create(query=q, index=1, texts=[{"text": f"make it {k}"}], provenance="human")
        StudyItem.objects.create(
            study=study,
            query=q,
            order_key=rng.random(),
            agreement=k < 2,
            gold=k % 4 == 3,
            suspicion=rng.random(),
            extra_slots=rng.choice([0, 0, 1]),
            candidates_source=rng.choice(["", "audit"]),
        )
    return study


def _orm_and_raw(study_id: int, user, now, limit: int):
    study = Study.objects.get(pk=study_id)
    with transaction.atomic():
        raw = _candidates(candidate_items(study, user.pk, now, limit))
        orm = _candidates(candidate_query(study, user.pk, now, limit))
    return raw, orm


@pytest.mark.parametrize("seed", [1, 2])
def test_the_raw_candidate_rows_equal_the_orm_rule(seed):
    users = [make_annotator(f"cand{seed}-{i}") for i in range(4)]
    study = _serving_world(seed, users)
    rng = random.Random(seed)
    checked, changes = (
        0,
        [
            {"overlap": 3},
            {"serve_order": "suspicion"},
            {"estimate": {"stopped": True}},
            {"adaptive_max": 4},
        ],
    )
    for step in range(40):
        user = rng.choice(users)
        now = timezone.now() + timedelta(minutes=rng.choice([0, 3, 30]))
        for gate in (True, False):
            with override_settings(CIRVAL_SERVE_AFTER_PANEL=gate):
                raw, orm = _orm_and_raw(study.pk, user, now, rng.choice([1, 3, 8, 60]))
                assert raw == orm, (step, gate)
                checked += len(orm)
        if step % 3 < 2:  # serve an item (an assignment, a lease, a taken slot), mostly finished: the rows change
            with override_settings(CIRVAL_SERVE_AFTER_PANEL=False):
                served = next_assignment(Study.objects.get(pk=study.pk), user).assignment
            if served is not None and rng.random() < 0.7:
                Assignment.objects.filter(pk=served.pk).update(status=Assignment.Status.DONE)
                StudyItem.objects.filter(pk=served.item_id).update(completed=F("completed") + 1)
        if step % 10 == 9:
            Study.objects.filter(pk=study.pk).update(**changes[step // 10])
    assert checked > 100
