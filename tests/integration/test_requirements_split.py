"""The runtime needs requirements.txt alone: requirements-dev.txt holds the tests' tools only.

A fresh process refuses every module of the distributions that only requirements-dev.txt
brings (its pins and what they pull in, minus what requirements.txt pulls in), then sets
Django up, runs ``manage.py check`` and imports every module of the four apps."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

CHECK = r"""
import importlib, importlib.metadata as md, pkgutil, re, sys
from packaging.requirements import Requirement

def canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()

def pins(path):
    lines = (line.split("#")[0].strip() for line in open(path))
    return [Requirement(line) for line in lines if line and not line.startswith("-")]

def closure(reqs):
    seen, todo = set(), [(canon(r.name), set(r.extras)) for r in reqs]
    while todo:
        name, extras = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in md.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras or {""}):
                todo.append((canon(req.name), set(req.extras)))
    return seen

dev_only = closure(pins("requirements-dev.txt")) - closure(pins("requirements.txt"))
blocked = {m for m, dists in md.packages_distributions().items() if {canon(d) for d in dists} <= dev_only}
assert {"pytest", "playwright", "schemathesis", "radon", "sklearn"} <= blocked, sorted(blocked)
assert "mlcroissant" not in blocked  # a release builds croissant.json with it (annotation/release/croissant.py)

class DevOnly:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} is installed by requirements-dev.txt only")

sys.meta_path.insert(0, DevOnly())
import django
django.setup()
from django.core.management import call_command
call_command("check")
for app in ("config", "retrieval", "audit", "annotation"):
    for module in pkgutil.walk_packages(importlib.import_module(app).__path__, app + "."):
        if ".migrations." not in module.name:
            importlib.import_module(module.name)
print("ok")
"""


def test_the_app_runs_on_the_runtime_requirements_alone(tmp_path):
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings", CIRVAL_VAR_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr


def test_the_test_tools_are_not_runtime_requirements():
    runtime = (ROOT / "requirements.txt").read_text().lower()
    dev = (ROOT / "requirements-dev.txt").read_text()
    for tool in ("pytest", "pytest-django", "pytest-xdist", "playwright", "schemathesis", "radon"):
        assert f"\n{tool}==" not in runtime and f"\n{tool}==" in dev
    assert "-r requirements.txt" in dev.splitlines()  # pip install -r requirements-dev.txt: both
