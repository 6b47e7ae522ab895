"""Retrievers of every kind behind one interface (see :mod:`retrieval.retrievers.base`).

Torch-free: importing this package (or parsing a spec) never imports torch, open_clip or
transformers.
"""

from retrieval.retrievers.base import (
    ENTRY_POINT_GROUP,
    MODALITY_RULES,
    Fusion,
    LateFusion,
    Retriever,
    RetrieverKind,
    black_like,
    canonical_spec,
    expected_passes,
    kinds,
    parse_spec,
    pool_kinds,
    query_key,
    register_kind,
    spec_facts,
    spec_prefix,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "MODALITY_RULES",
    "Fusion",
    "LateFusion",
    "Retriever",
    "RetrieverKind",
    "black_like",
    "canonical_spec",
    "expected_passes",
    "kinds",
    "parse_spec",
    "pool_kinds",
    "query_key",
    "register_kind",
    "spec_facts",
    "spec_prefix",
]
