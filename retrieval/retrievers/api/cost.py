"""What a run of an ``api:`` retriever will send and cost, before it starts. Pure: no torch, no
network, no Django (:mod:`.budget` reads a dataset's workload from the database).

An early-fusion audit sends, per query, three query inputs (multimodal, text-only, image-only;
equal inputs once: queries that share a reference share its image-only input; under the
``circus`` rule the text-only input carries a black image of the reference's size) and, per
gallery image, one document input. Text tokens are estimated from characters
(:data:`~.catalog.CHARS_PER_TOKEN`); an image of unknown size is priced at the most an image can
cost. The number of calls follows the request limits of :mod:`.client`: a lower bound, since the
audit's chunks split the inputs further (the cost does not depend on it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from config.figures import fixed
from retrieval.retrievers.api.catalog import PRICES_READ, ModelInfo, model_info, text_tokens
from retrieval.retrievers.api.client import ClientConfig, batches

#: Estimated JPEG bytes per pixel at quality 95 (photographs), for the request-size limit.
_JPEG_BYTES_PER_PIXEL = 0.3
_UNKNOWN_SIDE = 1024


@dataclass(frozen=True)
class QueryInput:
    """One query as the audit sends it: its reference image (a key naming the file, and its
    size when known) and its text."""

    image_key: str
    width: int | None
    height: int | None
    text: str


@dataclass(frozen=True)
class CandidateInput:
    image_key: str
    width: int | None
    height: int | None


@dataclass
class Workload:
    queries: list[QueryInput] = field(default_factory=list)
    candidates: list[CandidateInput] = field(default_factory=list)


@dataclass
class Estimate:
    """Calls, inputs and US dollars one ``api:`` spec will cost (nothing of it paid yet)."""

    spec: str
    calls: int
    query_inputs: int
    candidate_inputs: int
    text_tokens: int
    image_units: float
    usd: float
    source: str
    read: str = PRICES_READ
    #: The unit of ``image_units``: 'pixels' (Voyage) or 'image tokens' (Gemini).
    image_unit: str = "pixels"

    def line(self) -> str:
        return (
            f"{self.spec}: {self.calls}+ calls, {self.query_inputs} query + {self.candidate_inputs} candidate "
            f"inputs, ~{self.text_tokens} text tokens and {self.image_units:.3g} {self.image_unit}: "
            f"estimated ${fixed(self.usd, 2)} (list prices read {self.read}: {self.source})"
        )

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _size(w: int | None, h: int | None) -> tuple[int | None, int | None]:
    return (int(w), int(h)) if w and h else (None, None)


def _image_bytes(w: int | None, h: int | None) -> int:
    pixels = (w or _UNKNOWN_SIDE) * (h or _UNKNOWN_SIDE)
    return int(pixels * _JPEG_BYTES_PER_PIXEL * 4 / 3) + 64


class _Tally:
    """Unique inputs of one side (query or document), with their sizes and prices."""

    def __init__(self, info: ModelInfo) -> None:
        self.info = info
        self.seen: set[Any] = set()
        self.sizes: list[tuple[int, int]] = []
        self.text_tokens = 0
        self.image_units = 0.0

    def add(self, key: Any, image: tuple[int | None, int | None] | None, text: str | None) -> None:
        if key in self.seen:
            return
        self.seen.add(key)
        tokens = text_tokens(text)
        self.text_tokens += tokens
        nbytes = len((text or "").encode()) + 32
        if image is not None:
            self.image_units += self.info.image_units(*image)
            tokens += self.info.image_tokens(*image)
            nbytes += _image_bytes(*image)
        self.sizes.append((nbytes, tokens))

    def calls(self, config: ClientConfig) -> int:
        limit = min(self.info.max_request_tokens, config.tpm)
        return sum(1 for _ in batches(self.sizes, config.batch, config.max_request_bytes, limit))


def estimate(
    parsed: Mapping[str, Any], workload: Workload, modality_rule: str = "family", config: ClientConfig | None = None
) -> Estimate:
    """The calls and cost of sending ``workload`` to the ``api:`` spec ``parsed`` (its
    :meth:`ApiKind.parse`) with the client ``config`` (its batch and request limits; default:
    the model's), nothing of it paid yet (see the module notes)."""
    info = model_info(parsed["provider"], parsed["model"])
    config = config or ClientConfig.for_model(info)
    queries, docs = _Tally(info), _Tally(info)
    for q in workload.queries:
        size = _size(q.width, q.height)
        queries.add(("mm", q.image_key, q.text), size, q.text)
        if modality_rule == "circus":  # the text with a black image of the reference's size
            queries.add(("text", size, q.text), size, q.text)
        else:
            queries.add(("text", q.text), None, q.text)
        queries.add(("image", q.image_key), size, None)
    for c in workload.candidates:
        docs.add(c.image_key, _size(c.width, c.height), None)
    tokens = queries.text_tokens + docs.text_tokens
    units = queries.image_units + docs.image_units
    return Estimate(
        spec=str(parsed["canonical"]),
        calls=queries.calls(config) + docs.calls(config),
        query_inputs=len(queries.sizes),
        candidate_inputs=len(docs.sizes),
        text_tokens=tokens,
        image_units=units,
        usd=info.text_usd(tokens) + info.image_usd(units),
        source=info.source,
        image_unit="pixels" if info.provider == "voyage" else "image tokens",
    )


def per_input_usd(info: ModelInfo, text_tokens_each: int = 16) -> float:
    """An upper bound of one input's price: an image of the largest billed size and a short text."""
    return info.text_usd(text_tokens_each) + info.image_usd(info.image_units(None, None))


def total_usd(estimates: Sequence[Estimate]) -> float:
    return sum(e.usd for e in estimates)
