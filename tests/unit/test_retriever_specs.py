"""Retriever specs are validated without torch, from a catalog that matches the pinned open_clip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval import specs

ROOT = Path(__file__).resolve().parents[2]


def test_catalog_matches_the_installed_open_clip():
    """Regenerate with ``python -m retrieval.specs --write-catalog`` when the pin changes."""
    assert json.loads(specs.CATALOG.read_text()) == specs.live_catalog()


def test_known_models_are_open_clips_and_ours():
    import open_clip

    import retrieval.encoders  # noqa: F401  (registers the tiny configs with open_clip)

    assert specs.known_models() == frozenset(open_clip.list_models())
    assert {"cirval-tiny-vit", "cirval-tiny-vit-b", "ViT-B-32"} <= specs.known_models()


def test_a_catalog_from_another_open_clip_is_not_trusted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    stale = tmp_path / "catalog.json"
    stale.write_text(json.dumps({"open_clip": "0.0.1", "pretrained_tags": {"ViT-B-32": ["only_this"]}}))
    monkeypatch.setattr(specs, "CATALOG", stale)
    specs._catalog_tags.cache_clear()
    try:
        assert "openai" in specs.pretrained_tags("ViT-B-32")  # asked open_clip itself
        with pytest.raises(ValueError, match="not a pretrained tag"):
            specs.parse_retriever_spec("openclip:ViT-B-32@only_this")
    finally:
        specs._catalog_tags.cache_clear()


def test_checkpoint_formats_open_clip_loads_are_told_from_their_first_bytes(tmp_path: Path):
    """Each format open_clip's loader reads is recognised (written by the real libraries);
    an empty file, a text file or an image is refused by the spec check, before any worker."""
    import numpy as np
    import safetensors.torch
    import torch

    state = {"w": torch.zeros(2, 2)}
    files = {
        "new.pt": "zip (torch.save or .npz)",
        "old.pt": "pickle (older torch.save)",
        "w.safetensors": "safetensors",
        "w.npz": "zip (torch.save or .npz)",
        "w.npy": "numpy .npy",
    }
    torch.save(state, tmp_path / "new.pt")
    torch.save(state, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    safetensors.torch.save_file(state, str(tmp_path / "w.safetensors"))
    np.savez(tmp_path / "w.npz", w=np.zeros(2))
    np.save(tmp_path / "w.npy", np.zeros(2))
    for name, kind in files.items():
        assert specs.checkpoint_format(tmp_path / name) == kind
        assert specs.parse_retriever_spec(f"openclip:ViT-B-32@{tmp_path / name}")["kind"] == "checkpoint"

    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "notes.pt").write_text("not weights")
    (tmp_path / "cat.pt").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(32))
    with pytest.raises(ValueError, match="checkpoint file is empty: .*empty.pt"):
        specs.parse_retriever_spec(f"openclip:ViT-B-32@{tmp_path / 'empty.pt'}")
    for name in ("notes.pt", "cat.pt"):
        with pytest.raises(ValueError, match=f"bad retriever spec .*not a checkpoint open_clip can load.*{name}"):
            specs.parse_retriever_spec(f"openclip:ViT-B-32@{tmp_path / name}")
    with pytest.raises(ValueError, match="cannot read checkpoint file"):
        specs.checkpoint_format(tmp_path)  # a folder: open() fails; the spec check says so in words
