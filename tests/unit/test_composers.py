"""composer: specs (issue 37 item 4): the authors' checkpoint key layouts load, and each
composer's multimodal query equals a direct re-implementation of the authors' inference
(SEARLE's encode_with_pseudo_tokens, Pic2Word's encode_text_img_retrieval, CLIP4Cir's
combine_features) on a tiny random open_clip backbone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from retrieval.retrievers import parse_spec, spec_facts

BACKBONE = "cirval-tiny-vit"
WIDTH, DIM = 64, 32  # the tiny model's text width and embedding size


def _searle_state(seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    shapes = {"layers.0": (48, DIM), "layers.3": (48, 48), "layers.6": (WIDTH, 48)}
    return {
        f"{k}.{p}": torch.randn(*(s if p == "weight" else s[:1]), generator=g) * 0.2
        for k, s in shapes.items()
        for p in ("weight", "bias")
    }


def _pic2word_state(seed: int = 2) -> dict:
    g = torch.Generator().manual_seed(seed)
    shapes = {"layers.0.0": (40, DIM), "layers.1.0": (40, 40), "fc_out": (WIDTH, 40)}
    return {
        f"module.{k}.{p}": torch.randn(*(s if p == "weight" else s[:1]), generator=g) * 0.2
        for k, s in shapes.items()
        for p in ("weight", "bias")
    }


def _combiner_state(seed: int = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "text_projection_layer": (24, DIM),
        "image_projection_layer": (24, DIM),
        "combiner_layer": (56, 48),
        "output_layer": (DIM, 56),
        "dynamic_scalar.0": (56, 48),
        "dynamic_scalar.3": (1, 56),
    }
    return {
        f"{k}.{p}": torch.randn(*(s if p == "weight" else s[:1]), generator=g) * 0.2
        for k, s in shapes.items()
        for p in ("weight", "bias")
    }


def _images(n: int = 3) -> list[Image.Image]:
    return [Image.new("RGB", (40 + 3 * i, 36), (40 * i, 200 - 30 * i, 90)) for i in range(n)]


TEXTS = ["make it red", "add a circle", "remove the star"]


def _built(tmp_path, name: str, payload: dict):
    path = tmp_path / f"{name}.pt"
    torch.save(payload, path)
    kind, parsed = parse_spec(f"composer:{name}@{path}?backbone={BACKBONE}")
    return kind.build(parsed, device="cpu", precision="fp32")


def _text_tower(model, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The CLIP text tower after the token embedding, written out (positions, causal
    transformer, final norm, the EOT token's feature, projection)."""
    x = x + model.positional_embedding
    x = model.transformer(x, attn_mask=model.attn_mask)
    x = model.ln_final(x)
    return x[torch.arange(x.shape[0]), tokens.argmax(dim=-1)] @ model.text_projection


