"""The early-fusion retriever of an ``api:`` spec: a hosted embedder behind the ledger of paid
inputs (:mod:`.ledger`). Imported by :meth:`ApiKind.build` only (torch and PIL).

Queries are sent with the API's query side (Voyage ``input_type: query``; Gemini's ``task:
search result | query:`` prefix), candidates with its document side; a query is the reference
image, then the text. Modality rules: ``family``: a text-only query is the text alone, an
image-only query the image alone; ``circus``: the text-only query is the text with a black image
(of the reference's size when the caller passes ``black_like(reference)``; of
:data:`CIRCUS_BLACK_SIZE` when it passes no image), the image-only query the image alone (the
empty text, dropped: the APIs refuse an empty text part).
"""

from __future__ import annotations

import hashlib
import io
import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from retrieval.retrievers.api.catalog import ModelInfo, model_info, text_tokens
from retrieval.retrievers.api.client import ApiClient, batches, input_bytes
from retrieval.retrievers.api.ledger import Ledger, input_key
from retrieval.retrievers.api.providers import PROVIDER_FORMATS, Input, InputType, template_version
from retrieval.retrievers.base import query_key

#: The black image of a ``circus`` text-only query given no reference image.
CIRCUS_BLACK_SIZE = (512, 512)
JPEG_QUALITY = 95


