"""Issue 10, items 3 to 5: the quorum before export, one agreement engine behind every entry
point, and session studies' consensus, adjudication and CIRCLED export (round trip)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import tempfile
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from sklearn.metrics import cohen_kappa_score

from annotation.agreement.reports import study_agreement, study_triples
from annotation.assignment import queue as engine
from annotation.export.validated import CIRCLED_KEYS, export_study
from annotation.models import Assignment, Study, StudyItem
from annotation.studies.building import StudyError, StudySpec, create_study
from annotation.verdicts.adjudication import adjudicate, adjudication_queue
from annotation.verdicts.state import study_counts
from retrieval.importers import circled
from tests.conftest import FIXTURES
from tests.integration.test_report_export import check_export, judge, make_user

pytestmark = pytest.mark.django_db

SCALES = ("naturalness", "coherence", "goal_progress", "low_redundancy", "overall")
CIRCLED_FILES = sorted((FIXTURES / "datasets/circled").glob("*.json"))


def circo_study(name: str = "q3", overlap: int = 3, quorum: int | None = None, total: int = 4) -> Study:
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    for n in ("ann_x", "ann_y", "ann_z"):
        make_user(n, "annotator")
    study, _ = create_study(
        StudySpec(
            name=name,
            datasets=["circo"],
            overlap=overlap,
            quorum=quorum,
            total=total,
            seed=3,
            annotators=["ann_x", "ann_y", "ann_z"],
        )
    )
    return study


# --------------------------------------------------------------------------- 3. quorum


def test_one_vote_in_an_overlap_3_study_is_pending_and_never_exported(tmp_path, client) -> None:
    study = circo_study()
    assert study.quorum is None and study.decision_quorum == 3  # the default quorum is the overlap
    items = list(StudyItem.objects.filter(study=study).order_by("id"))
    x, y, z = (get_user_model().objects.get(username=n) for n in ("ann_x", "ann_y", "ann_z"))
    judge(study, items[0], x, "V")  # one VALIDATED vote: pending
    judge(study, items[1], x, "V")
    judge(study, items[1], y, "V")  # two of three: still pending
    for user in (x, y, z):
        judge(study, items[2], user, "V")  # quorum reached: validated, unanimous
    manifest = check_export(export_study(study, tmp_path / "e").path)
    counts = manifest["counts"]
    assert (
        counts["validated"],
        counts["rejected"],
        counts["pending"],
        counts["unjudged"],
        counts["adjudicated"],
        counts["awaiting_adjudication"],
    ) == (1, 0, 2, 1, 0, 0)
    assert counts["by_provenance"] == {"unanimous": 1} and counts["exported_lines"] == 1
    traces = [json.loads(line) for f in (tmp_path / "e").rglob("*.trace.jsonl") for line in f.open()]
    assert [t["item"] for t in traces] == [items[2].pk]
    assert traces[0]["consensus"]["n_votes"] == 3 and traces[0]["consensus"]["quorum"] == 3
    # an adjudication decides a pending item; the queue does not list pending items
    assert adjudication_queue(study) == []
    staff = make_user("boss", None, staff=True)
    adjudicate(study, items[0], True, "clear", staff)
    counts = check_export(export_study(study, tmp_path / "f").path)["counts"]
    assert (counts["validated"], counts["adjudicated"], counts["pending"], counts["unjudged"]) == (2, 1, 1, 1)
    # the export page and the progress page warn while items are pending
    client.force_login(staff)
    for url in (f"/studies/{study.pk}/exports/", f"/studies/{study.pk}/progress/"):
        html = client.get(url).content.decode()
        assert 'id="export-pending"' in html and "1 item pending" in html and "1 unjudged" in html, url
    assert (study_counts(study)["pending"], study_counts(study)["unjudged"]) == (1, 1)


def test_quorum_setting_and_honest_provenance(tmp_path) -> None:
    study = circo_study(quorum=1)
    assert study.decision_quorum == 1
    items = list(StudyItem.objects.filter(study=study).order_by("id"))
    x = get_user_model().objects.get(username="ann_x")
    judge(study, items[0], x, "V")
    manifest = check_export(export_study(study, tmp_path / "e").path)
    # one vote decides at quorum 1, and says so: "single", never "unanimous"
    assert manifest["counts"]["by_provenance"] == {"single": 1} and manifest["counts"]["validated"] == 1
    with pytest.raises(StudyError, match="quorum must lie between 1 and the overlap"):
        create_study(StudySpec(name="bad", datasets=["circo"], overlap=2, quorum=3, total=2))
    out = io.StringIO()
    call_command(
        "create_study",
        "--name",
        "cli",
        "--dataset",
        "circo",
        "--overlap",
        "3",
        "--quorum",
        "2",
        "--total",
        "2",
        stdout=out,
    )
    assert Study.objects.get(name="cli").quorum == 2 and "quorum 2" in out.getvalue()


# --------------------------------------------------------------------------- 4. one agreement engine


def session_study(name: str, overlap: int = 2, **spec) -> tuple[Study, list]:
    call_command("import_dataset", "--format", "circled", "--name", "circled", *map(str, CIRCLED_FILES), verbosity=0)
    users = [make_user(n, "annotator") for n in ("ann_a", "ann_b")]
    # session rubric v1: these tests are about its rule (reject flags, median overall score),
    # which studies made under it keep; v2's turn-by-turn rule: tests/integration/test_turn_verdicts.py
    study, _ = create_study(
        StudySpec(
            name=name,
            datasets=["circled"],
            rubric="session@1",
            overlap=overlap,
            seed=1,
            annotators=["ann_a", "ann_b"],
            **spec,
        )
    )
    return study, users


def rate(
    study: Study, item: StudyItem, user, overall: int, rejects: list[str] | None = None, flagged: bool = False
) -> None:
    """One session judgement; under a rubric with a turn verdict (v2) every turn is valid
    when ``overall`` is at least 3, else the last turn is invalid."""
    a = Assignment.objects.create(study=study, item=item, annotator=user, status="reserved")
    verdict = study.rubric.rubric.turn_verdict
    n = item.query.n_turns
    turns = [
        {
            "real_difference_toward_target": True,
            "consistent_with_history": True,
            **({verdict.key: overall >= 3 or t < n - 1} if verdict else {}),
        }
        for t in range(n)
    ]
    engine.submit(
        a,
        {
            "scales": {**{k: 3 for k in SCALES}, "overall": overall},
            "per_turn_checks": turns,
            "reject_flags": rejects or [],
            "flagged": flagged,
            "time_spent_ms": 1000,
        },
    )


def csv_value(rows: list[list[str]], section: str, group: str, key: str) -> float:
    return float(next(r[3] for r in rows if r[:3] == [section, group, key]))


def test_identical_agreement_from_every_entry_point(client, eager_celery) -> None:
    """The issue's example: 1-5 ratings A = [1, 2, 5, 5], B = [2, 2, 5, 1] (3 and 4 unused) gave
    0.000 (headline: observed categories only), 0.292 (per scale: full range) and 0.143 (CLI:
    linear weights). Now every entry point gives Cohen's kappa with quadratic weights over the
    rubric's whole scale 1..5: 7/24 = 0.291666..."""
    study, (a, b) = session_study("iaa")
    items = list(StudyItem.objects.filter(study=study).order_by("id"))[:4]
    A, B = [1, 2, 5, 5], [2, 2, 5, 1]
    for item, va, vb in zip(items, A, B):
        rate(study, item, a, va)
        rate(study, item, b, vb)
    expected = cohen_kappa_score(A, B, weights="quadratic", labels=[1, 2, 3, 4, 5])
    assert expected == pytest.approx(7 / 24, abs=1e-15)

    client.force_login(make_user("boss", None, staff=True))
    page = client.get(f"/studies/{study.pk}/report/")
    assert page.status_code == 200
    reports, rows = entry_points(client, study, page)
    for report in reports.values():
        pc = report["pairwise_cohen"]
        assert pc["mean"] == pytest.approx(expected, abs=1e-12)
        assert (pc["weights"], pc["count"], pc["constant_pairs"]) == ("quadratic", 1, "undefined")
        assert report["spec"]["categories"] == [1, 2, 3, 4, 5] and report["n_categories"] == 5
        assert report["level"] == "ordinal"
    for key in ("percent_agreement", "krippendorff_alpha", "fleiss_kappa", "gwet_ac1"):
        assert len({json.dumps(r[key]) for r in reports.values()}) == 1, key
        assert csv_value(rows, "agreement", "", key) == pytest.approx(reports["page"][key], abs=1e-12), key
    assert csv_value(rows, "agreement", "pairwise_cohen", "mean") == pytest.approx(expected, abs=1e-12)
    assert next(r for r in rows if r[:3] == ["agreement", "pairwise_cohen", "mean"])[4] == "overall, quadratic weights"
    # the same bootstrap (items resampled, n = 1000, seed 0) everywhere
    assert len({json.dumps(r["confidence_intervals"]) for r in reports.values()}) == 1
    assert reports["page"]["confidence_intervals"]["n_boot"] == 1000
    assert reports["page"]["confidence_intervals"]["n_items"] == 4
    check_same_weights_everywhere(page, expected)


