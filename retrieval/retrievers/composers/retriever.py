"""A composer over an open_clip backbone as a :class:`retrieval.retrievers.base.Retriever`.

Candidates, text-only and image-only queries are the backbone's normalised embeddings (the same
as the ``openclip:`` retriever's). The multimodal query is the composer's, from the backbone's
raw (unnormalised) features as the authors feed them: the Combiner mixes the raw image and text
features; textual inversion maps the raw image features to a pseudo token and encodes the prompt
with that token in place of its placeholder word (the first one of each prompt), the
EOT-pooled, projected text feature as open_clip computes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from retrieval.encoders import OpenClipRetriever, build_retriever, file_sha256
from retrieval.retrievers.composers import PROMPTS
from retrieval.retrievers.composers.networks import BACKBONE_KEYS, network_of, strip_module
from retrieval.specs import SPEC_PREFIX, parse_retriever_spec, query_key


def _load(path: str) -> dict[str, Any]:
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{path} holds a {type(checkpoint).__name__}, not a checkpoint dict")
    return checkpoint


def backbone_spec(parsed: dict[str, Any], checkpoint: dict[str, Any]) -> str:
    """The backbone's ``openclip:`` spec: the composer spec's, else the checkpoint's
    (``backbone``; a relative checkpoint path is relative to the composer's folder)."""
    if parsed.get("backbone"):
        return str(parsed["backbone"])
    named = checkpoint.get("backbone")
    if not isinstance(named, str) or not named:
        raise ValueError(
            f"the composer checkpoint {parsed['checkpoint']} names no open_clip backbone: "
            f"say it in the spec, composer:{parsed['composer']}@PATH?backbone=MODEL[@WEIGHTS]"
        )
    model, _, weights = named.removeprefix(SPEC_PREFIX).partition("@")
    folder = Path(parsed["checkpoint"]).parent
    if weights and not weights.startswith(("random", "/")) and (folder / weights).is_file():
        weights = str(folder / weights)
    return parse_retriever_spec(SPEC_PREFIX + model + (f"@{weights}" if weights else ""))["canonical"]


def _load_backbone_weights(backbone: OpenClipRetriever, checkpoint: dict[str, Any]) -> None:
    """The checkpoint's own CLIP weights (CLIP4Cir's fine-tuned ``CLIP``, Pic2Word's
    ``state_dict``) into the backbone, when it carries them."""
    for key in BACKBONE_KEYS:
        state = checkpoint.get(key)
        if isinstance(state, dict) and any(isinstance(v, torch.Tensor) for v in state.values()):
            try:
                missing, _ = backbone.model.load_state_dict(strip_module(state), strict=False)
            except RuntimeError as exc:
                raise ValueError(f"the checkpoint's {key!r} weights do not fit the backbone: {exc}") from None
            if missing:
                raise ValueError(
                    f"the checkpoint's {key!r} weights lack {len(missing)} backbone tensors (e.g. {missing[0]})"
                )
            backbone.model.eval()
            return


class ComposerRetriever:
    """See the module notes."""

    fusion = "late"

    def __init__(
        self,
        composer: str,
        backbone: OpenClipRetriever,
        network: torch.nn.Module,
        digest: str,
        modality_rule: str = "family",
    ) -> None:
        self.composer, self.backbone = composer, backbone
        self.network = network.to(backbone.device).eval()
        self.dim, self.device, self.batch_size = backbone.dim, backbone.device, backbone.batch_size
        self.preprocess = backbone.preprocess
        self.modality_rule = modality_rule
        self.template, placeholder = PROMPTS.get(composer, ("{}", ""))
        self.template_version = f"{composer}:{self.template}"
        self.placeholder = int(backbone.tokenizer([placeholder])[0][1]) if placeholder else None
        self.spec = f"composer:{composer}@sha256:{digest}+{backbone.spec}"

    def __repr__(self) -> str:
        return f"ComposerRetriever(spec={self.spec!r})"

    # -- the backbone's embeddings --------------------------------------------------------

    def embed_images(self, images: list[Any]) -> torch.Tensor:
        return self.backbone.embed_images(images)

    def embed_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.backbone.embed_pixels(pixels)

    def embed_texts(self, texts: list[str]) -> torch.Tensor:
        return self.backbone.embed_texts(texts)

    def embed_candidates(self, images: list[Any]) -> torch.Tensor:
        return self.backbone.embed_images(images)

    # -- queries --------------------------------------------------------------------------

    def embed_queries(self, images: list[Any], texts: list[str | None]) -> torch.Tensor:
        if len(images) != len(texts):
            raise ValueError(f"{len(images)} images but {len(texts)} texts")
        out = torch.empty((len(images), self.dim), dtype=torch.float32)
        groups: dict[str, list[int]] = {"mm": [], "text": [], "image": []}
        for n, (im, t) in enumerate(zip(images, texts)):
            if im is None and t is None:
                raise ValueError("a query needs an image, a text or both")
            groups["mm" if im is not None and t is not None else "text" if im is None else "image"].append(n)
        if groups["text"]:
            out[groups["text"]] = self.embed_texts([texts[n] for n in groups["text"]])
        if groups["image"]:
            out[groups["image"]] = self.embed_images([images[n] for n in groups["image"]])
        for start in range(0, len(groups["mm"]), self.batch_size):
            rows = groups["mm"][start : start + self.batch_size]
            out[rows] = self._composed([images[n] for n in rows], [texts[n] for n in rows])  # type: ignore[misc]
        return out

    def query_cache_key(self, image_key: str | None, text: str | None) -> str:
        return query_key(self.spec, self.template_version, image_key, text)

    @torch.inference_mode()
    def _composed(self, images: list[Any], texts: list[str]) -> torch.Tensor:
        model = self.backbone.model
        pixels = self.backbone.preprocess_images(images).to(self.device)
        image = model.encode_image(pixels).float()
        if self.composer == "combiner":
            tokens = self.backbone.tokenizer(list(texts)).to(self.device)
            return self.network.combine(image, model.encode_text(tokens).float()).cpu()
        pseudo = self.network(image)
        tokens = self.backbone.tokenizer([self.template.format(t) for t in texts]).to(self.device)
        return F.normalize(encode_with_pseudo_token(model, tokens, pseudo, self.placeholder), dim=-1).float().cpu()


def encode_with_pseudo_token(
    model: Any, tokens: torch.Tensor, pseudo: torch.Tensor, placeholder: int | None
) -> torch.Tensor:
    """open_clip's ``encode_text`` of ``tokens`` with each row's first ``placeholder`` token
    embedding replaced by that row's ``pseudo`` token (a hook on the token embedding, so the rest
    of the text tower is open_clip's own: positions, causal mask, EOT pooling, projection)."""
    if not hasattr(model, "token_embedding"):
        raise ValueError("textual inversion needs an open_clip model with its own text tower (token_embedding)")
    hits = (tokens == placeholder).int()
    if placeholder is None or not bool(hits.any(dim=1).all()):
        raise ValueError("every prompt needs the placeholder word")
    first = hits.argmax(dim=1)

    def swap(_module: Any, _args: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[torch.arange(out.shape[0], device=out.device), first] = pseudo.to(out.dtype)
        return out

    handle = model.token_embedding.register_forward_hook(swap)
    try:
        return model.encode_text(tokens)
    finally:
        handle.remove()


def build_composer(
    parsed: dict[str, Any], *, device: str, precision: str, modality_rule: str = "family"
) -> ComposerRetriever:
    checkpoint = _load(parsed["checkpoint"])
    network = network_of(parsed["composer"], checkpoint)
    backbone = build_retriever(backbone_spec(parsed, checkpoint), device=device, precision=precision)  # type: ignore[arg-type]
    _load_backbone_weights(backbone, checkpoint)
    return ComposerRetriever(parsed["composer"], backbone, network, file_sha256(parsed["checkpoint"]), modality_rule)