def encode_image(image: Image.Image) -> tuple[bytes, str]:
    """JPEG bytes of ``image`` (as RGB, quality :data:`JPEG_QUALITY`) and the ledger's name of
    them: the sha256 of the pixels, their size and mode, and the encoding (so a new JPEG encoder
    build, which may write other bytes for the same pixels, does not make paid images new)."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    ident = hashlib.sha256(f"RGB:{rgb.size[0]}x{rgb.size[1]}:jpeg{JPEG_QUALITY}:".encode() + rgb.tobytes()).hexdigest()
    buf = io.BytesIO()
    rgb.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue(), ident


class ApiRetriever:
    """A hosted embedder (see the module notes). ``on_batch(n_done, n_todo)`` is called after
    each answer is in the ledger (progress; the tests stop a run there)."""

    fusion = "early"

    def __init__(
        self,
        parsed: dict[str, Any],
        ledger_root: str | Path,
        modality_rule: str = "family",
        client: ApiClient | Callable[[], ApiClient] | None = None,
        on_batch: Callable[[int, int], None] | None = None,
    ) -> None:
        if modality_rule not in ("family", "circus"):
            raise ValueError(f"unknown modality rule {modality_rule!r}")
        self.info: ModelInfo = model_info(parsed["provider"], parsed["model"])
        self.spec = str(parsed["canonical"])
        self.dim = int(parsed["dim"])
        self.modality_rule = modality_rule
        self.format = PROVIDER_FORMATS[self.info.provider]
        #: The version of the requests' prompts and part order: part of every ledger key (not the
        #: modality rule: the same request under either rule is paid once).
        self.request_template = f"{self.info.provider}-{self.format.template}"
        self.template_version = template_version(self.info.provider, modality_rule)
        self.ledger = Ledger(ledger_root, self.spec, self.dim)
        self._client = client
        self.on_batch = on_batch

    @property
    def client(self) -> ApiClient:
        """The client, made on first use (``client`` may be a factory): a run served from the
        ledger never needs one."""
        if self._client is None:
            self._client = ApiClient(self.info, self.dim)
        elif not isinstance(self._client, ApiClient):
            self._client = self._client()
        return self._client

    def query_cache_key(self, image_key: str | None, text: str | None) -> str:
        return query_key(self.spec, self.template_version, image_key, text)

    # -- inputs --------------------------------------------------------------------------

    def _input(self, image: Image.Image | None, text: str | None, input_type: InputType) -> tuple[Input, int]:
        """The parts of one input and its estimated tokens."""
        tokens = text_tokens(text)
        data, ident = None, ""
        if image is not None:
            data, ident = encode_image(image)
            tokens += self.info.image_tokens(*image.size)
        return self.format.parts(data, text, input_type, "image/jpeg", ident), tokens

    def _query(self, image: Image.Image | None, text: str | None) -> tuple[Input, int]:
        if image is None and text is None:
            raise ValueError("a query needs a reference image, a text or both")
        if self.modality_rule == "circus" and image is None:
            image = Image.new("RGB", CIRCUS_BLACK_SIZE, (0, 0, 0))
        return self._input(image, text if text else None, "query")

    def embed_queries(self, images: Sequence[Image.Image | None], texts: Sequence[str | None]) -> torch.Tensor:
        if len(images) != len(texts):
            raise ValueError(f"{len(images)} images for {len(texts)} texts")
        return self._embed([self._query(im, tx) for im, tx in zip(images, texts)], "query")

    def embed_candidates(self, images: Sequence[Image.Image]) -> torch.Tensor:
        return self._embed([self._input(im, None, "document") for im in images], "document")

    # -- the ledger and the API ------------------------------------------------------------

    def _embed(self, prepared: list[tuple[Input, int]], input_type: InputType) -> torch.Tensor:
        keys = [input_key(self.spec, self.request_template, input_type, parts) for parts, _ in prepared]
        have = self.ledger.get_many(keys)
        first = {k: i for i, k in reversed(list(enumerate(keys)))}
        todo = [first[k] for k in dict.fromkeys(keys) if k not in have]
        if todo:
            self._pay(prepared, keys, todo, input_type, have)
        out = np.stack([have[k] for k in keys]).astype(np.float32) if keys else np.zeros((0, self.dim), np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        if keys and not (norms > 0).all():
            raise ValueError(f"{self.spec}: the API returned a zero vector")
        return torch.from_numpy(np.ascontiguousarray(out / np.where(norms > 0, norms, 1.0)))

    def _pay(
        self,
        prepared: list[tuple[Input, int]],
        keys: list[str],
        todo: list[int],
        input_type: InputType,
        have: dict[str, np.ndarray],
    ) -> None:
        """The vectors of the inputs at ``todo``: those this process claims are sent (see
        :meth:`_send`), those another process is paying for are waited for and read back."""
        owner = f"{os.getpid()}-{uuid.uuid4().hex}"
        pending, done, delay = list(todo), [0], 0.05
        while pending:
            sent = self._send(prepared, keys, pending, input_type, have, owner, done, len(todo))
            have.update(self.ledger.get_many([keys[i] for i in pending if keys[i] not in have]))
            pending = [i for i in pending if keys[i] not in have]
            if pending and not sent:  # all left are another process's: wait for its answers
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _send(
        self,
        prepared: list[tuple[Input, int]],
        keys: list[str],
        pending: list[int],
        input_type: InputType,
        have: dict[str, np.ndarray],
        owner: str,
        done: list[int],
        total: int,
    ) -> int:
        """Claim what of ``pending`` no one pays for yet and send it, batch after batch, each
        answer stored in the ledger before the next request; returns how many were sent."""
        client = self.client
        policy = client.config.policy
        claimed = set(
            self.ledger.claim(
                [keys[i] for i in pending], owner, ttl_s=policy.max_tries * (policy.timeout_s + policy.cap_s)
            )
        )
        mine = [i for i in pending if keys[i] in claimed]
        sizes = [(input_bytes(prepared[i][0]), prepared[i][1]) for i in mine]
        try:
            for part in batches(
                sizes, client.config.batch, client.config.max_request_bytes, client.max_request_tokens()
            ):
                idx = [mine[j] for j in part]
                vectors, usage = client.embed(
                    [prepared[i][0] for i in idx], input_type, sum(prepared[i][1] for i in idx)
                )
                arr = np.asarray(vectors, dtype=np.float32)
                self.ledger.record([keys[i] for i in idx], arr, usage)
                have.update((keys[i], arr[n]) for n, i in enumerate(idx))
                done[0] += len(idx)
                if self.on_batch is not None:
                    self.on_batch(done[0], total)
        finally:
            self.ledger.release([keys[i] for i in mine if keys[i] not in have], owner)
        return len(mine)
