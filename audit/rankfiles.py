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
    mm_all: list[int | None] = field(default_factory=list)  # every positive's rank, when the file lists them
    text_all: list[int | None] = field(default_factory=list)
    image_all: list[int | None] = field(default_factory=list)
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


def check_rank_value(value: Any, where: str) -> int | list[int | None] | None:
    """One modality's rank: an integer >= 1, null, or a non-empty list of those (every positive's rank)."""
    if isinstance(value, list):
        if not value:
            raise RankFileError(f"{where}: an empty list of ranks (give null when no target was retrieved)")
        nested = next((n for n, v in enumerate(value) if isinstance(v, list)), None)
        if nested is not None:
            raise RankFileError(f"{where}[{nested}]: a list of ranks cannot hold another list")
        return [check_rank_value(v, f"{where}[{n}]") for n, v in enumerate(value)]  # type: ignore[misc]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RankFileError(f"{where}: a rank must be an integer >= 1, null or a list of those, got {value!r}")
    return value


def best_of(value: int | list[int | None] | None) -> int | None:
    """The best (smallest) rank of a value accepted by :func:`check_rank_value`."""
    if isinstance(value, list):
        return min((v for v in value if v is not None), default=None)
    return value


def _check_header(doc: Any, path: str) -> tuple[dict[str, Any], list[Any], list[str], int | None]:
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
    k = metadata.get("k")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise RankFileError(f"{path}: field 'metadata.k' must be an integer >= 1")
    return metadata, samples, gallery, k


def _sample_ranks(s: dict[str, Any], where: str) -> dict[str, Any]:
    ranks = s.get("ranks")
    if not isinstance(ranks, dict):
        raise RankFileError(f"{where}, field 'ranks': missing or not an object")
    values: dict[str, Any] = {}
    for modality, short in RANK_KEYS.items():
        if modality not in ranks:
            raise RankFileError(f"{where}, field 'ranks.{modality}': missing")
        value = check_rank_value(ranks[modality], f"{where}, field 'ranks.{modality}'")
        values[short] = best_of(value)
        values[short + "_all"] = value if isinstance(value, list) else []
    return values


def _sample_top(s: dict[str, Any], where: str, n_gallery: int) -> list[int]:
    retrievals = s.get("retrievals") or {}
    if not isinstance(retrievals, dict):
        raise RankFileError(f"{where}, field 'retrievals': not an object")
    top: list[int] = []
    for i in retrievals.get("multimodal") or []:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_gallery:
            raise RankFileError(f"{where}, field 'retrievals.multimodal': {i!r} is not a gallery index")
        top.append(i)
    return top


def _aggregation(sample: SampleRanks, agg: Any, where: str) -> None:
    if not isinstance(agg, dict):
        raise RankFileError(f"{where}, field 'aggregation': missing in an aggregated file")
    sample.label = agg.get("label")
    sample.detail_label = agg.get("detail_label")
    support = agg.get("retriever_support_at_k")
    if isinstance(support, dict):
        sample.support = {key: int(v) for key, v in support.items() if isinstance(v, int) and not isinstance(v, bool)}


def _sample(s: Any, where: str, n_gallery: int, aggregated: bool, seen: set[int]) -> SampleRanks:
    if not isinstance(s, dict):
        raise RankFileError(f"{where}: expected an object")
    idx = s.get("query_idx")
    if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
        raise RankFileError(f"{where}, field 'query_idx': expected an integer >= 0, got {idx!r}")
    if idx in seen:
        raise RankFileError(f"{where}, field 'query_idx': {idx} appears twice")
    seen.add(idx)
    text = s.get("query_text")
    sample = SampleRanks(query_idx=idx, query_text=text if isinstance(text, str) else None,
                         top_mm=_sample_top(s, where, n_gallery), **_sample_ranks(s, where))
    if aggregated:
        _aggregation(sample, s.get("aggregation"), where)
    return sample


def parse_rank_document(doc: Any, path: str = "<input>") -> RankFile:
    """Validate a loaded rank-file document and return its ranks.

    Each of ``ranks.multimodal``, ``ranks.text_only`` and ``ranks.image_only`` is one rank
    (the best positive's), ``null``, or the list of the ranks of every positive target.
    """
    metadata, samples, gallery, k = _check_header(doc, path)
    aggregated = isinstance(metadata.get("aggregation"), dict)
    seen: set[int] = set()
    out = [_sample(s, f"{path}, sample {n}", len(gallery), aggregated, seen) for n, s in enumerate(samples)]
    pool = [str(r) for r in metadata["aggregation"].get("retrievers", []) or []] if aggregated else []
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
