"""Study reports (JSON, CSV, the page with its SVG heatmaps), adjudication and the validated
export, over a small hand-built study whose every figure is worked out below, and over the
demo world's validity study (round trip).

The small study ("twelve"): 12 CIRCO queries, annotators ann_x, ann_y, ann_z (pseudonyms
annotator_01..03 in that order). Votes (V = VALIDATED; TEXT/IMAGE/TARGET/BROAD = invalid
with that category; '!' = flagged; '-' = no judgement):

    item  hidden                ann_x   ann_y   ann_z    majority
    0     composition_required  V       V       V        validated (unanimous)
    1     composition_required  V       V       TEXT     validated (majority)
    2     unresolved            V       TEXT    BROAD    rejected (majority)
    3     unresolved            TARGET  TARGET  IMAGE    rejected (unanimous)
    4     unresolved            V       V       V        validated (unanimous)
    5     (none)                V       V       V        validated (unanimous)
    6     composition_required  V       TEXT    -        pending (2 votes, quorum 3)
    7     unresolved            V       V       V!       flagged -> adjudication
    8     composition_required  V       V       V        validated (unanimous)
    9     composition_required  BROAD   TARGET  V        rejected (majority)
    10    unresolved            -       -       -        unjudged
    11    (none)                V       V       TEXT     validated (majority)
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command

from annotation.agreement.reports import study_report, study_triples
from annotation.assignment import queue as engine
from annotation.export.validated import MBEIR_KEYS, ExportError, export_study
from annotation.models import Assignment, ExportJob, Judgement, RubricVersion, Study, StudyItem
from annotation.studies.building import StudySpec, create_study
from annotation.verdicts.adjudication import adjudicate, adjudication_queue
from annotation.verdicts.readmodel import Verdicts
from retrieval.models import Query, QuerySubset
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db

ANNOTATORS = ("ann_x", "ann_y", "ann_z")
HIDDEN = [
    "composition_required",
    "composition_required",
    "unresolved",
    "unresolved",
    "unresolved",
    "",
    "composition_required",
    "unresolved",
    "composition_required",
    "composition_required",
    "unresolved",
    "",
]
VOTES = [
    ("V", "V", "V"),
    ("V", "V", "TEXT"),
    ("V", "TEXT", "BROAD"),
    ("TARGET", "TARGET", "IMAGE"),
    ("V", "V", "V"),
    ("V", "V", "V"),
    ("V", "TEXT", "-"),
    ("V", "V", "V!"),
    ("V", "V", "V"),
    ("BROAD", "TARGET", "V"),
    ("-", "-", "-"),
    ("V", "V", "TEXT"),
]
PAYLOADS = {
    "V": {"category": "VALIDATED"},
    "TEXT": {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified"},
    "IMAGE": {"category": "INVALID_IMAGE_QUERY", "sub_reason": "cropped"},
    "TARGET": {"category": "INVALID_TARGET_IMAGE", "sub_reason": "mismatch"},
    "BROAD": {"category": "QUERY_TOO_BROAD"},
}


def make_user(name: str, group: str | None = None, staff: bool = False):
    user = get_user_model().objects.create_user(name, password="pw", is_staff=staff)
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def judge(study: Study, item: StudyItem, user, code: str, note: str = "") -> None:
    position = Assignment.objects.filter(study=study, annotator=user).count() + 1
    assignment = Assignment.objects.create(
        study=study, item=item, annotator=user, position=position, status=Assignment.Status.RESERVED
    )
    payload = {**PAYLOADS[code.rstrip("!")], "time_spent_ms": 4000, "flagged": code.endswith("!"), "note": note}
    engine.submit(assignment, payload)


def build_twelve() -> tuple[Study, list[StudyItem]]:
    """The small study of the module docstring (needs the database)."""
    call_command(
        "import_dataset", "--format", "circo", "--name", "circo", str(FIXTURES / "datasets/circo/val.json"), verbosity=0
    )
    users = [make_user(n, "annotator") for n in ANNOTATORS]
    study, _ = create_study(
        StudySpec(name="twelve", datasets=["circo"], overlap=3, total=12, seed=3, annotators=list(ANNOTATORS))
    )
    items = list(StudyItem.objects.filter(study=study).order_by("id").select_related("query"))
    assert len(items) == 12
    for item, hidden, votes in zip(items, HIDDEN, VOTES):
        StudyItem.objects.filter(pk=item.pk).update(hidden_category=hidden)
        for k, (user, code) in enumerate(zip(users, votes)):
            if code != "-":
                judge(study, item, user, code, note=f"reason {item.pk}-{k}" if code != "V" else "")
    return study, items


@pytest.fixture
def twelve(db):
    return build_twelve()


@pytest.fixture
def people(db):
    return {
        "researcher": make_user("rita", "researcher"),
        "staff": make_user("boss", None, staff=True),
        "annotator": make_user("anna", "annotator"),
    }


# --------------------------------------------------------------------------- the report


def test_report_figures(twelve) -> None:
    study, items = twelve
    r = study_report(study)
    assert r["study"]["items"] == 12 and r["study"]["judgements"] == 32  # 10 items x 3 + item 6 x 2
    assert r["study"]["annotators"] == list(ANNOTATORS)
    # item 6 has 2 of its 3 votes: below the quorum (the overlap), pending, not a tie
    assert r["study"]["quorum"] == 3 and r["consensus"]["quorum"] == 3
    assert r["consensus"]["status"] == {"validated": 6, "rejected": 3, "adjudication": 1, "pending": 1, "unjudged": 1}
    assert r["consensus"]["provenance"] == {
        "unanimous": 5,
        "single": 0,
        "majority": 4,
        "primary": 0,
        "adjudicated": 0,
        "reliability": 0,
    }
    assert r["consensus"]["adjudication_reasons"] == {"tie": 0, "flagged": 1, "disagreement": 0}
    a = r["agreement"]
    assert a["n_items"] == 11 and a["n_items_excluded"] == 0  # item 10 has no rating at all
    # valid votes: 3+2+1+0+3+3+1+3+3+1+2 = 22 of 32
    assert a["binary_valid_invalid"]["valid_rate"] == pytest.approx(22 / 32)
    check_pairwise_and_categories(r)
    check_confusion_and_breakdowns(r)
    json.dumps(r, allow_nan=False)


def check_pairwise_and_categories(r: dict) -> None:
    # ann_x vs ann_y, 11 shared items: both V 7, x V / y I 2, both I 2 -> po 9/11, pe 71/121, kappa 28/50
    p = r["pairwise"]
    assert p["annotators"] == list(ANNOTATORS)
    assert p["cohen_kappa"][0][1] == pytest.approx(0.56) == p["cohen_kappa"][1][0]
    assert p["cohen_kappa"][0][0] is None
    # full signatures: x-y agree on 8 of 11 shared items, x-z and y-z on 5 of 10
    assert p["signature_agreement"][0][1] == pytest.approx(8 / 11)
    assert p["signature_agreement"][0][2] == pytest.approx(0.5) == p["signature_agreement"][1][2]
    assert p["shared_items"][0][1] == 11 and p["shared_items"][0][2] == 10
    categories = {c["category"]: c for c in r["categories"]}
    assert list(categories) == [
        "VALIDATED",
        "INVALID_TEXT_QUERY",
        "INVALID_IMAGE_QUERY",
        "INVALID_TARGET_IMAGE",
        "QUERY_TOO_BROAD",
    ]
    assert categories["VALIDATED"]["prevalence"] == pytest.approx(22 / 32)
    assert categories["QUERY_TOO_BROAD"]["prevalence"] == pytest.approx(2 / 32)
    assert categories["INVALID_TARGET_IMAGE"]["chosen_share"] == pytest.approx(3 / 32)


def check_confusion_and_breakdowns(r: dict) -> None:
    # confusion of ann_x against the majority consensus: V -> 6 validated, 1 rejected, 1 waiting, 1 pending;
    # I -> 2 rejected
    cx = r["confusion"]["by_annotator"]["ann_x"]
    assert r["confusion"]["columns"] == ["validated", "rejected", "adjudication", "pending"]
    assert cx["matrix"] == [[6, 1, 1, 1], [0, 2, 0, 0]]
    assert cx["agreement_with_consensus"] == pytest.approx(8 / 9)
    # breakdowns
    assert r["by_hidden_category"]["composition_required"]["items"] == 5
    assert r["by_hidden_category"]["(none)"]["items"] == 2
    assert r["by_hidden_category"]["unresolved"]["consensus"] == {
        "validated": 1,
        "rejected": 2,
        "adjudication": 1,
        "pending": 0,
        "unjudged": 1,
    }
    assert r["by_dataset"]["circo"]["items"] == 12
    assert r["by_dataset"]["circo"]["valid_rate"] == pytest.approx(22 / 32)


def test_report_pseudonymised_and_policies(twelve) -> None:
    study, _ = twelve
    r = study_report(study, pseudonymise=True, policy="unanimous")
    assert r["study"]["annotators"] == ["annotator_01", "annotator_02", "annotator_03"]
    assert "ann_x" not in json.dumps(r)
    # unanimous: items 0, 4, 5, 8 validated, 3 rejected; 1, 2, 9, 11 disagree; 7 is flagged; 6 pending
    assert r["consensus"]["status"] == {"validated": 4, "rejected": 1, "adjudication": 5, "pending": 1, "unjudged": 1}
    assert r["consensus"]["adjudication_reasons"] == {"tie": 0, "flagged": 1, "disagreement": 4}
    r = study_report(study, policy="primary", primary="ann_z")
    # ann_z decides: 0 V, 1 I, 2 I, 3 I, 4 V, 5 V, 7 flagged, 8 V, 9 V, 11 I; 6 is below the quorum
    assert r["consensus"]["status"] == {"validated": 5, "rejected": 4, "adjudication": 1, "pending": 1, "unjudged": 1}
    assert r["consensus"]["provenance"]["primary"] == 9


def test_report_endpoints_and_access(twelve, people, client) -> None:
    study, _ = twelve
    client.force_login(people["researcher"])
    page = client.get(f"/studies/{study.pk}/report/")
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count("<svg") == 2 and 'id="heatmap-kappa"' in html and 'id="heatmap-signature"' in html
    assert "0.56" in html  # the kappa of annotator_01 x annotator_02, printed in its cell
    assert "annotator_01" in html and "ann_x" not in html  # researchers see pseudonyms
    assert "<script" not in html.split('id="heatmap-kappa"')[1].split("</svg>")[0]
    data = client.get(f"/studies/{study.pk}/report.json").json()
    assert data["consensus"]["status"]["validated"] == 6
    assert client.get("/reports/").status_code == 200
    csv_resp = client.get(f"/studies/{study.pk}/report.csv")
    assert csv_resp.status_code == 200 and csv_resp["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(b"".join(csv_resp.streaming_content).decode())))
    assert rows[0] == ["section", "group", "key", "value", "basis"]
    assert ["pairwise_cohen_kappa", "annotator_01", "annotator_02", "0.56"] in [r[:3] + [r[3][:4]] for r in rows]
    # issue 28: two Cohen's kappas of one pair, each naming its basis
    basis = {tuple(r[:3]): r[4] for r in rows[1:]}
    assert basis[("pairwise_cohen_kappa", "annotator_01", "annotator_02")] == "binary valid / invalid, unweighted"
    assert (
        basis[("agreement", "pairwise_cohen_by_pair", "annotator_01__annotator_02")]
        == "validity signatures, unweighted"
    )
    assert basis[("agreement", "binary_valid_invalid", "pairwise_cohen_mean")] == "binary valid / invalid, unweighted"
    assert basis[("agreement", "", "fleiss_kappa")] == "" and basis[("study", "", "items")] == ""
    # staff see the usernames
    client.force_login(people["staff"])
    assert "ann_x" in client.get(f"/studies/{study.pk}/report/").content.decode()
    # annotators are refused everywhere
    client.force_login(people["annotator"])
    for url in (
        f"/studies/{study.pk}/report/",
        f"/studies/{study.pk}/report.json",
        f"/studies/{study.pk}/report.csv",
        "/reports/",
    ):
        assert client.get(url).status_code == 403, url
    client.logout()
    assert client.get(f"/studies/{study.pk}/report/").status_code == 302


def test_csv_neutralises_formulas(twelve, people, client) -> None:
    study, items = twelve
    evil = make_user('=HYPERLINK("http://x")', "annotator")
    plus = make_user("+SUM(1)", "annotator")
    study.annotators.add(evil, plus)
    judge(study, items[10], evil, "V")
    judge(study, items[10], plus, "BROAD")
    StudyItem.objects.filter(pk=items[5].pk).update(hidden_category="@cmd")
    StudyItem.objects.filter(pk=items[11].pk).update(hidden_category="-2+3")
    client.force_login(people["staff"])
    body = b"".join(client.get(f"/studies/{study.pk}/report.csv").streaming_content).decode()
    cells = [c for row in csv.reader(io.StringIO(body)) for c in row]
    assert '\'=HYPERLINK("http://x")' in cells and "'+SUM(1)" in cells and "'@cmd" in cells and "'-2+3" in cells
    for cell in cells:
        if cell[:1] in ("=", "+", "-", "@"):
            float(cell)  # only plain numbers (negative coefficients) may start with '-'
    assert any(c.startswith("-0.") for c in cells)  # negative kappas stay numbers


# --------------------------------------------------------------------------- export


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def check_export(path: Path) -> dict:
    """Invariants of any export folder: sha256 and line counts match the manifest, every
    query line has its trace line (same qid, validated), and nothing else is in the folder."""
    manifest = json.loads((path / "manifest.json").read_text())
    listed = {f["path"] for f in manifest["files"]}
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
    assert on_disk == listed | {"manifest.json"}
    total = 0
    for f in manifest["files"]:
        data = (path / f["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["bytes"]
        assert data.count(b"\n") == f["lines"]
        if f["kind"] == "queries":
            total += f["lines"]
            lines = read_jsonl(path / f["path"])
            trace = read_jsonl(path / f["path"].replace(".jsonl", ".trace.jsonl"))
            assert [line["qid"] for line in lines] == [t["qid"] for t in trace]
            for line, t in zip(lines, trace):
                assert tuple(line) == MBEIR_KEYS and line["query_modality"] == "image,text" and line["task_id"] == 7
                assert t["validated"] is True and t["subset"] == f["subset"] and t["dataset"] == f["dataset"]
                item = StudyItem.objects.select_related("query").get(pk=t["item"])
                assert item.query_id == t["query"] and item.hidden_category == t["hidden_category"]
    assert total == manifest["counts"]["exported_lines"] == manifest["counts"]["validated"]
    return manifest


def lines_of(path: Path, dataset: str, subset: str) -> list[dict]:
    f = path / dataset / subset / f"{dataset}_{subset}.jsonl"
    return read_jsonl(f) if f.exists() else []


def traces(path: Path) -> dict[int, dict]:
    return {t["item"]: t for f in path.rglob("*.trace.jsonl") for t in read_jsonl(f)}


def test_export_of_the_small_study(twelve, tmp_path) -> None:
    study, items = twelve
    out = tmp_path / "export"
    result = export_study(study, out)
    assert result.path == out.resolve()
    manifest = check_export(out)
    counts = manifest["counts"]
    # item 6 is below the quorum (2 of 3 votes) and item 10 unjudged: 2 pending, never exported
    assert (
        counts["items"],
        counts["validated"],
        counts["rejected"],
        counts["adjudicated"],
        counts["pending"],
        counts["unjudged"],
        counts["awaiting_adjudication"],
    ) == (12, 6, 3, 0, 1, 1, 1)
    assert counts["by_provenance"] == {"majority": 4, "unanimous": 5}  # validated and rejected together
    assert manifest["study"]["quorum"] == 3 and manifest["consensus"]["quorum"] == 3
    assert "quorum" in manifest["consensus"]["rule"]
    assert manifest["consensus"]["policy"] == "majority"
    assert manifest["rubric"] == {"key": "validity", "version": 1, "title": study.rubric.title}
    ids = [i.pk for i in items]
    assert [t["item"] for t in read_jsonl(out / "circo/validated_solved/circo_validated_solved.trace.jsonl")] == [
        ids[0],
        ids[1],
        ids[8],
    ]
    assert [t["item"] for t in read_jsonl(out / "circo/validated_unsolved/circo_validated_unsolved.trace.jsonl")] == [
        ids[4]
    ]
    assert [t["item"] for t in read_jsonl(out / "circo/validated/circo_validated.trace.jsonl")] == [ids[5], ids[11]]
    # an M-BEIR line built from the CIRCO query: text, reference path, ground truths (primary first)
    q = items[0].query
    line = lines_of(out, "circo", "validated_solved")[0]
    targets = list(q.targets.order_by("-is_primary", "id").values_list("image__external_id", flat=True))
    assert line["qid"] == f"circo:{q.external_id}" and line["query_txt"] == q.turns.get().text
    assert line["query_img_path"] == q.turns.get().reference_image.path
    assert line["pos_cand_list"] == targets and line["neg_cand_list"] == []
    assert json.loads(line["query_src_content"])["id"] == q.external_id
    check_small_trace(out, items)
    # the 'validated' subset of the dataset now holds exactly the validated queries
    subset = QuerySubset.objects.get(dataset__name="circo", name="validated")
    assert set(subset.queries.values_list("id", flat=True)) == {items[i].query_id for i in (0, 1, 4, 5, 8, 11)}
    assert subset.source == f"study {study.pk} export"
    assert not list(tmp_path.glob(".*"))  # no temporary folder or id file left behind


def check_small_trace(out: Path, items: list) -> None:
    """The trace of item 1: every vote and note, pseudonymised."""
    ids = [i.pk for i in items]
    t = traces(out)[ids[1]]
    assert t["consensus"] == {
        "policy": "majority",
        "status": "validated",
        "provenance": "majority",
        "quorum": 3,
        "valid_votes": 2,
        "invalid_votes": 1,
        "n_votes": 3,
        "flagged_votes": 0,
        "decided_by": None,
    }
    assert [(v["annotator"], v["signature"], v["category"], v["sub_reason"]) for v in t["votes"]] == [
        ("annotator_01", "VALID", "VALIDATED", ""),
        ("annotator_02", "VALID", "VALIDATED", ""),
        ("annotator_03", "INVALID_TEXT_QUERY", "INVALID_TEXT_QUERY", "underspecified"),
    ]
    assert [v["note"] for v in t["votes"]] == ["", "", f"reason {ids[1]}-2"]
    text = "".join(p.read_text() for p in out.rglob("*.jsonl")) + (out / "manifest.json").read_text()
    for name in ANNOTATORS:
        assert f'"{name}"' not in text  # usernames never appear as values


def test_adjudication_changes_the_export(twelve, people, tmp_path) -> None:
    study, items = twelve
    adjudicate(study, items[6], True, "the text is clear enough", people["staff"])  # pending -> validated
    adjudicate(study, items[7], False, "target is wrong", people["staff"])  # flagged -> rejected
    adjudicate(study, items[1], False, "first thought", people["staff"])
    adjudicate(study, items[1], True, "on reflection, fine", people["staff"])  # replaces the decision
    manifest = check_export(export_study(study, tmp_path / "e").path)
    assert manifest["counts"]["validated"] == 7 and manifest["counts"]["awaiting_adjudication"] == 0
    assert manifest["counts"]["adjudicated"] == 3 and manifest["counts"]["pending"] == 0
    assert manifest["counts"]["unjudged"] == 1  # item 10
    assert manifest["consensus"]["adjudications_applied"] == 3
    t = traces(tmp_path / "e")
    assert items[7].pk not in t
    assert t[items[6].pk]["consensus"]["provenance"] == "adjudicated"
    assert t[items[6].pk]["adjudication"]["note"] == "the text is clear enough"
    assert t[items[6].pk]["adjudication"]["adjudicator"] == "adjudicator_01"
    assert t[items[1].pk]["adjudication"]["note"] == "on reflection, fine"
    assert len(lines_of(tmp_path / "e", "circo", "validated_solved")) == 4
    assert QuerySubset.objects.get(dataset__name="circo", name="validated").queries.count() == 7


def test_export_policies_through_the_command(twelve, tmp_path) -> None:
    study, items = twelve
    out = io.StringIO()
    call_command(
        "export_validated", "--study", str(study.pk), "--out", str(tmp_path / "u"), "--policy", "unanimous", stdout=out
    )
    assert "4 validated of 12 items" in out.getvalue()
    assert set(traces(tmp_path / "u")) == {items[i].pk for i in (0, 4, 5, 8)}
    call_command(
        "export_validated",
        "--study",
        str(study.pk),
        "--out",
        str(tmp_path / "p"),
        "--policy",
        "primary",
        "--primary",
        "ann_z",
        stdout=io.StringIO(),
    )
    manifest = check_export(tmp_path / "p")
    # item 6 (ann_z did not vote) is below the quorum: pending under the primary policy too
    assert set(traces(tmp_path / "p")) == {items[i].pk for i in (0, 4, 5, 8, 9)}
    assert manifest["consensus"]["primary"] == "annotator_03"
    assert traces(tmp_path / "p")[items[0].pk]["consensus"]["decided_by"] == "annotator_03"
    with pytest.raises(CommandError, match="not an empty folder"):
        call_command("export_validated", "--study", str(study.pk), "--out", str(tmp_path / "p"))
    with pytest.raises(CommandError, match="has no assignment"):
        call_command(
            "export_validated",
            "--study",
            str(study.pk),
            "--out",
            str(tmp_path / "x"),
            "--policy",
            "primary",
            "--primary",
            "nobody",
        )
    with pytest.raises(CommandError, match="no study with id"):
        call_command("export_validated", "--study", "999999")


def test_a_failed_export_leaves_nothing(twelve, tmp_path, monkeypatch, settings) -> None:
    study, _ = twelve
    settings.EXPORT_DIR = tmp_path / "exports"
    from annotation.export import validated as export

    calls = []

    def boom(self, row):
        calls.append(row.item_id)
        if len(calls) == 3:
            raise OSError("disk full")
        return original(self, row)

    original = export._QueryData.mbeir_line
    monkeypatch.setattr(export._QueryData, "mbeir_line", boom)
    with pytest.raises(OSError, match="disk full"):
        export_study(study, chunk_size=2)
    assert list((tmp_path / "exports").iterdir()) == []
    assert not QuerySubset.objects.filter(name="validated").exists()


def test_session_studies_take_no_policy(db) -> None:
    study = Study.objects.create(name="s", rubric=RubricVersion.builtin("session"))
    with pytest.raises(ExportError, match="session rule"):
        export_study(study, policy="unanimous")


def check_majority_by_hand(study: Study, validated: set[int]) -> None:
    """Every item is exported exactly when, by hand: quorum reached, nobody flagged, strict majority."""
    for item in StudyItem.objects.filter(study=study):
        current = Judgement.objects.filter(assignment__item=item, is_current=True)
        votes = [j.validated for j in current]
        flagged = current.filter(flagged=True).exists()
        expected = len(votes) >= study.decision_quorum and not flagged and 2 * sum(votes) > len(votes)
        assert (item.pk in validated) is expected, item.pk


def test_demo_study_round_trip(db, tmp_path, settings, demo_images, demo_embeddings) -> None:
    settings.IMAGE_ROOTS = [demo_images.resolve()]  # the world drawn once per session, its embeddings cached
    settings.EMBEDDING_CACHE_DIR = demo_embeddings
    call_command("make_demo", "--images-dir", str(demo_images), verbosity=0, stdout=io.StringIO())
    study = Study.objects.get(name="demo-validity")
    users = list(study.annotators.order_by("username"))
    rng = random.Random(11)
    codes = ["V", "V", "V", "TEXT", "BROAD", "TARGET", "V!"]
    for n, item in enumerate(StudyItem.objects.filter(study=study).order_by("id")):
        StudyItem.objects.filter(pk=item.pk).update(hidden_category=("composition_required", "unresolved", "")[n % 3])
        for user in users:
            if rng.random() < 0.9:
                judge(study, item, user, rng.choice(codes))
    manifest = check_export(export_study(study, tmp_path / "demo").path)
    report = study_report(study)
    assert manifest["counts"]["validated"] == report["consensus"]["status"]["validated"] > 0
    assert manifest["counts"]["awaiting_adjudication"] == report["consensus"]["status"]["adjudication"]
    assert manifest["counts"]["pending"] == report["consensus"]["status"]["pending"]
    assert manifest["counts"]["unjudged"] == report["consensus"]["status"]["unjudged"]
    validated = {t["item"] for t in traces(tmp_path / "demo").values()}
    check_majority_by_hand(study, validated)
    # the adjudication queue (found with an aggregate query) holds exactly the waiting items
    for policy in ("majority", "unanimous", "primary"):
        waiting = study_report(study, policy=policy)["consensus"]["status"]["adjudication"]
        assert len(adjudication_queue(study, Verdicts.of(study, policy))) == waiting > 0, policy
    subsets = {f["subset"]: f["lines"] for f in manifest["files"] if f["kind"] == "queries"}
    assert sum(subsets.values()) == len(validated)
    assert set(subsets) <= {"validated_solved", "validated_unsolved", "validated"}
    qids = {
        line["qid"]
        for f in (tmp_path / "demo").rglob("*.jsonl")
        if not f.name.endswith(".trace.jsonl")
        for line in read_jsonl(f)
    }
    assert qids == {
        f"demo:{q}" for q in Query.objects.filter(study_items__pk__in=validated).values_list("external_id", flat=True)
    }


# --------------------------------------------------------------------------- pages


def test_adjudication_pages(twelve, people, client) -> None:
    study, items = twelve
    client.force_login(people["staff"])
    queue = client.get(f"/studies/{study.pk}/adjudication/")
    assert queue.status_code == 200
    html = queue.content.decode()
    assert "1 item waiting" in html and ">flagged<" in html  # item 6 (2 of 3 votes) is pending, not a tie
    page = client.get(f"/studies/{study.pk}/adjudication/{items[6].pk}/")
    html = page.content.decode()
    assert page.status_code == 200 and "ann_x" in html and "ann_y" in html  # staff see every vote and its author
    assert f"reason {items[6].pk}-1" in html and "VALIDATED</button>" in html and "REJECTED</button>" in html
    resp = client.post(f"/studies/{study.pk}/adjudication/{items[6].pk}/", {"decision": "validated", "note": "ok"})
    # on to the next waiting item
    assert resp.status_code == 302 and resp["Location"].endswith(f"/adjudication/{items[7].pk}/")
    resp = client.post(f"/studies/{study.pk}/adjudication/{items[7].pk}/", {"decision": "rejected", "note": ""})
    assert resp.status_code == 302 and resp["Location"].endswith(f"/studies/{study.pk}/adjudication/")
    assert client.post(f"/studies/{study.pk}/adjudication/{items[7].pk}/", {"decision": "maybe"}).status_code == 400
    r = study_report(study)
    assert r["consensus"]["status"] == {"validated": 7, "rejected": 4, "adjudication": 0, "pending": 0, "unjudged": 1}
    assert r["consensus"]["provenance"]["adjudicated"] == 2
    for who in ("annotator", "researcher"):
        client.force_login(people[who])
        assert client.get(f"/studies/{study.pk}/adjudication/").status_code == 403
        assert client.get(f"/studies/{study.pk}/adjudication/{items[6].pk}/").status_code == 403
        assert (
            client.post(f"/studies/{study.pk}/adjudication/{items[6].pk}/", {"decision": "rejected"}).status_code == 403
        )


def test_export_page_job_status_and_download(
    twelve, people, client, settings, tmp_path, eager_celery, django_capture_on_commit_callbacks
) -> None:
    study, _ = twelve
    settings.EXPORT_DIR = tmp_path / "exports"
    client.force_login(people["staff"])
    progress = client.get(f"/studies/{study.pk}/progress/").content.decode()
    assert f'action="/studies/{study.pk}/export/"' in progress and f"/studies/{study.pk}/report/" in progress
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.post(f"/studies/{study.pk}/export/", {"policy": "majority"})
    job = ExportJob.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/exports/{job.pk}/"
    job.refresh_from_db()
    assert job.status == "done", job.error
    status = client.get(f"/exports/{job.pk}/status/").json()
    assert status["status"] == "done" and status["percent"] == 100 and status["done"] == status["total"] == 12
    assert status["report"]["folder"] == Path(job.path).name and job.path not in json.dumps(status)  # no server path
    page = client.get(f"/exports/{job.pk}/").content.decode()
    assert "circo/validated_solved/circo_validated_solved.jsonl" in page
    manifest = check_export(Path(job.path))
    assert Path(job.path).parent == (tmp_path / "exports").resolve()
    name = "circo/validated_solved/circo_validated_solved.jsonl"
    download = client.get(f"/exports/{job.pk}/files/{name}")
    body = b"".join(download.streaming_content)
    assert download.status_code == 200
    assert hashlib.sha256(body).hexdigest() == next(f["sha256"] for f in manifest["files"] if f["path"] == name)
    assert client.get(f"/exports/{job.pk}/files/../../etc/passwd").status_code == 404
    assert client.get(f"/exports/{job.pk}/files/manifest.json").status_code == 200
    assert client.get(f"/studies/{study.pk}/exports/").status_code == 200
    # a bad request is refused with a message, not a job
    resp = client.post(f"/studies/{study.pk}/export/", {"policy": "primary", "primary": "nobody"})
    assert resp.status_code == 302 and ExportJob.objects.count() == 1
    # ... back on the page the form was sent from (the exports page has it too), never elsewhere
    exports = f"/studies/{study.pk}/exports/"
    assert 'name="back"' in client.get(exports).content.decode()
    resp = client.post(f"/studies/{study.pk}/export/", {"policy": "primary", "primary": "nobody", "back": exports})
    assert resp["Location"] == exports and "has no assignment" in client.get(exports).content.decode()
    resp = client.post(
        f"/studies/{study.pk}/export/", {"policy": "primary", "primary": "x", "back": "https://evil.example/"}
    )
    assert resp["Location"] == exports
    # a bare word (a URL name to redirect()) or a scheme-relative URL is no path of the site: the exports page
    for back in ("progress", "annotation:study_progress", "//evil.example/x", "javascript:alert(1)"):
        resp = client.post(f"/studies/{study.pk}/export/", {"policy": "primary", "primary": "x", "back": back})
        assert resp.status_code == 302 and resp["Location"] == exports, back
    # nobody but staff reaches any export URL
    for who in ("annotator", "researcher"):
        client.force_login(people[who])
        for url in (
            f"/exports/{job.pk}/",
            f"/exports/{job.pk}/status/",
            f"/exports/{job.pk}/files/{name}",
            f"/exports/{job.pk}/files/manifest.json",
            f"/studies/{study.pk}/exports/",
        ):
            assert client.get(url).status_code == 403, (who, url)
        assert client.post(f"/studies/{study.pk}/export/", {"policy": "majority"}).status_code == 403
    assert ExportJob.objects.count() == 1


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_export_runs_on_a_real_worker(client, worker_factory) -> None:
    """The page's export goes through the broker to a real ``celery worker`` process."""
    import shutil

    from tests.conftest import wait_for

    study, items = build_twelve()
    staff = make_user("boss", None, staff=True)
    client.force_login(staff)
    resp = client.post(f"/studies/{study.pk}/export/", {"policy": "majority"})
    job = ExportJob.objects.get()
    assert resp.status_code == 302 and job.status == "queued"
    worker = worker_factory(queues="celery").start("export")

    def finished():
        job.refresh_from_db()
        return job.status in ("done", "failed")

    wait_for(finished, timeout=120, what=f"the worker to run the export\n{worker.log()}")
    try:
        assert job.status == "done", job.error
        assert "annotation.run_export" in worker.log()
        assert client.get(f"/exports/{job.pk}/status/").json()["percent"] == 100
        manifest = check_export(Path(job.path))
        assert manifest["counts"]["validated"] == 6
        assert set(traces(Path(job.path))) == {items[i].pk for i in (0, 1, 4, 5, 8, 11)}
        assert QuerySubset.objects.get(dataset__name="circo", name="validated").queries.count() == 6
    finally:
        if job.path:
            shutil.rmtree(job.path, ignore_errors=True)


