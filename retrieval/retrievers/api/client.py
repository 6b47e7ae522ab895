"""One hosted model's client: its configuration, the key, batching, and one request at a time
through :mod:`.transport`. Standard library only (no torch, no PIL, no Django: the settings
are read by :func:`retrieval.retrievers.api.client_config`).

Settings (``config/settings.py``, each from the environment variable in brackets):
``API_KEYS`` (``VOYAGE_API_KEY``, ``GEMINI_API_KEY``), ``API_BASE_URLS`` (``VOYAGE_BASE_URL``,
``GEMINI_BASE_URL``: the API roots; tests point them at a local server), ``API_RPM`` and
``API_TPM`` (``CIRVAL_API_RPM``/``_TPM``: requests and tokens per minute of one process; 0: the
model's tier-1 limits), ``API_BATCH`` (``CIRVAL_API_BATCH``: inputs per request; 0: the
catalogue's), ``API_MAX_TRIES``, ``API_TIMEOUT_S``, ``API_MAX_REQUEST_MB`` (images go inline:
the largest request body) and ``API_LEDGER_DIR`` (the paid inputs, :mod:`.ledger`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from retrieval.retrievers.api.catalog import ModelInfo
from retrieval.retrievers.api.providers import PROVIDER_FORMATS, Input, InputType, Provider
from retrieval.retrievers.api.transport import (
    Answer,
    ApiKeyMissing,
    RateLimiter,
    RetryPolicy,
    call_with_retries,
    post_json,
)


@dataclass(frozen=True)
class ClientConfig:
    """How one process calls one model: the key ('' when unset), the API root ('' for the
    provider's), the limits and the retry policy."""

    key: str
    base_url: str
    rpm: int
    tpm: int
    batch: int
    max_request_bytes: int
    policy: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def for_model(
        cls,
        info: ModelInfo,
        key: str = "",
        base_url: str = "",
        rpm: int = 0,
        tpm: int = 0,
        batch: int = 0,
        max_tries: int = 6,
        timeout_s: float = 60.0,
        max_request_mb: float = 8.0,
    ) -> ClientConfig:
        """The configuration of ``info``'s model; a limit of 0 is the model's own."""
        for name, value in (("rpm", rpm), ("tpm", tpm), ("batch", batch)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0 (0: the model's default), not {value}")
        if max_tries < 1 or timeout_s <= 0 or max_request_mb <= 0:
            raise ValueError("max_tries must be >= 1, timeout_s and max_request_mb > 0")
        if batch > info.api_max_batch:
            raise ValueError(
                f"{info.provider}/{info.model} takes at most {info.api_max_batch} inputs a request, "
                f"not {batch} (CIRVAL_API_BATCH)"
            )
        return cls(
            key=(key or "").strip(),
            base_url=(base_url or "").strip(),
            rpm=rpm or info.default_rpm,
            tpm=tpm or info.default_tpm,
            batch=batch or info.max_batch,
            max_request_bytes=int(max_request_mb * 2**20),
            policy=RetryPolicy(max_tries=int(max_tries), timeout_s=float(timeout_s)),
        )


def input_bytes(parts: Input) -> int:
    """About what ``parts`` add to a request body (images as base64)."""
    return sum(
        4 * ((len(p.data or b"") + 2) // 3) + 64 if p.is_image else len((p.text or "").encode()) + 32 for p in parts
    )


def batches(sizes: Sequence[tuple[int, int]], max_inputs: int, max_bytes: int, max_tokens: int) -> Iterator[range]:
    """Consecutive index ranges of inputs of ``(bytes, tokens)`` sizes, each within the three
    limits (an input over a limit alone goes alone)."""
    start, nbytes, ntokens = 0, 0, 0
    for i, (b, t) in enumerate(sizes):
        if i > start and (i - start >= max_inputs or nbytes + b > max_bytes or ntokens + t > max_tokens):
            yield range(start, i)
            start, nbytes, ntokens = i, 0, 0
        nbytes += b
        ntokens += t
    if start < len(sizes):
        yield range(start, len(sizes))


class ApiClient:
    """Sends batches of inputs to one model and returns their vectors (see the module notes)."""

    def __init__(
        self,
        info: ModelInfo,
        dim: int,
        config: ClientConfig | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.info, self.dim = info, int(dim)
        self.config = config or ClientConfig.for_model(info)
        self.format: Provider = PROVIDER_FORMATS[info.provider]
        self.sleep, self.rng = sleep, rng or random.Random()
        self.limiter = limiter or RateLimiter(self.config.rpm, self.config.tpm, sleep=sleep)
        self.base_url = self.config.base_url or self.format.default_base
        self.requests = 0  # requests sent (every try, answered or not)

    def key(self) -> str:
        if not self.config.key:
            raise ApiKeyMissing(
                f"api:{self.info.provider}/{self.info.model} needs an API key: set the "
                f"environment variable {self.format.key_env}"
            )
        return self.config.key

    def max_request_tokens(self) -> int:
        return min(self.info.max_request_tokens, self.config.tpm)

    def embed(
        self, inputs: list[Input], input_type: InputType, tokens: int
    ) -> tuple[list[list[float]], dict[str, Any]]:
        """The vectors of ``inputs`` (one request, retried as :mod:`.transport` says) and the
        usage the answer reported."""
        key = self.key()
        dim = None if self.dim == self.info.dim else self.dim
        payload = self.format.body(self.info.model, inputs, input_type, dim)
        url = self.format.url(self.base_url, self.info.model)
        headers = self.format.headers(key)

        def send() -> Answer:
            self.requests += 1
            return post_json(url, headers, payload, self.config.policy.timeout_s)

        def hint(status: int) -> str:
            return f" (is {self.format.key_env} a valid key?)" if status in (401, 403) else ""

        return call_with_retries(
            send,
            lambda raw: self.format.parse(raw, len(inputs), self.dim),
            self.config.policy,
            f"api:{self.info.provider}/{self.info.model}",
            limiter=self.limiter,
            tokens=tokens,
            sleep=self.sleep,
            rng=self.rng,
            refused_hint=hint,
        )
