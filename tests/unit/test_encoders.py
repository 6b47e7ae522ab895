"""Tests for retrieval.encoders: tiny random-init open_clip retrievers, offline only."""

from __future__ import annotations

import hashlib
import socket
import struct
import zlib
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from retrieval import encoders
from retrieval.encoders import (
    ImageTooLargeError,
    OpenClipRetriever,
    Retriever,
    build_retriever,
    compose_embeddings,
    load_image,
    parse_retriever_spec,
)

REPO = Path(__file__).resolve().parents[2]
TINY = "openclip:cirval-tiny-vit"
TINY_B = "openclip:cirval-tiny-vit-b"


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here may reach the network or a hub: fail loudly if anything tries."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(open_clip.factory, "download_pretrained", refuse)
    monkeypatch.setattr(open_clip.factory, "download_pretrained_from_hf", refuse)


def _images(n: int, size: int = 32) -> list[Image.Image]:
    return [
        Image.fromarray(np.random.RandomState(i).randint(0, 256, (size, size + 3 * i % 7, 3), dtype=np.uint8))
        for i in range(n)
    ]


TEXTS = ["a red dress", "make it blue and shorter", "", "the same dog but lying on grass"]


@pytest.fixture(scope="module")
def tiny() -> OpenClipRetriever:
    return build_retriever(TINY, device="cpu")


# ------------------------------------------------------------------ building and shapes


def test_tiny_builds_offline_and_satisfies_protocol(tiny: OpenClipRetriever) -> None:
    r = build_retriever(TINY, device="cpu")  # built again under the no-network fixture
    assert isinstance(r, Retriever)
    assert r.dim == 32
    assert r.spec == "openclip:cirval-tiny-vit@random:0"
    assert r.source == TINY
    assert r.weights_kind == "random"
    b = build_retriever(TINY_B, device="cpu")
    assert b.dim == 48
    assert b.spec != r.spec


def test_embeddings_are_normalised_float32_cpu(tiny: OpenClipRetriever) -> None:
    img = tiny.embed_images(_images(5))
    txt = tiny.embed_texts(TEXTS)
    for emb, n in ((img, 5), (txt, len(TEXTS))):
        assert emb.shape == (n, 32)
        assert emb.dtype == torch.float32
        assert emb.device.type == "cpu"
        assert not emb.is_inference()  # callers may modify results in place
        assert torch.allclose(emb.norm(dim=1), torch.ones(n), atol=1e-5)
    # distinct inputs give distinct embeddings (the model is not degenerate)
    assert not torch.allclose(txt[0], txt[1])
    assert not torch.allclose(img[0], img[1])


def test_empty_inputs(tiny: OpenClipRetriever) -> None:
    assert tiny.embed_images([]).shape == (0, 32)
    assert tiny.embed_texts([]).shape == (0, 32)


def test_text_type_checked(tiny: OpenClipRetriever) -> None:
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        tiny.embed_texts(["ok", None])  # type: ignore[list-item]


def test_batching_does_not_change_results() -> None:
    small = build_retriever(TINY, device="cpu", batch_size=2)
    big = build_retriever(TINY, device="cpu", batch_size=64)
    ims = _images(5)
    assert torch.allclose(small.embed_images(ims), big.embed_images(ims), atol=1e-6)
    assert torch.allclose(small.embed_texts(TEXTS), big.embed_texts(TEXTS), atol=1e-6)


def test_amp_on_cpu_is_plain_fp32() -> None:
    fp32 = build_retriever(TINY, device="cpu")
    amp = build_retriever(TINY, device="cpu", precision="amp")
    assert amp.spec == fp32.spec  # autocast is CUDA-only, so nothing changes on CPU
    assert torch.equal(amp.embed_texts(TEXTS), fp32.embed_texts(TEXTS))
    with pytest.raises(ValueError, match="precision"):
        build_retriever(TINY, device="cpu", precision="fp16")  # type: ignore[arg-type]


# ------------------------------------------------------------------ compose


def test_compose_hand_checked() -> None:
    img = torch.tensor([[3.0, 4.0]])  # normalised: (0.6, 0.8)
    txt = torch.tensor([[2.0, 0.0]])  # normalised: (1, 0)
    # (1.6, 0.8) / sqrt(3.2) = (0.894427..., 0.447213...)
    out = compose_embeddings(img, txt)
    assert torch.allclose(out, torch.tensor([[0.8944272, 0.4472136]]), atol=1e-6)


def test_compose_matches_definition(tiny: OpenClipRetriever) -> None:
    img = tiny.embed_images(_images(4))
    txt = tiny.embed_texts(TEXTS)
    out = tiny.compose(img * 3.0, txt * 0.5)  # scaling must not matter
    n = torch.nn.functional.normalize
    expected = n(n(img, dim=-1) + n(txt, dim=-1), dim=-1)
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.allclose(out.norm(dim=1), torch.ones(4), atol=1e-5)
    with pytest.raises(ValueError, match="shape mismatch"):
        tiny.compose(img[:2], txt)


