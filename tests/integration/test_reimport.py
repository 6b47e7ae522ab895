"""Re-import that says what changed (issue 24, item 6): records removed from the file are
refused by default, naming them and what depends on them, or deleted with --delete-removed;
counts are added / changed / removed / unchanged by content, not by position."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from annotation.studies.building import StudySpec, create_study
from retrieval.loader import content_hash
from retrieval.models import Dataset, Query, QuerySubset, Target, Turn
from retrieval.records import QueryRecord, TargetRecord, TextRecord, TurnRecord
from tests.conftest import FIXTURES, make_annotator

DS = FIXTURES / "datasets"
pytestmark = pytest.mark.django_db


def run_import(*args: str) -> str:
    out = StringIO()
    call_command("import_dataset", *args, stdout=out)
    return out.getvalue()


def rows() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (Query, Turn, Target))


def test_a_removed_record_is_refused_by_name_then_deleted_on_request(tmp_path) -> None:
    records = json.loads((DS / "circo" / "val.json").read_text())
    path = tmp_path / "val.json"
    path.write_text(json.dumps(records))
    run_import("--format", "circo", "--name", "circo", str(path))
    gone = Query.objects.get(dataset__name="circo", external_id=str(records[5]["id"]))
    subset = QuerySubset.objects.create(dataset=gone.dataset, name="picked")
    subset.queries.add(gone)
    after = Query.objects.get(dataset__name="circo", external_id=str(records[6]["id"]))
    after_turn = after.turns.get().pk
    before = rows()

    path.write_text(json.dumps(records[:5] + records[6:]))  # 219 in the file
    with pytest.raises(CommandError) as err:
        run_import("--format", "circo", "--name", "circo", str(path))
    message = str(err.value)
    assert "1 stored query is not in the file any more" in message and str(records[5]["id"]) in message
    assert "1 retrieval.QuerySubset_queries" in message and "--delete-removed" in message
    assert rows() == before  # refused: nothing written

    out = run_import("--format", "circo", "--name", "circo", "--delete-removed", str(path))
    assert "0 added, 0 changed, 1 removed, 219 unchanged" in out  # the shifted 214 are unchanged
    assert "Deleted 1 queries no longer in the files" in out and "1 retrieval.QuerySubset_queries" in out
    assert Query.objects.filter(dataset__name="circo").count() == 219
    assert not Query.objects.filter(pk=gone.pk).exists() and subset.queries.count() == 0
    after.refresh_from_db()
    assert after.ordinal == 5 and after.turns.get().pk == after_turn  # the position follows, the rows stay

    report = json.loads(run_import("--format", "circo", "--name", "circo", "--json", str(path)))
    assert (
        report["queries_created"],
        report["queries_updated"],
        report["queries_removed"],
        report["queries_unchanged"],
    ) == (0, 0, 0, 219)


def test_queries_of_a_study_are_never_deleted_by_an_import(tmp_path) -> None:
    records = json.loads((DS / "circo" / "val.json").read_text())
    path = tmp_path / "val.json"
    path.write_text(json.dumps(records))
    run_import("--format", "circo", "--name", "circo", str(path))
    make_annotator("a")
    create_study(StudySpec(name="all", datasets=["circo"], overlap=1, annotators=["a"], candidates=0))
    path.write_text(json.dumps(records[1:]))
    with pytest.raises(CommandError, match=r"items of annotation studies \(.*annotation.StudyItem \(protected\)"):
        run_import("--format", "circo", "--name", "circo", "--delete-removed", str(path))
    assert Query.objects.filter(dataset__name="circo").count() == 220


def test_fashioniq_records_are_matched_by_content_not_by_position(tmp_path) -> None:
    """FashionIQ's query ids are positions: removing record 0 shifts every id. A re-import
    matches by content: the shifted records are unchanged (same rows), a record whose captions
    changed is changed (found by its images), a new one is added, the removed one removed."""
    records = json.loads((DS / "fashioniq" / "cap.dress.val.sample.json").read_text())
    path = tmp_path / "cap.dress.val.json"
    path.write_text(json.dumps(records))
    run_import("--format", "fashioniq", "--name", "fiq", str(path))
    pks = {q.raw["candidate"] + q.raw["target"]: q.pk for q in Query.objects.filter(dataset__name="fiq")}
    n = len(records)

    edited = [dict(r) for r in records[1:]]
    edited[2]["captions"] = ["is red", "has no sleeves"]
    extra = {"candidate": records[0]["target"], "target": records[1]["target"], "captions": ["new", "one"]}
    path.write_text(json.dumps(edited + [extra]))
    with pytest.raises(CommandError, match=r"1 stored query is not in the file any more: dress/val/00000"):
        run_import("--format", "fashioniq", "--name", "fiq", str(path))
    out = run_import("--format", "fashioniq", "--name", "fiq", "--delete-removed", str(path))
    assert f"1 added, 1 changed, 1 removed, {n - 2} unchanged" in out

    stored = {q.external_id: q for q in Query.objects.filter(dataset__name="fiq")}
    assert len(stored) == n
    for position, record in enumerate(edited + [extra]):
        q = stored[f"dress/val/{position:05d}"]
        assert q.raw == record and q.ordinal == position
        key = record["candidate"] + record["target"]
        if record is not extra:
            assert q.pk == pks[key]  # the same row: its judgements and audit results stay attached
    assert [t["text"] for t in stored["dress/val/00002"].turns.get().texts] == ["is red", "has no sleeves"]

    again = run_import("--format", "fashioniq", "--name", "fiq", str(path))
    assert f"0 added, 0 changed, 0 removed, {n} unchanged" in again


def test_the_content_hash_leaves_the_position_out() -> None:
    def record(ordinal: int, ext: str, source: str = "a.json", text: str = "t") -> QueryRecord:
        return QueryRecord(
            ext,
            "val",
            ordinal,
            source,
            [TurnRecord(1, "r", [TextRecord(text, "caption")])],
            [TargetRecord("x", 1.0, True, "gt")],
            raw={"c": text},
        )

    assert content_hash(record(0, "q1")) == content_hash(record(7, "q1", "b.json"))
    assert content_hash(record(0, "q1")) != content_hash(record(0, "q2"))
    assert content_hash(record(0, "q1"), positional=True) == content_hash(record(3, "q9"), positional=True)
    assert content_hash(record(0, "q1")) != content_hash(record(0, "q1", text="other"))
    assert Dataset.objects.count() == 0


@pytest.mark.usefixtures("eager_celery")  # the upload is imported by its task, run here
def test_the_upload_page_refuses_then_deletes_with_its_checkbox(client, tmp_path) -> None:
    import io

    from retrieval.models import ImportJob

    staff = make_annotator("boss", is_staff=True)
    client.force_login(staff)
    records = json.loads((DS / "circo" / "val.json").read_text())

    def upload(data: list, **extra) -> ImportJob:
        f = io.BytesIO(json.dumps(data).encode())
        f.name = "val.json"
        resp = client.post("/datasets/import/", {"format": "circo", "name": "up", "files": [f], **extra})
        assert resp.status_code == 302
        return ImportJob.objects.order_by("-pk").first()

    assert 'name="delete_removed"' in client.get("/datasets/import/").content.decode()
    assert upload(records).status == "done"
    refused = upload(records[1:])
    assert refused.status == "failed" and f"not in the file any more: {records[0]['id']}" in refused.error
    assert Query.objects.filter(dataset__name="up").count() == 220
    done = upload(records[1:], delete_removed="on")
    assert done.status == "done" and done.delete_removed
    assert (done.report["queries_removed"], done.report["queries_unchanged"]) == (1, 219)
    page = client.get(f"/datasets/imports/{done.pk}/").content.decode()
    assert "0 / 0 / 1 / 219" in page and 'id="removed-queries"' in page


def test_a_bom_is_warned_about_and_an_empty_list_refused(tmp_path) -> None:
    """Issue 24 item 7: a UTF-8 BOM is read past with a warning; an empty list, object or
    JSON Lines file is refused (it would import nothing, silently); messages count from 1."""
    records = json.loads((DS / "circo" / "val.json").read_text())
    bom = tmp_path / "bom" / "val.json"
    bom.parent.mkdir()
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(records[:3]).encode())
    out = run_import("--format", "circo", "--name", "bom", str(bom))
    assert "3 added" in out and "val.json: starts with a UTF-8 byte order mark (BOM)" in out
    for name, content, fmt in (
        ("val.json", "[ ]", "circo"),
        ("cap.dress.val.json", "\ufeff[]", "fashioniq"),
        ("mbeir_cirr_task7_test.jsonl", "\n\n", "mbeir"),
    ):
        path = tmp_path / fmt / name
        path.parent.mkdir()
        path.write_text(content)
        with pytest.raises(CommandError, match=r"the file holds no record .*nothing to import"):
            run_import("--format", fmt, "--name", f"empty-{fmt}", str(path))
        assert not Dataset.objects.filter(name=f"empty-{fmt}").exists()
    bad = tmp_path / "bad" / "mbeir_cirr_task7_test.jsonl"
    bad.parent.mkdir()
    line = (DS / "mbeir" / "mbeir_cirr_task7_test.jsonl").read_text().splitlines()[0]
    bad.write_text(line + "\n\n" + json.dumps({**json.loads(line), "qid": 7}) + "\n")
    with pytest.raises(CommandError, match=r"mbeir_cirr_task7_test.jsonl, line 3, field 'qid'"):
        run_import("--format", "mbeir", "--name", "lines", str(bad))


def test_mtfiq_attribute_only_asins_create_no_images_unless_asked(tmp_path) -> None:
    folder = DS / "mtfiq"
    sessions = json.loads((folder / "dress.val.sample.json").read_text())[:4]  # the attributes describe all 12
    attributes = json.loads((folder / "asin2attr.dress.val.sample.json").read_text())
    (tmp_path / "dress.val.json").write_text(json.dumps(sessions))
    used = {s["target"][1] for s in sessions} | {r[2] for s in sessions for r in s["reference"]}
    only_attributes = set(attributes) - used
    assert only_attributes and used & set(attributes)
    files = [str(tmp_path / "dress.val.json"), str(folder / "asin2attr.dress.val.sample.json")]
    out = run_import("--format", "mtfiq", "--name", "mt", *files)
    images = {i.external_id: i for i in Dataset.objects.get(name="mt").images.all()}
    assert set(images) == used
    assert f"{len(only_attributes)} ASIN(s) of the attribute files are in no session or gallery" in out
    assert all(images[a].extra["attributes"] == attributes[a] for a in used & set(attributes))
    run_import("--format", "mtfiq", "--name", "mt-all", "--attribute-images", *files)
    assert set(Dataset.objects.get(name="mt-all").images.values_list("external_id", flat=True)) == used | set(
        attributes
    )


def test_a_fashioniq_sample_then_its_full_file_keeps_the_sample_rows(tmp_path) -> None:
    """Positional ids are shared by every file of a category and split: the full file after its
    sample (another file name) claims the sample's rows by content; nothing is duplicated."""
    records = json.loads((DS / "fashioniq" / "cap.dress.val.sample.json").read_text())
    sample, full = tmp_path / "cap.dress.val.sample.json", tmp_path / "cap.dress.val.json"
    sample.write_text(json.dumps(records[:5]))
    full.write_text(json.dumps(records[2:]))  # the full file's order differs: the sample's 0 and 1 are gone
    run_import("--format", "fashioniq", "--name", "fiq", str(sample))
    kept = {q.raw["candidate"] + q.raw["target"]: q.pk for q in Query.objects.filter(dataset__name="fiq")}
    with pytest.raises(CommandError, match="2 stored queries are not in the file any more"):
        run_import("--format", "fashioniq", "--name", "fiq", str(full))
    out = run_import("--format", "fashioniq", "--name", "fiq", "--delete-removed", str(full))
    assert f"{len(records) - 5} added, 0 changed, 2 removed, 3 unchanged" in out
    stored = Query.objects.filter(dataset__name="fiq")
    assert stored.count() == len(records) - 2 and set(stored.values_list("source_file", flat=True)) == {full.name}
    assert all(
        kept[r["candidate"] + r["target"]] == stored.get(external_id=f"dress/val/{i:05d}").pk
        for i, r in enumerate(records[2:5])
    )
