"""An ``hf:`` retriever: one family's inference path over a transformers checkpoint.

Imports torch and transformers (workers only). What each family does is data in
:mod:`retrieval.retrievers.hf.families`; this module applies it:

1. each input becomes a prompt string (:func:`families.render`, or the checkpoint's chat
   template for the families whose code uses it) and an image sized as the family's code sizes
   it (:func:`fit_image`: the Qwen-VL "smart resize" with PIL, then the processor's own bounds);
2. a batch goes through the processor, then through the backbone without its LM head
   (``model.model``): the backbone's own multimodal positions, or GME's plain 1-D positions;
3. one hidden state per row is pooled (the last attended token, or LamRA's token before
   ``<emb>``), L2-normalised, returned as float32 on the CPU.

Performance: on CUDA with ``precision='amp'`` the weights load in bf16 (fp16 where the GPU has
no bf16) and run under autocast; a batch holds at most ``batch_size`` items and at most
``token_budget`` image tokens, and a CUDA out-of-memory error halves the batch size (kept for
later batches) and retries. On the CPU everything is plain fp32.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image

from retrieval.retrievers.base import query_key
from retrieval.retrievers.hf import amp_tag, checkpoint_digest
from retrieval.retrievers.hf.families import Family, family, messages, render, template_version

log = logging.getLogger(__name__)

MAX_RATIO = 200
#: Image tokens one batch may hold (the image-token budget), by device type.
TOKEN_BUDGET = {"cuda": 32768, "cpu": 4096}
BATCH_SIZE = {"cuda": 32, "cpu": 8}
#: Under the ``circus`` rule, the black image of a text-only query given without its reference.
CIRCUS_BLACK_SIZE = (512, 512)


def smart_size(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) that the Qwen-VL code resizes an image to: each side a multiple of
    ``factor``, the area within [min_pixels, max_pixels], the aspect ratio kept as near as that
    allows (rounded to the nearest multiple; scaled down with floor, up with ceil)."""
    if max(height, width) / max(1, min(height, width)) > MAX_RATIO:
        raise ValueError(f"an image of {width}x{height} is more than {MAX_RATIO} times as long as it is wide")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / scale / factor) * factor)
        w = max(factor, math.floor(width / scale / factor) * factor)
    elif h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * scale / factor) * factor
        w = math.ceil(width * scale / factor) * factor
    return h, w


def fit_image(fam: Family, image: Image.Image, max_pixels: int | None = None) -> Image.Image:
    """``image`` as the family's code hands it to the processor (RGB, resized with PIL's default
    filter where the family resizes before the processor)."""
    image = image if image.mode == "RGB" else image.convert("RGB")
    r = fam.resize
    if r.tiny_side and min(image.size) < r.tiny_side:
        image = image.resize((2 * r.tiny_side, 2 * r.tiny_side))
    if r.factor:
        cap = min(r.max_pixels, max_pixels) if max_pixels and r.max_pixels else (r.max_pixels or max_pixels)
        h, w = smart_size(image.height, image.width, r.factor, min(r.min_pixels or 0, cap), cap)
        if (w, h) != image.size:
            image = image.resize((w, h))
    return image


@dataclass
class Item:
    prompt: str
    image: Image.Image | None
    tokens: int  # estimated image tokens (for the budget)


