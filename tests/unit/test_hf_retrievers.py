"""``hf:`` retrievers: each family's adapter gives the embeddings of a re-implementation of its
official inference code (tests/hf_reference.py), to 1e-5, on tiny random-weight checkpoints of
the same transformers classes with a tokenizer built offline (retrieval/retrievers/hf/tiny.py).

The inputs are a composed query, the family's text-only query, its image-only query and
candidates, of images of different sizes (so that the batches are padded)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from retrieval.retrievers.base import parse_spec
from retrieval.retrievers.hf import families as fams
from retrieval.retrievers.hf import tiny as hf_tiny
from tests import hf_reference as ref

TOL = 1e-5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-tiny")
    return {
        "qwen2_vl": hf_tiny.qwen2_vl(root / "qwen2_vl"),
        "qwen2_5_vl": hf_tiny.qwen2_vl(root / "qwen2_5_vl", v2_5=True, seed=1),
        "qwen3_vl": hf_tiny.qwen3_vl(root / "qwen3_vl"),
        "llava_next": hf_tiny.llava_next(root / "llava_next"),
    }


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    rng = np.random.default_rng(7)
    return [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in ((50, 70), (40, 30))]


def build(spec: str, **options):
    kind, parsed = parse_spec(spec)
    return kind.build(parsed, device="cpu", precision="fp32", **options)


def queries(r, images: list[Image.Image]) -> torch.Tensor:
    """A composed query, a text-only query and an image-only query, in one call."""
    return r.embed_queries([images[0], None, images[1]], ["make it red", "a dog on the grass", None])


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == torch.float32
    assert torch.allclose(a, b.float(), atol=TOL, rtol=0), (a - b).abs().max()


def test_gme_equals_its_official_inference(tiny, images):
    r = build(f"hf:gme@{tiny['qwen2_vl']}")
    f = fams.FAMILIES["gme"]
    folder = str(tiny["qwen2_vl"])
    expected = torch.cat(
        [
            ref.gme(folder, [(images[0], "make it red")], f.mm),
            ref.gme(folder, [(None, "a dog on the grass")], f.text),
            ref.gme(folder, [(images[1], None)], f.image),
        ]
    )
    close(queries(r, images), expected)
    close(r.embed_candidates(images), ref.gme(folder, [(im, None) for im in images], None, is_query=False))


def test_vlm2vec_equals_its_official_inference(tiny, images):
    r = build(f"hf:vlm2vec@{tiny['qwen2_vl']}")
    folder = str(tiny["qwen2_vl"])
    cirr = "<|image_1|>\nGiven an image, find a similar everyday image with the described changes: "
    nights = "<|image_1|>\nFind a day-to-day image that looks similar to the provided image."
    prompts = [
        ref.vlm2vec_prompt(cirr, "make it red", True) + "\n",
        ref.vlm2vec_prompt("Find me an everyday image that matches the given caption:", "a dog on the grass", False),
        ref.vlm2vec_prompt(nights, "", True) + "\n",
    ]
    close(queries(r, images), ref.vlm2vec(folder, prompts, [images[0], None, images[1]]))
    cand = ref.vlm2vec_prompt("<|image_1|>\nRepresent the given image.", "", True)
    close(r.embed_candidates(images), ref.vlm2vec(folder, [cand, cand], images))


def test_vlm2vec_makes_a_tiny_image_56_pixels_square_first(tiny):
    r = build(f"hf:vlm2vec@{tiny['qwen2_vl']}")
    small = Image.new("RGB", (20, 90), (10, 200, 30))
    cand = ref.vlm2vec_prompt("<|image_1|>\nRepresent the given image.", "", True)
    close(r.embed_candidates([small]), ref.vlm2vec(str(tiny["qwen2_vl"]), [cand], [small]))


@pytest.mark.parametrize("backbone", ["qwen2_vl", "qwen2_5_vl"])
def test_lamra_equals_its_official_inference(tiny, images, backbone):
    r = build(f"hf:lamra@{tiny[backbone]}")
    folder = str(tiny[backbone])
    convs = [
        ref.lamra_conversation(images[0], "make it red"),
        ref.lamra_conversation(None, "a dog on the grass"),
        ref.lamra_conversation(images[1], None),
    ]
    close(queries(r, images), ref.lamra(folder, convs))
    close(r.embed_candidates(images), ref.lamra(folder, [ref.lamra_conversation(im, None) for im in images]))


def test_qwen3_vl_embedding_equals_its_official_inference(tiny, images):
    r = build(f"hf:qwen3-vl-embedding@{tiny['qwen3_vl']}")
    f = fams.FAMILIES["qwen3-vl-embedding"]
    folder = str(tiny["qwen3_vl"])
    expected = ref.qwen3_vl_embedding(
        folder,
        [
            {"image": images[0], "text": "make it red", "instruction": f.mm},
            {"text": "a dog on the grass", "instruction": f.text},
            {"image": images[1], "instruction": f.image},
        ],
    )
    close(queries(r, images), expected)
    close(r.embed_candidates(images), ref.qwen3_vl_embedding(folder, [{"image": im} for im in images]))


def test_e5v_equals_its_official_inference(tiny, images):
    r = build(f"hf:e5-v@{tiny['llava_next']}")
    folder = str(tiny["llava_next"])
    expected = torch.cat(
        [
            ref.e5v(folder, [ref.E5V_COMPOSED.replace("<sent>", "make it red")], [images[0]]),
            ref.e5v(folder, [ref.E5V_TEXT.replace("<sent>", "a dog on the grass")], None),
            ref.e5v(folder, [ref.E5V_IMAGE], [images[1]]),
        ]
    )
    close(queries(r, images), expected)
    close(r.embed_candidates(images), ref.e5v(folder, [ref.E5V_IMAGE] * 2, images))


@pytest.mark.parametrize("name", ["lamra", "qwen3-vl-embedding"])
def test_the_written_turn_is_the_chat_templates(tiny, name):
    """Without a chat template in the checkpoint, a chat family writes the turn itself: the
    same text the (Qwen-shaped) template renders."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny["qwen3_vl" if name.startswith("qwen3") else "qwen2_vl"])
    f = fams.FAMILIES[name]
    for role, text, has_image in (
        ("mm", "make it red", True),
        ("text", "a dog", False),
        ("image", None, True),
        ("candidate", None, True),
        ("mm", "", True),
        ("text", "", False),
    ):
        rendered = processor.apply_chat_template(
            fams.messages(f, role, text, has_image), tokenize=False, add_generation_prompt=True
        )
        assert fams.render(f, role, text, has_image) == rendered, (role, text)


