"""schemathesis against /api/schema/ as an annotator and as staff: no 500s anywhere.

The run is budgeted by time: rounds over every operation until ``CIRVAL_FUZZ_SECONDS``
(default 60, CI's quick form) have passed, at least one round. Set it higher for a long
hunt, e.g. ``CIRVAL_FUZZ_SECONDS=1800``."""

from __future__ import annotations

import json
import os
import time

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core.management import call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token

from annotation.assignment import queue as engine
from annotation.models import Study
from annotation.studies.building import StudySpec, create_study
from config.wsgi import application
from tests.conftest import FIXTURES, make_annotator

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def annotator_token(db):
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    user = make_annotator("fuzzer")
    other = make_annotator("other")
    create_study(StudySpec(name="fuzz", datasets=["circo"], overlap=2, total=20, annotators=["fuzzer", "other"]))
    study = Study.objects.get(name="fuzz")
    engine.next_assignment(study, user)  # an assignment of their own to poke at
    engine.next_assignment(study, other)
    return Token.objects.create(user=user).key


@pytest.fixture
def staff_token(db):
    boss = get_user_model().objects.create_user("boss", password="pw", is_staff=True)
    return Token.objects.create(user=boss).key


def test_no_server_errors_for_an_annotator_or_staff(client, annotator_token, staff_token):
    assert client.get("/api/schema/", HTTP_AUTHORIZATION=f"Token {annotator_token}").status_code == 403
    raw = client.get("/api/schema/", HTTP_AUTHORIZATION=f"Token {staff_token}", HTTP_ACCEPT="application/json")
    assert raw.status_code == 200
    schema = schemathesis.openapi.from_dict(json.loads(raw.content))
    schema.app = application
    operations = [op.ok() for op in schema.get_all_operations()]
    assert len(operations) >= 8
    failures: list[str] = []
    statuses: list[int] = []
    budget = float(os.environ.get("CIRVAL_FUZZ_SECONDS", "60"))

    def fuzzer(operation, headers):
        @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(data=st.data())
        def fuzz(data):
            case = data.draw(operation.as_strategy())
            if "pk" in (case.path_parameters or {}) and data.draw(st.booleans()):
                case.path_parameters["pk"] = data.draw(st.integers(min_value=1, max_value=5))  # real ids too
            response = case.call(app=application, headers=headers)
            statuses.append(response.status_code)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:200]}")

        return fuzz

    started, rounds = time.monotonic(), 0
    while rounds == 0 or time.monotonic() - started < budget:
        for token in (annotator_token, staff_token):
            for operation in operations:
                fuzzer(operation, {"Authorization": f"Token {token}"})()
        rounds += 1
    print(f"schemathesis: {rounds} rounds, {len(statuses)} requests, {len(failures)} server errors")
    assert not failures, "\n".join(failures[:10])
    # the fuzzer really got through authentication, and also met refusals
    assert len(statuses) >= 100
    assert sum(200 <= c < 300 for c in statuses) >= 20 and any(400 <= c < 500 for c in statuses)
