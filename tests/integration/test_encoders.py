"""A randomly initialised retriever is the same in another process (moved from
tests/unit/test_encoders.py: unit tests start no processes)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from retrieval.encoders import build_retriever
from tests.unit.test_encoders import REPO

_CHILD = """
import hashlib, sys
from retrieval.encoders import build_retriever
r = build_retriever('openclip:cirval-tiny-vit', device='cpu')
e = r.embed_texts(['a red dress', 'make it blue and shorter'])
print(hashlib.sha256(e.numpy().tobytes()).hexdigest())
"""


def test_random_init_deterministic_across_processes() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    here = build_retriever("openclip:cirval-tiny-vit", device="cpu").embed_texts(
        ["a red dress", "make it blue and shorter"]
    )
    assert out.stdout.strip().splitlines()[-1] == hashlib.sha256(here.numpy().tobytes()).hexdigest()
