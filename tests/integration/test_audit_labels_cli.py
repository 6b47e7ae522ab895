"""manage.py audit_labels run as a command: a malformed rank file ends it with a non-zero status
(moved from tests/unit/test_audit_labels_cli.py: unit tests start no processes)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT
from tests.unit.test_audit_labels_cli import LINES


def test_malformed_file_exits_non_zero(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(LINES[0]) + "\n" + '{"query": "q", "retriever": "A", "mm": -1, "text": 1, "image": 1}\n')
    proc = subprocess.run(
        [sys.executable, "manage.py", "audit_labels", str(path), "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "line 2" in proc.stderr and "'mm'" in proc.stderr
    assert proc.stdout == ""
