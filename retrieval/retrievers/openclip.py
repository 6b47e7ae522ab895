"""The ``openclip:`` kind: today's open_clip dual encoders (late fusion).

Parsing is :func:`retrieval.specs.parse_retriever_spec` (no torch); building returns a
:class:`retrieval.encoders.LazyRetriever`, whose model is built on its first encode.
"""

from __future__ import annotations

from typing import Any

from retrieval.retrievers.base import Fusion, Retriever, RetrieverKind
from retrieval.specs import SPEC_PREFIX, parse_retriever_spec


class OpenClipKind(RetrieverKind):
    prefix = "openclip"
    description = "open_clip dual encoder (late fusion: image and text encoded apart, summed)"

    def parse(self, rest: str) -> dict[str, Any]:
        return parse_retriever_spec(SPEC_PREFIX + rest)

    def canonical(self, parsed: dict[str, Any]) -> str:
        return str(parsed["canonical"])

    def fusion(self, parsed: dict[str, Any]) -> Fusion:
        return "late"

    def build(
        self,
        parsed: dict[str, Any],
        *,
        device: str,
        precision: str,
        modality_rule: str = "family",
        batch_size: int = 64,
    ) -> Retriever:
        from retrieval.encoders import LazyRetriever

        return LazyRetriever(
            self.canonical(parsed),
            device=device or None,
            batch_size=batch_size,
            precision=precision,
            modality_rule=modality_rule,
        )  # type: ignore[arg-type]


KIND = OpenClipKind()
