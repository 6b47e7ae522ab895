"""What each hosted API's requests and responses look like. Pure: the standard library only
(images arrive here already encoded, as bytes).

* Voyage multimodal embeddings (``POST {base}/multimodalembeddings``, ``Authorization: Bearer``):
  ``{"inputs": [{"content": [{"type": "text", "text": ...}, {"type": "image_base64",
  "image_base64": "data:image/jpeg;base64,..."}]}], "model": ..., "input_type": "query" |
  "document", "truncation": true}``, answered ``{"object": "list", "data": [{"object":
  "embedding", "embedding": [...], "index": i}], "model": ..., "usage": {"text_tokens",
  "image_pixels", "total_tokens"}}``. Voyage prepends its own retrieval prompt for each
  ``input_type``.
* Gemini (``POST {base}/models/{model}:batchEmbedContents``, ``x-goog-api-key``):
  ``{"requests": [{"model": "models/{model}", "content": {"parts": [{"text": ...},
  {"inlineData": {"mimeType": "image/jpeg", "data": base64}}]}, "outputDimensionality": n}]}``,
  answered ``{"embeddings": [{"values": [...]}]}``: one embedding per request, the parts of one
  content aggregated into one vector. Gemini Embedding 2 takes no ``taskType``: the task is a
  text prefix (``task: search result | query: ...`` on the query side).
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any, Literal

InputType = Literal["query", "document"]


class MalformedResponse(ValueError):
    """A 200 answer whose body is not what the API documents (retried, as a fault)."""

    #: Whether another try may help (a broken body may; vectors of another size will not).
    retry = True


class WrongDimension(MalformedResponse):
    """Every vector of a well-formed answer has another size than the spec's: the model answers
    with another dimension (retrying would pay again for the same answer)."""

    retry = False


@dataclass(frozen=True)
class Part:
    """One piece of an input: a text, or an encoded image (``data`` with its ``mime``)."""

    text: str | None = None
    data: bytes | None = None
    mime: str = "image/jpeg"
    #: What names the image in the ledger (e.g. a hash of its pixels and of how they were
    #: encoded); '' to name it by its encoded bytes.
    ident: str = ""

    @property
    def is_image(self) -> bool:
        return self.data is not None


Input = tuple[Part, ...]


@dataclass(frozen=True)
class Provider:
    """One provider's wire format, its API root and the environment variable of its key."""

    name: str
    key_env: str
    default_base: str
    #: Prefix of the query side's text (Gemini Embedding 2's task instruction); '' for none.
    query_prefix: str = ""
    #: Version of the prompts and part order below: part of every query's cache key.
    template: str = "1"

    def url(self, base: str, model: str) -> str:
        raise NotImplementedError

    def headers(self, key: str) -> dict[str, str]:
        raise NotImplementedError

    def body(self, model: str, inputs: list[Input], input_type: InputType, dim: int | None) -> dict[str, Any]:
        raise NotImplementedError

    def vectors(self, body: dict[str, Any], n: int) -> list[list[float]]:
        raise NotImplementedError

    def usage(self, body: dict[str, Any]) -> dict[str, Any]:
        """What the answer says was billed (kept in the ledger's call table)."""
        return {}

    def parts(
        self, image: bytes | None, text: str | None, input_type: InputType, mime: str = "image/jpeg", ident: str = ""
    ) -> Input:
        """The parts of one input: the image first, then the text (the reference image, then
        the modification); the query side's text carries :attr:`query_prefix`."""
        out: list[Part] = []
        if image is not None:
            out.append(Part(data=image, mime=mime, ident=ident))
        if input_type == "query" and self.query_prefix:
            out.append(Part(text=f"{self.query_prefix}{text or ''}".rstrip()))
        elif text:
            out.append(Part(text=text))
        if not out:
            raise ValueError("an input needs an image or a text")
        return tuple(out)

    def parse(self, raw: bytes, n: int, dim: int) -> tuple[list[list[float]], dict[str, Any]]:
        """The ``n`` vectors of a 200 answer's body and its usage; :class:`MalformedResponse`
        for anything else than ``n`` finite vectors of ``dim`` numbers."""
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedResponse(f"{self.name}: the answer is not JSON ({exc})") from None
        if not isinstance(body, dict):
            raise MalformedResponse(f"{self.name}: the answer is a {type(body).__name__}, not an object")
        vectors = self.vectors(body, n)
        if len(vectors) != n:
            raise MalformedResponse(f"{self.name}: {len(vectors)} embeddings for {n} inputs")
        sizes = {len(vec) for vec in vectors if isinstance(vec, list)}
        if vectors and len(sizes) == 1 and all(isinstance(v, list) for v in vectors) and sizes != {dim}:
            raise WrongDimension(f"{self.name}: the embeddings have {sizes.pop()} values, the spec says {dim}")
        for i, vec in enumerate(vectors):
            if not isinstance(vec, list) or len(vec) != dim:
                size = len(vec) if isinstance(vec, list) else type(vec).__name__
                raise MalformedResponse(f"{self.name}: embedding {i} has {size} values, expected {dim}")
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in vec):
                raise MalformedResponse(f"{self.name}: embedding {i} holds a value that is not a finite number")
        return vectors, self.usage(body)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class Voyage(Provider):
    def url(self, base: str, model: str) -> str:
        return f"{base.rstrip('/')}/multimodalembeddings"

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def body(self, model: str, inputs: list[Input], input_type: InputType, dim: int | None) -> dict[str, Any]:
        def segment(p: Part) -> dict[str, str]:
            if p.is_image:
                return {"type": "image_base64", "image_base64": f"data:{p.mime};base64,{_b64(p.data or b'')}"}
            return {"type": "text", "text": p.text or ""}

        out: dict[str, Any] = {
            "inputs": [{"content": [segment(p) for p in parts]} for parts in inputs],
            "model": model,
            "input_type": input_type,
            "truncation": True,
        }
        if dim is not None:
            out["output_dimension"] = dim
        return out

    def vectors(self, body: dict[str, Any], n: int) -> list[list[float]]:
        data = body.get("data")
        if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
            raise MalformedResponse("voyage: the answer has no 'data' list of objects")
        if all(isinstance(d.get("index"), int) for d in data):
            if sorted(d["index"] for d in data) != list(range(len(data))):
                raise MalformedResponse("voyage: the answer's indices are not 0..n-1")
            data = sorted(data, key=lambda d: d["index"])
        return [d.get("embedding") for d in data]  # type: ignore[misc]

    def usage(self, body: dict[str, Any]) -> dict[str, Any]:
        usage = body.get("usage")
        return usage if isinstance(usage, dict) else {}


