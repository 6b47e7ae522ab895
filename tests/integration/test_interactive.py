"""Interactive studies (issue 26, item 4): the annotator plays the user; every round is stored,
re-ranked by the worker's code over the cached gallery, and the session ends at the top N or
after R rounds; the sessions export in the CIRCLED layout and re-import with every turn human."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from annotation.assignment import queue as engine
from annotation.interactive import service
from annotation.interactive.service import RoundError, rank_round, session_for, session_state, submit_round
from annotation.models import Assignment, InteractiveRound, StudyItem
from annotation.studies.building import StudyError, StudySpec, create_study
from audit.runs.encoding import clear_memos
from retrieval.demo import build_demo
from retrieval.importers import circled
from retrieval.loader import load_parsed
from retrieval.models import Dataset, Query
from tests.conftest import make_annotator

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = "openclip:cirval-tiny-vit"


@pytest.fixture
def world(tmp_path, settings):
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=40, n_single=8, n_sessions=0), "demo", images_root=root)
    clear_memos()
    yield Dataset.objects.get(name="demo")
    clear_memos()


def sent(monkeypatch) -> list[int]:
    """Rounds the web tier sends to the worker (run here by the test, as a worker would)."""
    out: list[int] = []
    monkeypatch.setattr(service, "send_task", lambda name, pk: out.append(pk) or True)
    return out


def test_rounds_are_stored_ranked_and_the_session_ends_after_r_rounds(world, monkeypatch, tmp_path):
    queued = sent(monkeypatch)
    ann = make_annotator("ann")
    study, _ = create_study(
        StudySpec(
            name="iact",
            datasets=["demo"],
            overlap=1,
            annotators=["ann"],
            interactive={"retriever": SPEC, "top_n": 1, "max_rounds": 2},
        )
    )
    assert study.kind == "interactive" and study.interactive["strategy"] == "average"
    assert all(StudyItem.objects.filter(study=study).values_list("query__n_turns", flat=True))
    a = engine.next_assignment(study, ann).assignment
    session = session_for(a)
    state = session_state(session, ann.pk)
    assert state["rounds"] == [] and not state["ended"] and state["target"]["image"]
    with pytest.raises(RoundError):
        submit_round(session, "   ", None)
    first = submit_round(session, "make it  red", None, 1200)
    assert first.text == "make it red" and first.reference_id == service.start_reference(a.item.query)
    assert queued == [first.pk]
    with pytest.raises(RoundError, match="still being ranked"):
        submit_round(session, "again", None)
    assert rank_round(first.pk) == "done"
    first.refresh_from_db()
    gallery = Query.objects.get(pk=a.item.query_id).dataset.gallery.count()
    assert len(first.shown) == 1 and first.rank_ms > 0 and first.target_rank is not None
    assert 1 <= first.target_rank <= gallery
    # the state is blind: no rank anywhere in it
    assert "target_rank" not in json.dumps(session_state(session, ann.pk))
    if first.target_rank > 1:  # not found in one round: a second round about the shown result
        with pytest.raises(RoundError, match="pick one"):
            submit_round(session, "bluer", first.reference_id if first.reference_id not in first.shown else -1)
        second = submit_round(session, "bluer please", first.shown[0])
        assert rank_round(second.pk) == "done"
        second.refresh_from_db()
        assert second.reference_id == first.shown[0]
    session.refresh_from_db()
    assert session.outcome in ("found", "rounds")
    assert Assignment.objects.get(pk=a.pk).status == "done"
    assert StudyItem.objects.get(pk=a.item_id).completed == 1
    with pytest.raises(RoundError, match="ended"):
        submit_round(session, "more", None)
    # a redelivered task changes nothing
    assert rank_round(first.pk) == "done"

    out = StringIO()
    call_command("export_interactive", "--study", study.name, "--out", str(tmp_path / "export"), stdout=out)
    folder = Path(out.getvalue().strip())
    assert folder == (tmp_path / "export").resolve()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["sessions"] == 1
    files = [folder / f["path"] for f in manifest["files"] if f["path"].endswith(".json")]
    records = json.loads(files[0].read_text())
    rounds = list(session.rounds.order_by("index"))
    assert records[0]["num_turns"] == len(rounds)
    assert [t["relative_caption"] for t in records[0]["turns"]] == [r.text for r in rounds]
    trace = [json.loads(line) for line in (folder / manifest["files"][1]["path"]).read_text().splitlines()]
    assert [r["target_rank"] for r in trace[0]["rounds"]] == [r.target_rank for r in rounds]
    assert trace[0]["annotator"] == "annotator_01"
    parsed = circled.parse(files)
    (q,) = parsed.queries
    assert [t.provenance for t in q.turns] == ["human"] * len(rounds)
    assert [t.texts[0].text for t in q.turns] == [r.text for r in rounds]


def test_the_settings_are_checked(world):
    make_annotator("ann")
    with pytest.raises(StudyError, match="top_n"):
        create_study(StudySpec(name="bad", datasets=["demo"], interactive={"retriever": SPEC, "top_n": 0}))
    with pytest.raises(StudyError, match="strategy"):
        create_study(StudySpec(name="bad", datasets=["demo"], interactive={"retriever": SPEC, "strategy": "x"}))
    study, _ = create_study(StudySpec(name="ok", datasets=["demo"], interactive={}))
    assert study.interactive == {
        "retriever": SPEC,
        "top_n": 10,
        "max_rounds": 5,
        "strategy": "average",
        "alpha": 0.8,
        "target_view": "image",
    }
    assert InteractiveRound.objects.count() == 0


WEB_TIER = r"""
import sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.test import Client
from annotation.studies.building import StudySpec, create_study
from retrieval.models import Dataset, Image, Query, Target, Turn
from tests.conftest import make_annotator
ds = Dataset.objects.create(name="tiny", format="demo", images_root="/nonexistent")
a, b = (Image.objects.create(dataset=ds, external_id=x, path=x + ".png") for x in "ab")
q = Query.objects.create(dataset=ds, external_id="q1", split="val", n_turns=1)
Turn.objects.create(query=q, index=1, reference_image=a, texts=[{"text": "make it red"}])
Target.objects.create(query=q, image=b, is_primary=True)
make_annotator("ann")
study, _ = create_study(StudySpec(name="s", datasets=["tiny"], overlap=1, annotators=["ann"],
                                  interactive={"retriever": "openclip:cirval-tiny-vit"}))
