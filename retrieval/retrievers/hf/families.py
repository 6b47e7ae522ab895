"""The ``hf:`` families: each one's published prompts, pooling and image-size limits, as data.

Pure module (standard library only): the web tier and the README read it without torch. The
code that runs a family is :mod:`retrieval.retrievers.hf.embedder`.

Each family states, from its authors' public inference code:

* ``layout``: how a prompt is written around the input (see :func:`render`):
  ``plain``: the template is the whole model input; ``chat``: a Qwen chat turn (system line,
  user turn with the image placeholder before the text, then the assistant header); ``lamra``:
  a Qwen2-VL chat turn whose assistant answer is the ``<emb>`` token;
* the query templates for a composed query (``mm``), the family's own text-only query
  (``text``) and image-only query (``image``), and the candidate template (``candidate``);
  ``{text}`` is the query text, the image placeholder is the model's own (written here as
  ``{image}``). For ``chat`` families the template is the *instruction* (system line) and the
  user turn is the image then the text;
* ``pooling``: ``last`` (the hidden state of the last attended token), or ``before-emb`` (the
  token just before ``<emb>``, LamRA);
* ``positions``: ``mrope`` (the backbone's own multimodal rotary positions) or ``plain``
  (1-D positions over the whole sequence: GME's forward gives the language model no position
  ids, so its M-RoPE sections all read the same index);
* ``resize``: how an image is sized before the processor: ``(factor, min_pixels,
  max_pixels)`` of the Qwen-VL "smart resize" done with PIL as the family's code does (None:
  the processor's own sizing only), and the processor's own ``min_pixels``/``max_pixels``
  where the family sets them.

All families L2-normalise the pooled vector. Changing any template here changes
:data:`TEMPLATE_VERSION`, which is part of every cached query's key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

#: Bumped by hand when the code that applies the templates changes meaning.
TEMPLATE_REVISION = 1
QWEN_FACTOR = 28  # Qwen2-VL / Qwen2.5-VL: 14-pixel patches merged 2 x 2
QWEN3_FACTOR = 32  # Qwen3-VL: 16-pixel patches merged 2 x 2

LLAMA3_TURN = (
    "<|start_header_id|>user<|end_header_id|>\n\n{prompt}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n \n"
)


@dataclass(frozen=True)
class Resize:
    """PIL resize before the processor (``factor``/``min_pixels``/``max_pixels``), and the
    processor's own pixel bounds (``None``: the checkpoint's)."""

    factor: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    processor_min_pixels: int | None = None
    processor_max_pixels: int | None = None
    processor_resizes: bool = True
    #: VLM2Vec: an image with a side under this many pixels is first resized to a square of twice it.
    tiny_side: int | None = None


@dataclass(frozen=True)
class Family:
    name: str
    title: str
    backbones: tuple[str, ...]  # transformers model_type values the family runs on
    layout: str  # plain | chat | lamra | llama3
    mm: str
    text: str
    image: str
    candidate: str
    pooling: str = "last"
    positions: str = "mrope"
    resize: Resize = field(default_factory=Resize)
    image_token: str = "<|vision_start|><|image_pad|><|vision_end|>"
    #: Chat families: the system line when a template gives none; its end punctuation rule.
    default_instruction: str = ""
    end_instruction_with_punctuation: bool = False
    empty_input: str = ""  # what a chat family writes for no text and no image
    chat_suffix: str = ""  # written after the assistant header (GME: <|endoftext|>)
    #: The family's code renders its prompt with the checkpoint's chat template (used when the
    #: checkpoint has one; :func:`render` writes the same turn otherwise).
    uses_chat_template: bool = False
    padding_side: str = "right"
    max_length: int | None = None
    source: str = ""

    def templates(self) -> dict[str, str]:
        return {"mm": self.mm, "text": self.text, "image": self.image, "candidate": self.candidate}


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            name="gme",
            title="GME (GME-Qwen2VL)",
            backbones=("qwen2_vl",),
            layout="chat",
            # GME's instructions are the system line; candidates always take the default one.
            mm="Retrieve a day-to-day image that aligns with the modification instructions of the provided image.",
            text="Find an image that matches the given text.",
            image="Find a day-to-day image that looks similar to the provided image.",
            candidate="You are a helpful assistant.",
            default_instruction="You are a helpful assistant.",
            chat_suffix="<|endoftext|>",
            positions="plain",
            resize=Resize(
                factor=QWEN_FACTOR,
                min_pixels=4 * 28 * 28,
                max_pixels=16384 * 28 * 28,
                processor_min_pixels=256 * 28 * 28,
                processor_max_pixels=1280 * 28 * 28,
            ),
            max_length=1800,
            source="Alibaba-NLP/gme-Qwen2-VL-2B-Instruct gme_inference.py (GmeQwen2VL.embed/forward)",
        ),
        Family(
            name="vlm2vec",
            title="VLM2Vec-V2 (Qwen2-VL backbone)",
            backbones=("qwen2_vl", "qwen2_5_vl"),
            layout="plain",
            image_token="<|image_pad|>",
            # MMEB-V2's CIRR, MSCOCO_t2i and NIGHTS instructions, laid out as its eval code does
            # (image_i2i_vg_dataset.py for CIRR and NIGHTS and their candidates, image_t2i_eval.py for text).
            mm="{image}\nGiven an image, find a similar everyday image with the described changes: {text}\n",
            text="Find me an everyday image that matches the given caption: {text}\n",
            image="{image}\nFind a day-to-day image that looks similar to the provided image.\n",
            candidate="{image}\nRepresent the given image.",
            resize=Resize(processor_min_pixels=4 * 28 * 28, processor_max_pixels=1280 * 28 * 28, tiny_side=28),
            source="TIGER-AI-Lab/VLM2Vec src/model/processor.py (Qwen2_VL_process_fn, process_input_text), "
            "src/model/model.py (_pooling), src/data/eval_dataset/image_i2i_vg_dataset.py",
        ),
        Family(
            name="lamra",
            title="LamRA-Ret (Qwen2-VL / Qwen2.5-VL)",
            backbones=("qwen2_vl", "qwen2_5_vl"),
            layout="lamra",
            mm="{image}I'm looking for a similar everyday image with the described changes. {text}"
            "\nSummarize above image and sentence in one word: ",
            text="{text}\nSummarize above sentence in one word: ",
            image="{image}\nSummarize above image in one word: ",
            candidate="{image}\nSummarize above image in one word: ",
            default_instruction="You are a helpful assistant.",
            pooling="before-emb",
            uses_chat_template=True,
            resize=Resize(factor=QWEN_FACTOR, min_pixels=4 * 28 * 28, max_pixels=300 * 28 * 28),
            source="Code-kunkun/LamRA demo.py, dataset/datasets_circo.py, collators/qwen2_vision_process.py",
        ),
        Family(
            name="qwen3-vl-embedding",
            title="Qwen3-VL-Embedding",
            backbones=("qwen3_vl",),
            layout="chat",
            mm="Given an image, find a similar everyday image with the described changes.",
            text="Retrieve images or text relevant to the user's query.",
            image="Find a day-to-day image that looks similar to the provided image.",
            candidate="Represent the user's input.",
            default_instruction="Represent the user's input.",
            end_instruction_with_punctuation=True,
            empty_input="NULL",
            uses_chat_template=True,
            resize=Resize(
                factor=QWEN3_FACTOR, min_pixels=4 * 32 * 32, max_pixels=1800 * 32 * 32, processor_resizes=False
            ),
            max_length=8192,
            source="QwenLM/Qwen3-VL-Embedding src/models/qwen3_vl_embedding.py (Qwen3VLEmbedder)",
        ),
        Family(
            name="e5-v",
            title="E5-V (LLaVA-NeXT, Llama-3 prompts)",
            backbones=("llava_next",),
            layout="llama3",
            image_token="<image>",
            # E5-V's CIRR prompts (retrieval.py, llava_llama3) and its README's sentence prompt.
            mm='{image}Modify this image with "{text}", desribe modified image in one word:',
            text="{text}\nSummary above sentence in one word: ",
            image="{image}\n Describe this image in one word:",
            candidate="{image}\n Describe this image in one word:",
            padding_side="left",
            source="kongds/E5-V README.md and retrieval.py (cir, llava_llama3)",
        ),
    )
}


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown hf family '{name}'; families: {', '.join(sorted(FAMILIES))}") from None


def template_version(fam: Family, modality_rule: str, max_pixels: int | None = None) -> str:
    """The family's templates, layout, pooling and sizing, and the modality rule, as a short
    name: ``FAMILY-r<revision>-<digest>:<rule>`` (part of every cached query's key)."""
    payload = json.dumps([TEMPLATE_REVISION, asdict(fam), max_pixels], sort_keys=True)
    digest = hashlib.sha256(payload.encode("utf-8")).hexdigest()[:12]
    return f"{fam.name}-r{TEMPLATE_REVISION}-{digest}:{modality_rule}"


def ends_in_punctuation(text: str) -> bool:
    import unicodedata

    return bool(text) and unicodedata.category(text[-1]).startswith("P")


def instruction_of(fam: Family, instruction: str) -> str:
    """A chat family's system line: Qwen3-VL-Embedding strips it and ends it with '.' when it
    ends in no punctuation; an empty one is the default."""
    if fam.end_instruction_with_punctuation:
        instruction = instruction.strip()
        if instruction and not ends_in_punctuation(instruction):
            instruction += "."
    return instruction or fam.default_instruction


def render(fam: Family, role: str, text: str | None, has_image: bool) -> str:
    """The model input string of one item: ``role`` is ``mm``, ``text``, ``image`` or
    ``candidate``; ``text`` the query text (None: none)."""
    template = fam.templates()[role]
    if fam.layout == "chat":
        return _chat(fam, instruction_of(fam, template), text, has_image)
    body = template.replace("{image}", fam.image_token if has_image else "").replace("{text}", text or "")
    if fam.layout == "lamra":
        return (
            f"<|im_start|>system\n{fam.default_instruction}<|im_end|>\n<|im_start|>user\n{body}"
            "<|im_end|>\n<|im_start|>assistant\n<emb>.<|im_end|>\n<|im_start|>assistant\n"
        )
    if fam.layout == "llama3":
        return LLAMA3_TURN.format(prompt=body)
    return body


def _chat(fam: Family, instruction: str, text: str | None, has_image: bool) -> str:
    user = (fam.image_token if has_image else "") + (text or "")
    if not has_image and text is None and fam.empty_input:
        user = fam.empty_input
    return (
        f"<|im_start|>system\n{instruction}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        f"<|im_start|>assistant\n{fam.chat_suffix}"
    )


def describe(fam: Family) -> dict[str, Any]:
    """What the README and the audit form show of a family."""
    return {
        "family": fam.name,
        "title": fam.title,
        "backbones": list(fam.backbones),
        **fam.templates(),
        "pooling": fam.pooling,
        "positions": fam.positions,
        "source": fam.source,
    }


def messages(fam: Family, role: str, text: str | None, has_image: bool) -> list[dict[str, Any]]:
    """The conversation a chat-template family gives its processor's ``apply_chat_template``
    (with ``add_generation_prompt=True``) for one item; the same turn :func:`render` writes."""
    template = fam.templates()[role]
    image = [{"type": "image"}] if has_image else []
    if fam.layout == "lamra":
        body = template.replace("{image}", "").replace("{text}", text or "")
        return [
            {"role": "user", "content": [*image, {"type": "text", "text": body}]},
            {"role": "assistant", "content": [{"type": "text", "text": "<emb>."}]},
        ]
    if fam.layout != "chat":
        raise ValueError(f"family {fam.name} renders no chat template")
    content = [*image] + ([{"type": "text", "text": text}] if text is not None else [])
    if not content and fam.empty_input:
        content = [{"type": "text", "text": fam.empty_input}]
    return [
        {"role": "system", "content": [{"type": "text", "text": instruction_of(fam, template)}]},
        {"role": "user", "content": content},
    ]


def markdown() -> str:
    """Every family with its prompts, its text-only and image-only queries, pooling and image
    sizing, as a Markdown table and a note (for the README and the docs)."""
    out = [
        "| family | runs on | composed query | text-only query | image-only query | candidate | pooling | images |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in FAMILIES.values():
        r = f.resize
        sizing = f"PIL resize to multiples of {r.factor}, {r.min_pixels}-{r.max_pixels} px" if r.factor else ""
        if r.processor_min_pixels or r.processor_max_pixels:
            sizing += f"{'; ' if sizing else ''}processor {r.processor_min_pixels}-{r.processor_max_pixels} px"
        cells = [f"`{f.name}`", ", ".join(f.backbones)]
        cells += ["`" + t.replace("\n", "\\n").replace("|", "\\|") + "`" for t in f.templates().values()]
        # only the Qwen backbones have multimodal rotary positions; LLaVA-NeXT's are 1-D
        positions = f.positions if any(b.startswith("qwen") for b in f.backbones) else "1-D"
        cells += [f"{f.pooling} ({positions} positions)", sizing or "the processor's own"]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append(
        "Chat families (`gme`, `qwen3-vl-embedding`) take the template as the system instruction, the user turn "
        "being the image then the text. Under the `circus` modality rule every query is composed: the text "
        "with a black image of the reference's size, the image with the empty text."
    )
    return "\n".join(out)
