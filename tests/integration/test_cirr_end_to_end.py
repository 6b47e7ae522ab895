"""Real CIRR files end to end (issue 41, item 1), as a lab runs them: val (with its split file)
and test1 imported into ONE dataset in two commands, audited with ``run_audit --eager``, and
test1 exported as the CIRR server's files with every pairid, the reference never among a
query's predictions.

The records are the official ones (tests/fixtures/datasets/cirr: excerpts of cap.rc2.val.json
and cap.rc2.test1.json). The real test1 file holds pairid 27098 with the caption ``' '``; the
excerpt does not, so one test1-style record with that caption is added (its reference and
img_set are another excerpt record's). The test1 split file is the excerpt's entries plus the
``./test1/<id>.png`` entries of every other image the captions name (the layout of the real
split.rc2.test1.json, which lists them all)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from audit.models import AuditRun
from retrieval.captions import BLANK_TEXT_RULE, ranking_text
from retrieval.models import Dataset, Query
from tests.conftest import FIXTURES
from tests.integration.test_protocol_audit import SPEC, cache_dir, draw_images  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db
CIRR = FIXTURES / "datasets" / "cirr"
BLANK_PAIRID = 27098


def command(name: str, *args: str) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def cirr_test1_files(folder):
    """A test1 caption file with a blank caption, and its split file (module docstring)."""
    records = json.loads((CIRR / "cap.rc2.test1.sample.json").read_text())
    blank = {**records[0], "pairid": BLANK_PAIRID, "caption": " "}
    records.append(blank)
    split = json.loads((CIRR / "split.rc2.test1.sample.json").read_text())
    for r in records:
        for image in [r["reference"], *r["img_set"]["members"]]:
            split.setdefault(image, f"./test1/{image}.png")
    caps, splits = folder / "cap.rc2.test1.json", folder / "split.rc2.test1.json"
    caps.write_text(json.dumps(records))
    splits.write_text(json.dumps(split))
    return records, caps, splits


def test_val_and_test1_in_two_commands_audited_and_exported_with_every_pairid(tmp_path, cache_dir):  # noqa: F811
    val = [CIRR / "cap.rc2.val.sample.json", CIRR / "split.rc2.val.sample.json"]
    records, caps, splits = cirr_test1_files(tmp_path)
    root = tmp_path / "img"
    paths = [p.removeprefix("./") for f in (val[1], splits) for p in json.loads(f.read_text()).values()]
    draw_images(root, paths)

    first = command("import_dataset", "--format", "cirr", "--name", "cirr", "--images-root", str(root), *map(str, val))
    n_val = len(json.loads(val[0].read_text()))
    assert f"Dataset 'cirr' created (cirr): {n_val} queries ({n_val} added" in first
    second = command(
        "import_dataset", "--format", "cirr", "--name", "cirr", "--images-root", str(root), str(caps), str(splits)
    )
    assert (
        f"Dataset 'cirr' updated (cirr): {len(records)} queries ({len(records)} added, 0 changed, 0 removed" in second
    )
    ds = Dataset.objects.get(name="cirr")
    assert Query.objects.filter(dataset=ds, split="val").count() == n_val

    command("run_audit", "--dataset", "cirr", "--split", "val", "--retriever", SPEC, "--eager")
    run = AuditRun.objects.get(dataset=ds)
    assert run.status == "done", run.error

    out = command("export_predictions", "--run", str(run.pk), "--split", "test1", "--out", str(tmp_path / "out"))
    assert f"{len(records)} queries of cirr:test1 predicted" in out
    assert f"1 query has a blank text ({BLANK_PAIRID}): {BLANK_TEXT_RULE}" in out
    recall = json.loads((tmp_path / "out" / "recall_submission.json").read_text())
    subset = json.loads((tmp_path / "out" / "recall_subset_submission.json").read_text())
    assert (recall.pop("version"), recall.pop("metric"), subset.pop("version"), subset.pop("metric")) == (
        "rc2",
        "recall",
        "rc2",
        "recall_subset",
    )
    wanted = {str(r["pairid"]) for r in records}
    assert set(recall) == set(subset) == wanted  # every pairid, the blank one too
    gallery = len(json.loads(splits.read_text()))
    for r in records:
        top, group = recall[str(r["pairid"])], subset[str(r["pairid"])]
        assert r["reference"] not in top and r["reference"] not in group
        assert len(top) == len(set(top)) == min(50, gallery - 1)
        assert len(group) == 3 and set(group) <= set(r["img_set"]["members"])


def test_the_blank_text_rule() -> None:
    assert ranking_text("add a dog") == "add a dog"
    assert ranking_text(" ") is None and ranking_text("", blank_ok=False) is None
    assert ranking_text(" ", blank_ok=True) == "" and ranking_text("\t\n", blank_ok=True) == ""
