"""A release names no server path (issue 41, item 5): the same data released from two folders
(another CIRVAL_VAR_DIR, so another checkpoint folder, export folder and image root) gives the
same files, byte for byte, but for release.json's ``released_at``."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import zipfile
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import models as dj_models

from annotation.release.files import RELEASE_JSON, SUMS, TIMESTAMP_FIELD, release_files
from annotation.release.names import ServerPaths, public_spec
from audit.models import AuditLabel, AuditRank, AuditRun
from audit.runs import aggregation
from retrieval.models import Query
from tests.integration.test_report_export import build_twelve

pytestmark = pytest.mark.django_db

CHECKPOINT = "cirval-demo-retriever.pt"


def spec_in(var_dir: Path) -> str:
    return f"openclip:cirval-tiny-vit@{var_dir / 'models' / CHECKPOINT}"


def audited_study(var_dir: Path):
    """The small study, its pool drawn from a finished audit whose pool holds a checkpoint in
    ``var_dir/models`` and a pretrained tag."""
    study, _ = build_twelve()
    (var_dir / "models").mkdir(parents=True)
    (var_dir / "models" / CHECKPOINT).write_bytes(b"PK\x03\x04" + bytes(range(256)) * 4)  # a zip's magic
    specs = [spec_in(var_dir), "openclip:cirval-tiny-vit@random:3"]
    dataset = study.items.first().query.dataset
    run = AuditRun.objects.create(
        dataset=dataset, retrievers=specs, k=3, status=AuditRun.Status.RUNNING, planned=True, tau_encoder=specs[0]
    )
    queries = list(Query.objects.filter(dataset=dataset).order_by("ordinal"))
    AuditRank.objects.bulk_create(
        [
            AuditRank(run=run, query=q, retriever=spec, mm=1 + (n + j) % 5, text=1 + (2 * n + j) % 7, image=None)
            for n, q in enumerate(queries)
            for j, spec in enumerate(specs)
        ]
    )
    assert aggregation.aggregate_run(run.pk)
    study.pool = {**(study.pool or {}), "audit_runs": {dataset.name: run.pk}}
    study.save(update_fields=["pool"])
    return study, run


def move_var_dir(old: Path, new: Path) -> None:
    """What moving the data to another folder does to the database: every stored text that held
    the old folder holds the new one (timestamps untouched: queryset updates)."""
    shutil.copytree(old / "models", new / "models")
    for model in (AuditRun, AuditRank, AuditLabel):
        fields = [
            f.name
            for f in model._meta.concrete_fields
            if isinstance(f, (dj_models.CharField, dj_models.TextField, dj_models.JSONField))
        ]
        for row in model.objects.values("pk", *fields):
            changed = {}
            for name in fields:
                text = json.dumps(row[name])
                if str(old) in text:
                    changed[name] = json.loads(text.replace(str(old), str(new)))
            if changed:
                model.objects.filter(pk=row["pk"]).update(**changed)


def without_timestamp(root: Path, name: str) -> bytes:
    """A release file's bytes without what the timestamp changes: release.json's ``released_at``
    line, and in SHA256SUMS the line of release.json's checksum."""
    data = (root / name).read_bytes()
    if name == RELEASE_JSON:
        data, n = re.subn(rb'\n *"%s": "[^"]*",?' % TIMESTAMP_FIELD.encode(), b"", data)
        assert n == 1
    elif name == SUMS:
        data = b"".join(
            line for line in data.splitlines(True) if not line.endswith(b"  " + RELEASE_JSON.encode() + b"\n")
        )
    return data


def release_from(folder: Path, study, settings) -> Path:
    var = folder / "var"
    settings.EXPORT_DIR = var / "exports"
    settings.DEMO_MODELS_DIR = var / "models"
    settings.IMAGE_ROOTS = [var / "images"]
    out = var / "exports" / "release"
    call_command(
        "release",
        "--study",
        str(study.pk),
        "--out",
        str(out),
        "--layout",
        "mbeir",
        "--layout",
        "circo",
        stdout=io.StringIO(),
    )
    return out


def test_two_releases_from_two_folders_differ_only_in_the_timestamp(tmp_path, settings) -> None:
    first, second = tmp_path / "srv" / "cirval-a", tmp_path / "home" / "lab" / "checkout-b"
    study, run = audited_study(first / "var")
    a = release_from(first, study, settings)
    move_var_dir(first / "var", second / "var")
    assert AuditRun.objects.get(pk=run.pk).retrievers[0] == spec_in(second / "var")
    b = release_from(second, study, settings)

    names = release_files(a)
    assert names == release_files(b) and any(n.startswith(f"study-{study.pk}/audit/") for n in names)
    differ = [n for n in names if without_timestamp(a, n) != without_timestamp(b, n)]
    assert differ == [], differ  # file by file, the timestamp (and release.json's checksum line) aside
    assert {n for n in names if (a / n).read_bytes() != (b / n).read_bytes()} <= {RELEASE_JSON, SUMS}
    ra, rb = (json.loads((p / RELEASE_JSON).read_text()) for p in (a, b))
    ra.pop(TIMESTAMP_FIELD), rb.pop(TIMESTAMP_FIELD)
    assert ra == rb
    for root in (a, b):
        for name in names:  # no folder of either machine in any file
            text = (root / name).read_text(encoding="utf-8")
            assert str(tmp_path) not in text and "/models/" not in text, name
    # the checkpoint is named by its file name and sha256
    digest = hashlib.sha256((second / "var" / "models" / CHECKPOINT).read_bytes()).hexdigest()
    ckpt = next(r for r in ra["retrievers"] if r["checkpoint"])
    assert ckpt == {
        "spec": f"openclip:cirval-tiny-vit@{CHECKPOINT}",
        "checkpoint": CHECKPOINT,
        "checkpoint_sha256": digest,
        "kind": "checkpoint",
    }
    card = (a / "README.md").read_text()
    assert f"`openclip:cirval-tiny-vit@{CHECKPOINT}`: checkpoint sha256 {digest}" in card
    audit = json.loads((a / f"study-{study.pk}" / "audit" / "circo.json").read_text())
    assert f"openclip:cirval-tiny-vit@{CHECKPOINT}" in json.dumps(audit)
    # the zips (entries under the folder's name, which is the same here) are equal but for release.json
    za, zb = (zipfile.ZipFile(p.with_name(p.name + ".zip")) for p in (a, b))
    assert za.namelist() == zb.namelist()
    assert {n for n in za.namelist() if za.read(n) != zb.read(n)} <= {f"release/{RELEASE_JSON}", f"release/{SUMS}"}


def test_server_paths_are_written_as_file_names() -> None:
    specs = [
        "openclip:M@/srv/x/var/models/a.pt",
        "openclip:M@~/w/b.safetensors",
        "openclip:M@openai",
        "openclip:M@random:2",
        "external-name",
        "openclip:M@C:\\models\\c.ckpt",
    ]
    paths = ServerPaths(specs)
    assert [public_spec(s) for s in specs] == [
        "openclip:M@a.pt",
        "openclip:M@b.safetensors",
        "openclip:M@openai",
        "openclip:M@random:2",
        "external-name",
        "openclip:M@c.ckpt",
    ]
    cleaned = paths.clean(
        {
            "openclip:M@/srv/x/var/models/a.pt": ["ran /srv/x/var/models/a.pt", 3, None],
            "w": str(Path("~/w/b.safetensors").expanduser()),
        }
    )
    assert cleaned == {"openclip:M@a.pt": ["ran a.pt", 3, None], "w": "b.safetensors"}
