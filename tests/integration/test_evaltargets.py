"""retrieval.evaltargets: the target rule on Target rows (CIRR loaded from the annotation sample)."""

from __future__ import annotations

import json
import math

import pytest

from audit.labels import label_queries
from retrieval import importers
from retrieval.evaltargets import evaluation_targets, positive_image_ids
from retrieval.loader import load_parsed
from retrieval.models import Image, Query
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db

CIRR = FIXTURES / "datasets" / "cirr"


@pytest.fixture
def cirr_db(db):
    parsed = importers.parse("cirr", [CIRR / "cap.rc2.val.sample.json", CIRR / "split.rc2.val.sample.json"])
    load_parsed(parsed, "cirr-sample")
    return {q.external_id: q.pk for q in Query.objects.filter(dataset__name="cirr-sample")}


def test_cirr_rows_hard_positive_soft_graded_and_img_set_group(cirr_db):
    raw = {str(r["pairid"]): r for r in json.loads((CIRR / "cap.rc2.val.sample.json").read_text())}
    ext = dict(Image.objects.filter(dataset__name="cirr-sample").values_list("pk", "external_id"))
    targets = evaluation_targets(Query.objects.get(pk=cirr_db["12130"]).dataset, list(cirr_db.values()))
    assert len(targets) == 48  # every query has its hard target (even 29045, scored -1.0)
    for qid, pk in cirr_db.items():
        t = targets[pk]
        r = raw[qid]
        assert [ext[i] for i in t.positives] == [r["target_hard"]]
        soft = {k: v for k, v in r["target_soft"].items() if v > 0 and k != r["target_hard"]}
        assert {ext[i]: g for i, g in zip(t.extras, t.gains)} == soft
        assert {ext[i] for i in t.group} <= set(r["img_set"]["members"])
        assert r["target_hard"] in {ext[i] for i in t.group}
    fmt = Query.objects.get(pk=cirr_db["12130"]).dataset.format
    assert positive_image_ids(fmt, list(cirr_db.values())) == {pk: t.positives for pk, t in targets.items()}


def test_subset_and_graded_extras_reach_the_metrics():
    extras = {
        "graded": {"gains": [0.5], "mm": [1], "text": [None], "image": [3]},
        "subset": {"mm": 2, "text": 1, "image": 4},
    }
    audit = label_queries([("q", "R", 2, 20, 30, extras), ("p", "R", 1, 20, 30)], k=10)
    stats = audit.retriever_stats["R"]
    # only q has a group: Recall_subset@1 (mm) = 0 (rank 2), text 1.0
    assert stats["recall_subset"]["1"] == {"multimodal": 0.0, "text_only": 1.0, "image_only": 0.0}
    assert stats["recall_subset"]["2"]["multimodal"] == 1.0
    # graded nDCG (mm) of q: hard at 2 (gain 1), soft at 1 (gain 0.5); p: 1.0
    q_ndcg = (1 / math.log2(3) + 0.5) / (1 + 0.5 / math.log2(3))
    assert stats["ndcg_graded"]["multimodal"] == pytest.approx((q_ndcg + 1.0) / 2)
