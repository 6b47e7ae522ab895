"""The validated exports, read as the official tools read them (issue 24, item 5), on real-format
files: the CIRCO layout scored by a re-implementation of CIRCO's ``evaluation.py`` as is, a
session study's CIRCLED layout re-imported without flags, and the M-BEIR export's candidate
lists placed as UniIR's CIRR converter places them. Each runs on the repository's fixtures and,
where the shared reference samples are present, on those too."""

from __future__ import annotations

import json
import math
import random
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from annotation.assignment import queue as engine
from annotation.export.validated import export_study
from annotation.models import Assignment, ExportJob, StudyItem
from annotation.studies.building import StudySpec, create_study
from retrieval.models import Dataset, Query
from retrieval.targets import MBEIR_NO_POSITIVE
from tests.conftest import FIXTURES, SHARED, make_annotator
from tests.reference_impl import CIRCO_ASPECTS, circo_official_scores, uniir_cirr_lists

pytestmark = pytest.mark.django_db

ROOTS = [FIXTURES / "datasets", SHARED / "reference" / "datasets"]
MTFIQ = ["mtfiq", "multiturn_fashioniq"]  # the Multi-turn FashionIQ folder of each root
VALID = {"category": "VALIDATED", "time_spent_ms": 1000}
INVALID = {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified", "time_spent_ms": 1000}


def data_root(request) -> Path:
    root = request.param
    if not root.is_dir():
        pytest.skip(f"{root} is not here")
    return root


@pytest.fixture(params=ROOTS, ids=["fixtures", "shared-reference"])
def root(request) -> Path:
    return data_root(request)


def judge_all(study, user, payload_of) -> None:
    """One annotator (overlap 1) answers every item of ``study``; ``payload_of(item)``."""
    while True:
        served = engine.next_assignment(study, user)
        if served is None or served.assignment is None:
            return
        engine.submit(served.assignment, payload_of(served.assignment.item))


def one_export_file(path: Path, suffix: str) -> Path:
    files = sorted(
        p for p in path.rglob(f"*{suffix}") if suffix == ".trace.jsonl" or not p.name.endswith(".trace.jsonl")
    )
    assert len(files) == 1, files
    return files[0]


def circo_study(val: Path):
    """30 CIRCO queries judged by one annotator; every third item rejected, so that the
    validated queries' CIRCO ids are not 0..n-1."""
    call_command("import_dataset", "--format", "circo", "--name", "circo", str(val), verbosity=0)
    user = make_annotator("solo")
    study, _ = create_study(
        StudySpec(name="circo-sub", datasets=["circo"], overlap=1, total=30, seed=5, annotators=["solo"], candidates=0)
    )
    judge_all(study, user, lambda item: INVALID if item.pk % 3 == 0 else VALID)
    return study


def test_circo_export_scores_with_circos_evaluation_as_is(root, tmp_path) -> None:
    val = root / "circo" / "val.json"
    study = circo_study(val)
    result = export_study(study, tmp_path / "e", fmt="circo")
    exported = json.loads(one_export_file(result.path, ".circo.json").read_text())
    trace = [json.loads(line) for line in one_export_file(result.path, ".trace.jsonl").open()]
    assert 0 < len(exported) == len(trace) == result.manifest["counts"]["validated"] < 30

    original = {r["id"]: r for r in json.loads(val.read_text())}
    source_ids = [int(t["query_external_id"]) for t in trace]
    assert [t["circo_id"] for t in trace] == list(range(len(exported)))
    assert sorted(source_ids) != list(range(len(source_ids)))  # the original ids would not pass the assert
    for n, (entry, source_id) in enumerate(zip(exported, source_ids)):
        assert entry == {**original[source_id], "id": n}  # every field as CIRCO writes it, aspects kept

    gallery = sorted({int(x) for r in original.values() for x in [r["reference_img_id"], *r["gt_img_ids"]]})
    predictions = {}
    for n, source_id in enumerate(source_ids):
        rng = random.Random(source_id)
        ranked = rng.sample(gallery, 50)
        for gt in original[source_id]["gt_img_ids"][: rng.randint(0, 3)]:  # a few hits at random places
            if gt not in ranked:
                ranked[rng.randrange(50)] = gt
        predictions[str(n)] = list(dict.fromkeys(ranked))
    scores = circo_official_scores(exported, predictions)
    # the same figures as the original annotations give for the same predictions
    expected = circo_official_scores([original[s] for s in source_ids], predictions)
    assert json.dumps(scores) == json.dumps(expected)  # NaN compares equal as text
    assert any(v > 0 for v in scores["map"].values())
    present = {a for s in source_ids for a in original[s].get("semantic_aspects", [])}
    assert present and all(not math.isnan(scores["semantic_map10"][a]) for a in present)
    assert all(math.isnan(scores["semantic_map10"][a]) for a in set(CIRCO_ASPECTS) - present)
    with pytest.raises(AssertionError):  # keyed by the CIRCO ids, the script refuses the file
        circo_official_scores(exported, {str(s): predictions[str(n)] for n, s in enumerate(source_ids)})


@pytest.fixture(params=list(zip(ROOTS, MTFIQ)), ids=["fixtures", "shared-reference"])
def mtfiq_dir(request) -> Path:
    root, name = request.param
    folder = root / name
    if not folder.is_dir():
        pytest.skip(f"{folder} is not here")
    return folder


def session_payload(item) -> dict:
    return {
        "scales": {k: 5 for k in ("naturalness", "coherence", "goal_progress", "low_redundancy", "overall")},
        "per_turn_checks": [{"real_difference_toward_target": True, "consistent_with_history": True, "valid": True}]
        * item.query.n_turns,
        "reject_flags": [],
        "time_spent_ms": 1000,
    }


def test_session_export_reimports_as_circled_without_flags(mtfiq_dir, tmp_path) -> None:
    files = [
        mtfiq_dir / f"{c}.val.sample.json" for c in ("dress", "shirt") if (mtfiq_dir / f"{c}.val.sample.json").exists()
    ]
    call_command("import_dataset", "--format", "mtfiq", "--name", "mt", *map(str, files), verbosity=0)
    user = make_annotator("solo")
    study, _ = create_study(
        StudySpec(
            name="mt-sessions", datasets=["mt"], rubric="session", overlap=1, total=24, seed=2, annotators=["solo"]
        )
    )
    judge_all(study, user, session_payload)
    result = export_study(study, tmp_path / "e")
    exported = [f for f in result.manifest["files"] if f["kind"] == "queries"]
    assert {f["subset"] for f in exported} <= {"fashioniq_dress_val", "fashioniq_shirt_val"}

    call_command(
        "import_dataset",
        "--format",
        "circled",
        "--name",
        "back",
        *[str(result.path / f["path"]) for f in exported],
        verbosity=0,
    )
    back = {q.external_id: q for q in Query.objects.filter(dataset__name="back").prefetch_related("turns", "targets")}
    source = {q.external_id: q for q in Query.objects.filter(dataset__name="mt").prefetch_related("turns", "targets")}
    validated = StudyItem.objects.filter(study=study).values_list("query__external_id", flat=True)
    assert set(back) == set(validated) and len(back) == result.manifest["counts"]["validated"] > 0

    def shape(q):
        turns = [
            (t.reference_image.external_id, t.texts[0]["text"] if q.dataset.format == "circled" else None)
            for t in q.turns.order_by("index").select_related("reference_image")
        ]
        return [ref for ref, _ in turns], [
            t.image.external_id for t in q.positive_targets(q.targets.select_related("image"))
        ]

    for ext, q in back.items():
        assert shape(q) == shape(source[ext])
        assert q.category == f"fashioniq_{source[ext].category}_val"


@pytest.fixture(params=ROOTS, ids=["fixtures", "shared-reference"])
def cirr_root(request) -> Path:
    return data_root(request)


def test_mbeir_export_places_cirr_targets_as_uniirs_converter(cirr_root, tmp_path) -> None:
    cap, split = cirr_root / "cirr" / "cap.rc2.val.sample.json", cirr_root / "cirr" / "split.rc2.val.sample.json"
    call_command("import_dataset", "--format", "cirr", "--name", "cirr", str(cap), str(split), verbosity=0)
    n = Query.objects.filter(dataset__name="cirr").count()
    user = make_annotator("solo")
    study, _ = create_study(
        StudySpec(name="cirr-all", datasets=["cirr"], overlap=1, total=n, seed=1, annotators=["solo"], candidates=0)
    )
    judge_all(study, user, lambda item: VALID)
    result = export_study(study, tmp_path / "e")
    lines = [json.loads(line) for line in one_export_file(result.path, ".jsonl").open()]
    records = {str(r["pairid"]): r for r in json.loads(cap.read_text())}
    # UniIR's converter leaves out a record with no positive (29045 scores its target_hard -1.0): so does the export
    skipped = sorted(
        f"cirr:{p}" for p, r in records.items() if r["target_hard"] in r["target_soft"] and not uniir_cirr_lists(r)[0]
    )
    assert "cirr:29045" in skipped and len(lines) == n - len(skipped)
    left_out = result.manifest["left_out"]
    assert {**left_out, "qids": sorted(left_out["qids"])} == {
        "queries": len(skipped),
        "reason": MBEIR_NO_POSITIVE,
        "qids": skipped,
    }
    same = departed = 0
    for line in lines:
        record = records[line["qid"].split(":", 1)[1]]
        soft, hard = record["target_soft"], record["target_hard"]
        assert not set(line["neg_cand_list"]) & {k for k, v in soft.items() if v == 1.0}  # the bug
        reference = uniir_cirr_lists(record)
        if hard in soft:  # exactly UniIR's lists (a hard target scored below 1.0 is a negative)
            assert (sorted(line["pos_cand_list"]), sorted(line["neg_cand_list"])) == (
                sorted(reference[0]),
                sorted(reference[1]),
            )
            same += 1
        else:  # documented departure: a hard target target_soft does not list is a positive (retrieval.targets)
            assert sorted(line["pos_cand_list"]) == sorted(set(reference[0]) | {hard})
            assert sorted(line["neg_cand_list"]) == sorted(reference[1])
            departed += 1
        assert line["pos_cand_list"][0] == hard or soft.get(hard, 1.0) < 1.0
    assert same > departed > 0
    out = StringIO()
    call_command("export_validated", "--study", str(study.pk), "--out", str(tmp_path / "cli"), stdout=out)
    assert f"{len(skipped)} validated queries left out of the M-BEIR files (" in out.getvalue()
    assert f"): {MBEIR_NO_POSITIVE}." in out.getvalue()
    assert Dataset.objects.get(name="cirr").format == "cirr" and Assignment.objects.filter(study=study).count() == n


def test_the_export_page_offers_the_circo_layout_through_the_clis_service(
    client, settings, tmp_path, eager_celery, django_capture_on_commit_callbacks
) -> None:  # noqa: F811
    """Issue 28: the CIRCO export is on the export page, and the page's job writes what
    ``export_validated --format circo`` writes (the same service, byte for byte)."""
    study = circo_study(FIXTURES / "datasets" / "circo" / "val.json")
    settings.EXPORT_DIR = tmp_path / "exports"
    staff = make_annotator("boss", is_staff=True)
    client.force_login(staff)
    page = client.get(f"/studies/{study.pk}/exports/").content.decode()
    assert 'name="format"' in page and 'value="circo"' in page
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.post(f"/studies/{study.pk}/export/", {"policy": "majority", "format": "circo"})
    job = ExportJob.objects.get()
    assert resp.status_code == 302 and job.query_format == "circo"
    job.refresh_from_db()
    assert job.status == "done", job.error
    assert job.manifest["query_format"] == "circo"
    by_page = one_export_file(Path(job.path), ".circo.json").read_bytes()
    call_command(
        "export_validated", "--study", str(study.pk), "--out", str(tmp_path / "cli"), "--format", "circo", verbosity=0
    )
    assert one_export_file(tmp_path / "cli", ".circo.json").read_bytes() == by_page
    listed = client.get(f"/studies/{study.pk}/exports/").content.decode()
    assert (
        "circo" in listed and Path(job.path).name in listed and str(settings.EXPORT_DIR) not in listed
    )  # no server path
    resp = client.post(f"/studies/{study.pk}/export/", {"policy": "majority", "format": "xml"})
    assert resp.status_code == 302 and ExportJob.objects.count() == 1  # refused with a message, no job


def test_a_demo_session_export_reimports_as_circled_with_its_ids(tmp_path) -> None:
    """Sessions of data that is not CIRR, FashionIQ or CIRCO (CIRVal's demo world) are named
    ``<dataset>_<split>`` and re-import with their image ids as they are (no path; one warning)."""
    from retrieval.demo import build_demo
    from retrieval.loader import load_parsed

    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=20, n_single=0, n_sessions=3), "demo", images_root=root)
    user = make_annotator("solo")
    study, _ = create_study(
        StudySpec(name="demo-sessions", datasets=["demo"], rubric="session", overlap=1, seed=1, annotators=["solo"])
    )
    judge_all(study, user, session_payload)
    result = export_study(study, tmp_path / "e")
    exported = [f for f in result.manifest["files"] if f["kind"] == "queries"]
    assert [f["subset"] for f in exported] == ["demo_val"]
    out = StringIO()
    call_command(
        "import_dataset",
        "--format",
        "circled",
        "--name",
        "back",
        *[str(result.path / f["path"]) for f in exported],
        stdout=out,
    )
    assert "demo_val.json: subset 'demo_val' is not from CIRR, FashionIQ or CIRCO" in out.getvalue()
    back = {q.external_id: q for q in Query.objects.filter(dataset__name="back")}
    source = {q.external_id: q for q in Query.objects.filter(dataset__name="demo", n_turns__gt=1)}
    assert set(back) == set(source) and len(back) == 3
    for ext, q in back.items():
        refs = [
            list(x.turns.order_by("index").values_list("reference_image__external_id", flat=True))
            for x in (q, source[ext])
        ]
        assert refs[0] == refs[1]
        assert [t.image.external_id for t in q.targets.all()] == [
            t.image.external_id for t in source[ext].positive_targets(source[ext].targets.all())
        ]
