"""make_demo as the README runs it: world, audit, studies, accounts; deterministic."""
from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from annotation.assignment import queue as engine
from annotation.models import Study
from annotation.judging.payloads import item_payload
from retrieval.models import Dataset, QuerySubset
from retrieval.stats import dataset_stats

pytestmark = pytest.mark.django_db


def test_make_demo_builds_audits_and_opens_studies(tmp_path, settings):
    settings.IMAGE_ROOTS = [tmp_path.resolve()]
    out = StringIO()
    call_command("make_demo", "--images-dir", str(tmp_path / "demo"), stdout=out)
    text = out.getvalue()
    for line in ("admin", "annotator1", "annotator2", "annotator3", "researcher", "password"):
        assert line in text
    s = dataset_stats(Dataset.objects.get(name="demo"))
    assert s["images"] >= 400 and s["single_turn"] >= 150 and s["multi_turn"] >= 40 and s["missing_images"] == 0
    assert set(s["turns_histogram"]) >= {"1", "2", "3", "4", "5"}
    assert len(list((tmp_path / "demo").rglob("*.png"))) == s["images"]

    # the audit labelled every single-turn query; the validity study is the shortcut-free part
    free = QuerySubset.objects.get(dataset__name="demo", name="shortcut_free").queries.count()
    study = Study.objects.get(name="demo-validity")
    assert study.items.count() == free > 0
    assert set(study.items.values_list("hidden_category", flat=True)) <= {"composition_required", "unresolved"}
    assert Study.objects.get(name="demo-sessions").items.count() == s["multi_turn"]

    # annotators get the fixed-size candidate panel, never the label nor the serving rule
    user = get_user_model().objects.get(username="annotator1")
    payload = item_payload(engine.next_assignment(study, user).assignment)
    assert len(payload["panel"]) == study.candidates == 20
    body = json.dumps(payload)
    assert "served_by" not in body and "staff" not in payload
    assert "composition_required" not in body and "unresolved" not in body

    # the session filmstrip shows the target's rank after each turn only when the study is not blind
    sessions = Study.objects.get(name="demo-sessions")
    served = engine.next_assignment(sessions, user).assignment
    assert sessions.blind and all(t["rank"] is None for t in item_payload(served)["query"]["turns"])
    sessions.blind = False
    sessions.save()
    turns = item_payload(served)["query"]["turns"]
    assert len(turns) >= 2 and any(t["rank"] for t in turns)
    assert all(t["rank"] is None or t["rank"] >= 1 for t in turns)

    # running it again changes nothing
    before = dataset_stats(Dataset.objects.get(name="demo"))
    call_command("make_demo", "--images-dir", str(tmp_path / "demo"), stdout=StringIO())
    assert dataset_stats(Dataset.objects.get(name="demo")) == before
    assert Study.objects.filter(name__startswith="demo-").count() == 2
