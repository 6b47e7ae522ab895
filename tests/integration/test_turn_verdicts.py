"""Issue 26, item 3: sessions judged turn by turn, end to end over the database (PostgreSQL in
CI: ``DATABASE_URL=postgres://...``). Three annotators judge CIRCLED sessions through the REST
API under session rubric v2; the consensus decides every turn with the study's vote rule; the
report, report.csv and ``agreement --study --turns`` give agreement per turn position and per
session through the one engine (equal to sklearn's Cohen's kappa and krippendorff's alpha); the
CIRCLED export writes whole valid sessions or valid prefixes with per-turn provenance in its
trace, and a valid-prefix export re-imports with retrieval/importers/circled.py."""

from __future__ import annotations

import csv
import io
import json
from itertools import combinations

import krippendorff
import numpy as np
import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.test import APIClient
from sklearn.metrics import cohen_kappa_score

from annotation.agreement.reports import study_report, study_turn_agreement
from annotation.export.validated import ExportError, export_study
from annotation.models import Study, StudyItem
from annotation.studies.building import StudySpec, create_study
from annotation.verdicts.readmodel import Verdicts, decide_row, iter_item_batches
from retrieval.importers import circled
from retrieval.models import Dataset, Query
from tests.conftest import FIXTURES, make_annotator

pytestmark = pytest.mark.django_db

CIRCLED_FILES = sorted((FIXTURES / "datasets/circled").glob("*.json"))
SCALES = ("naturalness", "coherence", "goal_progress", "low_redundancy", "overall")
T, F = True, False
# session -> annotator -> turn verdicts (and reject flags); worked out by hand:
#   cirr_val_0000 (3 turns): turn 3 invalid for a and b -> rejected at turn 3, valid prefix 2
#   cirr_val_0001: every turn valid; c's circle flag is one of three -> validated whole
#   circo_val_0000: turn 2 invalid for all -> rejected, valid prefix 1
#   fashioniq_dress_val_0000: turn 1 invalid for a and b -> rejected, prefix 0 (nothing to keep)
ANSWERS = {
    "cirr_val_0000": {"ann_a": ([T, T, F], []), "ann_b": ([T, T, F], []), "ann_c": ([T, T, T], [])},
    "cirr_val_0001": {"ann_a": ([T, T], []), "ann_b": ([T, T], []), "ann_c": ([T, T], ["circle"])},
    "circo_val_0000": {"ann_a": ([T, F], []), "ann_b": ([T, F], []), "ann_c": ([F, F], [])},
    "fashioniq_dress_val_0000": {"ann_a": ([F, T], []), "ann_b": ([F, F], []), "ann_c": ([T, T], [])},
}
PREFIX = {"cirr_val_0000": 2, "cirr_val_0001": 2, "circo_val_0000": 1, "fashioniq_dress_val_0000": 0}


def payload(turns: list[bool], rejects: list[str]) -> dict:
    return {
        "scales": {k: 4 for k in SCALES},
        "reject_flags": rejects,
        "time_spent_ms": 2000,
        "per_turn_checks": [
            {"real_difference_toward_target": v, "consistent_with_history": True, "valid": v} for v in turns
        ],
    }


@pytest.fixture
def judged() -> Study:
    call_command("import_dataset", "--format", "circled", "--name", "circled", *map(str, CIRCLED_FILES), verbosity=0)
    names = ("ann_a", "ann_b", "ann_c")
    users = [make_annotator(n) for n in names]
    study, _ = create_study(
        StudySpec(name="turns", datasets=["circled"], rubric="session", overlap=3, seed=1, annotators=list(names))
    )
    assert study.rubric.version == 2 and study.rubric.rubric.turn_verdict.key == "valid"
    for user in users:
        api = APIClient()
        api.force_authenticate(user)
        while True:
            served = api.post(f"/api/studies/{study.pk}/next/")
            if served.status_code != 200 or not served.json().get("assignment"):
                break
            asg = served.json()["assignment"]
            session = StudyItem.objects.get(assignments__pk=asg).query.external_id
            turns, rejects = ANSWERS[session][user.username]
            # a payload without a turn's verdict is refused and names the field
            missing = payload(turns, rejects)
            del missing["per_turn_checks"][-1]["valid"]
            r = api.post(f"/api/assignments/{asg}/judgements/", missing, format="json")
            assert r.status_code == 400 and r.json()["field"] == f"per_turn_checks[{len(turns) - 1}].valid"
            r = api.post(f"/api/assignments/{asg}/judgements/", payload(turns, rejects), format="json")
            assert r.status_code in (200, 201), r.content
    return study


