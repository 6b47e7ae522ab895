"""Readers for external rank files: the CIRCUS shortcut-audit JSON (pure; no Django).

Two layouts share one shape (``metadata``, ``summary``, ``gallery_paths``,
``samples``; see the CIRCUS format notes, sections 2 and 5):

* a **per-retriever** file, ``retrieval_data_<ds>_task<N>_<retriever>.json``: each
  sample's ``ranks`` are that retriever's own 1-based ranks;
* the **aggregated** file (``metadata.aggregation`` present): ``ranks`` are the best
  (minimum) ranks over the pool, and each sample carries the pool's ``aggregation``
  block (label, detail label, ``retriever_support_at_k``).

Samples are keyed by ``query_idx``, the 0-based line number of the query in the
dataset's source query file. ``retrievals.multimodal`` lists gallery indices (positions
in ``gallery_paths``) of the top results.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RANK_KEYS: dict[str, str] = {"multimodal": "mm", "text_only": "text", "image_only": "image"}
#: The rank-row field of each modality, in :data:`retrieval.metrics.MODALITIES` order.
RANK_FIELDS: tuple[str, ...] = tuple(RANK_KEYS.values())
_NAME_RE = re.compile(r"^retrieval_data_(?P<ds>[^_]+)_task(?P<task>\d+)_(?P<retriever>.+)\.json$")


class RankFileError(ValueError):
    """A malformed rank file; the message names the file, sample and field."""


@dataclass
class SampleRanks:
    query_idx: int
    query_text: str | None
    mm: int | None
    text: int | None
    image: int | None
    top_mm: list[int] = field(default_factory=list)
    label: str | None = None
    detail_label: str | None = None
    support: dict[str, int] | None = None


@dataclass
class RankFile:
    path: str
    aggregated: bool
    retriever: str
    dataset: str | None
    k: int | None
    gallery_paths: list[str]
    samples: list[SampleRanks]
    pool: list[str] = field(default_factory=list)  # aggregated files: the retrievers behind the best ranks


def retriever_name(path: str | Path, metadata: dict[str, Any]) -> str:
    """The retriever key: from the file name pattern, else the metadata, else the file stem."""
    name = Path(path).name
    m = _NAME_RE.match(name)
    if metadata.get("aggregation") is not None:
        agg = metadata["aggregation"]
        return "aggregated:" + str(agg.get("name") or (m.group("retriever") if m else Path(path).stem))
    if m:
        return m.group("retriever")
    for key in ("retriever_name", "retriever"):
        if isinstance(metadata.get(key), str) and metadata[key]:
            return metadata[key]
    return Path(path).stem


def _rank(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RankFileError(f"{where}: a rank must be an integer >= 1 or null, got {value!r}")
    return value


def parse_rank_document(doc: Any, path: str = "<input>") -> RankFile:
    """Validate a loaded rank-file document and return its ranks."""
    if not isinstance(doc, dict):
        raise RankFileError(f"{path}: expected a JSON object at the top level")
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict):
        raise RankFileError(f"{path}: field 'metadata' is missing or not an object")
    samples = doc.get("samples")
    if not isinstance(samples, list):
        raise RankFileError(f"{path}: field 'samples' is missing or not a list")
    gallery = doc.get("gallery_paths", [])
    if not isinstance(gallery, list) or not all(isinstance(p, str) for p in gallery):
        raise RankFileError(f"{path}: field 'gallery_paths' must be a list of strings")
    aggregated = isinstance(metadata.get("aggregation"), dict)
    k = metadata.get("k")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise RankFileError(f"{path}: field 'metadata.k' must be an integer >= 1")
    out: list[SampleRanks] = []
    seen: set[int] = set()
    for n, s in enumerate(samples):
        where = f"{path}, sample {n}"
        if not isinstance(s, dict):
            raise RankFileError(f"{where}: expected an object")
        idx = s.get("query_idx")
        if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
            raise RankFileError(f"{where}, field 'query_idx': expected an integer >= 0, got {idx!r}")
        if idx in seen:
            raise RankFileError(f"{where}, field 'query_idx': {idx} appears twice")
        seen.add(idx)
        ranks = s.get("ranks")
        if not isinstance(ranks, dict):
            raise RankFileError(f"{where}, field 'ranks': missing or not an object")
        values: dict[str, int | None] = {}
        for modality, short in RANK_KEYS.items():
            if modality not in ranks:
                raise RankFileError(f"{where}, field 'ranks.{modality}': missing")
            values[short] = _rank(ranks[modality], f"{where}, field 'ranks.{modality}'")
        top: list[int] = []
        retrievals = s.get("retrievals") or {}
        if not isinstance(retrievals, dict):
            raise RankFileError(f"{where}, field 'retrievals': not an object")
        for i in retrievals.get("multimodal") or []:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(gallery):
                raise RankFileError(f"{where}, field 'retrievals.multimodal': {i!r} is not a gallery index")
            top.append(i)
        text = s.get("query_text")
        sample = SampleRanks(query_idx=idx, query_text=text if isinstance(text, str) else None, top_mm=top, **values)
        agg = s.get("aggregation")
        if aggregated:
            if not isinstance(agg, dict):
                raise RankFileError(f"{where}, field 'aggregation': missing in an aggregated file")
            sample.label = agg.get("label")
            sample.detail_label = agg.get("detail_label")
            support = agg.get("retriever_support_at_k")
            if isinstance(support, dict):
                sample.support = {
                    key: int(v) for key, v in support.items() if isinstance(v, int) and not isinstance(v, bool)
                }
        out.append(sample)
    pool = []
    if aggregated:
        pool = [str(r) for r in metadata["aggregation"].get("retrievers", []) or []]
    return RankFile(
        path=str(path), aggregated=aggregated, retriever=retriever_name(path, metadata),
        dataset=metadata.get("dataset") if isinstance(metadata.get("dataset"), str) else None,
        k=k, gallery_paths=list(gallery), samples=out, pool=pool,
    )


def read_rank_file(path: str | Path) -> RankFile:
    """Read and validate one CIRCUS rank file (per-retriever or aggregated)."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except json.JSONDecodeError as exc:
        raise RankFileError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except OSError as exc:
        raise RankFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse_rank_document(doc, str(path))


def path_suffixes(path: str) -> list[str]:
    """``'/a/b/c.jpg'`` -> ``['a/b/c.jpg', 'b/c.jpg', 'c.jpg']`` (longest first)."""
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    return ["/".join(parts[i:]) for i in range(len(parts))]
