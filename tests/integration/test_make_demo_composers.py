"""make_demo --composers: the demo's audit runs its two trained dual encoders and the demo's two
composers (a Combiner and a SEARLE-layout textual inversion, trained over the compose model), so
that an audit of the demo exercises the composers' own multimodal passes end to end (issue 37)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from audit.models import AuditLabel, AuditRank, AuditRun
from retrieval.models import Query

pytestmark = pytest.mark.django_db


def test_make_demo_with_composers(tmp_path, settings):
    settings.IMAGE_ROOTS = [tmp_path.resolve()]
    settings.VAR_DIR = tmp_path / "var"
    settings.DEMO_MODELS_DIR = tmp_path / "models"
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    call_command("make_demo", "--images-dir", str(tmp_path / "demo"), "--composers", stdout=StringIO())
    run = AuditRun.objects.get(dataset__name="demo", status="done")
    kinds = [spec.split(":", 1)[0] for spec in run.retrievers]
    assert kinds == ["openclip", "openclip", "composer", "composer"]
    assert sorted(s.split("@")[0] for s in run.retrievers[2:]) == ["composer:combiner", "composer:searle"]
    singles = Query.objects.filter(dataset__name="demo", n_turns=1).count()
    assert AuditLabel.objects.filter(run=run).count() == singles
    for spec in run.retrievers[2:]:
        assert AuditRank.objects.filter(run=run, retriever=spec).exclude(mm=None).exists()
    assert run.timings["cache"]["query_mm_encoded"] > 0
