"""The web tier takes ``hf:`` specs without importing transformers or torch: in a fresh process,
the New audit form is served and posted with an ``hf:`` spec of a tiny local checkpoint, and a
bad family is refused with the list of families."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from retrieval.retrievers.hf import tiny

ROOT = Path(__file__).resolve().parents[2]

CHECK = r"""
import sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth import get_user_model
from django.test import Client
from retrieval.models import Dataset, Image, Query, Target, Turn
ds = Dataset.objects.create(name="tiny", format="demo", images_root="/nonexistent")
img = Image.objects.create(dataset=ds, external_id="a", path="a.png")
q = Query.objects.create(dataset=ds, external_id="q1", split="val")
Turn.objects.create(query=q, index=1, reference_image=img, texts=[{"text": "make it red"}])
Target.objects.create(query=q, image=img, is_primary=True)
client = Client()
client.force_login(get_user_model().objects.create_superuser("boss", password="x"))
folder = sys.argv[1]
for page in client.get("/audits/new/"), client.post("/audits/new/", {
        "dataset": "tiny", "split": "", "k": 10, "min_mm_retrievers": 1, "exclude_reference": "on",
        "retrievers": f"hf:qwen3-vl-embedding@{folder}\nhf:vlm2vec@{folder}"}):
    print(page.status_code, page.get("Location", ""))
from audit.runs.planning import normalise_retrievers
try:
    normalise_retrievers(["hf:clip@" + folder])
except ValueError as exc:
    print("refused:", exc)
print(sorted(m for m in ("torch", "transformers", "open_clip", "tokenizers") if m in sys.modules))
"""


def test_the_web_tier_takes_hf_specs_without_transformers(tmp_path: Path):
    folder = tiny.qwen3_vl(tmp_path / "qwen3_vl")
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="config.settings",
        CIRVAL_VAR_DIR=str(tmp_path),
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        CELERY_BROKER_URL="filesystem://",
    )
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(folder)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "200 "
    assert lines[1].startswith("302 /audits/"), out.stdout
    assert lines[2].startswith("refused: bad retriever spec 'hf:clip@"), lines[2]
    assert lines[2].endswith("unknown hf family 'clip'; families: e5-v, gme, lamra, qwen3-vl-embedding, vlm2vec")
    assert lines[3] == "[]"
