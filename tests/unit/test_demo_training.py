"""The demo retrievers: deterministic training, checkpoints that the normal retriever path loads."""

from __future__ import annotations

import hashlib
import logging

import pytest
import torch

from retrieval.demo import describe_scene, random_scene, render_scene
from retrieval.demo_training import DEMO_MODELS, checkpoint_path, retriever_spec, train_model, training_split
from retrieval.encoders import build_retriever, parse_retriever_spec

TINY = dict(steps=2, n_refs=4, groups_per_step=2)


def test_same_seed_same_checkpoint_bytes(tmp_path) -> None:
    a = train_model(tmp_path / "a.pt", DEMO_MODELS["compose"], seed=3, **TINY)
    b = train_model(tmp_path / "b.pt", DEMO_MODELS["compose"], seed=3, **TINY)
    assert a == b == hashlib.sha256((tmp_path / "a.pt").read_bytes()).hexdigest()
    assert train_model(tmp_path / "c.pt", DEMO_MODELS["compose"], seed=4, **TINY) != a
    assert train_model(tmp_path / "d.pt", DEMO_MODELS["caption"], seed=3, **TINY) != a
    assert torch.get_num_threads() >= 1 and not torch.are_deterministic_algorithms_enabled()  # restored


def test_training_split_is_seeded_and_well_formed() -> None:
    from retrieval.encoders import open_clip_module

    create_model_and_transforms = open_clip_module().create_model_and_transforms
    _, _, preprocess = create_model_and_transforms("cirval-demo", pretrained=None)
    a, b = training_split(5, 6, preprocess), training_split(5, 6, preprocess)
    assert torch.equal(a.images, b.images) and a.captions == b.captions and a.groups == b.groups
    assert len(a.groups) == 6 and all(len(edits) == 4 for _, edits in a.groups)
    assert len(a.captions) == len(a.images) and all(" on a" in c for c in a.captions)
    ref, edits = a.groups[0]
    assert all(t != ref for _, t in edits) and len({t for _, t in edits}) == 4


def test_checkpoint_loads_through_the_retriever_spec(tmp_path) -> None:
    path = checkpoint_path(tmp_path, "compose", 3)
    digest = train_model(path, DEMO_MODELS["compose"], seed=3, **TINY)
    spec = retriever_spec(path)
    assert parse_retriever_spec(spec)["kind"] == "checkpoint"
    r = build_retriever(spec, device="cpu")
    assert r.spec == f"openclip:cirval-demo@sha256:{digest}"
    scene = random_scene(__import__("random").Random(1))
    img = r.embed_images([render_scene(scene, 64)])
    txt = r.embed_texts([describe_scene(scene)])
    assert img.shape == txt.shape == (1, r.dim) and torch.allclose(img.norm(dim=-1), torch.ones(1))
    # the trained weights are the ones loaded, not a random init
    state = torch.load(path, map_location="cpu")
    assert torch.equal(r.model.state_dict()["text_projection"], state["text_projection"])
    random_init = build_retriever("openclip:cirval-demo", device="cpu")
    assert not torch.equal(random_init.model.state_dict()["text_projection"], state["text_projection"])


def test_bad_objectives_refused(tmp_path) -> None:
    with pytest.raises(ValueError):
        train_model(tmp_path / "x.pt", ("images",), **TINY)
    with pytest.raises(ValueError):
        train_model(tmp_path / "x.pt", ("captions",), **{**TINY, "steps": 0})


def test_family_edits_name_every_colour_of_their_family() -> None:
    """The compose objective's family colour edits (as the demo's family queries are written:
    "make the star a warm colour") have one target per colour of the family, none of them the
    reference, and the other draws of the split do not move."""
    from retrieval.encoders import open_clip_module

    create_model_and_transforms = open_clip_module().create_model_and_transforms
    from retrieval.demo import COLOUR_FAMILIES

    _, _, preprocess = create_model_and_transforms("cirval-demo", pretrained=None)
    plain, split = training_split(5, 12, preprocess), training_split(5, 12, preprocess, family=True)
    assert split.groups == plain.groups and plain.family is None
    assert len(split.family) == len(split.groups)
    drawn = [(g, f) for g, f in zip(split.groups, split.family) if f is not None]
    assert drawn, "no reference of 12 allowed a family edit"
    for (ref, _), (text, targets) in drawn:
        family = next(name for name in COLOUR_FAMILIES if name in text)
        assert len(targets) >= 2 and ref not in targets
        captions = [split.captions[t] for t in targets]
        assert all(any(colour in c for colour in COLOUR_FAMILIES[family]) for c in captions)
        assert len(set(captions)) == len(targets)  # one image per colour


def test_the_progress_line_says_each_models_steps_and_the_time_left() -> None:
    from annotation.management.commands.train_demo_retriever import progress_text

    jobs = [("compose", None, 500), ("caption", None, 400)]
    text, done = progress_text(jobs, [0, 0.0, 0, 0.0], side_by_side=True)
    assert text.endswith("compose 0/500, caption 0/400 steps, estimating the time left") and done == 0
    # side by side: the slower model's time left (compose: 100 of 500 in 60 s -> 240 s)
    text, done = progress_text(jobs, [100, 60.0, 100, 40.0], side_by_side=True)
    assert text.endswith("compose 100/500, caption 100/400 steps, 0:04:00 left") and done == 200 / 900
    # one after the other: the rate over both (150 steps in 90 s -> 750 left in 450 s)
    text, _ = progress_text(jobs, [150, 90.0, 0, 0.0], side_by_side=False)
    assert text.endswith("0:07:30 left")


def test_the_demo_models_random_start_is_not_warned_of_but_any_other_is(caplog) -> None:
    """open_clip warns of every random start; the demo's trainer says it once instead."""
    from retrieval.demo_training import random_init_expected

    caplog.set_level(logging.WARNING)
    with random_init_expected("cirval-demo"):
        logging.warning("No pretrained weights loaded for model 'cirval-demo'. Model initialized randomly.")
        logging.warning("No pretrained weights loaded for model 'ViT-B-32'. Model initialized randomly.")
    logging.warning("No pretrained weights loaded for model 'cirval-demo'. Model initialized randomly.")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "No pretrained weights loaded for model 'ViT-B-32'. Model initialized randomly.",
        "No pretrained weights loaded for model 'cirval-demo'. Model initialized randomly.",
    ]
    assert not logging.getLogger().filters  # removed on the way out
