"""What annotators and researchers see as a query's targets follows the one target rule
(retrieval.targets): for CIRR the hard target only, never the soft targets of target_soft."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from annotation.assignment import queue as engine
from annotation.judging.payloads import item_payload
from annotation.studies.building import StudySpec, create_study
from retrieval import importers
from retrieval.loader import load_parsed
from retrieval.models import Image, Query
from tests.conftest import FIXTURES, make_annotator

pytestmark = pytest.mark.django_db

CIRR = FIXTURES / "datasets" / "cirr"


@pytest.fixture
def cirr(db):
    parsed = importers.parse("cirr", [CIRR / "cap.rc2.val.sample.json", CIRR / "split.rc2.val.sample.json"])
    load_parsed(parsed, "cirr-sample")
    return {str(r["pairid"]): r for r in json.loads((CIRR / "cap.rc2.val.sample.json").read_text())}


def image_pk(external_id: str) -> int:
    return Image.objects.get(dataset__name="cirr-sample", external_id=external_id).pk


def test_the_annotation_item_shows_the_hard_target_only(cirr):
    q = Query.objects.get(dataset__name="cirr-sample", external_id="12130")
    raw = cirr["12130"]
    soft = [k for k, v in raw["target_soft"].items() if v > 0 and k != raw["target_hard"]]
    # soft targets scored > 0: relevance > 0 and not a negative, so the old Target.is_positive showed them
    assert sorted(t.image.external_id for t in q.targets.all() if t.role == "soft" and t.relevance > 0) == sorted(soft)
    annotator = make_annotator("ann")
    study, _ = create_study(
        StudySpec(name="s", datasets=["cirr-sample"], overlap=1, total=48, annotators=[annotator.username], seed=1)
    )
    shown = {}
    while (served := engine.next_assignment(study, annotator)).assignment is not None:
        payload = item_payload(served.assignment)
        shown[payload["query"]["external_id"]] = [t["id"] for t in payload["query"]["targets"]]
        engine.submit(served.assignment, {"category": "VALIDATED", "time_spent_ms": 1000})
    assert len(shown) == 48
    for qid, ids in shown.items():
        assert ids == [image_pk(cirr[qid]["target_hard"])], qid


def test_the_dataset_page_shows_each_query_s_hard_target_only(client, cirr):
    user = get_user_model().objects.create_user("res", password="pw")
    user.groups.add(Group.objects.get_or_create(name="researcher")[0])
    client.force_login(user)
    rows = []
    for page in (1, 2, 3):
        html = client.get(f"/datasets/cirr-sample/?page={page}").content.decode()
        rows += re.findall(r'<article class="queryrow">(.*?)</article>', html, re.S)
    assert len(rows) == 48
    for row in rows:
        qid = re.search(r"<code>(\d+)</code>", row).group(1)
        shown = [int(pk) for pk in re.findall(r'class="thumb[^"]* target"><img[^>]*src="/images/(\d+)/', row)]
        assert shown == [image_pk(cirr[qid]["target_hard"])], qid