def decisions(study: Study) -> dict[str, object]:
    verdicts = Verdicts.of(study)
    return {row.external_id: decide_row(row, verdicts) for batch in iter_item_batches(study) for row in batch}


def test_consensus_turn_by_turn_through_the_api(judged) -> None:
    ds = decisions(judged)
    assert {k: d.prefix for k, d in ds.items()} == PREFIX
    assert {k: d.status for k, d in ds.items()} == {
        "cirr_val_0000": "rejected",
        "cirr_val_0001": "validated",
        "circo_val_0000": "rejected",
        "fashioniq_dress_val_0000": "rejected",
    }
    d = ds["cirr_val_0000"]
    assert [t.status for t in d.turns] == ["validated", "validated", "rejected"]
    assert [(t.valid_votes, t.invalid_votes) for t in d.turns] == [(3, 0), (3, 0), (1, 2)]
    assert d.provenance == "majority" and ds["cirr_val_0001"].provenance == "majority"  # c's circle flag


def own_verdicts(dimension: str) -> dict[tuple[str, str], int]:
    """(session, annotator) -> 1/0, straight from ANSWERS (the test's own derivation)."""
    out = {}
    for session, by in ANSWERS.items():
        for user, (turns, rejects) in by.items():
            if dimension == "verdict":
                out[(session, user)] = int(all(turns) and not rejects)
            elif int(dimension.split(":")[1]) <= len(turns):
                out[(session, user)] = int(turns[int(dimension.split(":")[1]) - 1])
    return out


def reference(dimension: str) -> tuple[float, float | None]:
    """(Krippendorff's nominal alpha by the krippendorff package, mean pairwise Cohen's kappa by
    sklearn over the pairs that are defined) of one turn dimension."""
    labels = own_verdicts(dimension)
    sessions = sorted({s for s, _ in labels})
    users = ("ann_a", "ann_b", "ann_c")
    data = np.array([[labels.get((s, u), np.nan) for s in sessions] for u in users], dtype=float)
    alpha = krippendorff.alpha(reliability_data=data, level_of_measurement="nominal", value_domain=[0, 1])
    kappas = []
    for a, b in combinations(range(3), 2):
        x, y = data[a], data[b]
        if len(set(x) | set(y)) > 1:
            kappas.append(cohen_kappa_score(x, y, labels=[0, 1]))
    return alpha, (sum(kappas) / len(kappas) if kappas else None)


@pytest.mark.parametrize("dimension", ["verdict", "turn:1", "turn:2", "turn:3"])
def test_agreement_per_turn_position_is_the_engines_and_matches_the_references(judged, dimension) -> None:
    report = study_report(judged)
    t = report["turns"]
    row = t["session"] if dimension == "verdict" else t["positions"][int(dimension.split(":")[1]) - 1]
    alpha, kappa = reference(dimension)
    if dimension == "turn:3":  # one session has a third turn: no item with 2+ ratings to compare
        assert row["n_items"] == 1 and row["n_judgements"] == 3
        return
    assert row["krippendorff_alpha"] == pytest.approx(alpha, abs=1e-12)
    assert row["pairwise_cohen_mean"] == pytest.approx(kappa, abs=1e-12)
    # the command gives the same numbers through the same engine
    out = io.StringIO()
    call_command("agreement", "--study", str(judged.pk), "--turns", "--format", "json", "--bootstrap", "0", stdout=out)
    cmd = json.loads(out.getvalue())
    block = cmd["session"] if dimension == "verdict" else cmd["positions"][int(dimension.split(":")[1]) - 1]
    assert block["krippendorff_alpha"] == pytest.approx(alpha, abs=1e-12)
    assert block["pairwise_cohen"]["mean"] == pytest.approx(kappa, abs=1e-12)
    out = io.StringIO()
    call_command(
        "agreement",
        "--study",
        str(judged.pk),
        "--dimension",
        dimension,
        "--format",
        "json",
        "--bootstrap",
        "0",
        stdout=out,
    )
    assert json.loads(out.getvalue())["krippendorff_alpha"] == pytest.approx(alpha, abs=1e-12)