# ------------------------------------------------------------------ determinism


def test_random_init_deterministic_and_rng_untouched() -> None:
    torch.manual_seed(1234)
    expected_next = torch.rand(3)
    torch.manual_seed(1234)
    a = build_retriever(TINY, device="cpu")
    after = torch.rand(3)
    assert torch.equal(after, expected_next), "building must not consume the caller's RNG"
    b = build_retriever(TINY, device="cpu")
    ims = _images(3)
    assert torch.equal(a.embed_images(ims), b.embed_images(ims))
    assert torch.equal(a.embed_texts(TEXTS), b.embed_texts(TEXTS))
    other = build_retriever(TINY + "@random:7", device="cpu")
    assert other.spec == "openclip:cirval-tiny-vit@random:7"
    assert not torch.allclose(other.embed_texts(TEXTS), a.embed_texts(TEXTS))


def test_local_checkpoint_roundtrip(tmp_path: Path, tiny: OpenClipRetriever) -> None:
    ckpt = tmp_path / "tiny.pt"
    torch.save(tiny.model.state_dict(), ckpt)
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    r = build_retriever(f"openclip:cirval-tiny-vit@{ckpt}", device="cpu")
    assert r.weights_kind == "checkpoint"
    assert r.spec == f"openclip:cirval-tiny-vit@sha256:{digest}"
    assert r.source == f"openclip:cirval-tiny-vit@{ckpt.resolve()}"
    assert torch.equal(r.embed_texts(TEXTS), tiny.embed_texts(TEXTS))


