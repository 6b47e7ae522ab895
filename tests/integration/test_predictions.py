"""export_predictions: the CIRR test server's and CIRCO's submission files, ranked by an
audit's retriever, scored by re-implementations of the servers' logic (tests/reference_impl.py)
to the audit's own protocol figures, on real CIRR and CIRCO records."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditRank
from audit.protocol import run_protocol
from retrieval.models import Dataset, Image, Query, Turn
from tests.conftest import FIXTURES
from tests.integration.test_protocol_audit import SPEC, audit, cache_dir, draw_images  # noqa: F401 (fixture)
from tests.reference_impl import circo_evaluation, cirr_server

pytestmark = pytest.mark.django_db
DS = FIXTURES / "datasets"


def export(*args) -> list[str]:
    out = StringIO()
    call_command("export_predictions", *args, stdout=out)
    return out.getvalue().splitlines()


def test_cirr_submission_files(tmp_path, cache_dir):  # noqa: F811
    files = [DS / "cirr" / n for n in ("cap.rc2.val.sample.json", "split.rc2.val.sample.json")]
    split = json.loads(files[1].read_text())
    draw_images(tmp_path / "img", [p.removeprefix("./") for p in split.values()])
    call_command(
        "import_dataset",
        "--format",
        "cirr",
        "--name",
        "cirr",
        "--images-root",
        str(tmp_path / "img"),
        *map(str, files),
        stdout=StringIO(),
    )
    ds = Dataset.objects.get(name="cirr")
    run = audit(ds)
    lines = export("--run", str(run.pk), "--split", "val", "--out", str(tmp_path / "out"), "--name", "tiny")
    recall = json.loads((tmp_path / "out" / "recall_submission_tiny.json").read_text())
    subset = json.loads((tmp_path / "out" / "recall_subset_submission_tiny.json").read_text())
    assert lines[-1].startswith(f"{Query.objects.filter(dataset=ds).count()} queries")
    assert recall.pop("version") == subset.pop("version") == "rc2"
    assert (recall.pop("metric"), subset.pop("metric")) == ("recall", "recall_subset")
    assert all(len(v) == 50 and len(set(v)) == 50 for v in recall.values())
    assert all(len(v) == 3 for v in subset.values())

    # the audit's own ranking: its stored top list, the reference dropped
    names = dict(Image.objects.filter(dataset=ds).values_list("pk", "external_id"))
    refs = dict(Turn.objects.filter(query__dataset=ds).values_list("query_id", "reference_image_id"))
    for qid, ext, top in AuditRank.objects.filter(run=run).values_list("query_id", "query__external_id", "top_mm"):
        assert recall[ext] == [names[i] for i in top if i != refs[qid]][:50]
        assert refs[qid] not in subset[ext]

    # scored as the server scores them = the protocol report's figures
    annotations = json.loads(files[0].read_text())
    ranked = {str(e) for e in AuditRank.objects.filter(run=run).values_list("query__external_id", flat=True)}
    theirs = cirr_server(recall, subset, [a for a in annotations if str(a["pairid"]) in ranked])
    row = next(r for r in run_protocol(run)["rows"] if r["modality"] == "multimodal")
    for key, value in theirs.items():
        assert row[key] * 100 == pytest.approx(value, abs=1e-9), key


def test_circo_submission_file_is_scored_by_evaluation_py(tmp_path, cache_dir):  # noqa: F811
    val = json.loads((DS / "circo" / "val.json").read_text())[:30]
    (tmp_path / "val.json").write_text(json.dumps(val))
    used = {r["reference_img_id"] for r in val} | {g for r in val for g in r["gt_img_ids"]}
    extra = set(range(1, 120)) - used
    root = tmp_path / "img"
    draw_images(root, [f"{i:012d}.jpg" for i in used | extra])
    call_command(
        "import_dataset",
        "--format",
        "circo",
        "--name",
        "circo",
        "--images-root",
        str(root),
        str(tmp_path / "val.json"),
        stdout=StringIO(),
    )
    call_command("import_gallery", "--dataset", "circo", "--split", "val", "--folder", str(root), stdout=StringIO())
    run = audit(Dataset.objects.get(name="circo"))
    export("--run", str(run.pk), "--split", "val", "--out", str(tmp_path / "out"), "--retriever", SPEC)
    submission = json.loads((tmp_path / "out" / "circo_val_submission.json").read_text())
    assert set(submission) == {str(r["id"]) for r in val}
    assert all(isinstance(i, int) for ids in submission.values() for i in ids)
    theirs = circo_evaluation(submission, val)
    row = next(r for r in run_protocol(run)["rows"] if r["modality"] == "multimodal")
    for key, value in theirs.items():
        assert row[key] * 100 == pytest.approx(value, abs=1e-9), key


def test_refusals(tmp_path, cache_dir):  # noqa: F811
    with pytest.raises(CommandError, match="no finished audit run with id 999"):
        export("--run", "999", "--split", "test1")
    files = [
        DS / "cirr" / n
        for n in (
            "cap.rc2.val.sample.json",
            "split.rc2.val.sample.json",
            "cap.rc2.test1.sample.json",
            "split.rc2.test1.sample.json",
        )
    ]
    paths = [p.removeprefix("./") for f in files[1::2] for p in json.loads(f.read_text()).values()]
    draw_images(tmp_path / "img", paths)
    call_command(
        "import_dataset",
        "--format",
        "cirr",
        "--name",
        "cirr",
        "--images-root",
        str(tmp_path / "img"),
        *map(str, files),
        stdout=StringIO(),
    )
    run = audit(Dataset.objects.get(name="cirr"), split="val")
    with pytest.raises(CommandError, match="retriever 'openclip:other' is not one this audit ran"):
        export("--run", str(run.pk), "--split", "val", "--retriever", "openclip:other")
    with pytest.raises(CommandError, match="has no single-turn query in split 'test'"):
        export("--run", str(run.pk), "--split", "test")
    # CIRR's test1 excerpt names references outside its split file: no file, no ranking
    with pytest.raises(CommandError, match="queries could not be ranked"):
        export("--run", str(run.pk), "--split", "test1", "--out", str(tmp_path / "out"))
