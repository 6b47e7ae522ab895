"""Blind interactive studies (issue 26): when the target is only described, its annotator is
never served the target's image — not by the image view, the item's JSON or the prefetch —
while the start reference and the candidates a round showed stay fetchable, and a study that
shows the target serves it. Driven over HTTP as an annotator's browser or script would."""

from __future__ import annotations

import json

import pytest
from django.core.cache import cache

from annotation.access import may_fetch_image
from annotation.interactive import service
from annotation.models import InteractiveRound, InteractiveSession
from annotation.studies.building import StudySpec, create_study
from retrieval.models import Dataset, Image, Query, Target, Turn
from tests.conftest import make_annotator

pytestmark = pytest.mark.django_db

SPEC = "openclip:cirval-tiny-vit"


@pytest.fixture
def corpus():
    """Two queries: reference a -> target b, reference c -> target d; e, f other gallery images
    (placeholders: the files are missing, the view still answers 200 when it may serve them)."""
    cache.clear()
    ds = Dataset.objects.create(name="tiny", format="demo", images_root="/nonexistent")
    img = {x: Image.objects.create(dataset=ds, external_id=x, path="", missing=True) for x in "abcdef"}
    for n, (ref, target) in enumerate(("ab", "cd"), start=1):
        q = Query.objects.create(dataset=ds, external_id=f"q{n}", split="val", n_turns=1)
        Turn.objects.create(query=q, index=1, reference_image=img[ref], texts=[{"text": "make it red"}])
        Target.objects.create(query=q, image=img[target], is_primary=True)
    yield img
    cache.clear()


def _study(name: str, annotator: str, view: str):
    study, _ = create_study(
        StudySpec(
            name=name,
            datasets=["tiny"],
            overlap=1,
            annotators=[annotator],
            interactive={"retriever": SPEC, "target_view": view},
        )
    )
    return study


def _play(client, user, study):
    """Open the study's first item in the browser; the assignment and its query's images."""
    client.force_login(user)
    page = client.post(f"/annotate/{study.pk}/", follow=True)
    assert page.status_code == 200
    a = study.assignments.get(annotator=user)
    query = a.item.query
    return a, query.turns.get().reference_image_id, query.targets.get().image_id


def _fetch(client, pk: int, size: str = "") -> int:
    return client.get(f"/images/{pk}/{size}").status_code


def _ranked(a, shown: list[int]) -> InteractiveRound:
    """A round of the session as the worker leaves it (the worker's ranking is tested elsewhere)."""
    session = InteractiveSession.objects.get(assignment=a)
    rnd = session.rounds.order_by("-index").first()
    InteractiveRound.objects.filter(pk=rnd.pk).update(status=InteractiveRound.DONE, shown=shown, target_rank=7)
    return rnd


def test_a_described_target_is_not_served_but_the_shown_candidates_are(corpus, client, monkeypatch):
    monkeypatch.setattr(service, "send_task", lambda name, pk: True)
    ann = make_annotator("ann")
    study = _study("fisd", "ann", "description")
    a, reference, target = _play(client, ann, study)
    assert _fetch(client, reference) == 200  # the start reference is shown
    assert _fetch(client, target) == 404 and _fetch(client, target, "?size=160") == 404  # guessed URL
    state = client.get(f"/api/assignments/{a.pk}/interactive/").json()
    assert state["target"].get("description") is not None and "image" not in state["target"]
    # the item's JSON (the judging API) names no target, turn target nor panel either
    payload = client.get(f"/api/assignments/{a.pk}/").json()
    assert payload["query"]["targets"] == [] and payload["panel"] == []
    assert f"/images/{target}/" not in json.dumps(payload)
    assert _fetch(client, target) == 404
    # the prefetch of the next item leaves its target out too
    other = next(pk for pk in (corpus["b"].pk, corpus["d"].pk) if pk != target)
    upcoming = client.get(f"/annotate/{study.pk}/upcoming/").json()["images"]
    assert upcoming and not any(f"/images/{other}/" in url for url in upcoming)
    assert _fetch(client, other) == 404

    sent = client.post(
        f"/api/assignments/{a.pk}/interactive/rounds/", {"text": "bluer"}, content_type="application/json"
    )
    assert sent.status_code == 202
    shown = [corpus["e"].pk, corpus["f"].pk]
    _ranked(a, shown)
    assert client.get(f"/api/assignments/{a.pk}/interactive/").status_code == 200  # the page polls
    assert [_fetch(client, pk) for pk in shown] == [200, 200]
    assert _fetch(client, target) == 404
    cache.clear()  # the grants are lost: the stored rounds still decide
    assert [_fetch(client, pk) for pk in shown] == [200, 200] and _fetch(client, reference) == 200
    assert _fetch(client, target) == 404


def test_a_target_a_round_showed_is_legitimately_visible(corpus, client, monkeypatch):
    monkeypatch.setattr(service, "send_task", lambda name, pk: True)
    ann = make_annotator("ann")
    a, _, target = _play(client, ann, _study("fisd", "ann", "description"))
    client.post(f"/api/assignments/{a.pk}/interactive/rounds/", {"text": "bluer"}, content_type="application/json")
    _ranked(a, [corpus["e"].pk, target])  # the retriever put the target among the candidates
    client.get(f"/api/assignments/{a.pk}/interactive/")
    assert _fetch(client, target) == 200
    cache.clear()
    assert _fetch(client, target) == 200


def test_a_study_that_shows_the_target_serves_it(corpus, client):
    ann = make_annotator("ann")
    a, reference, target = _play(client, ann, _study("shown", "ann", "image"))
    assert client.get(f"/api/assignments/{a.pk}/interactive/").json()["target"]["image"]["id"] == target
    assert _fetch(client, target) == 200 and _fetch(client, reference) == 200
    cache.clear()
    assert _fetch(client, target) == 200


def test_the_same_target_shown_in_another_study_stays_visible(corpus, client):
    """The annotator also plays the query in a study that shows its target: refusing the image
    would hide nothing, so it is theirs (granted or not), while they annotate there."""
    Query.objects.filter(external_id="q2").delete()  # one query: both studies serve it
    ann = make_annotator("ann")
    _, _, target = _play(client, ann, _study("fisd", "ann", "description"))
    assert _fetch(client, target) == 404 and not may_fetch_image(ann, target)
    shown = _study("shown", "ann", "image")
    assert _play(client, ann, shown)[2] == target
    assert _fetch(client, target) == 200
    cache.clear()
    assert may_fetch_image(ann, target)
    shown.annotators.remove(ann)  # removed from the study that shows it: hidden again
    assert _fetch(client, target) == 404
