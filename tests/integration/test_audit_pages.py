"""Audit pages: researchers and staff only, live progress, the report with inline SVG charts."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from audit.forms import DEFAULT_POOL, default_pool
from audit.models import AuditRun
from retrieval.models import Dataset, Query, QuerySubset
from tests.conftest import FIXTURES
from tests.integration.test_audit_import import tiny  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db

DIR = FIXTURES / "circus_audit"


@pytest.fixture
def done_run(tiny):  # noqa: F811
    call_command(
        "import_ranks",
        "--dataset",
        "tiny",
        str(DIR / "retrieval_data_tiny_task7_alpha.json"),
        str(DIR / "retrieval_data_tiny_task7_beta.json"),
        stdout=StringIO(),
        stderr=StringIO(),
    )
    return AuditRun.objects.get()


def login(client, accounts, who):
    assert client.login(username=who, password=accounts[who])


def test_anonymous_is_sent_to_login(client, done_run):
    for url in ("/audits/", f"/audits/{done_run.pk}/", f"/audits/{done_run.pk}/status/", "/audits/new/"):
        resp = client.get(url)
        assert resp.status_code == 302 and "/login/" in resp["Location"], url


def test_annotator_gets_403(client, demo_accounts, done_run):
    login(client, demo_accounts, "annotator1")
    for url in ("/audits/", f"/audits/{done_run.pk}/", f"/audits/{done_run.pk}/status/", "/audits/new/"):
        assert client.get(url).status_code == 403, url
    assert client.post("/audits/new/", {"dataset": "tiny"}).status_code == 403


def test_researcher_sees_the_report(client, demo_accounts, done_run):
    login(client, demo_accounts, "researcher")
    listing = client.get("/audits/")
    assert listing.status_code == 200
    html = listing.content.decode()
    # Table 1 row of the latest finished audit: tiny, 6 queries, 2 / 1 / 3, shortcut-free 3
    row = re.search(r"<tr><td>tiny</td>.*?</tr>", html, re.S).group(0)
    assert [int(x) for x in re.findall(r'class="num">(\d+)<', row)] == [6, 2, 1, 3, 3]
    assert "New audit" not in html  # staff only

    page = client.get(f"/audits/{done_run.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    counts = re.search(r'<tr id="label-counts">.*?</tr>', html, re.S).group(0)
    assert [int(x) for x in re.findall(r'class="num">(\d+)<', counts)] == [6, 2, 1, 3, 3]
    svgs = re.findall(r"<svg.*?</svg>", html, re.S)
    assert len(svgs) == 3  # CompGap on nDCG and on MRR, support histogram
    for svg in svgs:
        ET.fromstring(svg)  # well-formed, inline (no external chart library)
    assert "Composition Gap on nDCG" in html and "How many retrievers solve each query" in html
    assert "Shortcut-free subset" in html and "Validated subset" not in html
    assert "0.667" in html  # alpha's and beta's multimodal Recall@10 (4 of 6)
    assert "cirval/jobs.js" not in html  # finished: nothing to poll

    status = client.get(f"/audits/{done_run.pk}/status/").json()
    assert status["status"] == "done" and status["percent"] == 100
    assert status["counts"]["composition_required"] == 2


def test_validated_subset_is_scored_when_present(client, demo_accounts, done_run):
    dataset = Dataset.objects.get(name="tiny")
    subset = QuerySubset.objects.create(dataset=dataset, name="validated", source="study 1 export")
    subset.queries.set(Query.objects.filter(dataset=dataset, ordinal__in=[1, 4]))  # the composition_required ones
    login(client, demo_accounts, "researcher")
    html = client.get(f"/audits/{done_run.pk}/").content.decode()
    assert "Validated subset" in html and "(2 queries)" in html
    # on these two, alpha's multimodal ranks are 5 and 15: Recall@10 = 0.5
    section = html.split("Validated subset", 1)[1].split("</section>", 1)[0]
    assert "0.500" in section


def test_running_audit_shows_progress_and_polls(client, demo_accounts, tiny, monkeypatch):  # noqa: F811
    started = timezone.now() - timezone.timedelta(seconds=60)
    run = AuditRun.objects.create(
        dataset=Dataset.objects.get(name="tiny"),
        split="test",
        retrievers=["openclip:cirval-tiny-vit"],
        status="running",
        planned=True,
        done=30,
        total=120,
        started_at=started,
    )
    # The clock stands still 10 s after the start: a quarter done in 10 s leaves exactly 30 s.
    monkeypatch.setattr(timezone, "now", lambda: started + timezone.timedelta(seconds=10))
    login(client, demo_accounts, "researcher")
    html = client.get(f"/audits/{run.pk}/").content.decode()
    assert 'id="job-progress" max="100" value="25"' in html
    assert "cirval/jobs.js" in html
    status = client.get(f"/audits/{run.pk}/status/").json()
    assert status["percent"] == 25 and status["done"] == 30 and status["total"] == 120
    assert status["eta_seconds"] == 30.0


def test_staff_starts_an_audit(client, demo_accounts, tiny, django_capture_on_commit_callbacks, tmp_path):  # noqa: F811
    login(client, demo_accounts, "admin")
    assert client.get("/audits/").content.decode().count("New audit") >= 1
    assert client.get("/audits/new/").status_code == 200
    bad = client.post(
        "/audits/new/", {"dataset": "tiny", "retrievers": "openclip:no-such-model", "k": 10, "min_mm_retrievers": 1}
    )
    assert bad.status_code == 200 and "unknown open_clip model" in bad.content.decode()
    notes = tmp_path / "weights.pt"
    notes.write_text("my notes, not weights")  # an existing file that no loader reads
    bad = client.post(
        "/audits/new/",
        {"dataset": "tiny", "retrievers": f"openclip:cirval-tiny-vit@{notes}", "k": 10, "min_mm_retrievers": 1},
    )
    assert bad.status_code == 200 and "not a checkpoint open_clip can load" in bad.content.decode()
    assert not AuditRun.objects.exists()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        resp = client.post(
            "/audits/new/",
            {
                "dataset": "tiny",
                "split": "",
                "retrievers": "openclip:cirval-tiny-vit\n\nopenclip:cirval-tiny-vit-b\n",
                "k": 5,
                "min_mm_retrievers": 2,
                "exclude_reference": "on",
            },
        )
    run = AuditRun.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/audits/{run.pk}/"
    assert (run.split, run.k, run.min_mm_retrievers, run.exclude_reference) == ("test", 5, 2, True)
    assert run.retrievers == ["openclip:cirval-tiny-vit", "openclip:cirval-tiny-vit-b"]
    assert run.status == "queued" and run.created_by.username == "admin"
    assert len(callbacks) == 1  # the coordinator is sent once the run is committed
    # both tiny configurations name no weights: the page says their ranks mean nothing
    page = client.get(f"/audits/{run.pk}/").content.decode()
    assert page.count(">random weights<") == 2 and "2 of the 2 retrievers name no weights" in page
    # the run records its modality rule (the setting's, from the form), and the page names it
    assert run.summary["modality_rule"] == "family" and "Unimodal queries</dt><dd>each retriever family" in page
    # the next form starts from the newest finished computed audit's pool, else the tiny ones
    assert default_pool() == DEFAULT_POOL
    AuditRun.objects.filter(pk=run.pk).update(status="done", retrievers=["openclip:ViT-B-32@/m/a.pt"])
    assert default_pool() == "openclip:ViT-B-32@/m/a.pt"
    assert "openclip:ViT-B-32@/m/a.pt</textarea>" in client.get("/audits/new/").content.decode()


def test_researcher_cannot_start_an_audit(client, demo_accounts, tiny):  # noqa: F811
    login(client, demo_accounts, "researcher")
    assert client.get("/audits/new/").status_code == 403
    assert (
        client.post(
            "/audits/new/",
            {"dataset": "tiny", "retrievers": "openclip:cirval-tiny-vit", "k": 10, "min_mm_retrievers": 1},
        ).status_code
        == 403
    )
    assert not AuditRun.objects.exists()


def test_report_shows_map_at_k_beside_recall_and_states_the_tie_rule(client, demo_accounts, done_run):
    login(client, demo_accounts, "researcher")
    html = client.get(f"/audits/{done_run.pk}/").content.decode()
    table = re.search(r'<table class="data scores multi-target" id="multi-full">.*?</table>', html, re.S).group(0)
    assert "mAP@5" in table and "mAP@50" in table and "nDCG (graded)" in table
    first = re.search(r"<tr><td><code>alpha</code></td><td>multimodal</td>.*?</tr>", table, re.S).group(0)
    values = [float(x) for x in re.findall(r'class="num">([0-9.]+)<', first)]
    # alpha's multimodal ranks 2, 5, 12, 1, 15, 4 (one target each): Recall@10 4/6,
    # mAP@5 = mAP@10 = (1/2 + 1/5 + 1 + 1/4) / 6, mAP@25 = mAP@50 adds 1/12 and 1/15
    assert values[:5] == [0.667, 0.325, 0.325, 0.35, 0.35]
    assert "Recall<sub>subset</sub>" not in table  # no CIRR image sets in this dataset
    rules = re.search(r'<section class="card" id="rank-rules">.*?</section>', html, re.S).group(0)
    assert "Ties are pessimistic" in rules and "1 + the number of other gallery images" in rules
    assert "the qrels positives" in rules  # the tiny dataset is in M-BEIR format