client = Client()
client.login(username="ann", password="pw")
page = client.post(f"/annotate/{study.pk}/", follow=True)
print(page.status_code, "feedback" in page.content.decode())
pk = study.assignments.get().pk
sent = client.post(f"/api/assignments/{pk}/interactive/rounds/", {"text": "bluer"}, content_type="application/json")
print(sent.status_code, sent.json()["rounds"][0]["status"])
print(client.get(f"/api/assignments/{pk}/interactive/").json()["rounds"][0]["status"])
print(sorted(m for m in ("torch", "open_clip", "torchvision") if m in sys.modules))
"""


def test_the_web_tier_takes_a_round_without_loading_torch(tmp_path):
    """The page and its API store the round and send it: torch stays out of the web process."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="config.settings",
        CIRVAL_VAR_DIR=str(tmp_path),
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        CELERY_BROKER_URL="filesystem://",
    )
    out = subprocess.run(
        [sys.executable, "-c", WEB_TIER], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == ["200 True", "202 pending", "pending", "[]"], out.stdout


def test_lost_rounds_are_sent_again_and_the_description_view_hides_the_target(world, monkeypatch, settings):
    from datetime import timedelta

    from django.utils import timezone

    from annotation.interactive.service import resend_stale_rounds

    settings.JOB_STALE_SECONDS = 25
    down = []
    monkeypatch.setattr(service, "send_task", lambda name, pk: down.append(pk) and False)  # the broker is down
    ann = make_annotator("ann")
    study, _ = create_study(
        StudySpec(
            name="fisd",
            datasets=["demo"],
            overlap=1,
            annotators=["ann"],
            interactive={"retriever": SPEC, "target_view": "description"},
        )
    )
    a = engine.next_assignment(study, ann).assignment
    session = session_for(a)
    state = session_state(session, ann.pk)
    target = a.item.query.targets.get(is_primary=True).image
    assert state["target"] == {"description": target.extra["description"]} and target.extra["description"]
    rnd = submit_round(session, "make it red", None)
    assert down == [rnd.pk] and InteractiveRound.objects.get(pk=rnd.pk).sent_at is None
    monkeypatch.setattr(service, "send_task", lambda name, pk: down.append(pk) or True)  # back
    later = timezone.now() + timedelta(seconds=2)
    assert resend_stale_rounds(later) == 1 and down == [rnd.pk, rnd.pk]
    assert resend_stale_rounds(later) == 0  # sent just now: not again before JOB_STALE_SECONDS
    assert resend_stale_rounds(later + timedelta(seconds=30)) == 1  # its worker died: sent again
    assert rank_round(rnd.pk) == "done"
    assert resend_stale_rounds(later + timedelta(seconds=90)) == 0


def test_staff_create_an_interactive_study_with_the_form_and_the_api(world, client):
    from django.contrib.auth import get_user_model

    make_annotator("ann")
    boss = get_user_model().objects.create_superuser("boss", password="boss-pw")
    client.force_login(boss)
    page = client.post(
        "/studies/new/",
        {
            "name": "by-form",
            "datasets": ["demo"],
            "rubric": "session",
            "overlap": 1,
            "consensus": "majority",
            "seed": 0,
            "agreement_size": 0,
            "lease_minutes": 10,
            "candidates": 20,
            "annotators": ["ann"],
            "serve_order": "random",
            "interactive": "on",
            "interactive_retriever": SPEC,
            "interactive_top_n": 5,
            "interactive_max_rounds": 3,
            "interactive_strategy": "weighted",
            "interactive_target_view": "description",
        },
    )
    assert page.status_code == 302, page.content.decode()[:2000]
    from annotation.models import Study

    study = Study.objects.get(name="by-form")
    assert study.interactive == {
        "retriever": SPEC,
        "top_n": 5,
        "max_rounds": 3,
        "strategy": "weighted",
        "alpha": 0.8,
        "target_view": "description",
    }
    made = client.post(
        "/api/studies/",
        {"name": "by-api", "datasets": ["demo"], "overlap": 1, "interactive": {"max_rounds": 4}},
        content_type="application/json",
    )
    assert made.status_code == 201, made.content
    assert made.json()["kind"] == "interactive" and made.json()["interactive"]["max_rounds"] == 4
    bad = client.post(
        "/api/studies/",
        {"name": "bad", "datasets": ["demo"], "interactive": {"top_n": 99}},
        content_type="application/json",
    )
    assert bad.status_code == 400 and "top_n" in bad.json()["detail"]


def test_the_study_pages_serve_an_interactive_study(world, client, monkeypatch):
    """Staff and annotator pages of an interactive study with one ended session answer 200."""
    from django.contrib.auth import get_user_model

    sent(monkeypatch)
    ann = make_annotator("ann")
    study, _ = create_study(
        StudySpec(
            name="pages",
            datasets=["demo"],
            overlap=1,
            annotators=["ann"],
            interactive={"retriever": SPEC, "max_rounds": 1},
        )
    )
    a = engine.next_assignment(study, ann).assignment
    rnd = submit_round(session_for(a), "make it red", None)
    rank_round(rnd.pk)
    client.force_login(ann)
    for url in ("/annotate/", f"/annotate/{study.pk}/history/", f"/annotate/{study.pk}/item/{a.pk}/"):
        assert client.get(url).status_code == 200, url
    assert "session is saved" not in client.get(f"/annotate/{study.pk}/item/{a.pk}/").content.decode()  # JS writes it
    # the study list says what the annotator does here, not the validity rubric's title
    listing = client.get("/annotate/").content.decode()
    assert "Interactive: describe what to change" in listing and "Validity of a composed" not in listing
    boss = get_user_model().objects.create_superuser("boss", password="boss-pw")
    client.force_login(boss)
    progress = client.get(f"/studies/{study.pk}/progress/").content.decode()
    assert 'id="interactive-summary"' in progress and "<dt>Rounds</dt><dd>1</dd>" in progress
    for url in (f"/studies/{study.pk}/report/", f"/room/studies/{study.pk}/", "/studies/", f"/api/studies/{study.pk}/"):
        assert client.get(url).status_code == 200, url
    download = client.get(f"/studies/{study.pk}/interactive/export/")
    assert download.status_code == 200 and json.loads(download.content)[0]["num_turns"] == 1
    # an unknown subset: the app's page, saying so and linking the subsets there are (was bare text)
    wrong = client.get(f"/studies/{study.pk}/interactive/export/?subset=nope")
    page = wrong.content.decode()
    assert wrong.status_code == 400 and wrong["Content-Type"].startswith("text/html")
    assert "No ended session of subset “nope”" in page and page.count('href="?subset=') == 1