def entry_points(client, study: Study, page) -> tuple[dict[str, dict], list[list[str]]]:
    """The agreement block from the page's context, report.json, the command and the function;
    and report.csv's rows."""
    from_json = json.loads(client.get(f"/studies/{study.pk}/report.json").content)["agreement"]
    rows = list(
        csv.reader(io.StringIO(b"".join(client.get(f"/studies/{study.pk}/report.csv").streaming_content).decode()))
    )
    out = io.StringIO()
    call_command("agreement", "--study", str(study.pk), "--format", "json", stdout=out, stderr=io.StringIO())
    # the same triples from a file: `agreement FILE --level ordinal` goes through the study path
    # (issue 28: it weighted linearly, 0.359, where the study path weighted quadratically, 0.632)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "triples.jsonl"
        path.write_text(
            "".join(json.dumps({"item": i, "annotator": a, "label": v}) + "\n" for i, a, v in study_triples(study))
        )
        from_file = io.StringIO()
        call_command(
            "agreement",
            str(path),
            "--level",
            "ordinal",
            "--categories",
            "1,2,3,4,5",
            "--format",
            "json",
            stdout=from_file,
            stderr=io.StringIO(),
        )
    return {
        "page": page.context["report"]["agreement"],
        "json": from_json,
        "cli": json.loads(out.getvalue()),
        "file": json.loads(from_file.getvalue()),
        "function": study_agreement(study, n_boot=1000),
    }, rows


