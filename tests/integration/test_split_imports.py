"""A dataset of several splits (issue 41, item 1): a split is added to, or re-imported into, a
dataset that holds others, each in its own command; a re-import compares records only within
the splits (and files) it covers, so nothing else is "removed"; "changed" counts only records
whose content changed (a caption file re-imported without its split file is unchanged).

Real CIRR and FashionIQ records (tests/fixtures/datasets, excerpts of the official files)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from retrieval.models import GalleryEntry, Query
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db
CIRR = FIXTURES / "datasets" / "cirr"
FIQ = FIXTURES / "datasets" / "fashioniq"
VAL = [CIRR / "cap.rc2.val.sample.json", CIRR / "split.rc2.val.sample.json"]
TEST1 = CIRR / "cap.rc2.test1.sample.json"


def run_import(*args: str) -> str:
    out = StringIO()
    call_command("import_dataset", *args, stdout=out)
    return out.getvalue()


def cirr(*paths, extra: tuple[str, ...] = ()) -> str:
    return run_import("--format", "cirr", "--name", "cirr", *extra, *map(str, paths))


def counts() -> dict[str, int]:
    return {s: Query.objects.filter(dataset__name="cirr", split=s).count() for s in ("val", "test1")}


def test_test1_is_added_to_a_val_dataset_in_a_second_command_and_val_to_a_test1_dataset() -> None:
    n_val, n_test = len(json.loads(VAL[0].read_text())), len(json.loads(TEST1.read_text()))
    cirr(*VAL)
    val_rows = set(Query.objects.filter(split="val").values_list("pk", "content_hash"))
    out = cirr(TEST1)
    assert f"{n_test} added, 0 changed, 0 removed, 0 unchanged" in out, out
    assert counts() == {"val": n_val, "test1": n_test}
    assert set(Query.objects.filter(split="val").values_list("pk", "content_hash")) == val_rows  # untouched

    # again, unchanged; and the same with --delete-removed: nothing of either split is deleted
    assert f"0 added, 0 changed, 0 removed, {n_test} unchanged" in cirr(TEST1)
    assert f"0 added, 0 changed, 0 removed, {n_val} unchanged" in cirr(*VAL, extra=("--delete-removed",))
    assert counts() == {"val": n_val, "test1": n_test}

    # the other way round: val added to a test1-only dataset
    run_import("--format", "cirr", "--name", "other", str(TEST1))
    out = run_import("--format", "cirr", "--name", "other", *map(str, VAL))
    assert f"{n_val} added, 0 changed, 0 removed, 0 unchanged" in out, out
    assert Query.objects.filter(dataset__name="other").count() == n_val + n_test


def test_removed_records_are_those_of_the_reimported_split_only(tmp_path) -> None:
    """Removed: the stored records of the same split and file that the file no longer holds."""
    records = json.loads(TEST1.read_text())
    cirr(*VAL)
    cirr(TEST1)
    shorter = tmp_path / TEST1.name
    shorter.write_text(json.dumps(records[:-1]))
    with pytest.raises(CommandError, match=rf"1 stored query is not in the file any more: {records[-1]['pairid']} "):
        cirr(shorter)
    out = cirr(shorter, extra=("--delete-removed",))
    assert f"0 added, 0 changed, 1 removed, {len(records) - 1} unchanged" in out, out
    assert counts() == {"val": len(json.loads(VAL[0].read_text())), "test1": len(records) - 1}


def test_a_caption_file_reimported_without_its_split_file_is_unchanged(tmp_path) -> None:
    cirr(*VAL)
    before = dict(Query.objects.values_list("pk", "extra"))
    out = cirr(VAL[0])
    n = len(before)
    assert f"0 added, 0 changed, 0 removed, {n} unchanged" in out, out
    assert dict(Query.objects.values_list("pk", "extra")) == before  # the gallery each searches is kept
    # a changed caption is changed, the rest unchanged
    records = json.loads(VAL[0].read_text())
    records[3]["caption"] = "a different caption"
    (tmp_path / VAL[0].name).write_text(json.dumps(records))
    assert f"0 added, 1 changed, 0 removed, {n - 1} unchanged" in cirr(tmp_path / VAL[0].name)


def test_fashioniq_captions_reimported_without_their_split_file_are_unchanged() -> None:
    files = [FIQ / "cap.dress.val.sample.json", FIQ / "split.dress.val.sample.json"]
    run_import("--format", "fashioniq", "--name", "fiq", *map(str, files))
    n = Query.objects.filter(dataset__name="fiq").count()
    entries = GalleryEntry.objects.filter(dataset__name="fiq").count()
    out = run_import("--format", "fashioniq", "--name", "fiq", str(files[0]))
    assert f"0 added, 0 changed, 0 removed, {n} unchanged" in out, out
    assert GalleryEntry.objects.filter(dataset__name="fiq").count() == entries
    # and the shirt category added to the dress dataset, in a second command
    out = run_import(
        "--format",
        "fashioniq",
        "--name",
        "fiq",
        str(FIQ / "cap.shirt.val.sample.json"),
        str(FIQ / "split.shirt.val.sample.json"),
    )
    assert "0 changed, 0 removed, 0 unchanged" in out and Query.objects.filter(category="dress").count() == n