def test_report_page_json_csv_and_command_show_the_turns(judged, client) -> None:
    report = study_report(judged)
    t = report["turns"]
    assert [p["turn"] for p in t["positions"]] == [1, 2, 3]
    assert t["positions"][0]["consensus"]["validated"] == 3 and t["positions"][0]["consensus"]["rejected"] == 1
    assert t["prefix_lengths"] == {"0": 1, "1": 1, "2": 2} and t["whole_sessions"] == 1 and t["prefix_sessions"] == 2
    # own verdicts valid: c on cirr_val_0000, a and b on cirr_val_0001 (c raised a flag), c on the dress session
    assert t["session"]["valid_rate"] == pytest.approx(4 / 12)
    assert study_turn_agreement(judged)["positions"][1]["n_items"] == 4
    staff = get_user_model().objects.create_user("staff", password="pw", is_staff=True, is_superuser=True)
    client.force_login(staff)
    page = client.get(f"/studies/{judged.pk}/report/").content.decode()
    assert "Turn by turn" in page and "Turn 3" in page and "Session (derived verdict)" in page
    data = json.loads(client.get(f"/studies/{judged.pk}/report.json").content)
    assert data["turns"]["positions"][1]["krippendorff_alpha"] == pytest.approx(reference("turn:2")[0], abs=1e-12)
    rows = list(
        csv.reader(io.StringIO(b"".join(client.get(f"/studies/{judged.pk}/report.csv").streaming_content).decode()))
    )
    alpha_row = next(r for r in rows if r[:3] == ["turns", "turn 1", "krippendorff_alpha"])
    assert float(alpha_row[3]) == pytest.approx(reference("turn:1")[0], abs=1e-12)
    kappa_row = next(r for r in rows if r[:3] == ["turns", "turn 2", "pairwise_cohen_mean"])
    assert kappa_row[4] == "turn verdict valid / invalid, unweighted"
    out = io.StringIO()
    call_command("agreement", "--study", str(judged.pk), "--turns", "--bootstrap", "0", stdout=out)
    text = out.getvalue()
    assert "session" in text and "turn 1" in text and "turn 3" in text


def read_export(root) -> tuple[dict[str, dict], dict[str, dict]]:
    sessions, traces = {}, {}
    for f in sorted(root.rglob("*.json")):
        if f.name != "manifest.json":
            sessions.update({s["session_id"]: s for s in json.loads(f.read_text())})
    for f in sorted(root.rglob("*.trace.jsonl")):
        for line in f.read_text().splitlines():
            traces[json.loads(line)["qid"]] = json.loads(line)
    return sessions, traces


def test_export_whole_sessions_or_valid_prefixes_and_reimport(judged, tmp_path) -> None:
    whole = export_study(judged, tmp_path / "whole")
    sessions, traces = read_export(whole.path)
    assert list(sessions) == ["cirr_val_0001"] and sessions["cirr_val_0001"]["num_turns"] == 2
    assert whole.manifest["consensus"]["sessions"] == "whole" and whole.manifest["counts"]["valid_prefixes"] == 0
    trace = traces["cirr_val_0001"]["turn_verdicts"]
    assert trace["turns_kept"] == 2 and not trace["truncated"] and trace["scope"] == "whole"

    result = export_study(judged, tmp_path / "prefix", sessions="prefix")
    sessions, traces = read_export(result.path)
    assert {k: s["num_turns"] for k, s in sessions.items()} == {
        "cirr_val_0000": 2,
        "cirr_val_0001": 2,
        "circo_val_0000": 1,
    }
    assert result.manifest["counts"]["valid_prefixes"] == 2 and result.manifest["counts"]["validated"] == 1
    original = {s["session_id"]: s for f in CIRCLED_FILES for s in json.loads(f.read_text())}
    cut = sessions["cirr_val_0000"]
    assert cut["turns"] == original["cirr_val_0000"]["turns"][:2]
    assert cut["ground_truth_ids"] == original["cirr_val_0000"]["ground_truth_ids"]
    # per-turn provenance: which turns were kept, each turn's consensus and every answer
    tv = traces["cirr_val_0000"]["turn_verdicts"]
    assert (tv["num_turns"], tv["turns_kept"], tv["truncated"], tv["valid_prefix"]) == (3, 2, True, 2)
    assert [t["kept"] for t in tv["turns"]] == [True, True, False]
    assert [t["status"] for t in tv["turns"]] == ["validated", "validated", "rejected"]
    assert tv["turns"][2]["answers"] == {"annotator_01": False, "annotator_02": False, "annotator_03": True}
    assert (tv["turns"][2]["valid_votes"], tv["turns"][2]["invalid_votes"]) == (1, 2)
    assert traces["cirr_val_0000"]["consensus"]["status"] == "rejected"

    # the valid-prefix export re-imports as CIRCLED, with the cut sessions
    files = sorted(p for p in result.path.rglob("*.json") if p.name != "manifest.json")
    parsed = circled.parse(files)
    assert {q.external_id: len(q.turns) for q in parsed.queries} == {
        "cirr_val_0000": 2,
        "cirr_val_0001": 2,
        "circo_val_0000": 1,
    }
    call_command("import_dataset", "--format", "circled", "--name", "circled-prefixes", *map(str, files), verbosity=0)
    again = Dataset.objects.get(name="circled-prefixes")
    assert dict(Query.objects.filter(dataset=again).values_list("external_id", "n_turns")) == {
        "cirr_val_0000": 2,
        "cirr_val_0001": 2,
        "circo_val_0000": 1,
    }