def check_same_weights_everywhere(page, expected: float) -> None:
    # the per-scale row and the breakdowns use the same weights and say which
    report = page.context["report"]
    overall = next(r for r in report["categories"] if r["category"] == "overall")
    assert overall["pairwise_cohen_mean"] == pytest.approx(expected, abs=1e-12)
    assert overall["kappa_weights"] == "quadratic" and "quadratic" in overall["kind"]
    assert report["by_dataset"]["circled"]["pairwise_cohen_mean"] == pytest.approx(expected, abs=1e-12)
    assert report["by_dataset"]["circled"]["kappa_weights"] == "quadratic"
    assert "quadratic weights" in report["pairwise"]["kappa_of"]
    html = page.content.decode()
    assert "quadratic weights" in html and 'id="constant-pairs"' in html and "n = 1000 replicates" in html
    assert "CIRCUS" in html  # both conventions explained


def test_constant_raters_are_undefined_and_ac1_is_defined(client) -> None:
    """Both annotators give overall 4 everywhere: Cohen's kappa is 0/0, shown undefined and left
    out of the mean; Gwet's AC1 over the rubric's 5 values is 1.0 (p_a = 1, p_e = 0)."""
    study, (a, b) = session_study("constant")
    for item in list(StudyItem.objects.filter(study=study).order_by("id"))[:3]:
        rate(study, item, a, 4)
        rate(study, item, b, 4)
    r = study_agreement(study)
    assert r["pairwise_cohen"]["mean"] is None and r["pairwise_cohen"]["n_undefined"] == 1
    assert r["pairwise_cohen"]["by_pair"] == {"ann_a__ann_b": None}
    assert r["gwet_ac1"] == 1.0 and r["n_categories"] == 5
    one = study_agreement(study, constant_pairs="one")
    assert one["pairwise_cohen"]["mean"] == 1.0 and one["pairwise_cohen"]["count"] == 1
    client.force_login(make_user("boss", None, staff=True))
    html = client.get(f"/studies/{study.pk}/report/").content.decode()
    assert "undefined" in html and "0 of 1 pairs" in html
    # Fleiss' kappa is undefined too (one label everywhere): its reason shows under it on the page
    # and in the CSV (issue 28: the page said "undefined" with no reason, the CSV dropped it)
    why = r["undefined"]["fleiss_kappa"]
    assert r["fleiss_kappa"] is None and why
    headline = html.split('id="headline"')[1].split("</dl>")[0].replace("&#x27;", "'")
    assert f'<small class="muted why">{why}</small>' in headline
    rows = list(
        csv.reader(io.StringIO(b"".join(client.get(f"/studies/{study.pk}/report.csv").streaming_content).decode()))
    )
    assert ["agreement", "undefined", "fleiss_kappa", why, ""] in rows
    html = client.get(f"/studies/{study.pk}/report/?constant_pairs=one").content.decode()
    assert "1 of 1 pairs" in html


