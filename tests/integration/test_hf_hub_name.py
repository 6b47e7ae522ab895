"""An ``hf:`` spec may name a hub checkpoint (explicit use): it loads from the hub cache, and its
identity is that of the snapshot's files, the same as naming the folder. Run in a fresh process
with an offline hub and a hub cache laid out in a temporary folder: nothing is downloaded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from retrieval.retrievers.hf import tiny

ROOT = Path(__file__).resolve().parents[2]

CHECK = r"""
import sys
from retrieval.retrievers.base import parse_spec
kind, parsed = parse_spec("hf:qwen3-vl-embedding@tiny-org/tiny-qwen3")
print(parsed["hub"], kind.identity(parsed, device="cpu", precision="fp32"))
print(kind.build(parsed, device="cpu", precision="fp32").spec)
kind, parsed = parse_spec("hf:qwen3-vl-embedding@" + sys.argv[1])
print(kind.identity(parsed, device="cpu", precision="fp32")["spec"])
"""


def test_a_hub_name_loads_from_the_cache_with_the_folders_identity(tmp_path: Path):
    folder = tiny.qwen3_vl(tmp_path / "qwen3_vl")
    repo = tmp_path / "hub" / "models--tiny-org--tiny-qwen3"
    shutil.copytree(folder, repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1", CIRVAL_VAR_DIR=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(folder)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    named, built, local = out.stdout.strip().splitlines()
    assert named == "tiny-org/tiny-qwen3 None"  # unbuilt, a hub name tells no identity
    assert built == local and local.startswith("hf:qwen3-vl-embedding@sha256:")