def test_prefixes_need_a_turn_verdict_rubric_and_v1_studies_keep_their_rule(db) -> None:
    call_command("import_dataset", "--format", "circled", "--name", "circled", *map(str, CIRCLED_FILES), verbosity=0)
    make_annotator("solo")
    old, _ = create_study(
        StudySpec(name="old", datasets=["circled"], rubric="session@1", overlap=1, annotators=["solo"])
    )
    assert old.rubric.version == 1 and Verdicts.of(old).turn_key is None
    with pytest.raises(ExportError, match="valid prefixes need"):
        export_study(old, sessions="prefix")
    assert study_report(old)["turns"] is None


def test_adjudication_page_and_export_page_for_turns(judged, client, settings, tmp_path) -> None:
    from annotation.export.validated import run_export_job
    from annotation.models import ExportJob

    settings.EXPORT_DIR = tmp_path / "exports"
    staff = get_user_model().objects.create_user("boss", password="pw", is_staff=True, is_superuser=True)
    client.force_login(staff)
    items = {i.query.external_id: i for i in StudyItem.objects.filter(study=judged).select_related("query")}
    page = client.get(f"/studies/{judged.pk}/adjudication/{items['circo_val_0000'].pk}/").content.decode()
    assert 'id="turn-decisions"' in page and "Valid prefix: 1 turn." in page
    assert "every turn is decided by the majority rule" in page
    # an adjudicator's VALIDATED keeps every turn; REJECTED keeps the consensus prefix, never all
    client.post(f"/studies/{judged.pk}/adjudication/{items['circo_val_0000'].pk}/", {"decision": "validated"})
    client.post(f"/studies/{judged.pk}/adjudication/{items['cirr_val_0001'].pk}/", {"decision": "rejected"})
    ds = decisions(judged)
    assert (ds["circo_val_0000"].status, ds["circo_val_0000"].provenance, ds["circo_val_0000"].prefix) == (
        "validated",
        "adjudicated",
        2,
    )
    assert (ds["cirr_val_0001"].status, ds["cirr_val_0001"].prefix) == ("rejected", 1)

    # the export page offers the choice and the worker's job honours it
    form = client.get(f"/studies/{judged.pk}/exports/").content.decode()
    assert 'name="sessions"' in form and 'value="prefix"' in form
    client.post(f"/studies/{judged.pk}/export/", {"sessions": "prefix"})
    job = ExportJob.objects.get(study=judged)
    assert job.sessions == "prefix"
    job = run_export_job(job)
    assert job.status == "done", job.error
    assert job.manifest["consensus"]["sessions"] == "prefix"
    sessions, traces = read_export(type(tmp_path)(job.path))
    assert {k: s["num_turns"] for k, s in sessions.items()} == {
        "cirr_val_0000": 2,
        "cirr_val_0001": 1,
        "circo_val_0000": 2,
    }
    assert traces["cirr_val_0001"]["adjudication"]["decision"] == "rejected"
    assert traces["cirr_val_0001"]["turn_verdicts"]["turns_kept"] == 1
    page = client.get(f"/exports/{job.pk}/").content.decode()
    assert 'id="export-prefixes">2<' in page
    client.post(f"/studies/{judged.pk}/export/", {"sessions": "sparkle"})
    assert ExportJob.objects.filter(study=judged).count() == 1  # refused, nothing queued


def test_my_judgements_reads_each_session_answer(judged, client) -> None:
    """An annotator's history page words a session answer as the rubric does: every scale's
    rating, the turns' verdicts counted and the reject flags, not a count of the scales."""
    client.force_login(get_user_model().objects.get(username="ann_c"))
    page = client.get(f"/annotate/{judged.pk}/history/").content.decode()
    scales = "Naturalness 4 · Coherence 4 · Goal progress 4 · Low redundancy 4 · Overall 4"
    assert f"{scales} · turns: 2 valid, 0 invalid · Circle" in page  # cirr_val_0001
    assert f"{scales} · turns: 0 valid, 2 invalid<" in page  # circo_val_0000
    assert "scales 5" not in page
