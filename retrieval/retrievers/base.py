"""The retriever interface: one protocol for late- and early-fusion retrievers, and the
registry of retriever *kinds* (one per spec prefix).

Pure and torch-free at module level (the web tier parses specs through it): standard library
only; torch and PIL are imported by the kinds' ``build`` and by the retrievers they build.

A spec reads ``PREFIX:REST``. Each prefix names a :class:`RetrieverKind`:

* built in (imported lazily, so parsing needs no torch): ``openclip`` (open_clip dual
  encoders), ``composer`` (Pic2Word/SEARLE textual inversion and CLIP4Cir's Combiner over an
  open_clip backbone), ``hf`` (multimodal LLM embedders through transformers) and ``api``
  (hosted embedders);
* plugins: every entry point of group :data:`ENTRY_POINT_GROUP` (``cirval.retrievers``); its
  name is the prefix and its object a :class:`RetrieverKind` instance, or a class building one
  with no arguments.

Fusion:

* ``late``: the retriever embeds the reference image and the text separately and composes
  them; one image encode and one text encode serve all three query modalities. Such a
  retriever also offers ``embed_images``/``embed_texts``/``compose`` (:class:`LateFusion`),
  which the audit uses to share image encodes between queries and candidates.
* ``early``: the reference image and the text go through one forward pass
  (:meth:`Retriever.embed_queries`); text-only and image-only queries are passes of their own.

Modality rule (``modality_rule`` of :meth:`RetrieverKind.build`): ``family`` (each family's own
text-only and image-only queries) or ``circus`` (CIRCUS's variant: the text-only query is the
text with the reference image zeroed out, i.e. a black image of the same size; the image-only
query is the image with the text dropped, i.e. the empty string).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from retrieval.specs import query_key  # the one implementation of Retriever.query_cache_key (re-exported)

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from PIL import Image

__all__ = [
    "BUILTIN_KINDS",
    "ENTRY_POINT_GROUP",
    "Fusion",
    "LateFusion",
    "MODALITY_RULES",
    "ModalityRule",
    "Retriever",
    "RetrieverKind",
    "black_like",
    "canonical_spec",
    "expected_passes",
    "kinds",
    "parse_spec",
    "query_key",
    "pool_kinds",
    "register_kind",
    "spec_facts",
    "spec_prefix",
]

Fusion = Literal["late", "early"]
ModalityRule = Literal["family", "circus"]
MODALITY_RULES: tuple[str, ...] = ("family", "circus")
ENTRY_POINT_GROUP = "cirval.retrievers"

#: Built-in kinds: prefix -> "module:attr" (imported on first use, so that parsing one kind never
#: imports another's dependencies). ``attr`` is a :class:`RetrieverKind`; a module may instead
#: call :func:`register_kind` when imported.
BUILTIN_KINDS: dict[str, str] = {
    "openclip": "retrieval.retrievers.openclip:KIND",
    "composer": "retrieval.retrievers.composers:KIND",
    "hf": "retrieval.retrievers.hf:KIND",
    "api": "retrieval.retrievers.api:KIND",
}


class RetrieverKind:
    """One spec prefix: how its specs parse (no torch), read back, fuse and build.

    Subclasses set :attr:`prefix` and implement :meth:`parse` and :meth:`build`; the rest has
    defaults. ``parsed`` dicts are plain JSON-able data (they travel to workers)."""

    prefix: str = ""
    #: One line for the audit form and the README.
    description: str = ""

    def parse(self, rest: str) -> dict[str, Any]:
        """The spec's part after ``PREFIX:`` as a dict; ValueError with a clear message otherwise."""
        raise NotImplementedError

    def canonical(self, parsed: dict[str, Any]) -> str:
        """The canonical spec string (``PREFIX:...``) of ``parsed``."""
        if "canonical" in parsed:
            return str(parsed["canonical"])
        raise NotImplementedError

    def fusion(self, parsed: dict[str, Any]) -> Fusion:
        return "late"

    def build(self, parsed: dict[str, Any], *, device: str, precision: str, modality_rule: str = "family") -> Retriever:
        raise NotImplementedError

    # Optional: ``identity(parsed, *, device, precision, modality_rule) -> {"spec", "dim",
    # "template_version"} | None``, torch-free: what the built retriever will say, so that the
    # audit builds it only when something is to be encoded (retrieval.retrievers.pipeline).

    def estimate_cost(self, parsed: dict[str, Any], n_calls: int) -> float | None:
        """Estimated cost in US dollars of ``n_calls`` encoder calls (``None``: free, local)."""
        return None

    #: Whether a late-fusion retriever's multimodal query is composed from one image encode and
    #: one text encode (open_clip: normalised sum), rather than a pass of its own (composers).
    composes: bool = True

    def expected_passes(
        self, parsed: dict[str, Any], queries: Sequence[tuple[str, str]], candidates: Sequence[str]
    ) -> dict[str, Any]:
        """Encoder passes an audit of ``queries`` ((reference image key, text) each) over
        ``candidates`` (image keys) needs with nothing cached (see :func:`expected_passes`)."""
        return expected_passes(
            self.fusion(parsed), queries, candidates, composes=self.composes and self.fusion(parsed) == "late"
        )

    def describe(self, parsed: dict[str, Any]) -> dict[str, Any]:
        """What the audit form and page show of one spec: kind, fusion, canonical spec."""
        return {
            "kind": self.prefix,
            "fusion": self.fusion(parsed),
            "canonical": self.canonical(parsed),
            "description": self.description,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.prefix!r}>"


