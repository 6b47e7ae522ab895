"""Reference inference for each ``hf:`` family: a re-implementation, written for these tests,
of the steps each family's public inference code takes (read from its repository; no code
copied). The adapters in ``retrieval.retrievers.hf`` must give the same embeddings.

Each function takes a checkpoint folder and a list of inputs ``(image or None, text or None)``
and returns L2-normalised float32 embeddings, one row per input, computed the way the
family's own code computes them: its own prompt strings, its own image resize, its own
batching and padding side, the full ``...ForConditionalGeneration`` model with
``output_hidden_states`` where its code uses it, and its own pooling.

* GME: ``gme_inference.py`` of Alibaba-NLP/gme-Qwen2-VL (``GmeQwen2VL.embed`` and ``forward``);
* VLM2Vec-V2: TIGER-AI-Lab/VLM2Vec (``Qwen2_VL_process_fn``, ``MMEBModel._pooling``);
* LamRA: Code-kunkun/LamRA (``demo.py``, the CIRCO dataset's messages, its vision resize);
* Qwen3-VL-Embedding: QwenLM/Qwen3-VL-Embedding (``Qwen3VLEmbedder.process``);
* E5-V: kongds/E5-V (README example and ``retrieval.py``'s CIR prompts, Llama-3 template).
"""

from __future__ import annotations

import math
import unicodedata

import torch
import torch.nn.functional as F
from PIL import Image


def _qwen_resize(image: Image.Image, factor: int, lo: int, hi: int) -> Image.Image:
    """qwen_vl_utils' fetch_image for a PIL image: RGB, then resized with PIL's default filter
    to sides that are multiples of ``factor`` with an area in [lo, hi]."""
    image = image.convert("RGB")
    width, height = image.size

    def nearest(x: float) -> int:
        return round(x / factor) * factor

    new_h, new_w = max(factor, nearest(height)), max(factor, nearest(width))
    if new_h * new_w > hi:
        shrink = math.sqrt(height * width / hi)
        new_h = max(factor, math.floor(height / shrink / factor) * factor)
        new_w = max(factor, math.floor(width / shrink / factor) * factor)
    elif new_h * new_w < lo:
        grow = math.sqrt(lo / (height * width))
        new_h, new_w = math.ceil(height * grow / factor) * factor, math.ceil(width * grow / factor) * factor
    return image.resize((new_w, new_h))