class Gemini(Provider):
    def url(self, base: str, model: str) -> str:
        return f"{base.rstrip('/')}/models/{model}:batchEmbedContents"

    def headers(self, key: str) -> dict[str, str]:
        return {"x-goog-api-key": key, "Content-Type": "application/json"}

    def body(self, model: str, inputs: list[Input], input_type: InputType, dim: int | None) -> dict[str, Any]:
        def part(p: Part) -> dict[str, Any]:
            if p.is_image:
                return {"inlineData": {"mimeType": p.mime, "data": _b64(p.data or b"")}}
            return {"text": p.text or ""}

        requests = []
        for parts in inputs:
            one: dict[str, Any] = {"model": f"models/{model}", "content": {"parts": [part(p) for p in parts]}}
            if dim is not None:
                one["outputDimensionality"] = dim
            requests.append(one)
        return {"requests": requests}

    def vectors(self, body: dict[str, Any], n: int) -> list[list[float]]:
        embeddings = body.get("embeddings")
        if not isinstance(embeddings, list) or not all(isinstance(e, dict) for e in embeddings):
            raise MalformedResponse("gemini: the answer has no 'embeddings' list of objects")
        return [e.get("values") for e in embeddings]  # type: ignore[misc]

    def usage(self, body: dict[str, Any]) -> dict[str, Any]:
        usage = body.get("usageMetadata")
        return usage if isinstance(usage, dict) else {}


PROVIDER_FORMATS: dict[str, Provider] = {
    "voyage": Voyage("voyage", "VOYAGE_API_KEY", "https://api.voyageai.com/v1"),
    "gemini": Gemini(
        "gemini",
        "GEMINI_API_KEY",
        "https://generativelanguage.googleapis.com/v1beta",
        query_prefix="task: search result | query: ",
    ),
}


def template_version(provider: str, modality_rule: str) -> str:
    """The template version of an ``api:`` retriever of ``provider`` under ``modality_rule``
    (its queries' cache keys name it)."""
    return f"{provider}-{PROVIDER_FORMATS[provider].template}-{modality_rule}"
