"""The ``composer:`` kind: CIR composers over an open_clip backbone (late fusion: the reference
image and the text are encoded apart, then fused).

* ``pic2word`` (Saito et al., CVPR 2023) and ``searle`` (Baldrati et al., ICCV 2023): textual
  inversion. A small network maps the reference's image features to a pseudo-word token that
  takes the place of a placeholder word in a prompt ("a photo of * , {text}", Pic2Word; "a photo of
  $ that {text}", SEARLE); the open_clip text encoder encodes the prompt.
* ``combiner``: CLIP4Cir's Combiner (Baldrati et al., CVPRW 2022), a gated MLP over the image
  and text features.

Grammar (parsed here without torch)::

    composer:KIND@PATH                        the backbone named in the checkpoint ("backbone")
    composer:KIND@PATH?backbone=MODEL[@WEIGHTS]

PATH is the authors' released checkpoint (their key layouts: SEARLE ``{"Phi": ...}``, Pic2Word
``{"state_dict_img2text": ...}`` with DDP's ``module.`` prefixes, CLIP4Cir ``{"Combiner": ...}``
and optionally its fine-tuned ``{"CLIP": ...}``) or CIRVal's own (the same keys, plus
``backbone``: an ``openclip:`` spec, its checkpoint path relative to the composer's folder).
The multimodal query is the composer's; the text-only and image-only queries are the backbone's
text and image embeddings; candidates are the backbone's image embeddings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retrieval.retrievers.base import Fusion, Retriever, RetrieverKind
from retrieval.specs import SPEC_PREFIX, checkpoint_format, parse_retriever_spec

COMPOSERS = ("pic2word", "searle", "combiner")
#: Each composer's prompt (textual inversion) and the placeholder word the pseudo token replaces.
PROMPTS: dict[str, tuple[str, str]] = {"pic2word": ("a photo of * , {}", "*"), "searle": ("a photo of $ that {}", "$")}


class ComposerKind(RetrieverKind):
    prefix = "composer"
    description = "CIR composer over an open_clip backbone: pic2word, searle (textual inversion), combiner (CLIP4Cir)"
    composes = False  # the multimodal query is the composer's own pass

    def parse(self, rest: str) -> dict[str, Any]:
        head, _, query = rest.partition("?")
        name, sep, path = head.partition("@")
        name = name.strip().lower()
        if name not in COMPOSERS:
            raise ValueError(
                f"unknown composer '{name}' (expected one of {', '.join(COMPOSERS)}): "
                "composer:KIND@PATH[?backbone=MODEL[@WEIGHTS]]"
            )
        if not sep or not path.strip():
            raise ValueError(f"composer:{name} needs a checkpoint: composer:{name}@PATH")
        checkpoint = Path(path.strip()).expanduser().resolve()
        if not checkpoint.is_file():
            raise ValueError(f"composer checkpoint not found: {checkpoint}")
        checkpoint_format(checkpoint)
        backbone = None
        if query:
            key, _, value = query.partition("=")
            if key.strip() != "backbone" or not value.strip():
                raise ValueError(f"unknown composer option '{query}' (expected backbone=MODEL[@WEIGHTS])")
            backbone = parse_retriever_spec(SPEC_PREFIX + value.strip().removeprefix(SPEC_PREFIX))["canonical"]
        return {"composer": name, "checkpoint": str(checkpoint), "backbone": backbone}

    def canonical(self, parsed: dict[str, Any]) -> str:
        tail = f"?backbone={parsed['backbone'][len(SPEC_PREFIX) :]}" if parsed.get("backbone") else ""
        return f"composer:{parsed['composer']}@{parsed['checkpoint']}{tail}"

    def fusion(self, parsed: dict[str, Any]) -> Fusion:
        return "late"

    def build(self, parsed: dict[str, Any], *, device: str, precision: str, modality_rule: str = "family") -> Retriever:
        from retrieval.retrievers.composers.retriever import build_composer

        return build_composer(parsed, device=device, precision=precision, modality_rule=modality_rule)


KIND = ComposerKind()