@runtime_checkable
class Retriever(Protocol):
    """A built retriever. Embeddings are ``[N, dim]`` float32 CPU tensors, rows L2-normalised.

    ``spec`` is the retriever's identity and its embedding-cache folder (model, exact weights,
    precision); ``template_version`` names its prompt templates and modality rule and is part
    of every query's cache key (:meth:`query_cache_key`)."""

    spec: str
    dim: int
    fusion: Fusion
    template_version: str

    def embed_queries(self, images: list[Image.Image | None], texts: list[str | None]) -> torch.Tensor:
        """One row per query: multimodal when both are given, text-only when the image is
        ``None``, image-only when the text is ``None`` (never both ``None``)."""
        ...

    def embed_candidates(self, images: list[Image.Image]) -> torch.Tensor:
        """Candidate (gallery) image embeddings."""
        ...

    def query_cache_key(self, image_key: str | None, text: str | None) -> str:
        """The cache key of one query: names the retriever, its exact inputs (the image by its
        file's sha256, the text) and the template version (:func:`retrieval.specs.query_key`)."""
        ...


@runtime_checkable
class LateFusion(Protocol):
    """The extra methods of a late-fusion retriever (one encode of each input serves all
    three modalities; the audit shares image encodes between references and candidates)."""

    def embed_images(self, images: list[Image.Image]) -> torch.Tensor: ...

    def embed_texts(self, texts: list[str]) -> torch.Tensor: ...

    def compose(self, image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor: ...


def black_like(image: Image.Image) -> Image.Image:
    """CIRCUS's zeroed-out image: black, of ``image``'s size (the ``circus`` text-only query)."""
    from PIL import Image as PILImage

    return PILImage.new("RGB", image.size, (0, 0, 0))


def expected_passes(
    fusion: str, queries: Sequence[tuple[str, str]], candidates: Sequence[str], composes: bool = True
) -> dict[str, Any]:
    """Encoder passes of an audit with nothing cached. Late fusion that composes: one image
    encode per distinct image (references and candidates together: a reference in the gallery
    is encoded once) and one text encode per distinct text serve all three modalities. Otherwise
    (early fusion; a composer's own multimodal pass): one pass per distinct (reference, text)
    pair, per distinct text (text-only), per distinct reference (image-only) and per candidate."""
    pairs = set(queries)
    refs, texts, cands = {k for k, _ in pairs}, {t for _, t in pairs}, set(candidates)
    if fusion == "late" and composes:
        out = {"images": len(refs | cands), "texts": len(texts), "queries": 0, "candidates": 0}
    else:
        out = {"images": 0, "texts": 0, "queries": len(pairs) + len(texts) + len(refs), "candidates": len(cands)}
    return {"fusion": fusion, **out, "total": sum(out.values())}


# --------------------------------------------------------------------------- registry

_lock = threading.RLock()
_registry: dict[str, RetrieverKind] = {}
_failed: dict[str, str] = {}


def register_kind(kind: RetrieverKind) -> None:
    """Register ``kind`` under its prefix (the latest registration of a prefix wins)."""
    prefix = getattr(kind, "prefix", "")
    if not isinstance(prefix, str) or not prefix or not prefix.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"a retriever kind needs a prefix of letters, digits, '-' or '_', not {prefix!r}")
    with _lock:
        _registry[prefix] = kind


def _as_kind(obj: Any, where: str) -> RetrieverKind:
    if isinstance(obj, type):
        obj = obj()
    for name in ("parse", "build", "canonical", "fusion"):
        if not callable(getattr(obj, name, None)):
            raise TypeError(f"{where} is no retriever kind (no {name}())")
    return obj