def test_a_checkpoint_without_a_chat_template_gives_the_same_embeddings(tmp_path, tiny, images):
    bare = hf_tiny.qwen2_vl(tmp_path / "bare", chat_template=False)
    close(queries(build(f"hf:lamra@{bare}"), images), queries(build(f"hf:lamra@{tiny['qwen2_vl']}"), images))


def test_identity_without_building_matches_the_built_retriever(tiny):
    kind, parsed = parse_spec(f"hf:qwen3-vl-embedding@{tiny['qwen3_vl']}")
    known = kind.identity(parsed, device="cpu", precision="amp")
    r = kind.build(parsed, device="cpu", precision="amp")
    assert (known["spec"], known["dim"], known["template_version"]) == (r.spec, r.dim, r.template_version)
    assert r.spec.startswith("hf:qwen3-vl-embedding@sha256:") and r.dim == 32 and r.fusion == "early"
    assert kind.fusion(parsed) == "early"
    assert r.query_cache_key("abc", "red") != r.query_cache_key("abc", "blue")
    circus = kind.build(parsed, device="cpu", precision="fp32", modality_rule="circus")
    assert circus.template_version != r.template_version and circus.query_cache_key("abc", "red") != r.query_cache_key(
        "abc", "red"
    )


def test_batches_keep_to_the_size_and_the_image_token_budget_and_halve_on_out_of_memory(tiny, images, monkeypatch):
    r = build(f"hf:vlm2vec@{tiny['qwen2_vl']}", batch_size=2)
    whole = r.embed_candidates(images * 3)
    items = [r._item("candidate", im, None) for im in images * 3]
    assert [len(c) for c in r._chunks(items)] == [2, 2, 2]
    r.token_budget = items[0].tokens + items[1].tokens - 1
    assert max(len(c) for c in r._chunks(items)) == 1
    r.token_budget, r.batch_size = 10**6, 8
    sizes: list[int] = []
    encode = type(r)._encode

    def short_of_memory(self, chunk):
        sizes.append(len(chunk))
        if len(chunk) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return encode(self, chunk)

    monkeypatch.setattr(type(r), "_encode", short_of_memory)
    close(r.embed_candidates(images * 3), whole)
    assert sizes == [6, 3, 1, 1, 1, 1, 1, 1] and r.batch_size == 1  # 6 -> 3 -> 1, kept for the rest


