"""Retrievers (image and text encoders) for the shortcut audit.

Pure module: torch, open_clip, numpy and Pillow only (no Django, no Celery). open_clip
(and with it torchvision, timm, sympy, huggingface_hub) is imported only where a model, a
tokenizer or a transform is built (:func:`open_clip_module`): an audit served wholly from the
embedding cache needs a retriever's ``spec``, ``dim`` and :meth:`compose` only, which the
spec string and the model's config file give (:func:`retrieval.specs.model_config`).

A retriever turns images and texts into L2-normalised embeddings in one space, and
composes a multimodal query as ``normalise(normalise(img) + normalise(txt))``.

Output convention: every ``embed_*`` / ``compose`` result is a contiguous float32
tensor **on the CPU**, whatever device the model runs on. Embeddings go to the on-disk
cache (:mod:`retrieval.embcache`) and to ranking code that decides itself where to
compute; returning CPU tensors keeps GPU memory bounded to one batch.

Retriever specs (``openclip:MODEL[@random:SEED|@TAG|@/path/to/ckpt.pt]``) are parsed by
:mod:`retrieval.specs`, which needs no torch; :func:`parse_retriever_spec` is re-exported
here. Only a TAG may contact a hub; random and local builds never do.
"""

from __future__ import annotations

import gc
import hashlib
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any, Literal, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from PIL import Image

from retrieval.imagefiles import DEFAULT_MAX_PIXELS
from retrieval.specs import MODEL_CONFIG_DIR, model_config, parse_retriever_spec, query_key, spec_string, weights_of

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "IMAGE_ERRORS",
    "ImageTooLargeError",
    "LazyRetriever",
    "OpenClipRetriever",
    "Retriever",
    "build_retriever",
    "compose_embeddings",
    "load_image",
    "parse_retriever_spec",
]

Precision = Literal["fp32", "amp"]

_register_lock = threading.Lock()


def open_clip_module() -> Any:
    """open_clip, imported on first use (seconds: it pulls torchvision, timm, sympy and
    huggingface_hub in), with the shipped tiny configs made known to it (idempotent).

    A process that keeps its start-up heap out of the garbage collector's scans (a worker,
    :func:`config.worker_tuning.freeze_startup_heap`) keeps this import's objects out too,
    as it did when open_clip was imported at start-up: otherwise every full collection would
    scan them (about 0.15 s each)."""
    fresh = "open_clip" not in sys.modules
    import open_clip

    if fresh and gc.get_freeze_count():
        gc.collect()
        gc.freeze()
    with _register_lock:
        names = {p.stem for p in MODEL_CONFIG_DIR.glob("*.json")}
        if names and not names.issubset(set(open_clip.list_models())):
            open_clip.add_model_config(MODEL_CONFIG_DIR)
    return open_clip


# --------------------------------------------------------------------------- images


class ImageTooLargeError(ValueError):
    """The image has more pixels than allowed (possible decompression bomb)."""


