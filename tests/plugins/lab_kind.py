"""A lab's own retriever, as a plugin package would ship it (issue 37 item 6): the test writes a
``*.dist-info`` folder whose ``entry_points.txt`` names ``lab = <this module>:LabKind`` in the group
``cirval.retrievers``. Early fusion: the reference image and the text go through one forward
pass (a joint non-linearity), so that a mixed-pool audit runs both fusions. Meaningless weights,
fixed by a seed."""

from __future__ import annotations

import hashlib

import numpy as np

from retrieval.retrievers import RetrieverKind, query_key


class LabRetriever:
    fusion = "early"
    template_version = "lab-1"
    dim = 16

    def __init__(self, spec: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.spec, self.image_w, self.text_w = spec, rng.normal(size=(48, 32)), rng.normal(size=(64, 32))
        self.out = rng.normal(size=(32, self.dim))
        self.calls = 0

    def _image(self, im) -> np.ndarray:
        return np.asarray(im.convert("RGB").resize((4, 4)), dtype=np.float32).ravel() / 255.0

    def _text(self, text: str) -> np.ndarray:
        v = np.zeros(64, dtype=np.float32)
        for word in text.lower().split():
            v[int(hashlib.sha256(word.encode()).hexdigest(), 16) % 64] += 1.0
        return v

    def _pass(self, images, texts):
        import torch

        self.calls += 1
        rows = []
        for im, t in zip(images, texts):
            h = (self._image(im) @ self.image_w if im is not None else 0) + (self._text(t) @ self.text_w if t else 0)
            rows.append(np.tanh(h) @ self.out)
        x = torch.tensor(np.array(rows), dtype=torch.float32)
        return torch.nn.functional.normalize(x, dim=-1)

    def embed_queries(self, images, texts):
        return self._pass(images, texts)

    def embed_candidates(self, images):
        return self._pass(images, [None] * len(images))

    def query_cache_key(self, image_key, text):
        return query_key(self.spec, self.template_version, image_key, text)


class LabKind(RetrieverKind):
    prefix = "lab"
    description = "the lab's early-fusion toy"

    def parse(self, rest: str) -> dict:
        if not rest.startswith("toy@") or not rest[4:].isdigit():
            raise ValueError("expected lab:toy@SEED")
        return {"seed": int(rest[4:])}

    def canonical(self, parsed: dict) -> str:
        return f"lab:toy@{parsed['seed']}"

    def fusion(self, parsed: dict) -> str:
        return "early"

    def build(self, parsed: dict, *, device: str, precision: str, modality_rule: str = "family"):
        return LabRetriever(self.canonical(parsed), parsed["seed"])