def test_the_circus_rule_makes_every_query_a_composed_one(tiny, images):
    """CIRCUS's text-only query is the text with a black image, its image-only query the image
    with the empty text: the family's composed template either way."""
    circus = build(f"hf:qwen3-vl-embedding@{tiny['qwen3_vl']}", modality_rule="circus")
    family = build(f"hf:qwen3-vl-embedding@{tiny['qwen3_vl']}")
    black = Image.new("RGB", images[0].size, (0, 0, 0))
    close(
        circus.embed_queries([black, images[1]], ["a dog on the grass", ""]),
        family.embed_queries([black, images[1]], ["a dog on the grass", ""]),
    )
    close(circus.embed_queries([images[1]], [None]), family.embed_queries([images[1]], [""]))
    assert not torch.allclose(circus.embed_queries([images[1]], [None]), family.embed_queries([images[1]], [None]))


def test_max_pixels_caps_the_image_tokens(tiny):
    big = Image.new("RGB", (640, 480), (90, 90, 200))
    r = build(f"hf:lamra@{tiny['qwen2_vl']}", max_pixels=28 * 28 * 16)
    item = r._item("candidate", big, None)
    assert item.image.width * item.image.height <= 28 * 28 * 16
    assert (
        "max_pixels" not in r.template_version
        and r.template_version != build(f"hf:lamra@{tiny['qwen2_vl']}").template_version
    )


def test_a_family_refuses_a_checkpoint_of_another_architecture(tiny):
    with pytest.raises(ValueError, match="runs on llava_next"):
        build(f"hf:e5-v@{tiny['qwen2_vl']}")


def test_specs_parse_and_name_their_identity_without_torch_or_transformers(tiny, monkeypatch):
    """The web tier parses hf: specs: the kind's module imports neither torch nor transformers."""
    for name in [m for m in sys.modules if m == "retrieval.retrievers.hf" or m.startswith("retrieval.retrievers.hf.")]:
        monkeypatch.delitem(sys.modules, name)
    for heavy in ("torch", "transformers", "PIL"):
        monkeypatch.setitem(sys.modules, heavy, None)  # any import of them now fails
    hf = importlib.import_module("retrieval.retrievers.hf")
    parsed = hf.KIND.parse(f"gme@{tiny['qwen2_vl']}")
    assert parsed["canonical"] == f"hf:gme@{tiny['qwen2_vl'].resolve()}"
    known = hf.KIND.identity(parsed, device="cpu", precision="fp32")
    assert known["dim"] == 32 and known["spec"].startswith("hf:gme@sha256:")
    assert hf.KIND.parse("vlm2vec@TIGER-Lab/VLM2Vec-Qwen2VL-2B")["hub"] == "TIGER-Lab/VLM2Vec-Qwen2VL-2B"
    assert hf.KIND.identity(hf.KIND.parse("e5-v@royokong/e5-v"), device="cpu", precision="fp32") is None


@pytest.mark.parametrize(
    "spec, message",
    [
        ("hf:nope@/tmp", "unknown hf family 'nope'; families: e5-v, gme, lamra, qwen3-vl-embedding, vlm2vec"),
        ("hf:gme", "expected hf:FAMILY@PATH"),
        ("hf:gme@/no/such/folder", "no checkpoint folder '/no/such/folder'"),
        ("hf:gme@./relative/missing", "no checkpoint folder"),
    ],
)
def test_bad_specs_say_why(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_spec(spec)


def test_a_folder_without_a_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="has no config.json"):
        parse_spec(f"hf:gme@{tmp_path}")


def test_every_family_is_described_with_its_prompts_and_rules():
    for name, f in fams.FAMILIES.items():
        d = fams.describe(f)
        assert d["family"] == name and d["source"] and d["pooling"] in ("last", "before-emb")
        assert {"mm", "text", "image", "candidate"} <= set(d)
    table = fams.markdown()
    assert all(f"| `{name}` |" in table for name in fams.FAMILIES) and "circus" in table
