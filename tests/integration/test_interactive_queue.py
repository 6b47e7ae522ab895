"""Interactive rounds have a queue of their own (issue 26): a round never waits behind audit
chunks, imports or exports in a busy queue; every worker launcher consumes it; and the page
says "no worker alive" while a round waits and no live worker consumes that queue, even when
workers of the other queues beat; ``/healthz`` counts a waiting round as work for a worker."""

from __future__ import annotations

import re

import pytest
from celery import current_app

from annotation.interactive import service
from annotation.studies.building import StudySpec, create_study
from retrieval.jobs import workers
from retrieval.models import Dataset, Image, Query, Target, Turn
from tests.conftest import ROOT, make_annotator

pytestmark = pytest.mark.django_db


def routed(task: str) -> str:
    return current_app.amqp.router.route({}, task)["queue"].name


def test_rounds_go_to_their_own_queue_and_audits_stay_on_gpu():
    assert service.rank_queue() == "interactive" == routed(service.RANK_TASK)
    assert routed("audit.tasks.encode_gallery_chunk") == "gpu"
    assert routed("retrieval.run_import") == "celery"


def test_every_worker_launcher_consumes_the_rounds_queue():
    """./cirval (up and worker), the test and bench workers, the app's docstring and the
    waiting-job hint all name the same queues, the rounds' among them."""
    queues = {"celery", "gpu", service.rank_queue()}
    launchers = {
        "cirval": 2,
        "tests/conftest.py": 1,
        "bench/load.py": 1,
        "config/celery.py": 1,
        "templates/_job_progress.html": 1,
    }
    for path, n in launchers.items():
        found = re.findall(r"""-Q["',\s]+([a-z,]+)|queues: str = "([a-z,]+)\"""", (ROOT / path).read_text())
        lists = [set(filter(None, "".join(m).split(","))) for m in found]
        assert len([q for q in lists if q == queues]) >= n, (path, lists)
    production = (ROOT / "docs/guides/production.md").read_text()  # the docs page that says how to run workers
    assert "-Q interactive" in production and "cirval-worker@interactive" in production
    assert "cirval-worker@interactive" in (ROOT / "deploy/systemd/cirval-worker@.service").read_text()


def test_the_page_says_no_worker_while_a_round_waits_and_none_consumes_its_queue(client, monkeypatch):
    monkeypatch.setattr(service, "send_task", lambda name, pk: True)
    ds = Dataset.objects.create(name="tiny", format="demo", images_root="/nonexistent")
    a, b = (Image.objects.create(dataset=ds, external_id=x, path="", missing=True) for x in "ab")
    q = Query.objects.create(dataset=ds, external_id="q1", split="val", n_turns=1)
    Turn.objects.create(query=q, index=1, reference_image=a, texts=[{"text": "make it red"}])
    Target.objects.create(query=q, image=b, is_primary=True)
    ann = make_annotator("ann")
    study, _ = create_study(
        StudySpec(
            name="s",
            datasets=["tiny"],
            overlap=1,
            annotators=["ann"],
            interactive={"retriever": "openclip:cirval-tiny-vit"},
        )
    )
    client.force_login(ann)
    client.post(f"/annotate/{study.pk}/", follow=True)
    pk = study.assignments.get().pk
    state = f"/api/assignments/{pk}/interactive/"
    assert client.get(state).json()["no_worker"] == ""  # nothing waits
    assert client.get("/healthz").status_code == 200  # nothing waits, so no worker is needed
    sent = client.post(f"{state}rounds/", {"text": "bluer"}, content_type="application/json").json()
    assert sent["rounds"][0]["status"] == "pending" and sent["no_worker"] == workers.NO_WORKER
    # /healthz counts the waiting round: no worker at all is an outage
    assert workers.waiting_jobs() == {"annotation.InteractiveRound": 1}
    health = client.get("/healthz")
    assert health.status_code == 503 and health.json()["workers"] == {"ok": False, "alive": 0}
    workers.beat("jobs@host", ["celery", "gpu"])  # alive, but not on the rounds' queue
    assert client.get(state).json()["no_worker"] == workers.NO_WORKER
    workers.beat("iact@host", ["interactive"])
    assert client.get(state).json()["no_worker"] == ""
    workers.gone("iact@host")
    assert client.get(state).json()["no_worker"] == workers.NO_WORKER
