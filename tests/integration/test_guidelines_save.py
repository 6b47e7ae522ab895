"""Issue 39: saving a study's settings with its guidelines unchanged stores no new version and
says so (it said "Guidelines saved as version 1" for the text written at creation)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.forms.models import model_to_dict
from django.test import Client
from django.urls import reverse

from annotation.judging.guidelines import current_guidelines
from annotation.models import GuidelinesVersion
from annotation.room.forms import StudySettingsForm
from annotation.studies.building import StudySpec, create_study
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from tests.conftest import make_annotator

pytestmark = pytest.mark.django_db


@pytest.fixture
def study(tmp_path):
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=12, n_single=4, n_sessions=0), "demo", images_root=root)
    make_annotator("ann")
    s, _ = create_study(
        StudySpec(
            name="g",
            datasets=["demo"],
            overlap=1,
            annotators=["ann"],
            candidates=0,
            guidelines="## Judge each query\r\n\r\nLook closely.",
        )
    )
    return s


def _save(client, study, **changes):
    fields = {
        k: ("" if v is None else v) for k, v in model_to_dict(study, fields=StudySettingsForm.Meta.fields).items()
    }
    fields["guidelines"] = (
        fields["guidelines"].replace("\r\n", "\n").replace("\n", "\r\n")
    )  # as a browser's textarea sends it
    r = client.post(reverse("room:study_settings", kwargs={"study_id": study.pk}), {**fields, **changes}, follow=True)
    assert r.status_code == 200
    return [str(m) for m in get_messages(r.wsgi_request)] or [str(m) for m in r.context["messages"]]


def test_unchanged_guidelines_keep_their_version(study):
    staff = get_user_model().objects.create_user("boss", password="pw", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(staff)
    assert current_guidelines(study).version == 0
    said = _save(client, study)
    assert said == ["Nothing changed in the settings of g: the guidelines stay at version 0."], said
    assert not GuidelinesVersion.objects.filter(study=study).exists()

    said = _save(client, study, lease_minutes=5)
    assert said == ["Settings of g saved (lease minutes); the guidelines stay at version 0."], said
    assert not GuidelinesVersion.objects.filter(study=study).exists()

    said = _save(client, study, guidelines="## Judge each query\r\n\r\nLook very closely.")
    assert said == ["Settings of g saved. Guidelines saved as version 1."], said
    study.refresh_from_db()
    said = _save(client, study)
    assert said == ["Nothing changed in the settings of g: the guidelines stay at version 1."], said
    assert GuidelinesVersion.objects.filter(study=study).count() == 1
