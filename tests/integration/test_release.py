"""A release (manage.py release / the staff button): croissant.json read back by mlcroissant,
the dataset card's numbers equal to the study's report, byte-identical re-runs."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from django.core.management import call_command

from annotation.agreement.reports import default_bootstrap, study_report
from annotation.release.croissant import PLACEHOLDER
from annotation.release.files import RELEASE_JSON, SUMS, TIMESTAMP_FIELD
from annotation.release.names import public_spec
from tests.integration.test_report_export import build_twelve

pytestmark = pytest.mark.django_db


def sums(path: Path) -> dict[str, str]:
    return {name: digest for digest, name in (line.split("  ", 1) for line in (path / SUMS).read_text().splitlines())}


def jsonl(paths: list[Path]) -> list[dict]:
    return [json.loads(line) for p in paths for line in p.read_text(encoding="utf-8").splitlines() if line]


def _plain(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    return value


def croissant_records(path: Path, monkeypatch) -> dict[str, list[dict]]:
    """Every RecordSet of croissant.json as mlcroissant reads it: local files only (any
    connection attempt fails the test), no validation warning."""
    import socket

    import mlcroissant as mlc

    def no_network(*args, **kwargs):
        raise AssertionError("mlcroissant tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    ds = mlc.Dataset(jsonld=str(path / "croissant.json"))
    assert not ds.metadata.ctx.issues.errors, ds.metadata.ctx.issues.report()
    assert not ds.metadata.ctx.issues.warnings, ds.metadata.ctx.issues.report()
    out = {}
    for rs in ds.metadata.record_sets:
        prefix = rs.id + "/"
        out[rs.id] = [{k[len(prefix) :]: _plain(v) for k, v in rec.items()} for rec in ds.records(record_set=rs.id)]
    return out


def expected_mbeir(path: Path, folder: str) -> dict[str, list[dict]]:
    """The records each RecordSet must give, read straight from the JSONL (in the FileSet's path order)."""
    root = path / folder / "mbeir"
    files = sorted(p for p in root.rglob("*.jsonl") if not p.name.endswith(".trace.jsonl"))
    traces = sorted(p for p in root.rglob("*.trace.jsonl"))
    q, t = jsonl(files), jsonl(traces)
    pre = f"{folder}/mbeir/"
    return {
        pre + "queries": [
            {
                k: line[k]
                for k in ("qid", "query_txt", "query_img_path", "query_modality", "query_src_content", "task_id")
            }
            for line in q
        ],
        pre + "targets": [{k: line[k] for k in ("qid", "pos_cand_list", "neg_cand_list")} for line in q],
        pre + "verdicts": [
            {
                "qid": x["qid"],
                "item": x["item"],
                "dataset": x["dataset"],
                "subset": x["subset"],
                "hidden_category": x["hidden_category"],
                "status": x["consensus"]["status"],
                "policy": x["consensus"]["policy"],
                "n_votes": x["consensus"]["n_votes"],
                "valid_votes": x["consensus"]["valid_votes"],
            }
            for x in t
        ],
        pre + "alternatives": [
            {
                "qid": x["qid"],
                "images": [p["image"] for p in x["positives"]],
                "sources": [p["source"] for p in x["positives"]],
            }
            for x in t
        ],
    }


def test_release_of_the_small_study(tmp_path, monkeypatch) -> None:
    study, _ = build_twelve()
    out = io.StringIO()
    call_command(
        "release",
        "--study",
        str(study.pk),
        "--out",
        str(tmp_path / "r1"),
        "--layout",
        "mbeir",
        "--layout",
        "circo",
        stdout=out,
    )
    text = out.getvalue()
    assert "rai:personalSensitiveInformation" in text and "rai:dataReleaseMaintenancePlan" in text
    root = tmp_path / "r1"
    assert (tmp_path / "r1.zip").is_file()
    folder = f"study-{study.pk}"
    for name in (
        "README.md",
        "croissant.json",
        RELEASE_JSON,
        SUMS,
        f"{folder}/agreement.json",
        f"{folder}/agreement.csv",
        f"{folder}/mbeir/manifest.json",
        f"{folder}/circo/manifest.json",
    ):
        assert (root / name).is_file(), name
    # every checksum is right
    import hashlib

    for name, digest in sums(root).items():
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest, name
    # mlcroissant reads back every record of the JSONL
    got = croissant_records(root, monkeypatch)
    want = expected_mbeir(root, folder)
    for rs, records in want.items():
        assert got[rs] == records, rs
    assert len(got[f"{folder}/mbeir/queries"]) == 6
    circo = [c for p in sorted((root / folder / "circo").rglob("*.circo.json")) for c in json.loads(p.read_text())]
    assert got[f"{folder}/circo/circo_queries"] == [
        {k: c[k] for k in ("id", "relative_caption", "shared_concept")} for c in circo
    ]
    assert len(circo) == 6
    # the card's numbers are the report's
    report = study_report(study, pseudonymise=True, n_boot=default_bootstrap(study), seed=0)
    card = (root / "README.md").read_text()
    assert f"* Validated: {report['consensus']['status']['validated']} " in card
    assert f"* Items in the study: {report['study']['items']} " in card
    alpha = report["agreement"]["krippendorff_alpha"]
    assert f"krippendorff alpha {alpha:.3f}" in card
    assert PLACEHOLDER in card and "## Licence and citation" in card and "CC BY-NC 4.0" in card
    meta = json.loads((root / "croissant.json").read_text())
    objects = {d["contentUrl"]: d["sha256"] for d in meta["distribution"] if d["@type"] == "cr:FileObject"}
    assert set(objects) == set(sums(root)) - {"croissant.json", RELEASE_JSON}
    assert all(sums(root)[name] == digest for name, digest in objects.items())
    assert meta["rai:personalSensitiveInformation"].startswith(PLACEHOLDER)
    assert f"{alpha:.3f}" in meta["rai:dataAnnotationAnalysis"]
    # reproducible: a second release of the same study differs only in released_at
    call_command(
        "release",
        "--study",
        str(study.pk),
        "--out",
        str(tmp_path / "r2"),
        "--layout",
        "mbeir",
        "--layout",
        "circo",
        stdout=io.StringIO(),
    )
    a, b = sums(root), sums(tmp_path / "r2")
    assert a.keys() == b.keys()
    assert {k for k in a if a[k] != b[k]} <= {RELEASE_JSON}
    ra, rb = (json.loads((p / RELEASE_JSON).read_text()) for p in (root, tmp_path / "r2"))
    ra.pop(TIMESTAMP_FIELD), rb.pop(TIMESTAMP_FIELD)
    assert ra == rb and re.fullmatch(r"[0-9a-f]{40}|unknown", ra["cirval_commit"])
    assert ra["studies"][0]["rubric"] == {"key": study.rubric.key, "version": study.rubric.version}


def test_release_button_runs_a_job(client, tmp_path, settings, django_capture_on_commit_callbacks) -> None:
    """The staff button queues a ReleaseJob (nothing is built in the request); a worker (here
    eager Celery) builds it; its page, status, files and zip are staff-only."""
    from annotation.models import ReleaseJob
    from config import celery_app
    from tests.integration.test_report_export import make_user

    study, _ = build_twelve()
    settings.EXPORT_DIR = tmp_path / "exports"
    staff, researcher = make_user("boss", None, staff=True), make_user("rita", "researcher")
    client.force_login(staff)
    page = client.get(f"/studies/{study.pk}/progress/").content.decode()
    assert f'action="/studies/{study.pk}/release/"' in page
    before = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    try:
        with django_capture_on_commit_callbacks(execute=True):
            resp = client.post(f"/studies/{study.pk}/release/", {"layout": ["mbeir", "circo"]})
    finally:
        celery_app.conf.task_always_eager = before
    job = ReleaseJob.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/releases/{job.pk}/"
    job.refresh_from_db()
    assert job.status == "done", job.error
    assert job.layouts == ["mbeir", "circo"] and "croissant.json" in job.files
    status = client.get(f"/releases/{job.pk}/status/").json()
    assert status["percent"] == 100 and any(
        p.startswith("rai:personalSensitiveInformation") for p in status["report"]["placeholders"]
    )
    html = client.get(f"/releases/{job.pk}/").content.decode()
    assert "Fill in before publishing" in html and job.zip_name in html
    assert job.path not in json.dumps(status) and job.path not in html  # the folder's name, never the server path
    zipped = client.get(f"/releases/{job.pk}/zip")
    import zipfile

    body = io.BytesIO(b"".join(zipped.streaming_content))
    names = zipfile.ZipFile(body).namelist()
    assert zipped.status_code == 200 and f"{Path(job.path).name}/croissant.json" in names
    card = client.get(f"/releases/{job.pk}/files/README.md")
    assert card.status_code == 200 and b"## Dataset summary" in b"".join(card.streaming_content)
    assert client.get(f"/releases/{job.pk}/files/../../secret").status_code == 404
    # a session layout for a category study is refused with a message, not a job
    resp = client.post(f"/studies/{study.pk}/release/", {"layout": ["circled"]})
    assert resp.status_code == 302 and ReleaseJob.objects.count() == 1
    client.force_login(researcher)
    for url in (
        f"/releases/{job.pk}/",
        f"/releases/{job.pk}/status/",
        f"/releases/{job.pk}/zip",
        f"/releases/{job.pk}/files/README.md",
    ):
        assert client.get(url).status_code == 403, url
    assert client.post(f"/studies/{study.pk}/release/").status_code == 403


def test_release_of_the_demo_from_the_command_line(
    db, tmp_path, settings, demo_images, demo_embeddings, monkeypatch
) -> None:
    """The demo's two studies in one release (M-BEIR + CIRCLED): the card's audit and study
    numbers are the audit report's and the study report's; mlcroissant reads back the
    sessions, their turns and the verdicts."""
    import random

    from annotation.assignment import queue as engine
    from annotation.models import Assignment, Study, StudyItem
    from audit.labels import LABELS, label_shares
    from audit.models import AuditRun
    from audit.report import audit_report_json
    from tests.integration.test_report_export import judge

    settings.IMAGE_ROOTS = [demo_images.resolve()]
    settings.EMBEDDING_CACHE_DIR = demo_embeddings
    call_command("make_demo", "--images-dir", str(demo_images), verbosity=0, stdout=io.StringIO())
    validity, sessions = Study.objects.get(name="demo-validity"), Study.objects.get(name="demo-sessions")
    rng = random.Random(5)
    for item in StudyItem.objects.filter(study=validity).order_by("id"):
        for user in validity.annotators.order_by("username"):
            judge(validity, item, user, rng.choice(["V", "V", "V", "TEXT", "BROAD"]))
    for item in StudyItem.objects.filter(study=sessions).order_by("id").select_related("query")[:6]:
        for user in list(sessions.annotators.order_by("username"))[:2]:
            a = Assignment.objects.create(study=sessions, item=item, annotator=user, status="reserved")
            engine.submit(
                a,
                {
                    "scales": {
                        "naturalness": 3,
                        "coherence": 3,
                        "goal_progress": 3,
                        "low_redundancy": 3,
                        "overall": rng.choice([2, 4, 5]),
                    },
                    "per_turn_checks": [
                        {"real_difference_toward_target": True, "consistent_with_history": True, "valid": True}
                    ]
                    * item.query.n_turns,
                    "time_spent_ms": 1000,
                },
            )
    root = tmp_path / "demo-release"
    printed = io.StringIO()
    call_command(
        "release",
        "--study",
        str(validity.pk),
        "--study",
        str(sessions.pk),
        "--out",
        str(root),
        "--layout",
        "mbeir",
        "--layout",
        "circled",
        stdout=printed,
    )
    # the demo's source licence and citation are unknown to CIRVal: the command says so
    assert "license: the source dataset's licence of demo" in printed.getvalue()
    assert "citeAs: the source dataset's citation of demo" in printed.getvalue()
    card = (root / "README.md").read_text()
    run = AuditRun.objects.get(pk=validity.pool["audit_runs"]["demo"])
    audit = audit_report_json(run)
    audited = sum(audit["counts"][label] for label in LABELS)
    assert audited > 0 and f"* Audit of `demo`: {audited} queries audited at K={run.k}" in card
    for label, share in label_shares(audit["counts"]).items():
        assert f"  * {label}: {audit['counts'][label]} ({share * 100:.1f}%)" in card
    for study in (validity, sessions):
        report = study_report(study, pseudonymise=True, n_boot=default_bootstrap(study), seed=0)
        assert f"* Validated: {report['consensus']['status']['validated']} " in card
    from annotation.agreement.reports import annotator_pseudonyms
    from annotation.alternatives.study import alternatives_report

    alts = alternatives_report(validity, annotator_pseudonyms(validity), n_boot=default_bootstrap(validity), seed=0)
    mean = alts["accepted_per_query"]["mean"]
    assert (
        f"Alternatives added per query: mean {mean if mean is None else round(mean, 3)} over "
        f"{alts['accepted_per_query']['n_items']} judged queries" in card
    )
    report = study_report(validity, pseudonymise=True, n_boot=default_bootstrap(validity), seed=0)
    a = report["agreement"]
    iv = a["confidence_intervals"]["intervals"]["krippendorff_alpha"]
    assert f"krippendorff alpha {a['krippendorff_alpha']:.3f} (95% CI {iv['low']:.3f} to {iv['high']:.3f})" in card
    release = json.loads((root / RELEASE_JSON).read_text())
    assert {r["spec"] for r in release["retrievers"]} == {public_spec(s) for s in run.retrievers}
    assert all(
        len(r["checkpoint_sha256"]) == 64 and r["spec"].endswith("@" + r["checkpoint"]) for r in release["retrievers"]
    )  # named by file name and sha256, never the server path
    got = croissant_records(root, monkeypatch)
    want = expected_mbeir(root, f"study-{validity.pk}")
    for rs, records in want.items():
        assert got[rs] == records, rs
    base = root / f"study-{sessions.pk}" / "circled"
    records = [
        r
        for p in sorted(p for p in base.rglob("*.json") if p.name != "manifest.json")
        for r in json.loads(p.read_text())
    ]
    pre = f"study-{sessions.pk}/circled/"
    assert records and got[pre + "sessions"] == [
        {k: r[k] for k in ("session_id", "subset", "num_turns")} for r in records
    ]
    assert got[pre + "turns"] == [
        {k: t[k] for k in ("turn", "reference_image_id", "relative_caption")} for r in records for t in r["turns"]
    ]
    traces = jsonl(sorted(base.rglob("*.trace.jsonl")))
    assert [v["qid"] for v in got[pre + "verdicts"]] == [t["qid"] for t in traces]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_release_runs_on_a_real_worker(client, worker_factory, tmp_path, settings) -> None:
    """The button's release goes through the broker to a real ``celery worker`` process."""
    import shutil

    from annotation.models import ReleaseJob
    from tests.conftest import wait_for
    from tests.integration.test_report_export import make_user

    study, _ = build_twelve()
    client.force_login(make_user("boss", None, staff=True))
    resp = client.post(f"/studies/{study.pk}/release/", {"layout": ["mbeir"]})
    job = ReleaseJob.objects.get()
    assert resp.status_code == 302 and job.status == "queued"
    worker = worker_factory(queues="celery").start("release")

    def finished():
        job.refresh_from_db()
        return job.status in ("done", "failed")

    wait_for(finished, timeout=180, what=f"the worker to run the release\n{worker.log()}")
    try:
        assert job.status == "done", job.error
        assert "annotation.run_release" in worker.log()
        assert client.get(f"/releases/{job.pk}/status/").json()["percent"] == 100
        root = Path(job.path)
        assert json.loads((root / f"study-{study.pk}/mbeir/manifest.json").read_text())["counts"]["validated"] == 6
        assert sums(root).keys() == set(job.files) - {SUMS}
        assert (root.parent / job.zip_name).is_file()
    finally:
        if job.path:
            shutil.rmtree(job.path, ignore_errors=True)
            Path(job.path + ".zip").unlink(missing_ok=True)
