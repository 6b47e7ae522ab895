"""The audit report's Sessions section on the demo world: curves, metric and filter tables."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from django.template.defaultfilters import floatformat

from audit.models import AuditRun
from audit.runs import dispatch, planning
from audit.runs.encoding import clear_memos
from retrieval.models import Dataset, Query

pytestmark = pytest.mark.django_db

NS = "{http://www.w3.org/2000/svg}"
FILTERS = ("success", "multi-turn", "epsilon-consistency", "tau-diversity")


@pytest.fixture
def demo_run(demo_db) -> AuditRun:
    """The demo's audit, made once for this module (tests/conftest.py demo_db); each test's own
    writes (more runs, edited splits) roll back."""
    clear_memos()
    yield AuditRun.objects.get(dataset__name="demo")
    clear_memos()


def login(client, accounts, who):
    assert client.login(username=who, password=accounts[who])


def section(html: str) -> str:
    return re.search(r'<section class="card" id="sessions">.*?</section>', html, re.S).group(0)


def test_demo_report_shows_the_session_curves_and_the_filter_table(client, demo_accounts, demo_run):
    run = demo_run
    assert run.status == "done", run.error
    ses = run.summary["sessions"]
    assert ses["n_sessions"] == 48  # every demo session is scored
    login(client, demo_accounts, "researcher")
    html = client.get(f"/audits/{run.pk}/").content.decode()
    part = section(html)
    assert "Sessions" in part and "(48 scored of 48 multi-turn queries)" in part

    # one chart of Hits@10 curves per retriever: three panels (modalities), three lines (strategies)
    svgs = re.findall(r"<svg.*?</svg>", part, re.S)
    assert len(svgs) == len(run.retrievers) + 1  # + the turn-length histogram
    for name, svg in zip(run.retrievers, svgs):
        root = ET.fromstring(svg)
        title = root.find(f"{NS}title").text
        assert name in title and "Hits@10" in title
        texts = [t.text for t in root.iter(f"{NS}text")]
        for word in ("latest", "average", "weighted", "multimodal", "text only", "image only", "turn l", "Hits@10"):
            assert word in texts, word
        assert len(root.findall(f"{NS}polyline")) == 9
        # every point has a tooltip with its value; the curve of the first panel's first series
        tips = [el.find(f"{NS}title").text for el in root if el.find(f"{NS}title") is not None]
        hits = ses["metrics"][name]["latest"]["multimodal"]["hits_at_k"]
        for turn, h in enumerate(hits, 1):
            assert f"multimodal · latest · turn l {turn}: {floatformat(h, 3)}" in tips
    hist = ET.fromstring(svgs[-1])
    assert "Sessions by number of turns" in hist.find(f"{NS}title").text

    # Final Recall@10 / AUC table: one row per retriever x strategy, 3 + 3 + 3 numbers
    table = re.search(r'<table class="data scores" id="session-metrics">.*?</table>', part, re.S).group(0)
    body = table.split("<tbody>", 1)[1]
    rows = re.findall(r"<tr>.*?</tr>", body, re.S)
    assert len(rows) == len(run.retrievers) * 3
    first = ses["metrics"][run.retrievers[0]]["latest"]
    cells = re.findall(r'class="num">([^<]*)<', rows[0])
    # the stored figure as the site writes numbers (Django's floatformat rounds a half up: 0.0625 is
    # "0.063", where Python's format rounds it to even)
    assert cells[0] == floatformat(first["multimodal"]["final_recall_at_k"], 3)
    assert cells[3].strip() == floatformat(first["multimodal"]["auc"], 3)
    # beside it, in brackets, the plain mean of the curve (CIRCLED's released code)
    hits = first["multimodal"]["hits_at_k"]
    assert re.search(r'class="num">[^<]*<span class="muted">\(([^)]*)\)', rows[0]).group(1) == floatformat(
        sum(hits) / len(hits), 3
    )

    # the filter table: each filter with removed alone, in sequence and remaining
    filters = re.search(r'<table class="data compact" id="session-filters">.*?</table>', part, re.S).group(0)
    for word in FILTERS:
        assert f"<td>{word}</td>" in filters
    steps = ses["filters"]["steps"]
    for step in steps:
        row = re.search(rf'<tr data-filter="{step["name"]}">.*?</tr>', filters, re.S).group(0)
        nums = [int(x) for x in re.findall(r'class="num">(\d+)<', row)]
        assert nums == [step["removed_alone"], step["removed"], step["remaining"]]
    assert sum(s["removed"] for s in steps) + steps[-1]["remaining"] == 48
    assert f"audit{run.pk}:sessions_kept" in part
    assert "epsilon = 30" in part and "tau = 0.8" in part

    # turn lengths 2..5, 12 sessions each (the demo cycles through the lengths)
    lengths = re.search(r'<table class="data compact" id="session-lengths">.*?</table>', part, re.S).group(0)
    assert re.findall(r'<th class="num">(\d+)</th>', lengths) == ["2", "3", "4", "5"]
    scored = re.search(r"<tr><td>scored sessions</td>.*?</tr>", lengths, re.S).group(0)
    assert re.findall(r'class="num">(\d+)<', scored) == ["12", "12", "12", "12"]


def test_annotators_get_403_and_sessions_only_runs_render(client, demo_accounts, demo_run):
    login(client, demo_accounts, "annotator1")
    assert client.get(f"/audits/{demo_run.pk}/").status_code == 403

    dataset = Dataset.objects.get(name="demo")
    Query.objects.filter(dataset=dataset, n_turns=1).update(split="single")  # split "val": sessions only
    run = dispatch.run_inline(planning.create_run(dataset, [demo_run.retrievers[0]], split="val", tau=0.9, epsilon=12))
    assert run.status == "done", run.error
    client.logout()
    login(client, demo_accounts, "researcher")
    html = client.get(f"/audits/{run.pk}/").content.decode()
    assert "only its multi-turn sessions were audited" in html
    assert "Composition Gap" not in html and "Shortcut-free subset" not in html
    part = section(html)
    assert "epsilon = 12" in part and "tau = 0.9" in part
    assert len(re.findall(r"<svg.*?</svg>", part, re.S)) == 2


def test_staff_sets_the_session_filters_in_the_form(
    client, demo_accounts, demo_run, django_capture_on_commit_callbacks
):
    login(client, demo_accounts, "admin")
    page = client.get("/audits/new/").content.decode()
    for field in ("epsilon", "tau", "tau_encoder"):
        assert f'name="{field}"' in page
    bad = client.post(
        "/audits/new/",
        {
            "dataset": "demo",
            "retrievers": "openclip:cirval-tiny-vit",
            "k": 10,
            "min_mm_retrievers": 1,
            "tau": "1.5",
            "tau_encoder": "openclip:nope",
        },
    )
    text = bad.content.decode()
    assert bad.status_code == 200 and "unknown open_clip model" in text and "less than or equal to 1" in text
    with django_capture_on_commit_callbacks(execute=False):
        resp = client.post(
            "/audits/new/",
            {
                "dataset": "demo",
                "retrievers": "openclip:cirval-tiny-vit",
                "k": 10,
                "min_mm_retrievers": 1,
                "epsilon": "20",
                "tau": "0.85",
                "tau_encoder": "openclip:cirval-tiny-vit-b",
            },
        )
    run = AuditRun.objects.exclude(pk=demo_run.pk).get()
    assert resp.status_code == 302
    assert (run.epsilon, run.tau, run.tau_encoder) == (20.0, 0.85, "openclip:cirval-tiny-vit-b")
    with django_capture_on_commit_callbacks(execute=False):
        client.post(
            "/audits/new/",
            {"dataset": "demo", "retrievers": "openclip:cirval-tiny-vit-b", "k": 10, "min_mm_retrievers": 1},
        )
    default = AuditRun.objects.order_by("-pk").first()
    assert (default.epsilon, default.tau, default.tau_encoder) == (30.0, 0.8, "openclip:cirval-tiny-vit-b")
