"""The hosted embedders an ``api:`` spec may name: dimensions, request limits, prices and
default rate limits. Pure data and arithmetic (standard library only).

Prices are list prices in US dollars, read from the providers' public pages (the source and
the date each figure was read are in the comment beside it). They change: an estimate is only
as current as this table, and the audit prints the table's date beside every estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: The day the prices and limits below were last read.
PRICES_READ = "2026-11-29"

#: Voyage bills images by pixels, each image counted between these bounds (smaller images are
#: upscaled, larger ones downsampled): docs.voyageai.com/docs/pricing, read 2026-11-29.
VOYAGE_MIN_PIXELS, VOYAGE_MAX_PIXELS = 50_000, 2_000_000
#: Voyage counts about 560 image pixels as one token towards its per-request and per-minute
#: token limits: docs.voyageai.com/docs/multimodal-embeddings, read 2026-11-29.
VOYAGE_PIXELS_PER_TOKEN = 560
#: Gemini counts an image as 258 tokens (its image tokenisation; with the $0.45 per million image
#: tokens below that is the $0.00012 per image quoted for Gemini Embedding 2): ai.google.dev
#: Gemini API pricing as quoted by tokencost.app/blog/gemini-embedding-2-pricing and zilliz.com's
#: Gemini Embedding 2 FAQ, read 2026-11-29.
GEMINI_IMAGE_TOKENS = 258
#: Characters per text token, for estimates only (the APIs report the real counts).
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class ModelInfo:
    """One hosted model: what CIRVal needs to call it and to price a run before it starts."""

    provider: str
    model: str
    dim: int  # the model's default output dimension
    dims: tuple[int, ...]  # output dimensions it offers (``@DIM`` of a spec)
    usd_per_m_text_tokens: float
    #: Voyage: US dollars per billion image pixels; Gemini: per million image tokens.
    usd_image_rate: float
    max_batch: int  # inputs CIRVal sends per request by default
    api_max_batch: int  # the most inputs the API takes in one request
    max_request_tokens: int  # the API's token limit of one request
    default_rpm: int  # requests per minute (tier 1 unless said otherwise)
    default_tpm: int  # tokens per minute
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    def image_units(self, width: int | None, height: int | None) -> float:
        """What one image is billed as: pixels (Voyage) or tokens (Gemini). An image of
        unknown size is priced at the most it can cost (an estimate errs high)."""
        if self.provider == "voyage":
            pixels = VOYAGE_MAX_PIXELS if not width or not height else int(width) * int(height)
            return float(min(max(pixels, VOYAGE_MIN_PIXELS), VOYAGE_MAX_PIXELS))
        return float(GEMINI_IMAGE_TOKENS)

    def image_tokens(self, width: int | None, height: int | None) -> int:
        """Tokens one image counts towards the request and per-minute token limits."""
        if self.provider == "voyage":
            return math.ceil(self.image_units(width, height) / VOYAGE_PIXELS_PER_TOKEN)
        return GEMINI_IMAGE_TOKENS

    def image_usd(self, units: float) -> float:
        """US dollars for ``units`` of :meth:`image_units`."""
        per = 1e9 if self.provider == "voyage" else 1e6
        return units * self.usd_image_rate / per

    def text_usd(self, tokens: float) -> float:
        return tokens * self.usd_per_m_text_tokens / 1e6


def text_tokens(text: str | None) -> int:
    """Estimated tokens of ``text`` (at least one for a non-empty text)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN) if text else 0


_VOYAGE_LIMITS = dict(
    max_batch=64, api_max_batch=1000, max_request_tokens=320_000, default_rpm=2000, default_tpm=1_000_000
)
# batchEmbedContents takes at most 100 requests (ai.google.dev/api/embeddings, read 2026-11-29).
_GEMINI_LIMITS = dict(
    max_batch=50, api_max_batch=100, max_request_tokens=1_000_000, default_rpm=150, default_tpm=1_000_000
)

MODELS: dict[tuple[str, str], ModelInfo] = {
    # docs.voyageai.com/docs/pricing (read 2026-11-29): $0.12 per million text tokens, $0.60 per
    # billion pixels. Limits: 1,000 inputs and 320k tokens per request
    # (docs.voyageai.com/reference/multimodal-embeddings-api), tier-1 rate limits 2000 RPM and
    # 1M TPM (docs.voyageai.com/docs/rate-limits, read 2026-11-29).
    ("voyage", "voyage-multimodal-3"): ModelInfo(
        "voyage",
        "voyage-multimodal-3",
        1024,
        (1024,),
        0.12,
        0.60,
        source="docs.voyageai.com/docs/pricing (read 2026-11-29)",
        **_VOYAGE_LIMITS,
    ),
    # The Voyage/MongoDB model catalogue (read 2026-11-29): same prices as voyage-multimodal-3;
    # dimensions 1024 (default), 256, 512, 2048.
    ("voyage", "voyage-multimodal-3.5"): ModelInfo(
        "voyage",
        "voyage-multimodal-3.5",
        1024,
        (256, 512, 1024, 2048),
        0.12,
        0.60,
        source="docs.voyageai.com/docs/pricing and the Voyage model catalogue (read 2026-11-29)",
        **_VOYAGE_LIMITS,
    ),
    # Gemini API pricing (ai.google.dev/gemini-api/docs/pricing, as quoted by
    # tokencost.app/blog/gemini-embedding-2-pricing, read 2026-11-29): text $0.20 and images
    # $0.45 per million tokens (standard, not the batch API). 3072 dimensions by default, 128 to
    # 3072 by Matryoshka truncation. The default rate limits are deliberately low (paid tiers
    # differ per project: ai.google.dev/gemini-api/docs/rate-limits); set CIRVAL_API_RPM/TPM.
    ("gemini", "gemini-embedding-2"): ModelInfo(
        "gemini",
        "gemini-embedding-2",
        3072,
        (128, 256, 512, 768, 1024, 1536, 2048, 3072),
        0.20,
        0.45,
        source="ai.google.dev/gemini-api/docs/pricing via tokencost.app (read 2026-11-29)",
        **_GEMINI_LIMITS,
    ),
    ("gemini", "gemini-embedding-2-preview"): ModelInfo(
        "gemini",
        "gemini-embedding-2-preview",
        3072,
        (128, 256, 512, 768, 1024, 1536, 2048, 3072),
        0.20,
        0.45,
        source="ai.google.dev/gemini-api/docs/pricing via tokencost.app (read 2026-11-29)",
        **_GEMINI_LIMITS,
    ),
}

PROVIDERS: tuple[str, ...] = tuple(sorted({p for p, _ in MODELS}))


def model_info(provider: str, model: str) -> ModelInfo:
    """The catalogue entry of ``provider/model``; ValueError naming the known ones otherwise."""
    if provider not in PROVIDERS:
        raise ValueError(f"unknown API provider '{provider}'; known: {', '.join(PROVIDERS)}")
    info = MODELS.get((provider, model))
    if info is None:
        known = ", ".join(m for p, m in sorted(MODELS) if p == provider)
        raise ValueError(f"unknown {provider} model '{model}'; known: {known}")
    return info
