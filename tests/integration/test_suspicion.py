"""Issue 25, item 2: the suspicion score on the demo world, against its planted defects.

The demo is made with retrievers trained for TRAINED_STEPS (shared with test_blind_panel:
trained once per session). With the lead-retriever score (docs/benchmarks/suspicion.md)
these 150-step retrievers measured 0.88 at the top 20 % of the queue (14 of 16; 35
planted defects in a queue of 76, recall 0.40; the previous score: 0.625); the floor sits two
hits below, well above the share of defects in the queue (0.46)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from annotation.assignment import queue as engine
from annotation.models import Study
from annotation.studies.suspicion_scores import refresh_suspicion
from audit.models import AuditLabel
from tests.conftest import TRAINED_STEPS

pytestmark = pytest.mark.django_db

#: What the demo's queue measured at the top 20 % (planted defects: 14 of 16), less two hits.
PRECISION_FLOOR = 0.75


@pytest.fixture
def demo(settings, trained_demo_models, demo_images, demo_embeddings):
    settings.DEMO_MODELS_DIR, settings.DEMO_TRAIN_STEPS = trained_demo_models, TRAINED_STEPS
    settings.IMAGE_ROOTS = [demo_images.resolve()]
    settings.EMBEDDING_CACHE_DIR = demo_embeddings
    call_command("make_demo", "--images-dir", str(demo_images), stdout=StringIO())
    return Study.objects.get(name="demo-validity")


def _scores(study):
    return dict(study.items.values_list("pk", "suspicion"))


def test_the_queue_finds_planted_defects_and_never_reads_the_label(demo):
    study = demo
    out = StringIO()
    call_command("demo_check", "--format", "json", stdout=out)
    got = json.loads(out.getvalue())["suspicion"]
    planted, human = got["planted"], got["human"]
    n = study.items.count()
    assert planted["queue"] == n and planted["found"] == -(-n // 5)  # the top 20 %, rounded up
    base = planted["planted"] / n  # a random queue's expected precision
    assert planted["precision"] >= PRECISION_FLOOR and planted["precision"] >= 1.5 * base, got
    assert planted["recall"] == pytest.approx(planted["hits"] / planted["planted"])
    assert human["planted"] > 0 and human["hits"] <= planted["hits"]
    text = StringIO()
    call_command("demo_check", stdout=text)
    assert "suspicion (study demo-validity" in text.getvalue() and f"{planted['precision']:.2f}" in text.getvalue()

    # every item of the study was scored from the audit (ranks, pool, embeddings)
    parts = [i.suspicion_parts for i in study.items.all()]
    assert all(p["scored"] and p["run"] for p in parts)
    assert all(p["parts"]["consistency"] is not None and p["parts"]["gap"] is not None for p in parts)
    assert all(p["parts"]["votes"] is None for p in parts)  # nobody judged yet

    # the score never reads the audit's label: relabel everything, the scores stay
    before = _scores(study)
    AuditLabel.objects.update(label="shortcut_solvable", detail="text_only")
    study.items.update(hidden_category="shortcut_solvable")
    refresh_suspicion(study.pk)
    assert _scores(study) == before


def test_votes_that_disagree_raise_the_score(demo):
    study = demo
    item = study.items.filter(agreement=False).order_by("suspicion").first()
    low = item.suspicion
    users = list(get_user_model().objects.filter(username__in=["annotator1", "annotator2"]).order_by("username"))
    for user, answer in zip(
        users, ({"category": "VALIDATED"}, {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified"})
    ):
        a = study.assignments.create(item=item, annotator=user, position=1)
        engine.submit(a, {**answer, "time_spent_ms": 900})
    refresh_suspicion(study.pk)
    item.refresh_from_db()
    assert item.suspicion_parts["votes"] == 2 and item.suspicion_parts["parts"]["votes"] == 1.0
    assert item.suspicion > low
