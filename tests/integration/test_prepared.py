"""config/prepared.py: a queryset compiled once gives, for new values, exactly the rows the
queryset itself gives (model instances, select_related rows, annotations), in the same
number of queries; a shape whose values the ORM inlines is never cached; and the tests'
check mode catches a build that reads anything but its arguments."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q, Value
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import config.prepared
from config.prepared import Prepared

pytestmark = pytest.mark.django_db


def users_with_groups(flag: bool, name: str, joined_before, limit: int):
    from django.contrib.auth.models import Group

    groups = Group.objects.filter(user=OuterRef("pk"), name=name)
    return (get_user_model().objects.filter(date_joined__lt=joined_before, is_active=flag)
            .annotate(in_group=Exists(groups), n_groups=Count("groups", filter=~Q(groups__name=name)), tag=Value(name))
            .order_by("username")[:limit])


@pytest.fixture
def people():
    from django.contrib.auth.models import Group

    User = get_user_model()
    g = Group.objects.create(name="g1")
    made = [User.objects.create(username=f"u{n}", is_active=n != 3) for n in range(6)]
    made[1].groups.add(g)
    made[2].groups.add(Group.objects.create(name="g2"))
    return made


def as_rows(users):
    return [(u.pk, u.username, u.is_active, u.in_group, u.n_groups, u.tag) for u in users]


def test_prepared_rows_equal_the_querysets_for_new_values(people):
    prepared = Prepared(users_with_groups)
    later = timezone.now() + timedelta(days=1)
    for flag, name, limit in [(True, "g1", 10), (True, "g2", 10), (False, "g1", 10), (True, "g1", 2), (True, "nobody", 10)]:
        with CaptureQueriesContext(connection) as direct:
            want = as_rows(users_with_groups(flag, name, later, limit))
        with CaptureQueriesContext(connection) as ran:
            got = as_rows(prepared((flag,), name=name, joined_before=later, limit=limit))
        assert got == want
        assert len(ran.captured_queries) == len(direct.captured_queries) == 1
    assert as_rows(prepared((True,), name="g1", joined_before=people[0].date_joined, limit=10)) == []
    # limit is sliced into the SQL (LIMIT 10, LIMIT 2): never cached, still right
    assert all(entry is False for key, entry in prepared._cache.items() if "limit" in dict(key[1]))


def test_ids_out_of_an_integer_columns_range_find_nothing(people):
    """As the queryset does (Django answers them with no rows without running SQL); a cached
    statement would overflow SQLite's integers (a 500 the API fuzz test found)."""
    def build(pk):
        return get_user_model().objects.filter(pk=pk)

    prepared = Prepared(build)
    assert [u.username for u in prepared(pk=people[1].pk)] == ["u1"]
    for pk in (500398791049434038272, -2**70, 2**63, 2**31):
        assert prepared(pk=pk) == list(build(pk)) == []
    assert [u.username for u in prepared(pk=people[2].pk)] == ["u2"]


def test_shape_in_the_key_and_values_as_parameters(people):
    def build(flag, name, joined_before):
        return users_with_groups(flag, name, joined_before, 10)

    prepared = Prepared(build)
    later = timezone.now() + timedelta(days=1)
    assert [u.username for u in prepared((True,), name="g1", joined_before=later)] == ["u0", "u1", "u2", "u4", "u5"]
    assert [u.username for u in prepared((False,), name="g1", joined_before=later)] == ["u3"]
    assert [u.in_group for u in prepared((True,), name="g2", joined_before=later)] == [False, False, True, False, False]
    assert len(prepared._cache) == 2 and all(prepared._cache.values())  # cached: one per shape


def test_check_mode_catches_a_build_that_reads_outside_state(people):
    outside = {"name": "g1"}

    def build(joined_before):  # wrong: reads ``outside``, which is not an argument
        return users_with_groups(True, outside["name"], joined_before, 10)

    prepared = Prepared(build)
    later = timezone.now() + timedelta(days=1)
    prepared(joined_before=later)
    outside["name"] = "g2"
    assert config.prepared.CHECK  # tests/conftest.py turns it on
    with pytest.raises(AssertionError, match="stale"):
        prepared(joined_before=later)
