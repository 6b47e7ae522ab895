"""make_demo as the README runs it: world, audit, studies, accounts; deterministic."""

from __future__ import annotations

import hashlib
import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from annotation.assignment import queue as engine
from annotation.judging.payloads import item_payload
from annotation.models import Study, StudyItem
from audit.labels import audit_json, label_queries
from audit.models import AuditRun
from retrieval.demo_training import CHECKPOINT_VERSION
from retrieval.models import Dataset, QuerySubset
from retrieval.stats import dataset_stats

pytestmark = pytest.mark.django_db


def _pretrain(tmp_path, settings) -> dict:
    """Tiny demo checkpoints where make_demo looks for them (a real run trains for minutes)."""
    settings.VAR_DIR = tmp_path / "var"
    settings.DEMO_MODELS_DIR = models = tmp_path / "models"
    call_command("train_demo_retriever", "--steps", "2", "--no-progress", stdout=StringIO())
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(models.glob("*.pt"))}


def test_make_demo_builds_audits_and_opens_studies(tmp_path, settings):
    settings.IMAGE_ROOTS = [tmp_path.resolve()]
    trained = _pretrain(tmp_path, settings)
    assert sorted(trained) == [f"cirval-demo-{name}-v{CHECKPOINT_VERSION}-s7.pt" for name in ("caption", "compose")]
    out = StringIO()
    call_command("make_demo", "--images-dir", str(tmp_path / "demo"), stdout=out)
    text = out.getvalue()
    # the existing checkpoints were reused, not trained again, and audited the demo
    models = settings.DEMO_MODELS_DIR
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(models.glob("*.pt"))} == trained
    run = AuditRun.objects.get(dataset__name="demo", status="done")
    assert run.retrievers == [
        f"openclip:cirval-demo@{(models / n).resolve()}"
        for n in (
            f"cirval-demo-compose-v{CHECKPOINT_VERSION}-s7.pt",
            f"cirval-demo-caption-v{CHECKPOINT_VERSION}-s7.pt",
        )
    ]
    assert "exists" in text or "Training" not in text
    # the truth file is under var/, not under the served image root
    truth = json.loads((settings.VAR_DIR / "demo" / "demo.truth.json").read_text())
    assert not list(tmp_path.joinpath("demo").rglob("*truth*"))
    for line in ("admin", "annotator1", "annotator2", "annotator3", "researcher", "password"):
        assert line in text
    s = dataset_stats(Dataset.objects.get(name="demo"))
    assert s["images"] >= 900 and s["single_turn"] >= 150 and s["multi_turn"] >= 40 and s["missing_images"] == 0
    assert set(s["turns_histogram"]) >= {"1", "2", "3", "4", "5"}
    assert len(list((tmp_path / "demo").rglob("*.png"))) == s["images"]

    # the audit labelled every single-turn query; the validity study is the shortcut-free part
    free = QuerySubset.objects.get(dataset__name="demo", name="shortcut_free").queries.count()
    study = Study.objects.get(name="demo-validity")
    assert study.items.count() == free > 0
    assert set(study.items.values_list("hidden_category", flat=True)) <= {"composition_required", "unresolved"}
    assert Study.objects.get(name="demo-sessions").items.count() == s["multi_turn"]

    # annotators get the fixed-size candidate panel, never the label nor the serving rule
    user = get_user_model().objects.get(username="annotator1")
    payload = item_payload(engine.next_assignment(study, user).assignment)
    assert len(payload["panel"]) == study.candidates == 50
    body = json.dumps(payload)
    assert "served_by" not in body and "staff" not in payload
    assert "composition_required" not in body and "unresolved" not in body

    # the session filmstrip shows the target's rank after each turn only when the study is not blind
    sessions = Study.objects.get(name="demo-sessions")
    served = engine.next_assignment(sessions, user).assignment
    assert sessions.blind and all(t["rank"] is None for t in item_payload(served)["query"]["turns"])
    sessions.blind = False
    sessions.save()
    turns = item_payload(served)["query"]["turns"]
    assert len(turns) >= 2 and any(t["rank"] for t in turns)
    assert all(t["rank"] is None or t["rank"] >= 1 for t in turns)

    # running it again changes nothing
    before = dataset_stats(Dataset.objects.get(name="demo"))
    call_command("make_demo", "--images-dir", str(tmp_path / "demo"), stdout=StringIO())
    assert dataset_stats(Dataset.objects.get(name="demo")) == before
    assert Study.objects.filter(name__startswith="demo-").count() == 3
    interactive = Study.objects.get(name="demo-interactive")  # sessions written by people, over the audit's retriever
    assert interactive.interactive["retriever"] in AuditRun.objects.get(dataset__name="demo").retrievers
    assert (interactive.interactive["top_n"], interactive.interactive["max_rounds"]) == (10, 5)

    # audit_report prints what audit_labels would print for the run's stored ranks
    report = StringIO()
    call_command("audit_report", "--dataset", "demo", "--format", "json", stdout=report)
    got = json.loads(report.getvalue())
    assert set(got) == {"counts", "detail_counts", "labels", "retrievers", "protocol"}
    from audit.protocol import run_protocol

    assert got["protocol"] == json.loads(json.dumps(run_protocol(run)))  # the demo has no published protocol: null
    assert got["counts"] == run.summary["counts"] and got["detail_counts"] == run.summary["detail_counts"]
    assert set(got["labels"]) <= set(truth["queries"]) and len(got["labels"]) == run.summary["n_queries"]
    assert set(got["retrievers"]) == set(run.retrievers)
    from audit.models import AuditRank

    rows = [
        (q, r, mm, t, i)
        for q, r, mm, t, i in AuditRank.objects.filter(run=run)
        .order_by("query__ordinal", "query_id")
        .values_list("query__external_id", "retriever", "mm", "text", "image")
    ]
    expected = json.loads(json.dumps(audit_json(label_queries(rows, k=run.k, min_mm_retrievers=run.min_mm_retrievers))))
    assert got["counts"] == expected["counts"] and got["labels"] == expected["labels"]
    by_run = StringIO()
    call_command("audit_report", "--run", str(run.pk), "--format", "json", stdout=by_run)
    assert json.loads(by_run.getvalue()) == got

    # demo_check compares the labels with the truth file, kind by kind
    check = StringIO()
    call_command("demo_check", "--format", "json", stdout=check)
    result = json.loads(check.getvalue())
    planted = {k: sum(1 for q in got["labels"] if truth["queries"][q]["kind"] == k) for k in result["audit"]}
    assert {k: v["planted"] for k, v in result["audit"].items()} == planted
    assert planted["text_only"] > 0 and planted["image_only"] > 0 and "human" not in result
    # and the labour figures (issue 25: bench/labour.py's simulated crowd on this truth)
    labour = result["labour"]
    fixed, adaptive, ds = labour["strategies"]
    assert fixed["judgements"] == 3 * labour["items"] * labour["repeats"]
    assert (
        ds["judgements"] < adaptive["judgements"] < fixed["judgements"]
    )  # a third only where the weights leave a split uncertain
    assert all(0.5 < r["validated_accuracy"] <= 1 for r in labour["strategies"])
    assert all(figures["spent"] == 0 for figures in labour["studies"].values())
    # and the pool's recall of the images that fit (issue 25): over the study's stored panels
    pool = result["pool"]
    study_items = StudyItem.objects.filter(study__name="demo-validity").exclude(candidates_source="")
    assert pool["queries"] == study_items.count() and pool["panel_size"] == 50
    assert pool["by_kind"]["too_broad"]["fitting"] >= 3 * pool["by_kind"]["too_broad"]["queries"] > 0
    assert pool["fitting"] == sum(k["fitting"] for k in pool["by_kind"].values())
    assert pool["recall"] == pool["found"] / pool["fitting"]
    audited = pool["audited"]  # the same panel function over every audited single-turn query
    assert audited["queries"] == AuditRank.objects.filter(run=run).values("query").distinct().count()
    assert audited["by_kind"]["too_broad"] == {**audited["by_kind"]["too_broad"], "queries": 12, "fitting": 145}
    # beside it, what an annotator following the page's rules reaches of them (issue 39, item 1)
    reach = pool["reachable"]
    assert reach["fitting"] == pool["fitting"] and reach["found"] <= pool["found"]
    assert audited["reachable"]["found"] <= audited["found"]
    text = StringIO()
    call_command("demo_check", stdout=text)
    assert (
        f"pool recall ({pool['queries']} queries with a panel, up to 50 candidates): {pool['found']} of "
        f"{pool['fitting']} fitting images" in text.getvalue()
    )
    assert (
        f"reachable recall (ticking every fitting image shown, no page opened at will): {reach['found']} of "
        f"{pool['fitting']}" in text.getvalue()
    )
