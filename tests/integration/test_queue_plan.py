"""The "next item" query reads a few rows of a large study, from its first request
(PostgreSQL: create_study refreshes the planner's statistics, see retrieval/dbstats.py).

The danger it guards against: statistics gathered before a new study existed (autovacuum
re-analyzes a table only once a tenth of it has changed) make the planner expect a handful
of the new study's rows, so it reads, joins and sorts all of them on every request."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from annotation.assignment import queue as engine
from annotation.studies.building import StudySpec, create_study
from retrieval.models import Dataset, Image, Query, Target, Turn
from tests.conftest import make_annotator

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

N_ITEMS = 3000


def _scanned_rows(plan: dict) -> list[tuple[str, int]]:
    """(node type, actual rows) of every scan of annotation_studyitem in a JSON plan."""
    found = []
    if plan.get("Relation Name") == "annotation_studyitem":
        found.append((plan["Node Type"], plan["Actual Rows"]))
    for child in plan.get("Plans", []):
        found += _scanned_rows(child)
    return found


def test_next_item_reads_a_few_rows_of_a_fresh_large_study():
    if connection.vendor != "postgresql":
        pytest.skip("planner statistics are PostgreSQL's: set DATABASE_URL=postgres://... (CI does)")
    ds = Dataset.objects.create(name="big", format="circo")
    img = Image.objects.create(dataset=ds, external_id="1", path="1.jpg", sha256="0" * 64)
    target = Image.objects.create(dataset=ds, external_id="2", path="2.jpg", sha256="1" * 64)
    queries = Query.objects.bulk_create(
        Query(dataset=ds, external_id=str(n), split="val", ordinal=n) for n in range(N_ITEMS)
    )
    Turn.objects.bulk_create(Turn(query=q, index=1, reference_image=img, texts=[{"text": "red"}]) for q in queries)
    Target.objects.bulk_create(Target(query=q, image=target, is_primary=True) for q in queries)
    user = make_annotator("planner")
    create_study(StudySpec(name="old", datasets=["big"], overlap=1, total=50, annotators=["planner"], candidates=0))
    with connection.cursor() as cursor:  # statistics from before the big study, as autovacuum left them
        cursor.execute("ANALYZE annotation_studyitem")
    study, _ = create_study(StudySpec(name="big", datasets=["big"], overlap=3, annotators=["planner"], candidates=0))

    with CaptureQueriesContext(connection) as ctx:
        served = engine.next_assignment(study, user)
    assert served.assignment is not None
    # the candidate rows (annotation.assignment.hot_rows.candidate_rows: studyitem aliased i)
    sql = next(q["sql"] for q in ctx.captured_queries if "FOR UPDATE OF i SKIP LOCKED" in q["sql"])
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        raw = cursor.fetchone()[0]
    plan = (raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"]
    scans = _scanned_rows(plan)
    assert scans, plan
    assert all(rows <= 50 for _, rows in scans), f"the queue read {scans} rows of {N_ITEMS}: {json.dumps(plan)[:2000]}"