def _last_real(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """VLM2Vec/GME pooling: the last position when every row is left-padded, else the position
    of each row's last 1 in the mask (right padding)."""
    if int(mask[:, -1].sum()) == mask.shape[0]:
        return hidden[:, -1]
    return hidden[torch.arange(hidden.shape[0]), mask.sum(dim=1) - 1]


# --------------------------------------------------------------------------------------- GME

GME_SYSTEM = "You are a helpful assistant."


@torch.no_grad()
def gme(
    folder: str, inputs: list[tuple[Image.Image | None, str | None]], instruction: str | None, is_query: bool = True
) -> torch.Tensor:
    """GmeQwen2VL.embed over one batch: the instruction is the system line (the default one for
    candidates), the image placeholder then the text form the user turn, ``<|endoftext|>``
    closes the assistant header; right padding; the language model gets the merged embeddings
    and no position ids; the last real token is pooled."""
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    processor = AutoProcessor.from_pretrained(folder, min_pixels=256 * 28 * 28, max_pixels=1280 * 28 * 28)
    processor.tokenizer.padding_side = "right"
    model = Qwen2VLForConditionalGeneration.from_pretrained(folder).eval()
    system = instruction if (is_query and instruction is not None) else GME_SYSTEM
    prompts, images = [], []
    for image, text in inputs:
        user = ""
        if image is not None:
            user += "<|vision_start|><|image_pad|><|vision_end|>"
            images.append(_qwen_resize(image, 28, 4 * 28 * 28, 16384 * 28 * 28))
        user += text if text is not None else ""
        prompts.append(
            f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n<|endoftext|>"
        )
    batch = processor(
        text=prompts, images=images or None, padding=True, truncation=True, max_length=1800, return_tensors="pt"
    )
    ids = batch["input_ids"]
    embeds = model.get_input_embeddings()(ids)
    if images:
        merged = model.model.visual(batch["pixel_values"], grid_thw=batch["image_grid_thw"]).pooler_output
        embeds[ids == model.config.image_token_id] = merged
    hidden = model.model.language_model(inputs_embeds=embeds, attention_mask=batch["attention_mask"]).last_hidden_state
    return F.normalize(_last_real(hidden, batch["attention_mask"]), p=2, dim=1)


# ----------------------------------------------------------------------------------- VLM2Vec


@torch.no_grad()
def vlm2vec(folder: str, prompts: list[str], images: list[Image.Image | None]) -> torch.Tensor:
    """Qwen2_VL_process_fn then the model: each item through the processor alone (its images
    resized inside the processor to 4..1280 tokens of 28 pixels; an image under 28 pixels a
    side first made 56 x 56), the ids padded by the tokenizer, the pixel rows concatenated;
    the last hidden layer pooled at the last real token."""
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    processor = AutoProcessor.from_pretrained(folder)
    size = {"shortest_edge": 4 * 28 * 28, "longest_edge": 1280 * 28 * 28}
    model = Qwen2VLForConditionalGeneration.from_pretrained(folder).eval()
    ids, pixels, grids = [], [], []
    for prompt, image in zip(prompts, images):
        if image is None:
            one = processor(text=[prompt], images=None, return_tensors="pt")
        else:
            if image.size[0] < 28 or image.size[1] < 28:
                image = image.resize((56, 56))
            one = processor(text=[prompt], images=[image], size=size, return_tensors="pt")
            pixels.append(one["pixel_values"])
            grids.append(one["image_grid_thw"])
        ids.append(one["input_ids"][0].tolist())
    padded = processor.tokenizer.pad({"input_ids": ids}, return_tensors="pt")
    kwargs = {"pixel_values": torch.cat(pixels), "image_grid_thw": torch.cat(grids)} if pixels else {}
    # transformers 5 reads the multimodal rotary positions' image spans from mm_token_type_ids
    # (VLM2Vec's own copy of the model read them from the image token in input_ids).
    types = (padded["input_ids"] == model.config.image_token_id).int()
    out = model(
        input_ids=padded["input_ids"],
        attention_mask=padded["attention_mask"],
        mm_token_type_ids=types,
        output_hidden_states=True,
        **kwargs,
    )
    return F.normalize(_last_real(out.hidden_states[-1], padded["attention_mask"]), p=2, dim=-1)


# ------------------------------------------------------------------------------------- LamRA


@torch.no_grad()
def lamra(folder: str, conversations: list[list[dict]]) -> torch.Tensor:
    """LamRA's demo: ``<emb>`` added to the tokenizer, each conversation through the chat
    template with a generation prompt, images resized as its collator does (4..300 tokens of
    28 pixels), one processor call; the last hidden layer at the token before ``<emb>``."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    processor.tokenizer.add_tokens(["<emb>"])
    emb = processor.tokenizer.convert_tokens_to_ids("<emb>")
    texts = [processor.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
    images = [
        _qwen_resize(part["image"], 28, 4 * 28 * 28, 300 * 28 * 28)
        for c in conversations
        for turn in c
        for part in turn["content"]
        if part["type"] == "image"
    ]
    batch = processor(text=texts, images=images or None, padding=True, return_tensors="pt")
    hidden = model(**batch, output_hidden_states=True, return_dict=True).hidden_states[-1]
    where = torch.argmax((batch["input_ids"] == emb).int(), dim=1)
    return F.normalize(hidden[torch.arange(len(where)), where - 1], dim=-1)


def lamra_conversation(image: Image.Image | None, text: str | None) -> list[dict]:
    """The CIRCO dataset's messages: composed query, sentence or image."""
    if image is not None and text is not None:
        content = [
            {"type": "image", "image": image},
            {"type": "text", "text": f"I'm looking for a similar everyday image with the described changes. {text}"},
            {"type": "text", "text": "\nSummarize above image and sentence in one word: "},
        ]
    elif image is None:
        content = [{"type": "text", "text": f"{text}\nSummarize above sentence in one word: "}]
    else:
        content = [{"type": "image", "image": image}, {"type": "text", "text": "\nSummarize above image in one word: "}]
    return [
        {"role": "user", "content": content},
        {"role": "assistant", "content": [{"type": "text", "text": "<emb>."}]},
    ]


# ------------------------------------------------------------------------- Qwen3-VL-Embedding


@torch.no_grad()
def qwen3_vl_embedding(folder: str, inputs: list[dict]) -> torch.Tensor:
    """Qwen3VLEmbedder.process: a system turn with the instruction (stripped, a full stop added
    when it ends in no punctuation; "Represent the user's input." when none), a user turn with
    the images then the texts ("NULL" for nothing); images resized to multiples of 32 within
    4..1800 tokens before the processor, which does not resize; right padding; the base model's
    last hidden state at the last attended position."""
    from transformers import AutoProcessor, Qwen3VLForConditionalGeneration

    processor = AutoProcessor.from_pretrained(folder, padding_side="right")
    model = Qwen3VLForConditionalGeneration.from_pretrained(folder).eval().model
    conversations, images = [], []
    for item in inputs:
        instruction = (item.get("instruction") or "").strip()
        if instruction and not unicodedata.category(instruction[-1]).startswith("P"):
            instruction += "."
        content = []
        if item.get("image") is not None:
            content.append({"type": "image", "image": item["image"]})
            images.append(_qwen_resize(item["image"], 32, 4 * 32 * 32, 1800 * 32 * 32))
        if item.get("text") is not None:
            content.append({"type": "text", "text": item["text"]})
        if not content:
            content = [{"type": "text", "text": "NULL"}]
        conversations.append(
            [
                {"role": "system", "content": [{"type": "text", "text": instruction or "Represent the user's input."}]},
                {"role": "user", "content": content},
            ]
        )
    text = processor.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False)
    batch = processor(
        text=text,
        images=images or None,
        truncation=True,
        max_length=8192,
        padding=True,
        do_resize=False,
        return_tensors="pt",
    )
    hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"]
    last = mask.shape[1] - mask.flip(dims=[1]).argmax(dim=1) - 1
    return F.normalize(hidden[torch.arange(hidden.shape[0]), last], p=2, dim=-1)


