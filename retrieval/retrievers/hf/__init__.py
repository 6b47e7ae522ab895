"""The ``hf:`` kind: multimodal LLM embedders run through transformers (early fusion).

Grammar: ``hf:FAMILY@PATH``. FAMILY is one of :data:`retrieval.retrievers.hf.families.FAMILIES`
(``gme``, ``vlm2vec``, ``lamra``, ``qwen3-vl-embedding``, ``e5-v``); PATH a local folder in
transformers' layout (``config.json``, weights, tokenizer and processor files), or, for
explicit use only, a hub name ``ORG/NAME`` (which transformers may download when the retriever
is built; nothing is fetched when a spec is parsed).

Torch-free: parsing a spec and naming a local checkpoint's identity read files only; torch and
transformers are imported by :meth:`HfKind.build` (:mod:`retrieval.retrievers.hf.embedder`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from retrieval.retrievers.base import Fusion, Retriever, RetrieverKind
from retrieval.retrievers.hf.families import FAMILIES, family, template_version

__all__ = ["KIND", "HfKind", "amp_tag", "checkpoint_digest", "checkpoint_dim"]

_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
#: Bytes read from each end of a large weights file for the checkpoint's digest.
_EDGE = 1 << 20
_SMALL = 4 << 20


def _digest_file(h: Any, path: Path) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as fh:
        if size <= _SMALL:
            h.update(fh.read())
            return
        h.update(fh.read(_EDGE))
        fh.seek(size - _EDGE)
        h.update(fh.read(_EDGE))


@lru_cache(maxsize=32)
def _digest_cached(folder: str, stamp: tuple[tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    for name, _size, _mtime in stamp:
        _digest_file(h, Path(folder) / name)
    return h.hexdigest()[:16]


def checkpoint_digest(folder: str | os.PathLike[str]) -> str:
    """A short digest of a checkpoint folder: every file's name and size, the whole of each small
    file (configs, tokenizer, processor, chat template) and both ends of each large one (weights).
    Cached per folder while no file's size or modification time changes."""
    root = Path(folder)
    files = sorted(p for p in root.iterdir() if p.is_file() and not p.name.startswith("."))
    stamp = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _digest_cached(str(root), stamp)


def checkpoint_dim(folder: str | os.PathLike[str]) -> int:
    """The embedding size of a checkpoint: its language model's hidden size, from config.json."""
    config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config") or {}
    dim = text.get("hidden_size") or config.get("hidden_size")
    if not isinstance(dim, int):
        raise ValueError(f"{folder}/config.json names no hidden_size")
    return dim


def amp_tag(precision: str, device: str) -> str:
    """The autocast part of a retriever's identity (CUDA only; bf16 where the GPU has it)."""
    if precision != "amp" or not str(device).startswith("cuda"):
        return ""
    import torch

    return "#amp-bf16" if torch.cuda.is_bf16_supported() else "#amp-fp16"


class HfKind(RetrieverKind):
    prefix = "hf"
    description = (
        "multimodal LLM embedder through transformers (early fusion): hf:FAMILY@PATH, FAMILY one of "
        + ", ".join(sorted(FAMILIES))
    )

    def parse(self, rest: str) -> dict[str, Any]:
        name, sep, where = rest.partition("@")
        name, where = name.strip(), where.strip()
        if not sep or not name or not where:
            raise ValueError("expected hf:FAMILY@PATH (a local checkpoint folder, or ORG/NAME on the hub)")
        fam = family(name)
        path = Path(where).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ValueError(f"{path} has no config.json: not a checkpoint folder in transformers' layout")
            folder = str(path.resolve())
            return {
                "backend": "hf",
                "family": fam.name,
                "path": folder,
                "hub": None,
                "canonical": f"hf:{fam.name}@{folder}",
            }
        if where.startswith(("/", ".", "~")) or "\\" in where or not _HUB_NAME.match(where):
            raise ValueError(f"no checkpoint folder {where!r} (nor a hub name ORG/NAME)")
        return {"backend": "hf", "family": fam.name, "path": None, "hub": where, "canonical": f"hf:{fam.name}@{where}"}

    def fusion(self, parsed: dict[str, Any]) -> Fusion:
        return "early"

    def identity(
        self,
        parsed: dict[str, Any],
        *,
        device: str,
        precision: str,
        modality_rule: str = "family",
        max_pixels: int | None = None,
    ) -> dict[str, Any] | None:
        """spec, dim and template version of a local checkpoint without building it (a hub name:
        None, the retriever is built to learn them)."""
        if not parsed.get("path"):
            return None
        return {
            "spec": f"hf:{parsed['family']}@sha256:{checkpoint_digest(parsed['path'])}{amp_tag(precision, device)}",
            "dim": checkpoint_dim(parsed["path"]),
            "template_version": template_version(family(parsed["family"]), modality_rule, max_pixels),
        }

    def build(
        self, parsed: dict[str, Any], *, device: str, precision: str, modality_rule: str = "family", **options: Any
    ) -> Retriever:
        from retrieval.retrievers.hf.embedder import HfRetriever

        return HfRetriever(parsed, device=device, precision=precision, modality_rule=modality_rule, **options)

    def describe(self, parsed: dict[str, Any]) -> dict[str, Any]:
        from retrieval.retrievers.hf.families import describe

        return {**super().describe(parsed), **describe(family(parsed["family"]))}


KIND = HfKind()
