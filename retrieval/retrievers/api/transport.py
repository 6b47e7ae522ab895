"""HTTP for the hosted embedders: one JSON POST, a per-process rate limiter, and retries with
exponential backoff and jitter. Standard library only (``urllib``): the two APIs need nothing
more, and CIRVal gains no HTTP dependency.

Retried: 429 (its ``Retry-After`` honoured), every 5xx, timeouts and dropped connections, and a
200 whose body is not the documented answer (:class:`~.providers.MalformedResponse`). Not
retried: any other 4xx (a bad key, a bad request), raised at once as :class:`ApiRefused`. After
``max_tries`` attempts :class:`ApiGaveUp` says what the last one met.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from retrieval.retrievers.api.providers import MalformedResponse

T = TypeVar("T")


class ApiError(RuntimeError):
    """A hosted embedder could not give the embeddings."""


class ApiRefused(ApiError):
    """The API refused the request (a 4xx other than 429): retrying would not help."""


class ApiGaveUp(ApiError):
    """Every try failed with a fault worth retrying (429, 5xx, timeout, malformed answer)."""


class ApiKeyMissing(ApiError):
    """The environment variable holding the provider's key is not set."""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class RetryPolicy:
    max_tries: int = 6
    base_s: float = 1.0  # first backoff (before jitter)
    cap_s: float = 60.0  # longest backoff, and longest Retry-After honoured
    timeout_s: float = 60.0  # per request

    def backoff(self, attempt: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds to wait after failed try ``attempt`` (1-based): full jitter over an
        exponentially growing window, and never less than the server's ``Retry-After``."""
        window = min(self.cap_s, self.base_s * 2 ** (attempt - 1))
        wait = rng.uniform(0, window)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.cap_s) + rng.uniform(0, self.base_s / 4))
        return wait


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds: a number of seconds or an HTTP date; None when absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class RateLimiter:
    """Requests and tokens per minute over a sliding 60-second window, for one process (each
    worker process keeps its own: set the limits to a share of the account's when several run).
    ``clock``/``sleep`` are injectable for tests."""

    WINDOW_S = 60.0

    def __init__(
        self,
        rpm: int,
        tpm: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rpm < 1 or tpm < 1:
            raise ValueError("rate limits must be >= 1 per minute")
        self.rpm, self.tpm = int(rpm), int(tpm)
        self.clock, self.sleep = clock, sleep
        self._events: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def _wait_s(self, now: float, tokens: int) -> float:
        while self._events and self._events[0][0] <= now - self.WINDOW_S:
            self._events.popleft()
        waits = [0.0]
        if len(self._events) >= self.rpm:
            waits.append(self._events[len(self._events) - self.rpm][0] + self.WINDOW_S - now)
        used = sum(t for _, t in self._events)
        if used + tokens > self.tpm:  # wait until enough old tokens leave the window
            freed = 0
            for at, t in self._events:
                freed += t
                if used - freed + tokens <= self.tpm:
                    waits.append(at + self.WINDOW_S - now)
                    break
        return max(waits)

    def acquire(self, tokens: int) -> float:
        """Block until a request of ``tokens`` fits in the window, then count it; returns the
        seconds waited. A request bigger than the whole per-minute budget waits for an empty window."""
        tokens = min(int(tokens), self.tpm)
        waited = 0.0
        with self._lock:
            while True:
                now = self.clock()
                wait = self._wait_s(now, tokens)
                if wait <= 0:
                    self._events.append((now, tokens))
                    return waited
                self.sleep(wait)
                waited += wait


def post_json(url: str, headers: dict[str, str], payload: dict[str, Any], timeout_s: float) -> Answer:
    """POST ``payload`` as JSON; the answer whatever its status (timeouts and dropped
    connections raise ``TimeoutError``/``ConnectionError``/``OSError``)."""
    data = json.dumps(payload, separators=(",", ":")).encode("utf-8")
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 (https or a test's loopback)
            return Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            body = exc.read() if exc.fp is not None else b""
        return Answer(exc.code, {k.lower(): v for k, v in (exc.headers or {}).items()}, body)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (TimeoutError, socket.timeout)):
            raise TimeoutError(f"timed out after {timeout_s:g} s") from None
        raise ConnectionError(f"cannot reach {url}: {exc.reason}") from None


#: What a try may raise that is worth another try.
TRANSIENT = (TimeoutError, socket.timeout, ConnectionError, http.client.HTTPException, OSError)


def _short(body: bytes, n: int = 300) -> str:
    text = body.decode("utf-8", "replace").strip()
    return text if len(text) <= n else text[:n] + "..."


def call_with_retries(
    send: Callable[[], Answer],
    parse: Callable[[bytes], T],
    policy: RetryPolicy,
    what: str,
    limiter: RateLimiter | None = None,
    tokens: int = 0,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    refused_hint: Callable[[int], str] = lambda status: "",
) -> T:
    """``parse`` of the first good answer of ``send()``, retrying faults as the module says."""
    rng = rng or random.Random()
    last = ""
    for attempt in range(1, policy.max_tries + 1):
        if limiter is not None:
            limiter.acquire(tokens)
        retry_after = None
        try:
            answer = send()
        except TRANSIENT as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if answer.status == 200:
                try:
                    return parse(answer.body)
                except MalformedResponse as exc:
                    if not exc.retry:
                        raise ApiRefused(f"{what}: {exc}") from None
                    last = f"malformed answer: {exc}"
            elif answer.status == 429 or answer.status >= 500:
                retry_after = retry_after_seconds(answer.headers.get("retry-after"))
                last = f"HTTP {answer.status}: {_short(answer.body)}"
            else:
                raise ApiRefused(f"{what}: HTTP {answer.status}{refused_hint(answer.status)}: {_short(answer.body)}")
        if attempt < policy.max_tries:
            sleep(policy.backoff(attempt, rng, retry_after))
    raise ApiGaveUp(f"{what}: gave up after {policy.max_tries} tries; the last one met {last}")
