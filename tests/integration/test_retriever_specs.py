"""The web tier checks retriever specs and starts an audit without loading torch, in a fresh
process (moved from tests/unit/test_retriever_specs.py: unit tests start no processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
for line in client.get("/audits/new/"), client.post("/audits/new/", {
        "dataset": "tiny", "split": "", "k": 10, "min_mm_retrievers": 1, "exclude_reference": "on",
        "retrievers": "openclip:cirval-tiny-vit\nopenclip:ViT-B-32@openai\nopenclip:ViT-B-32@random:3"}):
    print(line.status_code, line.get("Location", ""))
from audit.runs.planning import normalise_retrievers
try:
    normalise_retrievers(["openclip:ViT-B-32@no_such_tag"])
except ValueError as exc:
    print("refused:", exc)
print(sorted(m for m in ("torch", "open_clip", "torchvision") if m in sys.modules))
"""


def test_the_web_tier_starts_an_audit_without_loading_torch(tmp_path: Path):
    """A click on "Run audit" must not load torch into a process that serves annotators:
    importing it costs seconds of CPU under the GIL, and hundreds of MB for the process's life."""
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="config.settings",
        CIRVAL_VAR_DIR=str(tmp_path),
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        CELERY_BROKER_URL="filesystem://",
    )
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "200 "
    assert lines[1].startswith("302 /audits/"), out.stdout
    assert lines[2].startswith("refused: bad retriever spec 'openclip:ViT-B-32@no_such_tag'")
    assert lines[3] == "[]"
