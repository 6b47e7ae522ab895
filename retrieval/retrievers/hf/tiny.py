"""Tiny random-weight checkpoints of the transformers classes the ``hf:`` families run on,
built offline: a byte-level BPE tokenizer trained here on a few sentences (with each model's
special tokens), the real processor classes, and configs a few dozen units wide. Each is saved
in transformers' layout, so that ``hf:FAMILY@<folder>`` loads it. Nothing is downloaded.

For tests, benchmarks and demo pools: their embeddings carry no meaning. Imports torch,
tokenizers and transformers when a checkpoint is built (workers and tests only).
"""

from __future__ import annotations

from pathlib import Path

QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<image>", "<pad>"]

CORPUS = [
    "a photo of a dog on the grass",
    "make it red and add a cat",
    "Represent the given image.",
    "You are a helpful assistant.",
    "Summarize above image and sentence in one word:",
    "Find a day-to-day image that looks similar to the provided image.",
    "system user assistant",
    "Given an image, find a similar everyday image with the described changes:",
    "Modify this image with, describe modified image in one word:",
    "Summary above sentence in one word:",
]

#: A chat template written for these tests in the shape of the Qwen-VL ones: a default system
#: turn when the first turn is not one, an image as the vision placeholder, texts as they are.
QWEN_CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if loop.first and m.role != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.content is string -%}{{ m.content }}{%- else -%}"
    "{%- for c in m.content -%}"
    "{%- if c.type == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif c.type == 'text' -%}{{ c.text }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def _tokenizer(specials: list[str], bos: str | None = None, vocab: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    extra = [s for s in specials if s not in (bos, specials[0])]
    kwargs = {"bos_token": bos} if bos else {}
    pad = "<pad>" if "<pad>" in specials else specials[0]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=specials[0] if not bos else "<|eot_id|>",
        pad_token=pad,
        extra_special_tokens=extra,
        **kwargs,
    )


def _ids(tok, *names: str) -> list[int]:
    return [tok.convert_tokens_to_ids(n) for n in names]


def _text(vocab: int, **extra) -> dict:
    return dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        **extra,
    )


def _save(model, processor, folder: Path) -> Path:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder.mkdir(parents=True, exist_ok=True)
    processor.save_pretrained(folder)
    model.save_pretrained(folder)
    return folder


def qwen2_vl(folder: Path, *, seed: int = 0, chat_template: bool = True, v2_5: bool = False) -> Path:
    """A tiny Qwen2-VL (or Qwen2.5-VL) checkpoint."""
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tok = _tokenizer(QWEN_SPECIALS)
    pad, image, video, start = _ids(tok, "<|endoftext|>", "<|image_pad|>", "<|video_pad|>", "<|vision_start|>")
    proc_cls = Qwen2_5_VLProcessor if v2_5 else Qwen2VLProcessor
    processor = proc_cls(
        image_processor=Qwen2VLImageProcessor(),
        tokenizer=tok,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=QWEN_CHAT_TEMPLATE if chat_template else None,
    )
    text = _text(
        len(tok) + 8,
        rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
        bos_token_id=pad,
        eos_token_id=pad,
        pad_token_id=pad,
    )
    if v2_5:
        vision = dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=32,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[0],
        )
        config = Qwen2_5_VLConfig(
            text_config=text,
            vision_config=vision,
            image_token_id=image,
            video_token_id=video,
            vision_start_token_id=start,
        )
        cls = Qwen2_5_VLForConditionalGeneration
    else:
        vision = dict(
            depth=1,
            embed_dim=32,
            hidden_size=32,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        )
        config = Qwen2VLConfig(
            text_config=text,
            vision_config=vision,
            image_token_id=image,
            video_token_id=video,
            vision_start_token_id=start,
        )
        cls = Qwen2VLForConditionalGeneration
    torch.manual_seed(seed)
    return _save(cls(config).eval(), processor, folder)


def qwen3_vl(folder: Path, *, seed: int = 0) -> Path:
    """A tiny Qwen3-VL checkpoint (16-pixel patches, deepstack after the first vision block)."""
    import torch
    from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tok = _tokenizer(QWEN_SPECIALS)
    pad, image, video, start, end = _ids(
        tok, "<|endoftext|>", "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"
    )
    image_processor = Qwen2VLImageProcessor(
        patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    video_processor = Qwen3VLVideoProcessor(patch_size=16, merge_size=2, temporal_patch_size=2)
    processor = Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        video_processor=video_processor,
        chat_template=QWEN_CHAT_TEMPLATE,
    )
    text = _text(
        len(tok) + 8,
        head_dim=8,
        rope_scaling={"rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True},
        bos_token_id=pad,
        eos_token_id=pad,
    )
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=32,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        num_position_embeddings=64,
        deepstack_visual_indexes=[0],
    )
    config = Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=start,
        vision_end_token_id=end,
    )
    torch.manual_seed(seed)
    return _save(Qwen3VLForConditionalGeneration(config).eval(), processor, folder)


def llava_next(folder: Path, *, seed: int = 0) -> Path:
    """A tiny LLaVA-NeXT checkpoint (CLIP vision tower, Llama text model, 28-pixel tiles)."""
    import torch
    from transformers import (
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
    )

    tok = _tokenizer(LLAMA3_SPECIALS, bos="<|begin_of_text|>")
    image, pad, bos, eot = _ids(tok, "<image>", "<pad>", "<|begin_of_text|>", "<|eot_id|>")
    pinpoints = [[28, 28], [28, 56], [56, 28], [56, 56]]
    image_processor = LlavaNextImageProcessor(
        size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}, image_grid_pinpoints=pinpoints
    )
    processor = LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    text = dict(model_type="llama", **_text(len(tok) + 8, bos_token_id=bos, eos_token_id=eot, pad_token_id=pad))
    vision = dict(
        model_type="clip_vision_model",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
        projection_dim=32,
    )
    config = LlavaNextConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=image,
        image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    torch.manual_seed(seed)
    return _save(LlavaNextForConditionalGeneration(config).eval(), processor, folder)


BUILDERS = {"qwen2_vl": qwen2_vl, "qwen3_vl": qwen3_vl, "llava_next": llava_next}
