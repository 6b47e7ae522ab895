"""A local stand-in for the hosted embedders (Voyage multimodal, Gemini batchEmbedContents), for
tests: an HTTP server on a thread of the test process (no process is started) that checks each
request against the documented shape, answers in the documented shape, counts what it was paid
for, and injects the faults it is told to.

    with FakeEmbeddingApi() as api:
        monkeypatch.setenv(...)  # api.env() gives the keys and base URLs
        api.faults.extend(["429", "500", "slow", "malformed", "short", "drop"])

Faults, one per request in order (a request with no fault left is answered normally):

* ``"429"``: 429 with ``Retry-After`` (:attr:`FakeEmbeddingApi.retry_after`);
* ``"500"`` / ``"503"``: that status;
* ``"slow"``: answers nothing for :attr:`slow_s` seconds, then drops the connection (the
  client's timeout fires first);
* ``"drop"``: closes the connection without an answer;
* ``"malformed"``: 200 with a body that is not JSON; ``"short"``: 200 with one embedding too few;
  ``"wrongdim"``: 200 with vectors one value longer than asked;
* ``"ok"``: no fault (to let some requests through before the faults begin).

Only a well-formed 200 is *paid*: :attr:`paid` counts each input (by its content) in those;
a test checks that no input is paid twice. The vectors are a deterministic function of the
model, the input type and the content (:func:`vector_of`), so two runs are comparable.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

VOYAGE_KEY = "test-voyage-key"
GEMINI_KEY = "test-gemini-key"
VOYAGE_MODELS = {"voyage-multimodal-3": (1024,), "voyage-multimodal-3.5": (256, 512, 1024, 2048)}
GEMINI_MODELS = {"gemini-embedding-2", "gemini-embedding-2-preview"}
_GEMINI_PATH = re.compile(r"^/v1beta/models/([A-Za-z0-9.\-]+):batchEmbedContents$")


class BadRequest(ValueError):
    pass


def vector_of(model: str, input_type: str, content: Any, dim: int) -> list[float]:
    """The fake model's embedding of one input: a seeded Gaussian vector (not normalised, as a
    real API's need not be)."""
    seed = hashlib.sha256(json.dumps([model, input_type, content], sort_keys=True).encode()).digest()
    rng = np.random.default_rng(int.from_bytes(seed[:8], "little"))
    return [float(v) for v in rng.standard_normal(dim) * 3.0]


def _check_image(data: str, where: str) -> None:
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError:
        raise BadRequest(f"{where}: not base64") from None
    if not raw.startswith(b"\xff\xd8") and not raw.startswith(b"\x89PNG"):
        raise BadRequest(f"{where}: not a JPEG or PNG image")


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise BadRequest(message)


def voyage_inputs(body: dict[str, Any]) -> tuple[str, str, list[Any], int]:
    """Validate a Voyage multimodal request; (model, input_type, contents, dim)."""
    known = {"inputs", "model", "input_type", "truncation", "output_dimension", "output_encoding"}
    _require(set(body) <= known, f"unknown fields {sorted(set(body) - known)}")
    model = body.get("model")
    _require(model in VOYAGE_MODELS, f"unknown model {model!r}")
    _require(body.get("input_type") in (None, "query", "document"), "input_type must be query or document")
    _require(isinstance(body.get("truncation", True), bool), "truncation must be a boolean")
    dim = body.get("output_dimension", 1024)
    _require(dim in VOYAGE_MODELS[model], f"output_dimension {dim} not offered by {model}")
    inputs = body.get("inputs")
    _require(isinstance(inputs, list) and 0 < len(inputs) <= 1000, "inputs must be a list of 1 to 1000")
    contents = []
    for i, item in enumerate(inputs):
        _require(isinstance(item, dict) and set(item) == {"content"}, f"inputs[{i}] must be {{'content': [...]}}")
        content = item["content"]
        _require(isinstance(content, list) and content, f"inputs[{i}].content must be a non-empty list")
        kinds = set()
        for j, seg in enumerate(content):
            where = f"inputs[{i}].content[{j}]"
            kind = seg.get("type") if isinstance(seg, dict) else None
            _require(kind in ("text", "image_base64", "image_url"), f"{where}: bad type {kind!r}")
            _require(set(seg) == {"type", kind}, f"{where}: keys must be 'type' and {kind!r}")
            if kind == "text":
                _require(isinstance(seg["text"], str), f"{where}: text must be a string")
            elif kind == "image_base64":
                m = re.match(r"^data:(image/(?:png|jpeg|webp|gif));base64,(.*)$", seg[kind], re.S)
                _require(m is not None, f"{where}: image_base64 must be a data URL")
                _check_image(m.group(2), where)
            kinds.add(kind)
        _require(not {"image_base64", "image_url"} <= kinds, f"inputs[{i}]: image_base64 and image_url mixed")
        contents.append(content)
    return model, body.get("input_type") or "", contents, dim


