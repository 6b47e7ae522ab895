"""A warm audit in a fresh worker process imports no model library: open_clip (and with it
torchvision, timm, sympy, huggingface_hub, triton) only where a model is built, scipy.stats
and scipy.sparse only where a distribution or a sparse matrix is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("open_clip", "timm", "torchvision", "sympy", "huggingface_hub", "triton", "scipy.stats", "scipy.sparse")

AUDIT = r"""
import sys
import django
django.setup()
from django.core.management import call_command
from audit.runs import dispatch, planning
from retrieval.models import Dataset
if sys.argv[1] == "cold":
    call_command("migrate", verbosity=0)
    from retrieval.demo import build_demo
    from retrieval.loader import load_parsed
    load_parsed(build_demo(sys.argv[2], n_gallery=30, n_single=8, n_sessions=2), "demo", images_root=sys.argv[2])
run = dispatch.run_inline(planning.create_run(Dataset.objects.get(name="demo"), ["openclip:cirval-tiny-vit"]))
assert run.status == "done", run.error
print(run.timings["cache"]["encoded"])
print(sorted(m for m in HEAVY if m in sys.modules))
"""


def _audit(kind: str, tmp_path: Path) -> list[str]:
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="config.settings",
        CIRVAL_VAR_DIR=str(tmp_path / "var"),
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        CELERY_BROKER_URL="filesystem://",
        EMBEDDING_CACHE_DIR=str(tmp_path / "embeddings"),
        AUDIT_DEVICE="cpu",
        LOG_LEVEL="WARNING",
    )
    code = f"HEAVY = {HEAVY!r}\n" + AUDIT
    out = subprocess.run(
        [sys.executable, "-c", code, kind, str(tmp_path / "demo")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-2:]


def test_a_warm_audit_in_a_fresh_process_imports_no_model_library(tmp_path: Path):
    encoded, loaded = _audit("cold", tmp_path)
    assert int(encoded) > 0 and "'open_clip'" in loaded  # the cold audit built its model
    encoded, loaded = _audit("warm", tmp_path)
    assert (encoded, loaded) == ("0", "[]")