def _load_target(prefix: str, target: str) -> RetrieverKind | None:
    """Import ``module:attr`` for ``prefix``; the kind the module registered or its ``attr``."""
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    with _lock:
        if prefix in _registry:
            return _registry[prefix]
    obj = getattr(module, attr, None) if attr else None
    if obj is None:
        return None
    kind = _as_kind(obj, target)
    if not getattr(kind, "prefix", ""):
        kind.prefix = prefix
    register_kind(kind)
    return kind


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load(prefix: str) -> RetrieverKind | None:
    with _lock:
        if prefix in _registry:
            return _registry[prefix]
    try:
        if prefix in BUILTIN_KINDS:
            return _load_target(prefix, BUILTIN_KINDS[prefix])
        ep = _entry_points().get(prefix)
        if ep is None:
            return None
        kind = _as_kind(ep.load(), f"entry point {prefix} = {ep.value}")
        if getattr(kind, "prefix", "") != prefix:
            kind.prefix = prefix
        register_kind(kind)
        return kind
    except ModuleNotFoundError as exc:  # a built-in kind not present in this install
        _failed[prefix] = f"{type(exc).__name__}: {exc}"
        return None
    except Exception as exc:  # a broken plugin must not break the other kinds
        _failed[prefix] = f"{type(exc).__name__}: {exc}"
        return None


def available_prefixes() -> list[str]:
    """Every prefix a spec may use (built-ins, plugins, registered kinds), without loading any."""
    return sorted({*BUILTIN_KINDS, *_entry_points(), *_registry})


def kinds() -> dict[str, RetrieverKind]:
    """Every installed kind by prefix: built-ins, entry points of :data:`ENTRY_POINT_GROUP`
    and kinds registered with :func:`register_kind` (loaded now; a kind whose module fails to
    import is left out, see :func:`load_errors`)."""
    out = {}
    for prefix in available_prefixes():
        kind = _load(prefix)
        if kind is not None:
            out[prefix] = kind
    return out


def load_errors() -> dict[str, str]:
    """Why a prefix failed to load (import error of its module or plugin)."""
    return dict(_failed)


def spec_prefix(spec: str) -> str:
    """The prefix of ``spec`` (before the first ':'); '' when it has none."""
    head, sep, _ = spec.strip().partition(":") if isinstance(spec, str) else ("", "", "")
    return head.strip() if sep else ""


def parse_spec(spec: str) -> tuple[RetrieverKind, dict[str, Any]]:
    """The kind and the parsed dict of ``spec``; ValueError naming the installed kinds for an
    unknown prefix, and the kind's own explanation for a bad spec."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("empty retriever spec; expected e.g. 'openclip:ViT-B-32@openai'")
    spec = spec.strip()
    prefix = spec_prefix(spec)
    kind = _load(prefix) if prefix else None
    if kind is None:
        installed = ", ".join(f"'{p}:'" for p in kinds()) or "none"
        what = f"unknown backend '{prefix}'" if prefix else "missing backend prefix"
        extra = f" ({_failed[prefix]})" if prefix in _failed else ""
        raise ValueError(
            f"bad retriever spec '{spec}': {what}{extra}; installed kinds: {installed} "
            "(e.g. 'openclip:MODEL[@WEIGHTS]')"
        )
    rest = spec[len(prefix) + 1 :].strip()
    try:
        parsed = kind.parse(rest)
    except ValueError as exc:
        msg = str(exc)
        raise ValueError(msg if spec in msg else f"bad retriever spec '{spec}': {msg}") from None
    return kind, parsed


def canonical_spec(spec: str) -> str:
    """The canonical form of ``spec`` (ValueError as :func:`parse_spec`)."""
    kind, parsed = parse_spec(spec)
    return kind.canonical(parsed)


def pool_kinds(specs: Sequence[str]) -> list[dict[str, str]]:
    """Each spec's kind (its prefix) and fusion, for pages: parsed when it parses (a checkpoint
    since removed: the prefix, fusion unknown)."""
    out = []
    for spec in specs:
        try:
            facts = spec_facts(spec)
        except ValueError:
            facts = {"backend": spec_prefix(spec) or "?", "fusion": "unknown"}
        out.append({"spec": spec, "kind": str(facts["backend"]), "fusion": str(facts["fusion"])})
    return out


def spec_facts(spec: str) -> dict[str, Any]:
    """``spec`` parsed by its kind, with ``backend`` (the prefix), ``canonical`` and ``fusion``
    (and ``kind``: the prefix, unless the kind's parse sets it: open_clip's weights kind)."""
    kind, parsed = parse_spec(spec)
    return {
        "kind": kind.prefix,
        **parsed,
        "backend": kind.prefix,
        "canonical": kind.canonical(parsed),
        "fusion": kind.fusion(parsed),
    }
