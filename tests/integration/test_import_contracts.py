"""The layering of ``.importlinter`` holds: ``lint-imports`` (import-linter) keeps every contract.

It replaces the hand-written layering test: the apps one way (annotation -> audit -> retrieval
-> config), each app's sub-packages in layers, serving an item without the audit executor or an
importer, the pure modules without Django, no private name across modules, no cycle between
siblings, and dotted paths in strings one way too (tests/import_contracts.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_lint_imports_keeps_every_contract(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CIRVAL_VAR_DIR": str(tmp_path)}
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
