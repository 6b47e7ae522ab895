"""How the audit, the embedding cache and the ranking callers use a retriever of any kind.

:func:`audit_retriever` builds the retriever of a spec for the callers' pipeline: open_clip's
:class:`retrieval.encoders.LazyRetriever` as before; any other kind wrapped in
:class:`PipelineRetriever`, which gives it what the shared image pipeline needs (``preprocess``,
``embed_pixels``, ``batch_size``, ``device``) and builds it on first use when its kind can name
its identity without building (:meth:`RetrieverKind.identity`, optional).

:func:`late_path` says whether a retriever's three query modalities come from one image encode
and one text encode (late fusion with ``compose``, the family's modality rule), else every query
is one :meth:`Retriever.embed_queries` pass cached whole (kind ``query``) under
:meth:`Retriever.query_cache_key`; :func:`modality_pairs` gives a query's three inputs under the
retriever's modality rule.

Imports torch (workers only).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from PIL import Image

from retrieval.retrievers.base import Retriever, RetrieverKind, parse_spec

#: A CIRCUS text-only query's image key: the reference's key after it (a black image of its size).
BLACK_PREFIX = "black:"


def rgb_image(image: Image.Image) -> Image.Image:
    """The ``preprocess`` of a retriever that preprocesses images itself: the decoded image."""
    return image if image.mode == "RGB" else image.convert("RGB")


def modality_pairs(rule: str, image_key: str, text: str) -> dict[str, tuple[str | None, str | None]]:
    """(image key, text) of a query's multimodal, text-only and image-only inputs: ``family``:
    the text alone and the image alone; ``circus``: the text with a black image of the
    reference's size (key ``black:<key>``) and the image with the empty text."""
    if rule == "circus":
        return {"mm": (image_key, text), "text": (BLACK_PREFIX + image_key, text), "image": (image_key, "")}
    if rule != "family":
        raise ValueError(f"modality rule must be 'family' or 'circus', not {rule!r}")
    return {"mm": (image_key, text), "text": (None, text), "image": (image_key, None)}


def late_path(retriever: Any) -> bool:
    """Whether one image encode and one text encode serve the three modalities of a query."""
    return (
        getattr(retriever, "fusion", "late") == "late"
        and callable(getattr(retriever, "compose", None))
        and getattr(retriever, "modality_rule", "family") == "family"
    )


class PipelineRetriever:
    """A retriever of any kind as the audit pipeline uses it (see the module notes)."""

    def __init__(
        self,
        kind: RetrieverKind,
        parsed: dict[str, Any],
        *,
        device: str | None,
        precision: str,
        modality_rule: str = "family",
        batch_size: int = 16,
    ) -> None:
        self.kind, self.parsed = kind, parsed
        self._args = {
            "device": device or ("cuda" if torch.cuda.is_available() else "cpu"),
            "precision": precision,
            "modality_rule": modality_rule,
        }
        self.device = torch.device(self._args["device"])
        self.batch_size = int(getattr(kind, "batch_size", 0) or batch_size)
        self.modality_rule = modality_rule
        self.preprocess = rgb_image
        self._built: Retriever | None = None
        self._lock = threading.Lock()
        ident = getattr(kind, "identity", None)
        known = (
            ident(parsed, device=self._args["device"], precision=precision, modality_rule=modality_rule)
            if callable(ident)
            else None
        )
        if known is None:
            self._build()
            known = {"spec": self.built.spec, "dim": self.built.dim, "template_version": self.built.template_version}
        self.spec, self.dim = str(known["spec"]), int(known["dim"])
        self.template_version = str(known.get("template_version", ""))
        self.fusion = kind.fusion(parsed)
        if callable(getattr(self._built, "compose", None)) or getattr(kind, "late_compose", False):
            self.compose = self._compose

    @property
    def is_built(self) -> bool:
        return self._built is not None

    def _build(self) -> Retriever:
        with self._lock:
            if self._built is None:
                self._built = self.kind.build(self.parsed, **self._args)
        return self._built

    @property
    def built(self) -> Retriever:
        built = self._build()
        if "spec" in self.__dict__ and (built.spec, built.dim) != (self.spec, self.dim):
            raise RuntimeError(f"{self.spec!r}/{self.dim} was built as {built.spec!r}/{built.dim}")
        return built

    def _compose(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        return self.built.compose(image_emb, text_emb)  # type: ignore[attr-defined]

    def embed_pixels(self, images: Any) -> torch.Tensor:
        """Candidate embeddings of a batch from the shared image pipeline (decoded images)."""
        return self.embed_candidates(list(images))

    def embed_images(self, images: list[Image.Image]) -> torch.Tensor:
        built = self.built
        if callable(getattr(built, "embed_images", None)):
            return built.embed_images(images)  # type: ignore[attr-defined]
        return built.embed_candidates(images)

    def embed_texts(self, texts: list[str]) -> torch.Tensor:
        built = self.built
        if callable(getattr(built, "embed_texts", None)):
            return built.embed_texts(texts)  # type: ignore[attr-defined]
        return built.embed_queries([None] * len(texts), list(texts))

    def embed_candidates(self, images: list[Image.Image]) -> torch.Tensor:
        return self.built.embed_candidates(list(images)).float().cpu()

    def embed_queries(self, images: list[Image.Image | None], texts: list[str | None]) -> torch.Tensor:
        return self.built.embed_queries(list(images), list(texts)).float().cpu()

    def query_cache_key(self, image_key: str | None, text: str | None) -> str:
        from retrieval.retrievers.base import query_key

        return query_key(self.spec, self.template_version, image_key, text)

    def __repr__(self) -> str:
        return f"PipelineRetriever(spec={self.spec!r}, fusion={self.fusion!r}, built={self.is_built})"


def audit_retriever(
    spec: str, device: str | None = None, batch_size: int = 64, precision: str = "fp32", modality_rule: str = "family"
) -> Any:
    """The retriever of ``spec`` for the audit pipeline (see the module notes)."""
    kind, parsed = parse_spec(spec)
    if kind.prefix == "openclip":
        from retrieval.encoders import LazyRetriever

        return LazyRetriever(
            kind.canonical(parsed),
            device=device or None,
            batch_size=batch_size,
            precision=precision,
            modality_rule=modality_rule,
        )  # type: ignore[arg-type]
    return PipelineRetriever(
        kind, parsed, device=device, precision=precision, modality_rule=modality_rule, batch_size=batch_size
    )
