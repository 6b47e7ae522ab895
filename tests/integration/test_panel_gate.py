"""Issue 39, item 2: no item without its panel. A single-turn item is served only once its
candidate panel is stored; until then the study serves its other items and, with nothing else
left, says that the candidates are being prepared (and asks a worker for them).
``create_study`` on the command line fills the panels itself, so a study made there while no
worker runs serves every single-turn item with its panel."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.cache import cache
from django.core.management import call_command

from annotation.assignment import queue as engine
from annotation.core.serving import PANELS_PENDING
from annotation.judging import candidates
from annotation.judging.panel_fill import fill_candidates
from annotation.models import Study, StudyItem
from annotation.studies.building import StudySpec, create_study
from audit.runs.encoding import clear_memos
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from tests.conftest import make_annotator

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(tmp_path, settings):
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    settings.CANDIDATE_RETRIEVER = "openclip:cirval-tiny-vit"
    settings.CIRVAL_SERVE_AFTER_PANEL = True  # the gate, off in most tests (tests/conftest.py)
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=60, n_single=6, n_sessions=2), "demo", images_root=root)
    clear_memos()
    yield
    clear_memos()


def _serve_all(study: Study, user) -> list[StudyItem]:
    """Every item the annotator is served, each judged at once (no panel ticks needed)."""
    served = []
    while True:
        got = engine.next_assignment(study, user)
        if got.assignment is None:
            return served
        item = StudyItem.objects.select_related("query").get(pk=got.assignment.item_id)
        served.append(item)
        engine.submit(got.assignment, {"category": "VALIDATED", "time_spent_ms": 1000})


def test_an_item_waits_for_its_panel_and_the_study_says_so(world):
    user = make_annotator("ann1", password="x")
    study, _ = create_study(StudySpec(name="gated", datasets=["demo"], overlap=1, annotators=["ann1"], candidates=8))
    single = list(
        StudyItem.objects.filter(study=study, query__n_turns=1).select_related("query", "study").order_by("pk")
    )
    assert len(single) == StudyItem.objects.filter(study=study).count() == 6
    cache.delete(candidates._requested_key(study.pk))
    fill_candidates(single[:2])  # a worker has stored two panels so far

    served = _serve_all(study, user)
    # the two items with a panel are served; the rest wait
    assert sorted(i.pk for i in served) == sorted(i.pk for i in single[:2]) and all(i.candidates_source for i in served)
    assert engine.next_assignment(study, user).rule == PANELS_PENDING
    assert cache.get(candidates._requested_key(study.pk)) == 1  # and a worker was asked for the panels

    fill_candidates(single[2:])
    rest = _serve_all(study, user)
    assert sorted(i.pk for i in rest) == sorted(i.pk for i in single[2:]) and all(len(i.candidates) == 8 for i in rest)
    assert engine.next_assignment(study, user).rule != PANELS_PENDING


def test_create_study_on_the_command_line_fills_every_panel(world):
    user = make_annotator("ann2", password="x")
    out = StringIO()
    call_command(
        "create_study",
        "--name",
        "cli",
        "--dataset",
        "demo",
        "--overlap",
        "1",
        "--annotator",
        "ann2",
        "--json",
        stdout=out,
    )
    report = json.loads(out.getvalue())
    study = Study.objects.get(pk=report["id"])
    assert report["panels"] == 6
    served = _serve_all(study, user)  # no worker runs: every single-turn item is served with its panel
    singles = [i for i in served if i.query.n_turns == 1]
    assert len(singles) == 6 and all(len(i.candidates) == study.candidates for i in singles)
    text = StringIO()
    call_command("create_study", "--name", "cli2", "--dataset", "demo", "--overlap", "1", stdout=text)
    assert "6 candidate panels stored" in text.getvalue()
