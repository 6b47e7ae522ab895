"""The New audit form offers every installed retriever kind, shows each retriever's encoder passes
(late against early fusion) and an api: retriever's estimated cost; the audit page says each
retriever's kind and fusion; none of it loads torch or transformers into the web process (issue 37
item 7; a fresh process, as tests/integration/test_retriever_specs.py does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = r"""
import re, sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth import get_user_model
from django.test import Client
from audit.models import AuditRun
from retrieval.models import Dataset, Image, Query, Target, Turn
ckpt = sys.argv[1]
open(ckpt, "wb").write(b"PK\x03\x04" + b"\0" * 60)  # looks like a torch.save file: parsing reads no more
ds = Dataset.objects.create(name="tiny", format="demo", images_root="/nonexistent")
imgs = [Image.objects.create(dataset=ds, external_id=c, path=f"{c}.png", sha256=c * 64, width=64, height=48)
        for c in "abc"]
for n, text in enumerate(["make it red", "add a star"]):
    q = Query.objects.create(dataset=ds, external_id=f"q{n}", split="val")
    Turn.objects.create(query=q, index=1, reference_image=imgs[n], texts=[{"text": text}])
    Target.objects.create(query=q, image=imgs[2], is_primary=True)
client = Client()
client.force_login(get_user_model().objects.create_superuser("boss", password="x"))
pool = ["openclip:cirval-tiny-vit", "api:voyage/voyage-multimodal-3.5", f"composer:searle@{ckpt}?backbone=cirval-tiny-vit"]
page = client.get("/audits/new/").content.decode()
print("kinds", sorted(set(re.findall(r"<code>([a-z0-9_-]+):</code>", page))))
page = client.post("/audits/new/", {"dataset": "tiny", "split": "", "k": 10, "min_mm_retrievers": 1,
                                    "exclude_reference": "on", "retrievers": "\n".join(pool), "estimate": "1"})
body = page.content.decode()
rows = re.findall(r"<tr><td><code>(.*?)</code></td><td>(\w+)</td><td>(\w+)</td>((?:\s*<td class=\"num\">\d+</td>)+)", body)
for spec, kind, fusion, nums in rows:
    print("row", kind, fusion, re.findall(r"\d+", nums))
print("cost", "$" in body and "calls)" in body, AuditRun.objects.count())
run = AuditRun.objects.create(dataset=ds, split="val", retrievers=pool)
detail = client.get(f"/audits/{run.pk}/").content.decode()
print("detail", re.findall(r'title="retriever kind">(\w+)</span> <span class="tag" title="fusion of image and text">(\w+) fusion', detail))
print(sorted(m for m in ("torch", "open_clip", "torchvision", "transformers") if m in sys.modules))
"""


def test_the_form_shows_kinds_passes_and_cost_without_torch(tmp_path: Path):
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="config.settings",
        CIRVAL_VAR_DIR=str(tmp_path),
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        CELERY_BROKER_URL="filesystem://",
    )
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path / "searle.pt")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert {"openclip", "composer", "hf", "api"} <= set(eval(lines[0].removeprefix("kinds ")))  # noqa: S307 - our own print
    # 2 queries (2 references, 2 texts) over a gallery of 3 images (the references among them)
    assert lines[1] == "row openclip late ['3', '2', '0', '0', '5']"  # one encode per image and per text
    assert lines[2] == "row api early ['0', '0', '6', '3', '9']"  # 3 passes per query + one per candidate
    assert lines[3] == "row composer late ['0', '0', '6', '3', '9']"  # its own multimodal pass
    assert lines[4] == "cost True 0"  # an estimate starts nothing
    assert lines[5] == "detail [('openclip', 'late'), ('api', 'early'), ('composer', 'late')]"
    assert lines[6] == "[]"
