"""Training the demo retrievers: small open_clip models fitted to the demo world.

Pure module (torch, open_clip, Pillow, :mod:`retrieval.demo`; no Django). The demo world
has no public weights to use, so CIRVal trains its own retriever on a *training split*
of the world: random scenes and edits drawn from a generator seeded apart from the
demo's queries (``"demo-train:<seed>"``), so the study queries are never seen.

Objectives, all contrastive (InfoNCE with open_clip's learnable temperature):

* ``captions``: each image against its scene description (:func:`retrieval.demo.describe_scene`);
* ``compositions``: the composed query ``normalise(normalise(image(ref)) + normalise(text(edit)))``
  (:func:`retrieval.encoders.compose_embeddings`, the audit's composition) against the
  target image, the other targets of the same reference being the hard negatives; and, for
  references that allow one, a colour edit named by its family ("make the star a warm
  colour", :func:`retrieval.demo.family_composition`, as the demo's family queries are drawn)
  against every image of the family's colours (multi-positive). Without them the compose
  model never met "warm" or "cool", ranked the demo's sound family queries last, and they
  headed the suspicion queue as false alarms;
* ``neighbours``: image to image, each reference against its one-edit variants (its edits'
  targets, and every image a broad edit such as "change the colour of the circle" allows:
  :func:`retrieval.demo._broad`; multi-positive), and each variant against its reference;
  the other variants of the same reference (two edits away) count neither way. It makes
  "one edit away" the nearest images, so the images near a labelled target and its
  reference are the other images that fit the query: what a candidate pool needs (issue 25).

:data:`DEMO_MODELS` names the two models of the demo pool: ``compose`` (captions and
compositions) and ``caption`` (captions and image neighbours, never a composition: what a
shortcut-prone retriever looks like; its image-to-image lists serve the candidate pool). The
compose model learns no neighbours: with them the suspicion queue of the demo lost precision.

Deterministic: one CPU thread, ``torch.use_deterministic_algorithms``, every random
draw seeded, so the same seed and steps give a checkpoint with the same sha256 bytes.
The checkpoint is a plain ``state_dict`` that open_clip's ``load_checkpoint`` reads,
so ``openclip:cirval-demo@/path/model.pt`` builds it like any local checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from retrieval import encoders
from retrieval.demo import (
    EDIT_TYPES,
    broad_edit,
    describe_edit,
    describe_scene,
    family_composition,
    pick_edit,
    random_scene,
    render_scene,
    scene_key,
)
from retrieval.specs import spec_string

DEMO_CONFIG = "cirval-demo"
#: name -> training objectives
DEMO_MODELS: dict[str, tuple[str, ...]] = {
    "compose": ("captions", "compositions"),
    "caption": ("captions", "neighbours"),
}
#: Bumped when the objectives change, so that a checkpoint trained on the old ones is not reused.
CHECKPOINT_VERSION = 3
OBJECTIVES = ("captions", "compositions", "neighbours")
DEFAULT_STEPS = 500
_EDITS_PER_REF = 4


@dataclass
class TrainingSplit:
    """Rendered training scenes as model inputs, with captions and compositions.

    ``images``: ``[N, 3, H, W]`` preprocessed; ``captions[i]`` describes image ``i``;
    ``groups[g]`` = ``(ref index, [(edit text, target index), ...])``; ``broad[g]`` =
    ``(broad edit text, [every image index it allows])`` of group ``g``'s reference, or None
    (only when drawn with ``broad``, for the ``neighbours`` objective); ``family[g]`` =
    ``(family colour edit text, [every image of the family's colours])`` of group ``g``'s
    reference, or None (for the ``compositions`` objective).
    """

    images: torch.Tensor
    captions: list[str]
    groups: list[tuple[int, list[tuple[str, int]]]]
    broad: list[tuple[str, list[int]] | None] | None = None
    family: list[tuple[str, list[int]] | None] | None = None


def training_split(
    seed: int, n_refs: int, preprocess: Any, image_size: int = 128, broad: bool = False, family: bool = False
) -> TrainingSplit:
    """Draw ``n_refs`` references with up to four edits each from the training generator;
    with ``broad``, also one broad edit per reference and every image it allows (from a
    generator of its own, so the other draws stay the same), more one-edit variants; with
    ``family``, a family colour edit per reference that allows one and its targets (likewise
    from a generator of its own)."""
    rng = random.Random(f"demo-train:{seed}")
    scenes: dict[str, int] = {}
    ordered: list[dict[str, Any]] = []

    def index(scene: dict[str, Any]) -> int:
        key = scene_key(scene)
        if key not in scenes:
            scenes[key] = len(ordered)
            ordered.append(scene)
        return scenes[key]

    groups: list[tuple[int, list[tuple[str, int]]]] = []
    while len(groups) < n_refs:
        ref = random_scene(rng)
        kinds = rng.sample(EDIT_TYPES, len(EDIT_TYPES))
        comps = []
        for kind in kinds:
            picked = pick_edit(ref, kind, rng)
            if picked is not None:
                comps.append((describe_edit(ref, picked[0], rng), index(picked[1])))
            if len(comps) == _EDITS_PER_REF:
                break
        if len(comps) == _EDITS_PER_REF:
            groups.append((index(ref), comps))
    broad_groups = None
    if broad:
        broad_rng = random.Random(f"demo-train-broad:{seed}")
        broad_groups = []
        for ref_index, _ in groups:
            drawn = broad_edit(ordered[ref_index], broad_rng)
            broad_groups.append(None if drawn is None else (drawn[1], [index(s) for s in drawn[2]]))
    family_groups = _family_groups([ordered[r] for r, _ in groups], seed, index) if family else None
    images = torch.stack([preprocess(render_scene(s, image_size, seed)) for s in ordered])
    return TrainingSplit(
        images=images,
        captions=[describe_scene(s) for s in ordered],
        groups=groups,
        broad=broad_groups,
        family=family_groups,
    )


def _family_groups(refs: list[dict[str, Any]], seed: int, index: Any) -> list[tuple[str, list[int]] | None]:
    """Per reference, a family colour edit's text and the indices of all its targets
    (:func:`retrieval.demo.family_composition`, as the demo's family queries are drawn), or
    None where none fits."""
    rng = random.Random(f"demo-train-family:{seed}")
    out: list[tuple[str, list[int]] | None] = []
    for ref in refs:
        drawn = family_composition(ref, rng)
        out.append(None if drawn is None else (describe_edit(ref, drawn[0], rng), [index(t) for t in drawn[1]]))
    return out


class _RandomInitNotice(logging.Filter):
    """Drops open_clip's "No pretrained weights loaded for model '<config>'" for one config."""

    def __init__(self, config: str) -> None:
        super().__init__()
        self.notice = f"No pretrained weights loaded for model '{config}'"

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.notice)


@contextlib.contextmanager
def random_init_expected(config: str) -> Iterator[None]:
    """While ``config`` is built to be trained, leave out open_clip's warning that it starts
    from random weights (logged on the root logger): here that is the plan, and the trainer's
    caller says so once. Only that config, only while the block runs: a random model built
    anywhere else is still warned of (and the audit page tags it)."""
    notice = _RandomInitNotice(config)
    root = logging.getLogger()
    root.addFilter(notice)
    try:
        yield
    finally:
        root.removeFilter(notice)


@contextlib.contextmanager
def deterministic(seed: int) -> Iterator[None]:
    """One thread, deterministic kernels, seeded torch RNG; everything restored afterwards."""
    threads = torch.get_num_threads()
    was = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.use_deterministic_algorithms(was)
        torch.set_num_threads(threads)


def _clip_loss(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    logits = scale * a @ b.T
    labels = torch.arange(len(a))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def _batch_broad(
    split: TrainingSplit, batch: list[int], objectives: tuple[str, ...]
) -> list[tuple[int, str, list[int]]]:
    """(ref index, broad text, target indices) of the batch's groups, when ``neighbours`` reads them."""
    if "neighbours" not in objectives or not split.broad:
        return []
    return [(split.groups[g][0], *split.broad[g]) for g in batch if split.broad[g] is not None]


def _composition_loss(
    model: Any,
    tokenizer: Any,
    split: TrainingSplit,
    batch: list[int],
    img: torch.Tensor,
    scale: torch.Tensor,
    pos: dict[int, int],
) -> torch.Tensor:
    """Composed query (reference + edit text) against its target, the batch's images the
    candidates; a family edit's query against all its targets (multi-positive InfoNCE)."""
    comps = [(split.groups[g][0], t, [target]) for g in batch for t, target in split.groups[g][1]]
    comps += [(split.groups[g][0], *split.family[g]) for g in _batch_family(split, batch)]
    txt = model.encode_text(tokenizer([t for _, t, _ in comps]))
    query = encoders.compose_embeddings(img[torch.tensor([pos[r] for r, _, _ in comps])], txt)
    positive = torch.zeros((len(comps), len(img)), dtype=torch.bool)
    for row, (_, _, targets) in enumerate(comps):
        positive[row, torch.tensor([pos[t] for t in targets])] = True
    logits = scale * query @ img.T
    return (
        torch.logsumexp(logits, dim=1) - torch.logsumexp(logits.masked_fill(~positive, float("-inf")), dim=1)
    ).mean()


def _batch_family(split: TrainingSplit, batch: list[int]) -> list[int]:
    """The batch's groups that carry a family colour edit."""
    return [g for g in batch if split.family and split.family[g] is not None]


def _step_loss(
    model: Any, tokenizer: Any, split: TrainingSplit, batch: list[int], objectives: tuple[str, ...]
) -> torch.Tensor:
    """The loss of one batch of reference groups."""
    refs = [split.groups[g][0] for g in batch]
    comps = [c for g in batch for c in split.groups[g][1]]
    broad = _batch_broad(split, batch, objectives)
    family = (
        [t for g in _batch_family(split, batch) for t in split.family[g][1]] if "compositions" in objectives else []
    )
    image_ids = list(dict.fromkeys(refs + [t for _, t in comps] + [t for b in broad for t in b[2]] + family))
    pos = {i: n for n, i in enumerate(image_ids)}
    img = F.normalize(model.encode_image(split.images[image_ids]), dim=-1)
    scale = model.logit_scale.exp().clamp(max=100)
    cap = F.normalize(model.encode_text(tokenizer([split.captions[i] for i in image_ids])), dim=-1)
    loss = _clip_loss(img, cap, scale)
    if "compositions" in objectives:
        loss = loss + _composition_loss(model, tokenizer, split, batch, img, scale, pos)
    if "neighbours" in objectives:
        variants = {split.groups[g][0]: [t for _, t in split.groups[g][1]] for g in batch}
        for ref, _, targets in broad:
            variants[ref] = variants.get(ref, []) + targets
        loss = loss + _neighbour_loss(img, scale, pos, variants)
    return loss


def _neighbour_loss(
    img: torch.Tensor, scale: torch.Tensor, pos: dict[int, int], variants: dict[int, list[int]]
) -> torch.Tensor:
    """Image-to-image multi-positive InfoNCE: a reference's positives are its one-edit
    ``variants``, a variant's its reference; other variants of the same reference and the
    image itself are left out of the softmax."""
    n = len(img)
    positive = torch.zeros((n, n), dtype=torch.bool)
    ignore = torch.eye(n, dtype=torch.bool)
    for ref, targets in variants.items():
        rows = [pos[ref]] + [pos[t] for t in targets]
        ignore[torch.tensor(rows)[:, None], torch.tensor(rows)[None, :]] = True
        for t in targets:
            positive[pos[ref], pos[t]] = positive[pos[t], pos[ref]] = True
    ignore &= ~positive
    anchors = positive.any(dim=1)
    logits = (scale * img @ img.T).masked_fill(ignore, float("-inf"))
    loss = torch.logsumexp(logits, dim=1) - torch.logsumexp(logits.masked_fill(~positive, float("-inf")), dim=1)
    return loss[anchors].mean()


def train_model(
    out_path: Path,
    objectives: tuple[str, ...],
    seed: int = 7,
    steps: int = DEFAULT_STEPS,
    n_refs: int = 800,
    groups_per_step: int = 12,
    lr: float = 2e-3,
    config: str = DEMO_CONFIG,
    progress: Callable[[int, float], None] | None = None,
) -> str:
    """Train one demo model and save its state_dict at ``out_path``; returns the file's sha256.
    ``progress(steps_done, seconds)`` is called after every step (seconds since the first
    step began: the model's set-up and the split's drawing are not the rate's)."""
    unknown = set(objectives) - set(OBJECTIVES)
    if unknown or not objectives:
        raise ValueError(f"objectives must be among {', '.join(OBJECTIVES)}, not {objectives!r}")
    if steps < 1:
        raise ValueError("steps must be >= 1")
    open_clip = encoders.open_clip_module()  # imported here only (it is slow to import)
    with deterministic(seed):
        with random_init_expected(config):
            model, _, preprocess = open_clip.create_model_and_transforms(config, pretrained=None, device="cpu")
        tokenizer = open_clip.get_tokenizer(config)
        split = training_split(
            seed, n_refs, preprocess, broad="neighbours" in objectives, family="compositions" in objectives
        )
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps))
        )
        order = random.Random(f"demo-batches:{seed}")
        model.train()
        started = time.monotonic()
        for step in range(steps):
            batch = order.sample(range(len(split.groups)), min(groups_per_step, len(split.groups)))
            loss = _step_loss(model, tokenizer, split, batch, objectives)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            if progress:
                progress(step + 1, time.monotonic() - started)
        model.eval()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()  # torch.save names the archive after a file; a buffer keeps the bytes name-free
    torch.save(model.state_dict(), buf)
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, out_path)
    return hashlib.sha256(buf.getvalue()).hexdigest()


def checkpoint_path(models_dir: Path, name: str, seed: int) -> Path:
    """Where the demo model ``name`` trained with ``seed`` is saved."""
    return Path(models_dir) / f"{DEMO_CONFIG}-{name}-v{CHECKPOINT_VERSION}-s{seed}.pt"


def retriever_spec(path: Path, config: str = DEMO_CONFIG) -> str:
    """The retriever spec that builds a saved demo model."""
    return spec_string(config, Path(path).resolve())
