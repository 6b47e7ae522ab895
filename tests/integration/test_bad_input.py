"""Hostile and broken input on every import path: a clear refusal, nothing partial written."""

from __future__ import annotations

import io
import json
import struct
import zipfile
import zlib
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from PIL import Image as PILImage

from retrieval.models import Dataset, GalleryEntry, Image, ImportJob, Query, Target, Turn
from tests.conftest import make_annotator

pytestmark = pytest.mark.django_db

CIRCO_OK = {
    "id": 0,
    "reference_img_id": 1,
    "target_img_id": 2,
    "relative_caption": "make it red",
    "shared_concept": "a car",
    "gt_img_ids": [2],
    "semantic_aspects": [],
}


def counts():
    return tuple(m.objects.count() for m in (Dataset, Image, Query, Turn, Target, GalleryEntry))


def zip_bomb() -> bytes:
    """A small zip that would inflate to 100 MB of zeros (never inflated by CIRVal)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("val.json", b"\0" * (100 * 1024 * 1024))
    return buf.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (a decompression bomb if decoded)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IEND", b"")
    )


# (case id, format, file name, content, fragments the message must contain)
IMPORT_CASES = [
    ("truncated-json", "circo", "val.json", b'[{"id": 0, "reference_img_id": 1', ["val.json", "JSON"]),
    ("truncated-jsonl", "mbeir", "mbeir_cirr_task7_test.jsonl", b'{"qid": "8:1", "query_txt": "x"', ["line 1"]),
    (
        "wrong-type",
        "circo",
        "val.json",
        json.dumps([{**CIRCO_OK, "relative_caption": 7}]).encode(),
        ["record 1", "relative_caption"],
    ),
    (
        "missing-field",
        "fashioniq",
        "cap.dress.val.json",
        json.dumps([{"candidate": "B1", "captions": ["a", "b"]}]).encode(),
        ["record 1", "target"],
    ),
    ("not-a-list", "circo", "val.json", b'{"id": 0}', ["val.json"]),
    ("zip-bomb-named-json", "circo", "val.json", zip_bomb(), ["val.json"]),
    ("zip-bomb-named-zip", "circo", "val.zip", zip_bomb(), ["val.zip"]),
    ("binary-garbage", "cirr", "cap.rc2.val.json", bytes(range(256)) * 8, ["cap.rc2.val.json"]),
    (
        "traversal",
        "lasco",
        "lasco_val.json",
        json.dumps(
            [
                {
                    "qid": 1,
                    "query-image": [1, "../../etc/passwd"],
                    "query-text": "x",
                    "target-image": [2, "val2014/b.jpg"],
                }
            ]
        ).encode(),
        ["record 1", "query-image"],
    ),
    (
        "absolute-path",
        "lasco",
        "lasco_val.json",
        json.dumps(
            [{"qid": 1, "query-image": [1, "/etc/passwd"], "query-text": "x", "target-image": [2, "val2014/b.jpg"]}]
        ).encode(),
        ["record 1", "query-image"],
    ),
]


@pytest.mark.parametrize("case,fmt,name,content,fragments", IMPORT_CASES, ids=[c[0] for c in IMPORT_CASES])
def test_command_refuses_and_writes_nothing(tmp_path, case, fmt, name, content, fragments):
    path = tmp_path / name
    path.write_bytes(content)
    before = counts()
    with pytest.raises(CommandError) as err:
        call_command("import_dataset", "--format", fmt, "--name", "bad", str(path), stdout=StringIO())
    for fragment in fragments:
        assert fragment in str(err.value), (case, str(err.value))
    assert counts() == before


@pytest.mark.usefixtures("eager_celery")  # the upload is imported by its task, run here
@pytest.mark.parametrize("case,fmt,name,content,fragments", IMPORT_CASES, ids=[c[0] for c in IMPORT_CASES])
def test_browser_upload_refuses_and_writes_nothing(client, demo_accounts, case, fmt, name, content, fragments):
    client.login(username="admin", password=demo_accounts["admin"])
    before = counts()
    upload = io.BytesIO(content)
    upload.name = name
    resp = client.post("/datasets/import/", {"format": fmt, "name": "bad-upload", "files": [upload]})
    assert resp.status_code == 302
    job = ImportJob.objects.get(dataset_name="bad-upload")
    assert job.status == "failed"
    for fragment in fragments:
        assert fragment in job.error, (case, job.error)
    assert counts() == before
    status = client.get(f"/datasets/imports/{job.pk}/status/").json()
    assert status["status"] == "failed" and status["error"] == job.error


def test_a_two_gigabyte_claim_is_refused_before_reading(client, demo_accounts, settings):
    client.login(username="admin", password=demo_accounts["admin"])
    resp = client.generic(
        "POST",
        "/datasets/import/",
        b"x" * 10,
        content_type="multipart/form-data; boundary=zz",
        CONTENT_LENGTH=str(2 * 1024**3),
    )
    assert resp.status_code == 413 and b"limit" in resp.content
    assert not ImportJob.objects.exists()


def test_oversized_upload_is_refused_by_the_form(client, demo_accounts, settings):
    settings.CIRVAL_MAX_UPLOAD_BYTES = 1000
    client.login(username="admin", password=demo_accounts["admin"])
    upload = io.BytesIO(b"[" + b" " * 2000 + b"]")
    upload.name = "val.json"
    resp = client.post("/datasets/import/", {"format": "circo", "name": "big", "files": [upload]})
    assert resp.status_code == 413 or b"limit" in resp.content
    assert not ImportJob.objects.exists() and not Dataset.objects.exists()


def test_bomb_and_fake_images_are_reported_not_decoded(tmp_path, settings):
    settings.IMAGE_MAX_PIXELS = 1_000_000
    (tmp_path / f"{1:012d}.jpg").write_bytes(png_header(50_000, 50_000))  # bomb
    (tmp_path / f"{2:012d}.jpg").write_text("<html>not an image</html>")  # wrong content
    (tmp_path / f"{3:012d}.jpg").write_bytes(b"")  # empty
    PILImage.new("RGB", (10, 10)).save(tmp_path / f"{4:012d}.jpg", format="JPEG")
    val = tmp_path / "val.json"
    val.write_text(json.dumps([{**CIRCO_OK, "gt_img_ids": [2, 3, 4]}]))
    out = StringIO()
    call_command(
        "import_dataset", "--format", "circo", "--name", "imgs", "--images-root", str(tmp_path), str(val), stdout=out
    )
    text = out.getvalue()
    assert "3 of 4 images are missing" in text
    assert "exceeds the limit" in text and "not a readable image" in text
    assert list(Image.objects.filter(missing=False).values_list("external_id", flat=True)) == ["4"]


SCRIPT = '<script>alert("x")</script>\x07\u202e evil'


def test_script_and_control_characters_are_escaped_and_kept(tmp_path, client, demo_accounts):
    val = tmp_path / "val.json"
    val.write_text(json.dumps([{**CIRCO_OK, "relative_caption": SCRIPT, "shared_concept": SCRIPT}]))
    call_command("import_dataset", "--format", "circo", "--name", "xss", str(val), stdout=StringIO())
    q = Query.objects.get(dataset__name="xss")
    assert q.turns.get().texts[0]["text"] == SCRIPT and q.raw["relative_caption"] == SCRIPT  # stored intact
    client.login(username="researcher", password=demo_accounts["researcher"])
    for url in ("/datasets/xss/", f"/datasets/xss/queries/{q.pk}/"):
        body = client.get(url).content.decode()
        assert "<script>alert" not in body and "&lt;script&gt;alert" in body, url


def test_hostile_notes_render_escaped_and_export_intact(tmp_path, client):
    """A note with markup and control characters: escaped on every page, byte-exact in the export."""

    from annotation.assignment import queue as engine
    from annotation.export.validated import export_study
    from annotation.studies.building import StudySpec, create_study

    val = tmp_path / "val.json"
    val.write_text(json.dumps([{**CIRCO_OK, "id": n, "relative_caption": SCRIPT} for n in range(2)]))
    call_command("import_dataset", "--format", "circo", "--name", "xss", str(val), stdout=StringIO())
    user = make_annotator("ann")
    study, _ = create_study(StudySpec(name="xss", datasets=["xss"], overlap=1, annotators=["ann"]))
    asg = engine.next_assignment(study, user).assignment
    engine.submit(asg, {"category": "VALIDATED", "note": SCRIPT, "time_spent_ms": 5})
    client.force_login(user)
    for url in (f"/annotate/{study.pk}/item/{asg.pk}/", f"/annotate/{study.pk}/history/"):
        body = client.get(url).content.decode()
        assert "<script>alert" not in body, url
    # the history words the answer as the rubric does, not by its key
    history = client.get(f"/annotate/{study.pk}/history/").content.decode()
    assert study.rubric.rubric.valid_category.label in history and ">VALIDATED" not in history
    result = export_study(study, out_dir=tmp_path / "export")
    traces = [json.loads(line) for p in result.path.rglob("*.trace.jsonl") for line in p.read_text().splitlines()]
    lines = [
        json.loads(line)
        for p in result.path.rglob("*.jsonl")
        if not p.name.endswith(".trace.jsonl")
        for line in p.read_text().splitlines()
    ]
    assert any(line["query_txt"] == SCRIPT for line in lines)

    def strings(value):
        if isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)
        elif isinstance(value, str):
            yield value

    assert SCRIPT in set(strings(traces))  # the note, exactly as written


@pytest.mark.usefixtures("eager_celery")  # the upload is imported by its task, run here
@pytest.mark.parametrize("content,status", [(json.dumps([CIRCO_OK]).encode(), "done"), (b"[{", "failed")])
def test_uploaded_files_are_deleted_once_the_import_finished_or_failed(
    client, demo_accounts, settings, tmp_path, content, status
):
    settings.UPLOAD_DIR = tmp_path / "uploads"
    client.login(username="admin", password=demo_accounts["admin"])
    upload = io.BytesIO(content)
    upload.name = "val.json"
    resp = client.post("/datasets/import/", {"format": "circo", "name": "gone", "files": [upload]})
    assert resp.status_code == 302
    job = ImportJob.objects.get(dataset_name="gone")
    assert job.status == status
    assert not [p for p in settings.UPLOAD_DIR.rglob("*") if p.is_file()]  # nothing left on disk
    assert job.report or job.error  # the job keeps its own report
    assert [p.rsplit("/", 1)[-1] for p in job.files] == ["val.json"]


@pytest.mark.usefixtures("eager_celery")  # the upload is imported by its task, run here
def test_an_unexpected_importer_crash_fails_the_job_instead_of_leaving_it_running(
    client, demo_accounts, settings, tmp_path, monkeypatch
):
    from retrieval import importers

    def crash(*args, **kwargs):
        raise KeyError("surprise")

    monkeypatch.setattr(importers, "stream", crash)
    settings.UPLOAD_DIR = tmp_path / "uploads"
    client.raise_request_exception = False
    client.login(username="admin", password=demo_accounts["admin"])
    upload = io.BytesIO(json.dumps([CIRCO_OK]).encode())
    upload.name = "val.json"
    client.post("/datasets/import/", {"format": "circo", "name": "crash", "files": [upload]})
    job = ImportJob.objects.get(dataset_name="crash")
    assert job.status == "failed" and "KeyError" in job.error and job.finished_at is not None
    assert not [p for p in settings.UPLOAD_DIR.rglob("*") if p.is_file()]