# -------------------------------------------------------------------------------------- E5-V

LLAMA3 = "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n \n"


@torch.no_grad()
def e5v(folder: str, prompts: list[str], images: list[Image.Image] | None) -> torch.Tensor:
    """E5-V: the prompts (``<sent>`` already replaced) through LlavaNextProcessor with left
    padding, the full model's last hidden layer at the last position."""
    from transformers import LlavaNextForConditionalGeneration, LlavaNextProcessor

    processor = LlavaNextProcessor.from_pretrained(folder)
    processor.tokenizer.padding_side = "left"
    model = LlavaNextForConditionalGeneration.from_pretrained(folder).eval()
    batch = processor(text=prompts, images=images, return_tensors="pt", padding=True)
    out = model(**batch, output_hidden_states=True, return_dict=True).hidden_states[-1][:, -1, :]
    return F.normalize(out, dim=-1)


E5V_COMPOSED = LLAMA3.format('<image>Modify this image with "<sent>", desribe modified image in one word:')
E5V_IMAGE = LLAMA3.format("<image>\n Describe this image in one word:")
E5V_TEXT = LLAMA3.format("<sent>\nSummary above sentence in one word: ")


def vlm2vec_prompt(instruction: str, text: str | None, with_image: bool) -> str:
    """The eval code's text for a query or candidate: the MMEB instruction (its ``<|image_1|>``
    dropped) on a new line after the image token, then the text after a space (the i2i eval
    then ends a query, not a candidate, with a new line: the caller adds it); a text-only query
    (the t2i eval) is the instruction, a space, the text and a new line."""
    if not with_image:
        return f"{instruction} {text}\n"
    body = "\n" + instruction.replace("<|image_1|>", "").strip()
    body = body + " " + text if text else body
    return ("<|image_pad|>" + " " + body).replace(" \n", "\n")
