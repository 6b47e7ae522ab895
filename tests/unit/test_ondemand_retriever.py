"""On-demand candidate panels never call a hosted embedder (audit.runs.ondemand.candidate_retriever):
an annotator opening an item must not spend a study's API budget."""

import pytest
from django.test import override_settings

from audit.models import AuditRun
from audit.runs.ondemand import candidate_retriever
from retrieval.models import Dataset

pytestmark = pytest.mark.django_db

API = "api:voyage/voyage-multimodal-3.5"
LOCAL = "openclip:cirval-tiny-vit@random:0"


def _dataset() -> Dataset:
    return Dataset.objects.create(name="ondemand-pick", format="cirr")


def test_the_first_free_retriever_of_the_newest_audit_ranks_panels():
    ds = _dataset()
    AuditRun.objects.create(dataset=ds, split="val", retrievers=[API, LOCAL])
    assert candidate_retriever(ds.pk) == LOCAL


@override_settings(CANDIDATE_RETRIEVER="openclip:cirval-tiny-vit-b@random:1")
def test_an_audit_of_hosted_embedders_only_falls_back_to_the_local_default():
    ds = _dataset()
    AuditRun.objects.create(dataset=ds, split="val", retrievers=[API])
    assert candidate_retriever(ds.pk) == "openclip:cirval-tiny-vit-b@random:1"
