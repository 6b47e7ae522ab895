"""Leaderboard scores equal the audit's protocol figures (issue 40): a method entered as an
audit retriever and the same method entered through the prediction files the audit exports
(audit.predictions, the benchmarks' own submission formats) both score exactly the audit's
protocol table (audit.protocol.run_protocol) on the full split. Real CIRR / CIRCO records
(tests/fixtures/datasets) with a tiny open_clip retriever, as test_protocol_audit."""

from __future__ import annotations

import json

import pytest

from audit.leaderboard.entries import EntryError, enter_audit, enter_predictions
from audit.leaderboard.scoring import FULL
from audit.leaderboard.service import leaderboard_table
from audit.models import Leaderboard, LeaderboardEntry
from audit.predictions import export_predictions
from audit.protocol import run_protocol
from retrieval.models import Dataset
from tests.integration.test_protocol_audit import DS, SPEC, audit, cache_dir, draw_images, import_circo, import_dataset  # noqa: F401

pytestmark = pytest.mark.django_db


def _row(run):
    return next(r for r in run_protocol(run)["rows"] if r["modality"] == "multimodal")


def _figures_equal(ours, theirs, keys):
    for key in keys:
        assert ours[key] == pytest.approx(theirs[key], abs=1e-12), key


@pytest.fixture
def cirr(tmp_path, cache_dir):  # noqa: F811
    files = [DS / "cirr" / n for n in ("cap.rc2.val.sample.json", "split.rc2.val.sample.json")]
    split = json.loads(files[1].read_text())
    draw_images(tmp_path / "img", [p.removeprefix("./") for p in split.values()])
    import_dataset("--format", "cirr", "--name", "cirr", "--images-root", str(tmp_path / "img"), *map(str, files))
    ds = Dataset.objects.get(name="cirr")
    return ds, audit(ds)


def test_cirr_audit_entry_and_its_exported_files_score_the_audit_protocol_figures(cirr, tmp_path):
    ds, run = cirr
    files = export_predictions(run, "val", tmp_path / "pred").files
    board = Leaderboard.objects.create(dataset=ds, split="val", name="cirr-val")
    enter_audit(board, run, SPEC, name="tiny (audit)")
    enter_predictions(board, "tiny (files)", [(files[0], "cirr"), (files[1], "cirr")], paper="https://example.org/p")
    table = leaderboard_table(board, n_boot=20, seed=0)
    theirs = _row(run)
    keys = ("R@1", "R@5", "R@10", "R@50", "Recall_subset@1", "Recall_subset@2", "Recall_subset@3", "Avg")
    for name in ("tiny (audit)", "tiny (files)"):
        row = next(r for r in table["rows"] if r["name"] == name)
        _figures_equal(row["figures"], theirs, keys)
        assert row["cells"][FULL]["value"] == pytest.approx(theirs["R@10"], abs=1e-12)
    assert next(r for r in table["rows"] if r["name"] == "tiny (files)")["paper"] == "https://example.org/p"


def test_bad_prediction_files_are_refused_with_their_line_and_id_and_nothing_is_stored(cirr, tmp_path):
    ds, run = cirr
    recall = export_predictions(run, "val", tmp_path / "pred").files[0]
    board = Leaderboard.objects.create(dataset=ds, split="val", name="cirr-val")
    doc = json.loads(recall.read_text())
    keys = [k for k in doc if k not in ("version", "metric")]

    def refused(changed: dict, *words: str) -> None:
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(changed, indent=1))
        with pytest.raises(EntryError) as exc:
            enter_predictions(board, "bad", [(bad, "cirr")])
        for word in words:
            assert word in str(exc.value), str(exc.value)
        assert not LeaderboardEntry.objects.exists()

    short = dict(doc)
    short[keys[1]] = doc[keys[1]][:20]
    line = json.dumps(short, indent=1).splitlines().index(f' "{keys[1]}": [') + 1
    refused(short, f"line {line}", repr(keys[1]), "fewer than the cut-off 50")
    unknown = {**doc, "999999": doc[keys[0]]}
    refused(unknown, "unknown query id '999999'", "line ")
    image = dict(doc)
    image[keys[0]] = ["no-such-image", *doc[keys[0]][1:]]
    refused(image, "unknown image id 'no-such-image'", repr(keys[0]))
    missing = {k: v for k, v in doc.items() if k != keys[2]}
    refused(missing, "have no list", keys[2])


def test_circo_audit_entry_and_its_submission_score_the_audit_protocol_figures(tmp_path, cache_dir):  # noqa: F811
    ds, _ = import_circo(tmp_path)
    run = audit(ds)
    split = run.split or "val"
    files = export_predictions(run, split, tmp_path / "pred").files
    board = Leaderboard.objects.create(dataset=ds, split=split, name="circo", metric="mAP@10")
    enter_audit(board, run, SPEC, name="tiny (audit)")
    enter_predictions(board, "tiny (submission)", [(files[0], "circo")])
    table = leaderboard_table(board, n_boot=20, seed=0)
    theirs = _row(run)
    for name in ("tiny (audit)", "tiny (submission)"):
        row = next(r for r in table["rows"] if r["name"] == name)
        _figures_equal(row["figures"], theirs, ("mAP@5", "mAP@10", "mAP@25", "mAP@50", "R@5", "R@10", "R@25", "R@50"))
        assert row["cells"][FULL]["value"] == pytest.approx(theirs["mAP@10"], abs=1e-12)
    with pytest.raises(EntryError, match="takes circo files, not cirr"):
        enter_predictions(board, "wrong", [(files[0], "cirr")])
