"""Training the demo's composers: a CLIP4Cir Combiner and a SEARLE-layout textual-inversion
network over the demo's trained open_clip ``compose`` model (issue 37), so that the demo's audit
runs a composer beside the dual encoders.

Pure module (torch, open_clip; no Django). The backbone stays frozen: the training split's image
and text features are computed once, so a few hundred steps take seconds.

* ``combiner``: the Combiner of (reference features, edit text features) against the target image,
  the batch's other targets the negatives (InfoNCE);
* ``searle``: a phi network (SEARLE's key layout) trained as Pic2Word trains its mapping: the
  prompt "a photo of $" with the image's pseudo token against the image itself (contrastive), then
  used with SEARLE's prompt "a photo of $ that {edit}".

Each checkpoint holds the authors' key (``Combiner`` / ``Phi``) and ``backbone``: the backbone's
``openclip:`` spec with its checkpoint's file name, relative to the composer's folder.
Deterministic (one thread, seeded), like :mod:`retrieval.demo_training`.
"""

from __future__ import annotations

import io
import os
import random
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from retrieval import encoders
from retrieval.demo_training import DEMO_CONFIG, deterministic, random_init_expected, training_split
from retrieval.retrievers.composers.networks import Combiner, SearlePhi
from retrieval.retrievers.composers.retriever import encode_with_pseudo_token

#: Composer name -> steps of its training (small: the demo's set-up must stay quick).
DEMO_COMPOSERS: dict[str, int] = {"combiner": 300, "searle": 120}
COMPOSER_VERSION = 1


def composer_path(backbone_checkpoint: Path, name: str) -> Path:
    """Where the demo composer ``name`` over ``backbone_checkpoint`` is saved (beside it)."""
    backbone_checkpoint = Path(backbone_checkpoint)
    return backbone_checkpoint.with_name(f"{backbone_checkpoint.stem}-{name}-c{COMPOSER_VERSION}.pt")


def composer_spec(path: Path) -> str:
    return f"composer:{Path(path).stem.rsplit('-', 2)[-2]}@{Path(path).resolve()}"


def _backbone(checkpoint: Path) -> tuple[Any, Any, Any]:
    open_clip = encoders.open_clip_module()
    with random_init_expected(DEMO_CONFIG):
        model, _, preprocess = open_clip.create_model_and_transforms(
            DEMO_CONFIG, pretrained=str(checkpoint), device="cpu"
        )
    model.eval().requires_grad_(False)
    return model, preprocess, open_clip.get_tokenizer(DEMO_CONFIG)


def _features(model: Any, tokenizer: Any, split: Any) -> dict[str, Any]:
    """Raw image features of the split, and the (reference, edit text, target) triples with
    the edits' raw text features."""
    with torch.no_grad():
        images = torch.cat([model.encode_image(split.images[s : s + 256]) for s in range(0, len(split.images), 256)])
        triples = [(ref, text, target) for ref, edits in split.groups for text, target in edits]
        texts = [t for _, t, _ in triples]
        text_feats = torch.cat([model.encode_text(tokenizer(texts[s : s + 256])) for s in range(0, len(texts), 256)])
    return {"images": images, "triples": triples, "texts": text_feats}


def _combiner_loss(net: Combiner, feats: dict[str, Any], rows: list[int]) -> torch.Tensor:
    refs = torch.tensor([feats["triples"][r][0] for r in rows])
    targets = torch.tensor([feats["triples"][r][2] for r in rows])
    query = net.combine(feats["images"][refs], feats["texts"][rows])
    logits = 50.0 * query @ F.normalize(feats["images"][targets], dim=-1).T
    same = targets[:, None] == targets[None, :]
    logits = logits.masked_fill(same & ~torch.eye(len(rows), dtype=torch.bool), float("-inf"))
    return F.cross_entropy(logits, torch.arange(len(rows)))


def _searle_loss(
    net: SearlePhi, model: Any, tokens: torch.Tensor, feats: dict[str, Any], rows: list[int]
) -> torch.Tensor:
    image = feats["images"][rows]
    text = F.normalize(encode_with_pseudo_token(model, tokens.expand(len(rows), -1), net(image), 259), dim=-1)
    logits = 50.0 * text @ F.normalize(image, dim=-1).T
    return F.cross_entropy(logits, torch.arange(len(rows)))


def train_composer(
    out_path: Path,
    name: str,
    backbone_checkpoint: Path,
    seed: int = 7,
    steps: int | None = None,
    n_refs: int = 300,
    batch: int = 48,
) -> Path:
    """Train the demo composer ``name`` over the demo backbone and save it at ``out_path``."""
    if name not in DEMO_COMPOSERS:
        raise ValueError(f"demo composers are {', '.join(DEMO_COMPOSERS)}, not {name!r}")
    steps = DEMO_COMPOSERS[name] if steps is None else steps
    with deterministic(seed):
        model, preprocess, tokenizer = _backbone(backbone_checkpoint)
        feats = _features(model, tokenizer, training_split(seed + 1, n_refs, preprocess))
        dim, width = feats["images"].shape[1], model.token_embedding.weight.shape[1]
        net: Any = Combiner(dim, 2 * dim, 4 * dim) if name == "combiner" else SearlePhi(dim, 2 * width, width, 0.1)
        opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=0.01)
        order = random.Random(f"demo-composer:{name}:{seed}")
        pool = len(feats["triples"]) if name == "combiner" else len(feats["images"])
        tokens = tokenizer(["a photo of $"])
        net.train()
        for _ in range(steps):
            rows = order.sample(range(pool), min(batch, pool))
            loss = (
                _combiner_loss(net, feats, rows)
                if name == "combiner"
                else _searle_loss(net, model, tokens, feats, rows)
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        net.eval()
    key = "Combiner" if name == "combiner" else "Phi"
    payload = {key: net.state_dict(), "backbone": f"openclip:{DEMO_CONFIG}@{Path(backbone_checkpoint).name}"}
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(payload, buf)
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, out_path)
    return out_path