def gemini_inputs(model: str, body: dict[str, Any]) -> tuple[str, str, list[Any], int]:
    """Validate a Gemini batchEmbedContents request; (model, '', contents, dim)."""
    _require(model in GEMINI_MODELS, f"unknown model {model!r}")
    _require(set(body) == {"requests"}, "the body must be {'requests': [...]}")
    requests = body["requests"]
    _require(isinstance(requests, list) and 0 < len(requests) <= 100, "requests must be a list of 1 to 100")
    dims = set()
    contents = []
    for i, req in enumerate(requests):
        where = f"requests[{i}]"
        _require(
            isinstance(req, dict) and req.get("model") == f"models/{model}", f"{where}.model must be models/{model}"
        )
        _require(
            set(req) <= {"model", "content", "taskType", "title", "outputDimensionality"}, f"{where}: unknown field"
        )
        _require("taskType" not in req, f"{where}: {model} takes no taskType (a task prefix in the text)")
        parts = (req.get("content") or {}).get("parts")
        _require(isinstance(parts, list) and parts, f"{where}.content.parts must be a non-empty list")
        for j, part in enumerate(parts):
            pw = f"{where}.content.parts[{j}]"
            _require(isinstance(part, dict) and len(part) == 1, f"{pw}: one of text or inlineData")
            if "text" in part:
                _require(isinstance(part["text"], str), f"{pw}.text must be a string")
            else:
                blob = part.get("inlineData") or part.get("inline_data")
                _require(isinstance(blob, dict), f"{pw}: unknown part")
                mime = blob.get("mimeType") or blob.get("mime_type")
                _require(mime in ("image/png", "image/jpeg"), f"{pw}: mimeType {mime!r}")
                _check_image(blob.get("data", ""), pw)
        _require(sum(1 for p in parts if "text" not in p) <= 6, f"{where}: more than 6 images")
        dim = req.get("outputDimensionality", 3072)
        _require(isinstance(dim, int) and 128 <= dim <= 3072, f"{where}: outputDimensionality {dim!r}")
        dims.add(dim)
        contents.append(parts)
    _require(len(dims) == 1, "one outputDimensionality per batch here")
    return model, "", contents, dims.pop()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, json.dumps({"detail": message}).encode())

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        api = self.server.api
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fault = api.next_fault()
        with api.lock:
            api.requests += 1
        if fault == "slow":
            time.sleep(api.slow_s)
            self.close_connection = True
            return
        if fault == "drop":
            self.close_connection = True
            return
        if fault in ("429", "500", "503"):
            self._send(
                int(fault), b'{"detail": "injected"}', {"Retry-After": str(api.retry_after)} if fault == "429" else {}
            )
            return
        try:
            provider, (model, input_type, contents, dim) = self._validate(raw)
        except PermissionError as exc:
            self._error(401, str(exc))
            return
        except BadRequest as exc:
            with api.lock:
                api.bad_requests.append(str(exc))
            self._error(400, str(exc))
            return
        vectors = [vector_of(model, input_type, c, dim) for c in contents]
        if fault == "malformed":
            self._send(200, b'{"data": [ {"embedding": [0.1, ')
            return
        if fault == "short":
            vectors = vectors[:-1]
        if fault == "wrongdim":
            vectors = [v + [0.0] for v in vectors]
        with api.lock:
            if fault is None:
                api.paid.update(json.dumps([provider, model, input_type, c], sort_keys=True) for c in contents)
                api.paid_calls += 1
            api.last_bodies.append(json.loads(raw))
        self._send(200, json.dumps(self._answer(provider, model, vectors)).encode())

    def _validate(self, raw: bytes) -> tuple[str, tuple[str, str, list[Any], int]]:
        try:
            body = json.loads(raw)
        except ValueError:
            raise BadRequest("the body is not JSON") from None
        _require(self.headers.get("Content-Type", "").startswith("application/json"), "Content-Type must be JSON")
        if self.path == "/v1/multimodalembeddings":
            if self.headers.get("Authorization") != f"Bearer {VOYAGE_KEY}":
                raise PermissionError("invalid Voyage key")
            return "voyage", voyage_inputs(body)
        m = _GEMINI_PATH.match(self.path)
        _require(m is not None, f"unknown path {self.path}")
        if self.headers.get("x-goog-api-key") != GEMINI_KEY:
            raise PermissionError("invalid Gemini key")
        return "gemini", gemini_inputs(m.group(1), body)

    @staticmethod
    def _answer(provider: str, model: str, vectors: list[list[float]]) -> dict[str, Any]:
        if provider == "voyage":
            return {
                "object": "list",
                "model": model,
                "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
                "usage": {
                    "text_tokens": 7 * len(vectors),
                    "image_pixels": 50_000 * len(vectors),
                    "total_tokens": 96 * len(vectors),
                },
            }
        return {"embeddings": [{"values": v} for v in vectors]}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: FakeEmbeddingApi


class FakeEmbeddingApi:
    """The fake APIs on ``127.0.0.1:<free port>`` (see the module notes)."""

    def __init__(self, retry_after: str = "2", slow_s: float = 1.0) -> None:
        self.retry_after, self.slow_s = retry_after, slow_s
        self.faults: list[str] = []
        self.paid: Counter[str] = Counter()
        self.paid_calls = 0
        self.requests = 0
        self.bad_requests: list[str] = []
        self.last_bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def next_fault(self) -> str | None:
        with self.lock:
            fault = self.faults.pop(0) if self.faults else None
        return None if fault == "ok" else fault

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def env(self) -> dict[str, str]:
        """The environment a client needs to use this server."""
        return {
            "VOYAGE_API_KEY": VOYAGE_KEY,
            "GEMINI_API_KEY": GEMINI_KEY,
            "VOYAGE_BASE_URL": f"{self.url}/v1",
            "GEMINI_BASE_URL": f"{self.url}/v1beta",
        }

    def duplicates(self) -> dict[str, int]:
        """Inputs paid more than once (should be none)."""
        return {k: n for k, n in self.paid.items() if n > 1}

    def __enter__(self) -> FakeEmbeddingApi:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.api = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-embedding-api", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