def test_parsing_needs_no_torch_and_names_the_grammar(tmp_path):
    path = tmp_path / "phi.pt"
    torch.save({"Phi": _searle_state()}, path)
    facts = spec_facts(f"composer:SEARLE@{path}?backbone={BACKBONE}")
    assert facts["composer"] == "searle" and facts["fusion"] == "late" and facts["backbone"] == f"openclip:{BACKBONE}"
    assert facts["canonical"] == f"composer:searle@{path}?backbone={BACKBONE}"
    for bad, words in [
        ("composer:lincir@x.pt", "unknown composer"),
        ("composer:searle", "needs a checkpoint"),
        (f"composer:searle@{tmp_path / 'none.pt'}", "not found"),
        (f"composer:searle@{path}?depth=3", "unknown composer option"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse_spec(bad)


def test_searle_checkpoint_layout_and_the_authors_inference(tmp_path):
    r = _built(tmp_path, "searle", {"Phi": _searle_state()})
    assert r.placeholder == 259  # '$' in CLIP's BPE vocabulary, as SEARLE's code has it
    images = _images()
    got = r.embed_queries(images, TEXTS)
    model = r.backbone.model
    with torch.no_grad():
        feats = model.encode_image(r.backbone.preprocess_images(images))
        pseudo = r.network(feats)
        tokens = r.backbone.tokenizer([f"a photo of $ that {t}" for t in TEXTS])
        x = model.token_embedding(tokens)
        first = (tokens == 259).int().argmax(dim=1)
        x[torch.arange(len(TEXTS)), first] = pseudo
        want = F.normalize(_text_tower(model, x, tokens), dim=-1)
    assert torch.allclose(got, want, atol=1e-5)
    # text-only and image-only queries: the backbone's own embeddings
    assert torch.allclose(r.embed_queries([None], ["make it red"]), r.backbone.embed_texts(["make it red"]), atol=1e-6)
    assert torch.allclose(r.embed_queries([images[0]], [None]), r.backbone.embed_images(images[:1]), atol=1e-6)
    assert torch.allclose(r.embed_candidates(images), r.backbone.embed_images(images), atol=1e-6)


def test_pic2word_checkpoint_layout_with_ddp_prefixes(tmp_path):
    r = _built(tmp_path, "pic2word", {"epoch": 3, "name": "pic2word", "state_dict_img2text": _pic2word_state()})
    assert r.placeholder == 265  # '*'
    images = _images()
    got = r.embed_queries(images, TEXTS)
    model = r.backbone.model
    sd = {k.removeprefix("module."): v for k, v in _pic2word_state().items()}
    with torch.no_grad():
        h = model.encode_image(r.backbone.preprocess_images(images))
        for i in range(2):  # linear, dropout (eval: none), ReLU blocks, then fc_out
            h = F.relu(h @ sd[f"layers.{i}.0.weight"].T + sd[f"layers.{i}.0.bias"])
        pseudo = h @ sd["fc_out.weight"].T + sd["fc_out.bias"]
        tokens = r.backbone.tokenizer([f"a photo of * , {t}" for t in TEXTS])
        x = model.token_embedding(tokens)
        at = (tokens == 265).int().argmax(dim=1)
        x = torch.stack([torch.cat([x[n, : at[n]], pseudo[n : n + 1], x[n, at[n] + 1 :]]) for n in range(len(TEXTS))])
        want = F.normalize(_text_tower(model, x, tokens), dim=-1)
    assert torch.allclose(got, want, atol=1e-5)


def test_combiner_checkpoint_layout_and_fine_tuned_clip(tmp_path):
    import open_clip

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        tuned = open_clip.create_model(BACKBONE).state_dict()
    r = _built(tmp_path, "combiner", {"epoch": 1, "Combiner": _combiner_state(), "CLIP": tuned})
    assert torch.equal(r.backbone.model.state_dict()["text_projection"], tuned["text_projection"])
    images = _images()
    got = r.embed_queries(images, TEXTS)
    sd = _combiner_state()
    lin = lambda x, k: x @ sd[f"{k}.weight"].T + sd[f"{k}.bias"]  # noqa: E731
    model = r.backbone.model
    with torch.no_grad():
        img = model.encode_image(r.backbone.preprocess_images(images))
        txt = model.encode_text(r.backbone.tokenizer(TEXTS))
        joint = torch.cat([F.relu(lin(txt, "text_projection_layer")), F.relu(lin(img, "image_projection_layer"))], -1)
        gate = torch.sigmoid(lin(F.relu(lin(joint, "dynamic_scalar.0")), "dynamic_scalar.3"))
        want = F.normalize(
            lin(F.relu(lin(joint, "combiner_layer")), "output_layer") + gate * txt + (1 - gate) * img, dim=-1
        )
    assert torch.allclose(got, want, atol=1e-5)


def test_the_backbone_may_be_named_in_the_checkpoint(tmp_path):
    path = tmp_path / "searle.pt"
    torch.save({"Phi": _searle_state(), "backbone": f"openclip:{BACKBONE}"}, path)
    kind, parsed = parse_spec(f"composer:searle@{path}")
    r = kind.build(parsed, device="cpu", precision="fp32")
    assert r.spec.startswith("composer:searle@sha256:") and r.spec.endswith(f"+openclip:{BACKBONE}@random:0")
    torch.save({"Phi": _searle_state()}, path)
    kind, parsed = parse_spec(f"composer:searle@{path}")
    with pytest.raises(ValueError, match="names no open_clip backbone"):
        kind.build(parsed, device="cpu", precision="fp32")


def test_a_wrong_layout_is_refused_with_its_keys(tmp_path):
    with pytest.raises(ValueError, match="no combiner network"):
        _built(tmp_path, "combiner", {"epoch": 1, "optimizer": {}})