# --------------------------------------------------------------------------- 5. sessions


def check_circled_export(path: Path) -> dict:
    """The invariants of :func:`check_export` for a CIRCLED export: sha256 and sizes match the
    manifest, each JSON list has one element per line counted, with its trace line (same id)."""
    manifest = json.loads((path / "manifest.json").read_text())
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
    assert on_disk == {f["path"] for f in manifest["files"]} | {"manifest.json"}
    total = 0
    for f in manifest["files"]:
        data = (path / f["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["bytes"]
        if f["kind"] != "queries":
            assert data.count(b"\n") == f["lines"]
            continue
        sessions = json.loads(data)
        assert len(sessions) == f["lines"] and f["path"] == f"{f['dataset']}/{f['subset']}.json"
        total += len(sessions)
        trace = [json.loads(line) for line in (path / f["path"].replace(".json", ".trace.jsonl")).open()]
        assert [s["session_id"] for s in sessions] == [t["qid"] for t in trace]
        assert all(tuple(s) == CIRCLED_KEYS and s["subset"] == f["subset"] for s in sessions)
    assert total == manifest["counts"]["exported_lines"] == manifest["counts"]["validated"]
    return manifest


def check_round_trip(path: Path, manifest: dict, kept: set[str]) -> None:
    """The exported files re-import with our CIRCLED importer, identical to the source records."""
    exported = [f for f in manifest["files"] if f["kind"] == "queries"]
    assert exported and all(f["path"].endswith(".json") for f in exported)
    parsed = circled.parse([path / f["path"] for f in exported])
    source = {q.external_id: q for q in circled.parse(CIRCLED_FILES).queries}
    assert {q.external_id for q in parsed.queries} == kept
    for q in parsed.queries:
        s = source[q.external_id]
        assert q.raw == s.raw and q.category == s.category
        assert [(t.reference, [x.text for x in t.texts]) for t in q.turns] == [
            (t.reference, [x.text for x in t.texts]) for t in s.turns
        ]
        assert [t.image for t in q.targets] == [t.image for t in s.targets]


def test_session_consensus_adjudication_and_circled_round_trip(tmp_path, client) -> None:
    study, (a, b) = session_study("sessions", session_rule={"reject": "majority", "threshold": 3})
    items = list(StudyItem.objects.filter(study=study).order_by("id").select_related("query"))
    assert len(items) >= 4
    # item 0: overall 4 and 5 -> validated; item 1: 2 and 2 -> rejected; item 2: one reject flag of two ->
    # a tie for the adjudicator; item 3: one vote -> pending (quorum 2)
    for item, (va, ra), vb in ((items[0], (4, []), 5), (items[1], (2, []), 2), (items[2], (5, ["circle"]), 5)):
        rate(study, item, a, va, ra)
        rate(study, item, b, vb)
    rate(study, items[3], a, 5)
    queue = adjudication_queue(study)
    assert [(e.row.item_id, e.decision.reason) for e in queue] == [(items[2].pk, "tie")]
    staff = make_user("boss", None, staff=True)
    client.force_login(staff)
    html = client.get(f"/studies/{study.pk}/adjudication/{items[2].pk}/").content.decode()
    assert "circle" in html and "median overall score is at least 3" in html
    # the real split behind the tie (issue 28: it read "1 valid / 1 invalid" only by chance, and
    # "0 valid / 2 invalid" for a tie on reject flags whose other vote scored low)
    split = "1 reject flag / 1 no reject flag / 1 overall \u2265 3"
    assert f'<span class="split">{split}</span>' in html
    assert f'<td class="split">{split}</td>' in client.get(f"/studies/{study.pk}/adjudication/").content.decode()
    resp = client.post(f"/studies/{study.pk}/adjudication/{items[2].pk}/", {"decision": "validated", "note": "ok"})
    assert resp.status_code == 302

    result = export_study(study, tmp_path / "e")
    manifest = check_circled_export(result.path)
    counts = manifest["counts"]
    assert (counts["validated"], counts["rejected"], counts["adjudicated"]) == (2, 1, 1)
    assert counts["pending"] == 1 and counts["unjudged"] == len(items) - 4
    assert manifest["consensus"]["policy"] == "session" and manifest["query_format"] == "circled"
    assert manifest["consensus"]["session_rule"] == {"reject": "majority", "threshold": 3.0, "scale": "overall"}
    check_round_trip(result.path, manifest, {items[0].query.external_id, items[2].query.external_id})
    traces = {
        json.loads(line)["item"]: json.loads(line) for p in result.path.rglob("*.trace.jsonl") for line in p.open()
    }
    assert set(traces) == {items[0].pk, items[2].pk}
    t = traces[items[2].pk]
    assert t["consensus"]["provenance"] == "adjudicated" and t["adjudication"]["note"] == "ok"
    assert sorted(v["reject_flags"] for v in t["votes"]) == [[], ["circle"]]
    with pytest.raises(StudyError, match="no scale 'sparkle'"):
        create_study(
            StudySpec(
                name="bad-rule", datasets=["circled"], rubric="session", overlap=2, session_rule={"scale": "sparkle"}
            )
        )
    with pytest.raises(StudyError, match="session rule: reject rule"):
        create_study(
            StudySpec(
                name="bad-reject", datasets=["circled"], rubric="session", overlap=2, session_rule={"reject": "some"}
            )
        )
    assert {v["annotator"] for v in t["votes"]} == {"annotator_01", "annotator_02"}


def test_default_bootstrap_is_the_same_everywhere_and_bounded(client, monkeypatch, eager_celery) -> None:
    """A very large study gets fewer default replicates (never under 100), the same for the page,
    report.json and the command; an explicit ?bootstrap / --bootstrap wins."""
    from annotation.agreement import reports

    study, (a, b) = session_study("budget")
    items = list(StudyItem.objects.filter(study=study).order_by("id"))
    for item, va, vb in zip(items, [1, 2, 5, 5], [2, 2, 5, 1]):
        rate(study, item, a, va)
        rate(study, item, b, vb)
    assert reports.default_bootstrap(study) == 1000
    monkeypatch.setattr(reports, "_BOOTSTRAP_ITEM_BUDGET", 150 * len(items))
    assert reports.default_bootstrap(study) == 150
    client.force_login(make_user("boss", None, staff=True))
    page = client.get(f"/studies/{study.pk}/report/")
    reports_, _ = entry_points(client, study, page)
    assert {r["confidence_intervals"]["n_boot"] for k, r in reports_.items() if k not in ("function", "file")} == {150}
    assert "n = 150 replicates" in page.content.decode()
    assert (
        json.loads(client.get(f"/studies/{study.pk}/report.json?bootstrap=0").content)["agreement"][
            "confidence_intervals"
        ]["n_boot"]
        == 0
    )