class HfRetriever:
    """A built ``hf:`` retriever (:class:`retrieval.retrievers.base.Retriever`, early fusion)."""

    fusion = "early"

    def __init__(
        self,
        parsed: dict[str, Any],
        *,
        device: str | None = None,
        precision: str = "fp32",
        modality_rule: str = "family",
        batch_size: int | None = None,
        max_pixels: int | None = None,
        token_budget: int | None = None,
    ) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if modality_rule not in ("family", "circus"):
            raise ValueError(f"modality rule must be 'family' or 'circus', not {modality_rule!r}")
        self.family = family(parsed["family"])
        self.modality_rule = modality_rule
        self.max_pixels = max_pixels
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        amp = precision == "amp" and self.device.type == "cuda"
        self.amp_dtype = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if amp else None
        source, local = (parsed["path"], True) if parsed.get("path") else (parsed["hub"], False)
        self.processor = AutoProcessor.from_pretrained(source, local_files_only=local)
        self.processor.tokenizer.padding_side = self.family.padding_side
        self.model = (
            AutoModelForImageTextToText.from_pretrained(
                source, local_files_only=local, dtype=self.amp_dtype or torch.float32
            )
            .to(self.device)
            .eval()
        )
        backbone = self.model.config.model_type
        if backbone not in self.family.backbones:
            raise ValueError(
                f"hf family {self.family.name} runs on {', '.join(self.family.backbones)}, "
                f"not on a {backbone} checkpoint ({source})"
            )
        self.emb_token_id = self._emb_token() if self.family.pooling == "before-emb" else None
        folder = source if local else self._hub_snapshot(source)
        weights = f"sha256:{checkpoint_digest(folder)}" if folder else f"hub:{source}"
        self.spec = f"hf:{self.family.name}@{weights}{amp_tag(precision, str(self.device))}"
        self.dim = int(self.model.get_input_embeddings().embedding_dim)
        self.template_version = template_version(self.family, modality_rule, max_pixels)
        self.batch_size = int(batch_size or BATCH_SIZE.get(self.device.type, 8))
        self.token_budget = int(token_budget or TOKEN_BUDGET.get(self.device.type, 4096))
        self._chat = self.family.uses_chat_template and bool(getattr(self.processor, "chat_template", None))

    @staticmethod
    def _hub_snapshot(name: str) -> str | None:
        """The local snapshot folder a hub checkpoint was loaded from (so that naming the hub or
        that folder gives one identity); None when the hub cache does not tell."""
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json")
        return str(Path(found).parent) if isinstance(found, str) else None

    def _emb_token(self) -> int:
        """LamRA's ``<emb>`` token: its code adds it to the tokenizer (a checkpoint that has it
        keeps its id). Only the token before it is pooled, so its own embedding row is never read."""
        tok = self.processor.tokenizer
        if tok.convert_tokens_to_ids("<emb>") in (None, tok.unk_token_id):
            tok.add_tokens(["<emb>"])
        emb_id = int(tok.convert_tokens_to_ids("<emb>"))
        if emb_id >= self.model.get_input_embeddings().num_embeddings:
            self.model.resize_token_embeddings(len(tok))
        return emb_id

    # ------------------------------------------------------------------ inputs

    def _prompt(self, role: str, text: str | None, has_image: bool) -> str:
        if self._chat:
            return self.processor.apply_chat_template(
                messages(self.family, role, text, has_image), tokenize=False, add_generation_prompt=True
            )
        return render(self.family, role, text, has_image)

    def _item(self, role: str, image: Image.Image | None, text: str | None) -> Item:
        fitted = fit_image(self.family, image, self.max_pixels) if image is not None else None
        side = self.family.resize.factor or 28  # pixels a side of one image token (a 2 x 2 merge of patches)
        tokens = 0 if fitted is None else max(1, fitted.width * fitted.height // (side * side))
        return Item(self._prompt(role, text, fitted is not None), fitted, tokens)

    def _image_kwargs(self) -> dict[str, Any]:
        r = self.family.resize
        if not r.processor_resizes:
            return {"do_resize": False}
        lo, hi = r.processor_min_pixels, r.processor_max_pixels
        if self.max_pixels:
            hi = min(hi or self.max_pixels, self.max_pixels)
        if lo is None and hi is None:
            return {}
        size = dict(self.processor.image_processor.size)
        size.update({k: v for k, v in (("shortest_edge", lo), ("longest_edge", hi)) if v is not None})
        return {"size": size}

    # ------------------------------------------------------------------ forward

    def _inputs(self, items: list[Item]) -> dict[str, torch.Tensor]:
        images = [it.image for it in items if it.image is not None]
        kwargs: dict[str, Any] = {"padding": True, "return_tensors": "pt"}
        if self.family.max_length:
            kwargs.update(truncation=True, max_length=self.family.max_length)
        if images:
            kwargs.update(self._image_kwargs())
        batch = self.processor(text=[it.prompt for it in items], images=images or None, **kwargs)
        return {k: v.to(self.device) for k, v in batch.items() if isinstance(v, torch.Tensor)}

    def _hidden(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inner = self.model.model
        if self.family.positions != "plain":
            return inner(**batch).last_hidden_state
        ids = batch["input_ids"]
        embeds = inner.get_input_embeddings()(ids)
        if "pixel_values" in batch:
            vision = inner.visual(batch["pixel_values"].type(inner.visual.dtype), grid_thw=batch["image_grid_thw"])
            embeds[ids == self.model.config.image_token_id] = vision.pooler_output.to(embeds.dtype)
        return inner.language_model(inputs_embeds=embeds, attention_mask=batch["attention_mask"]).last_hidden_state

    def _pool(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        if self.family.pooling == "before-emb":
            cols = (batch["input_ids"] == self.emb_token_id).int().argmax(dim=1) - 1
        else:
            mask = batch["attention_mask"]
            cols = mask.shape[1] - 1 - mask.flip(dims=[1]).int().argmax(dim=1)
        return hidden[rows, cols]

    @torch.inference_mode()
    def _encode(self, items: list[Item]) -> torch.Tensor:
        batch = self._inputs(items)
        if self.amp_dtype is not None:
            with torch.autocast(device_type="cuda", dtype=self.amp_dtype):
                pooled = self._pool(self._hidden(batch), batch)
        else:
            pooled = self._pool(self._hidden(batch), batch)
        return F.normalize(pooled.float(), p=2, dim=-1).cpu()

    def _chunks(self, items: list[Item]) -> list[list[Item]]:
        """Consecutive items, at most ``batch_size`` and ``token_budget`` image tokens a chunk."""
        chunks: list[list[Item]] = []
        current: list[Item] = []
        tokens = 0
        for it in items:
            if current and (len(current) >= self.batch_size or tokens + it.tokens > self.token_budget):
                chunks.append(current)
                current, tokens = [], 0
            current.append(it)
            tokens += it.tokens
        if current:
            chunks.append(current)
        return chunks

    def encode_items(self, items: list[Item]) -> torch.Tensor:
        """Embeddings of ``items`` in order (batched; halving the batch on CUDA out-of-memory)."""
        out: list[torch.Tensor] = []
        pending = self._chunks(items)
        while pending:
            chunk = pending.pop(0)
            if len(chunk) > self.batch_size:  # planned before a backoff: split at the new size
                pending[:0] = [chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
                continue
            try:
                out.append(self._encode(chunk))
            except torch.cuda.OutOfMemoryError:
                if len(chunk) == 1:
                    raise
                torch.cuda.empty_cache()
                self.batch_size = max(1, len(chunk) // 2)
                log.warning("CUDA out of memory with %d items a batch: now %d", len(chunk), self.batch_size)
                pending.insert(0, chunk)
        return torch.cat(out) if out else torch.empty((0, self.dim), dtype=torch.float32)

    # ------------------------------------------------------------------ the Retriever protocol

    def query_items(self, images: list[Image.Image | None], texts: list[str | None]) -> list[Item]:
        if len(images) != len(texts):
            raise ValueError(f"{len(images)} images but {len(texts)} texts")
        items = []
        for image, text in zip(images, texts):
            if image is None and text is None:
                raise ValueError("a query needs an image, a text or both")
            if self.modality_rule == "circus":  # the caller usually gives these itself (with the reference's size)
                image = image if image is not None else Image.new("RGB", CIRCUS_BLACK_SIZE, (0, 0, 0))
                text = text if text is not None else ""
            role = "mm" if image is not None and text is not None else ("text" if image is None else "image")
            items.append(self._item(role, image, text))
        return items

    def embed_queries(self, images: list[Image.Image | None], texts: list[str | None]) -> torch.Tensor:
        """One row per query. A ``None`` image or text is the family's own text-only or image-only
        query. Under the ``circus`` rule every query is a composed one: the caller gives the black
        image of the reference's size or the empty text (:func:`retrieval.retrievers.pipeline.modality_pairs`);
        a ``None`` text is read as the empty text, a ``None`` image as a black one of
        :data:`CIRCUS_BLACK_SIZE`."""
        return self.encode_items(self.query_items(list(images), list(texts)))

    def embed_candidates(self, images: list[Image.Image]) -> torch.Tensor:
        return self.encode_items([self._item("candidate", image, None) for image in images])

    def query_cache_key(self, image_key: str | None, text: str | None) -> str:
        return query_key(self.spec, self.template_version, image_key, text)

    def __repr__(self) -> str:
        return f"HfRetriever(spec={self.spec!r}, family={self.family.name!r}, device={str(self.device)!r})"