def test_session_study_triples_and_report(db, tmp_path, settings, demo_images, demo_embeddings) -> None:
    """Session rubrics: one scale per report (default 'overall'), ordinal level, the session rule's consensus."""
    settings.IMAGE_ROOTS = [demo_images.resolve()]  # the world drawn once per session, its embeddings cached
    settings.EMBEDDING_CACHE_DIR = demo_embeddings
    call_command("make_demo", "--images-dir", str(demo_images), verbosity=0, stdout=io.StringIO())
    study = Study.objects.get(name="demo-sessions")
    users = list(study.annotators.order_by("username"))[:2]
    items = list(StudyItem.objects.filter(study=study).order_by("id").select_related("query")[:4])
    # overall: annotator1 4 4 2 5, annotator2 4 3 2 5 -> identical on 3 of 4 items
    overall = [(4, 4), (4, 3), (2, 2), (5, 5)]
    for item, (o1, o2) in zip(items, overall):
        for user, value in zip(users, (o1, o2)):
            a = Assignment.objects.create(study=study, item=item, annotator=user, status="reserved")
            engine.submit(
                a,
                {
                    "scales": {
                        "naturalness": 3,
                        "coherence": 3,
                        "goal_progress": 3,
                        "low_redundancy": 3,
                        "overall": value,
                    },
                    "per_turn_checks": [
                        {
                            "real_difference_toward_target": True,
                            "consistent_with_history": True,
                            "valid": value >= 3 or t < item.query.n_turns - 1,
                        }
                        for t in range(item.query.n_turns)
                    ],
                    "time_spent_ms": 1000,
                },
            )
    triples = study_triples(str(study.pk))
    assert sorted(t[2] for t in triples) == sorted(v for pair in overall for v in pair)
    assert {t[1] for t in triples} == {u.username for u in users}
    r = study_report(study)
    assert r["study"]["kind"] == "scale" and r["study"]["dimension"] == "overall"
    # session rubric v2 at quorum 2: the third session's last turn is invalid for both, the others valid
    assert r["consensus"]["policy"] == "session" and r["consensus"]["quorum"] == 2 and r["confusion"] is None
    assert r["consensus"]["status"]["validated"] == 3 and r["consensus"]["status"]["rejected"] == 1
    assert r["agreement"]["level"] == "ordinal" and r["agreement"]["percent_agreement"] == pytest.approx(3 / 4)
    assert r["pairwise"]["signature_agreement"][0][1] == pytest.approx(3 / 4)
    scales = {c["category"]: c for c in r["categories"]}
    assert scales["overall"]["mean"] == pytest.approx(29 / 8) and scales["naturalness"]["mean"] == 3
    out = io.StringIO()
    call_command(
        "agreement", "--study", str(study.pk), "--format", "json", "--bootstrap", "0", stdout=out, stderr=io.StringIO()
    )
    assert json.loads(out.getvalue())["n_judgements"] == 8
    with pytest.raises(CommandError, match="no study with id 424242"):
        call_command("agreement", "--study", "424242", stdout=io.StringIO())
    with pytest.raises(CommandError, match="unknown dimension"):
        study_triples(study.pk, "sparkle")


def test_report_of_a_study_without_judgements(people, client) -> None:
    call_command(
        "import_dataset",
        "--format",
        "circo",
        "--name",
        "circo",
        str(FIXTURES / "datasets/circo/val.json"),
        verbosity=0,
        stdout=io.StringIO(),
    )
    study, _ = create_study(StudySpec(name="empty", datasets=["circo"], total=5, seed=1))
    client.force_login(people["researcher"])
    page = client.get(f"/studies/{study.pk}/report/")
    assert page.status_code == 200 and "No judgement yet." in page.content.decode()
    data = client.get(f"/studies/{study.pk}/report.json").json()
    assert data["consensus"]["status"]["unjudged"] == 5 and data["agreement"]["n_items"] == 0
    assert client.get(f"/studies/{study.pk}/report.csv").status_code == 200
    assert client.get(f"/studies/{study.pk}/report/?policy=plurality").status_code == 404
    assert client.get("/studies/999999/report/").status_code == 404