def test_encoder_and_spec_parser_read_weights_alike(
    tmp_path: Path, tiny: OpenClipRetriever, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rule (retrieval.specs.weights_of) for a spec's WEIGHTS and for OpenClipRetriever's
    ``pretrained``: an existing file whose name neither looks like a path nor is a tag is a
    checkpoint in both; an unknown tag is refused by both with the same words."""
    monkeypatch.chdir(tmp_path)
    torch.save(tiny.model.state_dict(), tmp_path / "tinyweights")
    parsed = parse_retriever_spec("openclip:cirval-tiny-vit@tinyweights")
    direct = OpenClipRetriever("cirval-tiny-vit", pretrained="tinyweights", device="cpu")
    assert parsed["kind"] == direct.weights_kind == "checkpoint"
    assert parsed["checkpoint"] == direct.checkpoint == str((tmp_path / "tinyweights").resolve())
    assert build_retriever("openclip:cirval-tiny-vit@tinyweights", device="cpu").spec == direct.spec
    assert direct.source == parsed["canonical"]
    seeded = OpenClipRetriever("cirval-tiny-vit", pretrained=None, device="cpu", seed=5)
    assert (seeded.weights_kind, seeded.seed, seeded.source) == ("random", 5, "openclip:cirval-tiny-vit@random:5")
    for call in (
        lambda: parse_retriever_spec("openclip:cirval-tiny-vit@no_such_tag"),
        lambda: OpenClipRetriever("cirval-tiny-vit", pretrained="no_such_tag", device="cpu"),
    ):
        with pytest.raises(ValueError, match="'no_such_tag' is not a pretrained tag of cirval-tiny-vit"):
            call()


def test_lazy_and_built_retrievers_take_their_spec_from_one_function(tmp_path: Path, tiny: OpenClipRetriever) -> None:
    """encoders.retriever_identity is the one place a retriever's spec (the cache key) is built;
    specs.spec_string the one place a spec string is written; parse_retriever_spec reads it back."""
    ckpt = tmp_path / "tiny.pt"
    torch.save(tiny.model.state_dict(), ckpt)
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    for spec, expected in (
        (f"openclip:cirval-tiny-vit@{ckpt}", f"openclip:cirval-tiny-vit@sha256:{digest}"),
        ("openclip:cirval-tiny-vit@random:3", "openclip:cirval-tiny-vit@random:3"),
        ("openclip:cirval-tiny-vit", "openclip:cirval-tiny-vit@random:0"),
    ):
        lazy = encoders.LazyRetriever(spec, device="cpu")
        assert not lazy.is_built and lazy.spec == expected
        assert lazy.built.spec == expected  # the built one agrees (LazyRetriever.built checks it too)
        parsed = parse_retriever_spec(spec)
        assert encoders.retriever_identity(parsed["model"], parsed, "fp32", torch.device("cpu")) == expected
        assert parse_retriever_spec(parsed["canonical"])["canonical"] == parsed["canonical"]
    # amp on a CUDA device is part of the identity (CPU runs plain fp32: test_amp_on_cpu_is_plain_fp32)
    parsed = parse_retriever_spec("openclip:cirval-tiny-vit@random:3")
    assert (
        encoders.retriever_identity("cirval-tiny-vit", parsed, "amp", torch.device("cuda"))
        == "openclip:cirval-tiny-vit@random:3#amp-fp16"
    )


# ------------------------------------------------------------------ spec parsing


def test_parse_valid_specs(tmp_path: Path) -> None:
    assert parse_retriever_spec(TINY) == {
        "backend": "openclip",
        "model": "cirval-tiny-vit",
        "kind": "random",
        "seed": 0,
        "tag": None,
        "checkpoint": None,
        "canonical": TINY,
    }
    p = parse_retriever_spec("openclip:cirval-tiny-vit@random:0")
    assert (p["kind"], p["seed"], p["canonical"]) == ("random", 0, TINY)
    p = parse_retriever_spec(" openclip:cirval-tiny-vit-b@random:5 ")
    assert (p["seed"], p["canonical"]) == (5, "openclip:cirval-tiny-vit-b@random:5")
    p = parse_retriever_spec("openclip:ViT-B-32@openai")  # parsing never downloads
    assert (p["kind"], p["tag"], p["canonical"]) == ("tag", "openai", "openclip:ViT-B-32@openai")
    p = parse_retriever_spec("openclip:ViT-B-32@LAION2B-S34B-B79K")  # tags normalised as open_clip does
    assert p["tag"] == "laion2b_s34b_b79k"
    ckpt = tmp_path / "w.pt"
    torch.save({}, ckpt)
    p = parse_retriever_spec(f"openclip:ViT-B-32@{ckpt}")
    assert (p["kind"], p["checkpoint"]) == ("checkpoint", str(ckpt.resolve()))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "empty"),
        ("ViT-B-32", "missing backend prefix"),
        ("clip:ViT-B-32", "unknown backend 'clip'"),
        ("openclip:", "no model name"),
        ("openclip:@openai", "no model name"),
        ("openclip:NoSuchModel", "unknown open_clip model 'NoSuchModel'"),
        ("openclip:vit-b-32", "did you mean 'ViT-B-32'"),
        ("openclip:ViT-B-32@", "nothing after '@'"),
        ("openclip:ViT-B-32@not_a_tag", "not a pretrained tag of ViT-B-32"),
        ("openclip:ViT-B-32@/nonexistent/dir/w.pt", "checkpoint file not found"),
        ("openclip:ViT-B-32@random:x", "not a pretrained tag"),
        ("openclip:hf-hub:org/repo", "not supported"),
    ],
)
def test_parse_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_retriever_spec(spec)


def test_hf_dependent_model_refused_without_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with pytest.raises(ValueError, match="never contacts a hub"):
        OpenClipRetriever("ViT-B-16-SigLIP", pretrained=None, device="cpu")


# ------------------------------------------------------------------ image loading


def test_load_image_converts_to_rgb(tmp_path: Path) -> None:
    gray = tmp_path / "g.png"
    Image.new("L", (4, 3), 77).save(gray)
    im = load_image(gray)
    assert im.mode == "RGB" and im.size == (4, 3)
    assert im.getpixel((0, 0)) == (77, 77, 77)
    rgba = tmp_path / "a.png"
    src = Image.new("RGBA", (2, 1), (10, 20, 30, 255))
    src.putpixel((1, 0), (10, 20, 30, 0))  # fully transparent pixel
    src.save(rgba)
    im = load_image(rgba)
    assert im.mode == "RGB"
    assert im.getpixel((0, 0)) == (10, 20, 30)
    assert im.getpixel((1, 0)) == (255, 255, 255)  # flattened onto white


def test_pixel_limit(tmp_path: Path) -> None:
    p = tmp_path / "big.png"
    Image.new("RGB", (100, 60)).save(p)
    assert load_image(p, max_pixels=6000).size == (100, 60)  # exactly at the limit: allowed
    with pytest.raises(ImageTooLargeError, match="6000 pixels"):
        load_image(p, max_pixels=5999)


def _png_header_only(width: int, height: int) -> bytes:
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def test_decompression_bomb_refused_before_decoding(tmp_path: Path) -> None:
    # A header-only PNG (about 50 bytes) claiming 50000 x 50000 pixels: must be refused from its header.
    p = tmp_path / "bomb.png"
    p.write_bytes(_png_header_only(50_000, 50_000))
    with pytest.raises(ImageTooLargeError):
        load_image(p)
    # also when our own limit is lifted: Pillow's hard bomb error is mapped to ours
    with pytest.raises(ImageTooLargeError):
        load_image(p, max_pixels=10**12)
    assert issubclass(ImageTooLargeError, ValueError)
    assert encoders.DEFAULT_MAX_PIXELS < 50_000 * 50_000