def load_image(path: str | os.PathLike[str], max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Open an image file and return it decoded as RGB.

    The pixel count is checked from the header, before decoding; images with more than
    ``max_pixels`` pixels raise :class:`ImageTooLargeError`. Transparent images are
    flattened onto white. EXIF orientation is not applied (as in open_clip evaluation).
    """
    try:
        with Image.open(path) as im:
            width, height = im.size
            if width * height > max_pixels:
                raise ImageTooLargeError(
                    f"{path}: image is {width}x{height} = {width * height} pixels, "
                    f"more than the limit of {max_pixels} (possible decompression bomb)"
                )
            im.load()
            return _to_rgb(im)
    except Image.DecompressionBombError as exc:  # Pillow's own, stricter-than-ours guard
        raise ImageTooLargeError(f"{path}: {exc}") from exc


#: Exceptions that make an image unreadable (counted and skipped, never fatal).
IMAGE_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, ImageTooLargeError)


Preprocess = Callable[[Image.Image], torch.Tensor]
#: One loaded file: its key, then per preprocessing pipeline its tensor or the reason it failed.
LoadedItem = tuple[str, list[torch.Tensor | None], list[str | None]]


class _ImageFiles(torch.utils.data.Dataset):
    """``(key, path)`` pairs, each file decoded once and preprocessed by each of ``preprocesses``
    (one per retriever: models that see different image sizes share the decoding), in a loader
    process or in this one."""

    def __init__(self, items: Sequence[tuple[str, Any]], preprocesses: Sequence[Preprocess], max_pixels: int) -> None:
        self.items, self.preprocesses, self.max_pixels = list(items), list(preprocesses), max_pixels

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> LoadedItem:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[LoadedItem]:
        """A batch of items: every file of the batch decoded, then preprocessed by each
        pipeline a step at a time (:func:`preprocess_each`), not file by file. A file that
        cannot be decoded fails every pipeline; one that fails a step fails that pipeline."""
        n_pre = len(self.preprocesses)
        out: list[LoadedItem] = []
        loaded: list[tuple[int, Image.Image]] = []
        for i in indices:
            key, path = self.items[i]
            try:
                loaded.append((len(out), load_image(path, max_pixels=self.max_pixels)))
                out.append((key, [None] * n_pre, [None] * n_pre))
            except IMAGE_ERRORS as exc:
                out.append((key, [None] * n_pre, [_reason(exc)] * n_pre))
        images = [im for _, im in loaded]
        for j, preprocess in enumerate(self.preprocesses):
            for (n, _), px in zip(loaded, _preprocessed_or_reasons(preprocess, images)):
                if not isinstance(px, str):  # a tensor, or an image a retriever preprocesses itself
                    out[n][1][j] = px
                else:
                    out[n][2][j] = px
        return out


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _preprocessed_or_reasons(preprocess: Preprocess, images: Sequence[Image.Image]) -> list[torch.Tensor | str]:
    """:func:`preprocess_each`, or when some image fails a step, each image's tensor or reason."""
    try:
        return list(preprocess_each(preprocess, images))
    except IMAGE_ERRORS:  # find which, one by one
        out: list[torch.Tensor | str] = []
        for im in images:
            try:
                out.append(preprocess(im))
            except IMAGE_ERRORS as exc:
                out.append(_reason(exc))
        return out


def preprocess_each(preprocess: Preprocess, images: Sequence[Image.Image]) -> list[torch.Tensor]:
    """``[preprocess(im) for im in images]``, the same tensors, computed one step of the
    transform at a time over the whole list when ``preprocess`` is a torchvision ``Compose``
    (open_clip's: resize, crop, to tensor, normalise; each step a function of one image).
    On a CPU a step run over a batch of 64 small images costs about 15% less than the
    steps run image by image: each step's code stays hot."""
    if not _is_compose(preprocess):
        return [preprocess(im) for im in images]
    xs: list[Any] = list(images)
    for step in preprocess.transforms:
        xs = [step(x) for x in xs]
    return xs


def _is_compose(preprocess: Any) -> bool:
    """Whether ``preprocess`` is a torchvision ``Compose`` (without importing torchvision: a
    process that never built a model has none to compare)."""
    kind = type(preprocess)
    return kind.__name__ == "Compose" and kind.__module__.startswith("torchvision.")


def _collate(batch: list[LoadedItem]) -> tuple[list[str], list[torch.Tensor | None], list[dict[str, str]]]:
    """``(keys, per pipeline: the stacked tensors of the keys it did not fail (in order) or None,
    per pipeline: {key: reason} of those it failed)``."""
    keys = [key for key, _, _ in batch]
    n_pre = len(batch[0][1]) if batch else 0
    pixels: list[torch.Tensor | None] = []
    bad: list[dict[str, str]] = []
    for j in range(n_pre):
        ok = [px[j] for _, px, _ in batch if px[j] is not None]
        pixels.append((torch.stack(ok) if isinstance(ok[0], torch.Tensor) else ok) if ok else None)
        bad.append({key: err[j] for key, _, err in batch if err[j] is not None})
    return keys, pixels, bad


def shared_preprocessed_batches(
    items: Sequence[tuple[str, Any]],
    preprocesses: Sequence[Preprocess],
    batch_size: int,
    workers: int = 0,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Any:
    """Stream ``(keys, [pixel batch or None per pipeline], [unreadable {key: reason} per pipeline])``
    for ``(key, path)`` items, each file decoded once for every pipeline (the rows of pipeline
    ``j``'s batch are the keys not in its unreadable dict, in order).

    Files are decoded and preprocessed in ``workers`` loader processes (0: in this
    process), in input order, ``batch_size`` at a time, so the model's batches and the
    decoding overlap and memory holds a few batches, never the whole gallery.
    """
    loader = torch.utils.data.DataLoader(
        _ImageFiles(items, preprocesses, max_pixels),
        batch_size=max(1, batch_size),
        shuffle=False,
        num_workers=max(0, workers),
        collate_fn=_collate,
        prefetch_factor=2 if workers > 0 else None,
    )
    with _children_allowed():
        batches = iter(loader)  # the loader processes start here
    yield from batches


def preprocessed_batches(
    items: Sequence[tuple[str, Any]],
    preprocess: Preprocess,
    batch_size: int,
    workers: int = 0,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Any:
    """Stream ``(keys, pixel batch or None, unreadable {key: reason})`` for ``(key, path)`` items:
    :func:`shared_preprocessed_batches` with one pipeline (``keys``: those in the batch)."""
    for keys, pixels, bad in shared_preprocessed_batches(items, [preprocess], batch_size, workers, max_pixels):
        yield [k for k in keys if k not in bad[0]], pixels[0], bad[0]


@contextmanager
def _children_allowed() -> Any:
    """Let a daemonic process (a Celery prefork pool process) start loader processes.

    multiprocessing refuses children to daemonic processes so that they are not orphaned;
    DataLoader workers watch their parent and exit when it dies, and the iterator stops
    them when it is exhausted or dropped, so the refusal is lifted while they start.
    """
    config = multiprocessing.current_process()._config  # noqa: SLF001 - no public switch
    daemon = config.get("daemon")
    if daemon:
        config["daemon"] = False
    try:
        yield
    finally:
        if daemon:
            config["daemon"] = daemon


def _to_rgb(im: Image.Image) -> Image.Image:
    if im.mode == "RGB":
        return im.copy()
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, (255, 255, 255))
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    return im.convert("RGB")


# --------------------------------------------------------------------------- interface


def compose_embeddings(image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
    """Multimodal query: ``normalise(normalise(image) + normalise(text))``, row-wise."""
    if image_emb.shape != text_emb.shape:
        raise ValueError(f"shape mismatch: image {tuple(image_emb.shape)} vs text {tuple(text_emb.shape)}")
    img = F.normalize(image_emb.float(), dim=-1)
    txt = F.normalize(text_emb.float(), dim=-1)
    return F.normalize(img + txt, dim=-1)


@runtime_checkable
class Retriever(Protocol):
    """A dual encoder used by the audit.

    ``spec`` identifies model, weights, preprocessing and effective precision; it is the
    embedding-cache key, so two retrievers with equal ``spec`` produce equal embeddings
    (up to device arithmetic). For open_clip it reads ``openclip:MODEL@WEIGHTS[#amp-DTYPE]``
    with WEIGHTS ``random:SEED``, a tag, or ``sha256:<checkpoint file digest>``; it is
    not always buildable (use ``OpenClipRetriever.source`` for that).
    """

    spec: str
    dim: int

    def embed_images(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """``[N, dim]`` float32 CPU tensor, rows L2-normalised."""
        ...

    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """``[N, dim]`` float32 CPU tensor, rows L2-normalised."""
        ...

    def compose(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        """Multimodal query embeddings from paired image and text embeddings."""
        ...


class LateQueries:
    """Mixin: :meth:`embed_queries`, :meth:`embed_candidates` and :meth:`query_cache_key` of a
    retriever that has ``spec``, ``dim``, ``embed_images``, ``embed_texts`` and ``compose``.

    A multimodal query is ``compose(image, text)``; the family's text-only query is the text's
    embedding and its image-only query the image's (CIRCUS's variant is built by the caller:
    see ``modality_pairs`` of :mod:`retrieval.retrievers.pipeline`)."""

    fusion = "late"
    #: Texts are encoded as given (no prompt template).
    template_version = "plain"
    modality_rule = "family"

    def embed_queries(self, images: list[Any], texts: list[str | None]) -> torch.Tensor:
        if len(images) != len(texts):
            raise ValueError(f"{len(images)} images but {len(texts)} texts")
        out = torch.empty((len(images), self.dim), dtype=torch.float32)  # type: ignore[attr-defined]
        both = [n for n, (im, t) in enumerate(zip(images, texts)) if im is not None and t is not None]
        text_only = [n for n, (im, t) in enumerate(zip(images, texts)) if im is None and t is not None]
        image_only = [n for n, (im, t) in enumerate(zip(images, texts)) if im is not None and t is None]
        if len(both) + len(text_only) + len(image_only) != len(images):
            raise ValueError("a query needs an image, a text or both")
        if both:
            out[both] = (
                self.compose(
                    self.embed_images([images[n] for n in both]),  # type: ignore[attr-defined]
                    self.embed_texts([texts[n] for n in both]),
                )
                .float()
                .cpu()
            )  # type: ignore[attr-defined]
        if text_only:
            out[text_only] = self.embed_texts([texts[n] for n in text_only]).float().cpu()  # type: ignore[attr-defined]
        if image_only:
            out[image_only] = self.embed_images([images[n] for n in image_only]).float().cpu()  # type: ignore[attr-defined]
        return out

    def embed_candidates(self, images: list[Any]) -> torch.Tensor:
        return self.embed_images(images)  # type: ignore[attr-defined]

    def query_cache_key(self, image_key: str | None, text: str | None) -> str:
        return query_key(self.spec, self.template_version, image_key, text)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- spec parsing
# The grammar and its validation live in retrieval.specs (no torch), shared with the web tier.


def _needs_hf_assets(model: str) -> bool:
    """True if building ``model`` needs Hugging Face files (config or tokenizer)."""
    cfg = open_clip_module().get_model_config(model) or {}
    text_cfg = cfg.get("text_cfg", {})
    return bool(text_cfg.get("hf_model_name") or text_cfg.get("hf_tokenizer_name")) or "siglip" in model.lower()


def _hf_offline() -> bool:
    """Hugging Face's own switches (the library's environment variables, not CIRVal settings)."""
    on = ("1", "true", "yes")
    return (
        os.environ.get("HF_HUB_OFFLINE", "").lower() in on or os.environ.get("TRANSFORMERS_OFFLINE", "").lower() in on
    )


_tokenizers: dict[str, Any] = {}
_tokenizer_lock = threading.Lock()


def shared_tokenizer(model_name: str) -> Any:
    """open_clip's tokenizer for ``model_name``, one per distinct tokenizer setting: a pool
    of models that tokenize alike (most open_clip configs share the CLIP BPE tokenizer)
    builds the BPE tables once, not once per model (about 0.1 s each). Tokenizers hold no
    per-call state beyond a memo of encoded words."""
    open_clip = open_clip_module()
    text_cfg = (open_clip.get_model_config(model_name) or {}).get("text_cfg")
    if text_cfg is None:  # not a registered config (e.g. hf-hub:): nothing to compare, nothing shared
        return open_clip.get_tokenizer(model_name)
    key = repr(
        [
            text_cfg.get("hf_tokenizer_name"),
            text_cfg.get("context_length"),
            sorted((text_cfg.get("tokenizer_kwargs") or {}).items()),
        ]
    )
    with _tokenizer_lock:
        if key not in _tokenizers:
            _tokenizers[key] = open_clip.get_tokenizer(model_name)
        return _tokenizers[key]


_digest_cache: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes (memoised per path, size and mtime)."""
    st = os.stat(path)
    memo_key = (str(path), st.st_size, st.st_mtime_ns)
    if memo_key not in _digest_cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
        _digest_cache[memo_key] = h.hexdigest()
    return _digest_cache[memo_key]


# --------------------------------------------------------------------------- open_clip


def _amp(precision: str, device: torch.device) -> tuple[bool, torch.dtype]:
    """Whether the towers run under CUDA autocast, and in which dtype (fp16: the half type
    that keeps the embeddings' mantissa)."""
    return precision == "amp" and device.type == "cuda", torch.float16


def weights_id_of(weights: dict[str, Any]) -> str:
    """The weights part of a retriever's identity (:func:`retriever_identity`), from
    :func:`retrieval.specs.weights_of`: ``random:SEED``, the tag, or ``sha256:`` of the checkpoint's bytes."""
    if weights["kind"] == "random":
        return f"random:{weights['seed']}"
    if weights["kind"] == "tag":
        return weights["tag"]
    return f"sha256:{file_sha256(weights['checkpoint'])}"


AMP_TAGS = {torch.bfloat16: "#amp-bf16", torch.float16: "#amp-fp16"}


def retriever_identity(model_name: str, weights: dict[str, Any], precision: str, device: torch.device) -> str:
    """A retriever's ``spec``, its identity and the embedding-cache key: model, weights
    (:func:`weights_id_of`: a checkpoint by its digest, not its path) and autocast dtype.
    Both :class:`OpenClipRetriever` and :class:`LazyRetriever` take it from here, so a lazy
    retriever and the one it builds agree."""
    use_amp, amp_dtype = _amp(precision, device)
    return spec_string(model_name, weights_id_of(weights)) + (AMP_TAGS[amp_dtype] if use_amp else "")


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class OpenClipRetriever(LateQueries):
    """An open_clip dual encoder.

    ``pretrained``: None (random init with ``seed``, deterministic across processes),
    an open_clip pretrained tag (downloads if not cached: the only case that may reach
    a hub), or a path to a local checkpoint file, told apart by the spec grammar's rule
    (:func:`retrieval.specs.weights_of`). ``precision='amp'`` runs the towers
    under CUDA autocast (bf16 where supported, else fp16); on CPU it is plain fp32.
    """

    def __init__(
        self,
        model_name: str,
        pretrained: str | os.PathLike[str] | None = None,
        device: str | torch.device | None = None,
        precision: Precision = "fp32",
        batch_size: int = 64,
        seed: int = 0,
    ) -> None:
        if precision not in ("fp32", "amp"):
            raise ValueError(f"precision must be 'fp32' or 'amp', not {precision!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        open_clip = open_clip_module()
        if model_name not in open_clip.list_models():
            raise ValueError(f"unknown open_clip model '{model_name}'")
        self.model_name = model_name
        self.device = torch.device(device or _default_device())
        self.precision: Precision = precision
        self.batch_size = int(batch_size)

        # the spec grammar's rule (retrieval.specs.weights_of): random, a tag or a checkpoint
        weights = weights_of(model_name, f"random:{int(seed)}" if pretrained is None else os.fspath(pretrained))
        kind, checkpoint = weights["kind"], weights["checkpoint"]
        if kind != "tag" and _needs_hf_assets(model_name) and not _hf_offline():
            raise ValueError(
                f"{model_name} needs Hugging Face files (text tower or tokenizer); without a pretrained "
                "tag CIRVal never contacts a hub. Set HF_HUB_OFFLINE=1 to use a local HF cache."
            )
        self.weights_kind = kind
        self.checkpoint = checkpoint
        self.seed = weights["seed"] if kind == "random" else None
        #: the canonical spec that :func:`build_retriever` accepts (a path, not a digest)
        self.source = weights["canonical"]

        create_kwargs: dict[str, Any] = dict(
            pretrained=(weights["tag"] if kind == "tag" else checkpoint),
            precision="fp32",
            device="cpu",
            pretrained_image=False,
            pretrained_text=False,
        )
        if kind == "random":
            # Seed a forked RNG so init is reproducible and the caller's RNG is untouched.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                model, _, preprocess = open_clip.create_model_and_transforms(model_name, **create_kwargs)
        else:
            model, _, preprocess = open_clip.create_model_and_transforms(model_name, **create_kwargs)
        self.model = model.to(self.device).eval()
        self.preprocess: Callable[[Image.Image], torch.Tensor] = preprocess
        self.tokenizer = shared_tokenizer(model_name)
        cfg = open_clip.get_model_config(model_name) or {}
        self.dim = int(cfg.get("embed_dim") or self.model.text_projection.shape[1])

        self._use_amp, self._amp_dtype = _amp(precision, self.device)
        self.spec = retriever_identity(model_name, weights, precision, self.device)

    def __repr__(self) -> str:
        return f"OpenClipRetriever(spec={self.spec!r}, device={str(self.device)!r})"

    # -- encoding ---------------------------------------------------------------------

    def _autocast(self) -> Any:
        if self._use_amp:
            return torch.autocast(device_type="cuda", dtype=self._amp_dtype)
        return torch.autocast(device_type=self.device.type, enabled=False)

    def _to_device(self, x: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            return x.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device)

    def _run(
        self,
        items: Sequence[Any],
        prepare: Callable[[Sequence[Any]], torch.Tensor],
        encode: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        chunks: list[torch.Tensor] = []
        with torch.inference_mode():
            for start in range(0, len(items), self.batch_size):
                batch = self._to_device(prepare(items[start : start + self.batch_size]))
                with self._autocast():
                    out = encode(batch)
                chunks.append(F.normalize(out.float(), dim=-1).cpu())
        if not chunks:
            return torch.empty((0, self.dim), dtype=torch.float32)
        return torch.cat(chunks).contiguous()

    def preprocess_images(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """open_clip's evaluation transform (resize, centre crop, normalise) as a batch."""
        return torch.stack(preprocess_each(self.preprocess, images))

    def embed_images(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """Normalised image embeddings, ``[N, dim]`` float32 on the CPU."""
        return self._run(list(images), self.preprocess_images, self.model.encode_image)

    def embed_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """Normalised image embeddings of already preprocessed images (``[N, 3, H, W]``)."""
        return self._run(pixels, lambda batch: batch, self.model.encode_image)

    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """Normalised text embeddings, ``[N, dim]`` float32 on the CPU."""
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] is {type(t).__name__}, not str")
        return self._run(texts, lambda batch: self.tokenizer(list(batch)), self.model.encode_text)

    def compose(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        """``normalise(normalise(image) + normalise(text))``."""
        return compose_embeddings(image_emb, text_emb)


def build_retriever(
    spec: str,
    device: str | torch.device | None = None,
    batch_size: int = 64,
    precision: Precision = "fp32",
) -> OpenClipRetriever:
    """Build a retriever from a spec string (see :func:`parse_retriever_spec`)."""
    parsed = parse_retriever_spec(spec)
    if parsed["kind"] == "random":
        pretrained = None
    elif parsed["kind"] == "tag":
        pretrained = parsed["tag"]
    else:
        pretrained = parsed["checkpoint"]
    return OpenClipRetriever(
        parsed["model"],
        pretrained=pretrained,
        device=device,
        precision=precision,
        batch_size=batch_size,
        seed=parsed["seed"] or 0,
    )


class LazyRetriever(LateQueries):
    """A retriever whose model is built on its first encode.

    Its ``spec`` (the cache key), ``dim``, ``device`` and :meth:`compose` come from the
    spec string and the model config alone, so an audit whose embeddings are all cached
    never builds the model. Anything else is delegated to the built retriever.
    """

    def __init__(
        self,
        spec: str,
        device: str | torch.device | None = None,
        batch_size: int = 64,
        precision: Precision = "fp32",
        modality_rule: str = "family",
    ) -> None:
        parsed = parse_retriever_spec(spec)
        self.modality_rule = modality_rule
        self._args = (spec, device, batch_size, precision)
        self._built: OpenClipRetriever | None = None
        self._lock = threading.Lock()
        self.device = torch.device(device or _default_device())
        self.batch_size = int(batch_size)
        cfg = model_config(parsed["model"]) or {}  # the config file: no open_clip import
        if not cfg.get("embed_dim"):  # no declared dim: only the model knows
            self._build()
        self.dim = int(cfg.get("embed_dim") or self.built.dim)
        self.spec = retriever_identity(parsed["model"], parsed, precision, self.device)

    @property
    def is_built(self) -> bool:
        return self._built is not None

    def _build(self) -> OpenClipRetriever:
        with self._lock:
            if self._built is None:
                self._built = build_retriever(*self._args)
        return self._built

    @property
    def built(self) -> OpenClipRetriever:
        """The real retriever (built now if needed)."""
        built = self._build()
        if "spec" in self.__dict__ and (built.spec, built.dim) != (self.spec, self.dim):
            raise RuntimeError(f"lazy retriever {self.spec!r}/{self.dim} built as {built.spec!r}/{built.dim}")
        return built

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.built, name)

    def compose(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        return compose_embeddings(image_emb, text_emb)

    def __repr__(self) -> str:
        return f"LazyRetriever(spec={self.spec!r}, built={self.is_built})"
