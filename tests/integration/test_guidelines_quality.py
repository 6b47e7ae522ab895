"""Guidelines (Markdown, sanitised, versioned with the rubric) and the staff's quality signals."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from annotation.assignment import queue as engine
from annotation.judging.guidelines import current_guidelines, render_markdown, save_guidelines
from annotation.models import GuidelinesVersion
from annotation.quality.annotator_report import quality_signals
from annotation.studies.building import StudySpec, create_study
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db


def test_markdown_is_rendered_and_sanitised():
    html = str(
        render_markdown(
            "# Rule\n\n**Bold** [doc](https://example.org) ![ex](/images/3/)\n\n"
            "<script>alert(1)</script><img src=x onerror=alert(1)> [js](javascript:alert(1))"
        )
    )
    assert "<h1>Rule</h1>" in html and "<strong>Bold</strong>" in html
    assert '<img alt="ex" src="/images/3/">' in html and 'href="https://example.org"' in html
    assert "<script" not in html and "onerror" not in html and "javascript:" not in html


@pytest.fixture
def world():
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    users = []
    for name in ("ann", "bea", "cid"):
        u = get_user_model().objects.create_user(name, password="pw")
        u.groups.add(Group.objects.get(name="annotator"))
        users.append(u)
    study, _ = create_study(
        StudySpec(
            name="s",
            datasets=["circo"],
            overlap=3,
            total=6,
            annotators=[u.username for u in users],
            guidelines="v0 text",
        )
    )
    study.gold_rate = 0
    study.straight_run = 3
    study.save()
    return study, users


def test_guidelines_versions_and_the_item_page(world):
    study, (ann, *_rest) = world
    assert current_guidelines(study).version == 0
    v1 = save_guidelines(study, "## Look closely\n\nExample: ![low-res](/images/1/)", ann)
    assert v1.version == 1 and v1.rubric_id == study.rubric_id
    assert save_guidelines(study, "## Look closely\n\nExample: ![low-res](/images/1/)") is None  # unchanged text
    assert GuidelinesVersion.objects.filter(study=study).count() == 1
    c = Client()
    c.force_login(ann)
    served = engine.next_assignment(study, ann).assignment
    html = c.get(reverse("annotation:item", args=[study.pk, served.pk])).content.decode()
    assert 'id="guidelines"' in html and "<h2>Look closely</h2>" in html and "v1 · rubric validity v1" in html


def judge(study, user, validated: bool, ms: int):
    a = engine.next_assignment(study, user).assignment
    payload = (
        {"category": "VALIDATED"}
        if validated
        else {"category": "INVALID_TEXT_QUERY", "sub_reason": "ungrammatical_nonsensical"}
    )
    engine.submit(a, {**payload, "time_spent_ms": ms})
    return a


def test_quality_signals_per_annotator(world):
    study, (ann, bea, cid) = world
    for _ in range(4):  # ann: four identical quick answers; the others disagree with ann on every item
        judge(study, ann, True, 1200)
        judge(study, bea, False, 9000)
        judge(study, cid, False, 8000)
    q = quality_signals(study, fresh=True)
    assert q["ann"]["too_fast"] == 4 and q["bea"]["too_fast"] == 0
    assert q["ann"]["straight_runs"] == 1 and q["ann"]["longest_run"] == 4
    assert (q["ann"]["disagree"], q["ann"]["compared"]) == (4, 4)  # majority rejected every item
    assert (q["bea"]["disagree"], q["bea"]["compared"]) == (0, 4)
    assert q["ann"]["median_seconds"] == 1.2 and q["ann"]["gold"] is None
    staff = get_user_model().objects.create_user("boss", password="pw", is_staff=True)
    c = Client()
    c.force_login(staff)
    page = c.get(reverse("annotation:study_progress", args=[study.pk])).content.decode()
    assert 'id="quality"' in page and "4 of 4 (100 %)" in page
    annotator = Client()
    annotator.force_login(ann)
    mine = annotator.get(reverse("annotation:my_studies")).content.decode()
    assert "too fast" not in mine.lower() and "consensus" not in mine.lower()
