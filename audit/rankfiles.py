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

``gallery_paths`` may list millions of paths (4.3M in a 150 MB file) of which the samples'
top lists name a few thousand: it is streamed twice, once to count and type-check it, once
to keep what the top lists name (the path, or what the caller's ``keep`` makes of it: the
importer keeps the dataset's image id, not the path), so memory does not grow with the
gallery (``bench/rankfile_memory.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retrieval.importers import jsonstream
from retrieval.records import ParseError
from retrieval.validation import Record, is_int, json_type

RANK_KEYS: dict[str, str] = {"multimodal": "mm", "text_only": "text", "image_only": "image"}
#: The rank-row field of each modality, in :data:`retrieval.metrics.MODALITIES` order.
RANK_FIELDS: tuple[str, ...] = tuple(RANK_KEYS.values())
_NAME_RE = re.compile(r"^retrieval_data_(?P<ds>[^_]+)_task(?P<task>\d+)_(?P<retriever>.+)\.json$")


class RankFileError(ParseError):
    """A malformed rank file: a :class:`retrieval.records.ParseError` naming the file, the
    sample (``sample N``) and the field."""

    @classmethod
    def of(cls, exc: ParseError) -> RankFileError:
        """The same error as a RankFileError (what the rank-file readers' callers catch)."""
        return cls(exc.file, exc.record, exc.field, exc.message, record_label=exc.record_label)


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
    gallery_size: int  # how many paths ``gallery_paths`` lists in the file
    gallery_paths: dict[int, Any]  # gallery index -> its path (or ``keep(path)``), for the indices the top lists name
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


def check_rank_value(rec: Record, key: str) -> int | list[int | None] | None:
    """Field ``key`` of ``rec``, one modality's rank: an integer >= 1, null, or a non-empty list
    of those (every positive's rank)."""
    value = rec.req(key)
    if isinstance(value, list):
        if not value:
            rec.fail(key, "an empty list of ranks (give null when no target was retrieved)")
        for n, item in enumerate(value):
            if isinstance(item, list):
                rec.fail(f"{key}[{n}]", "a list of ranks cannot hold another list")
            _check_rank(rec, f"{key}[{n}]", item)
        return value
    return _check_rank(rec, key, value)


def _check_rank(rec: Record, key: str, value: Any) -> int | None:
    if value is not None and (not is_int(value) or value < 1):
        rec.fail(key, f"a rank must be an integer >= 1, null or a list of those, got {value!r}")
    return value


def best_of(value: int | list[int | None] | None) -> int | None:
    """The best (smallest) rank of a value accepted by :func:`check_rank_value`."""
    if isinstance(value, list):
        return min((v for v in value if v is not None), default=None)
    return value


@dataclass
class GalleryList:
    """What a rank file's ``gallery_paths`` holds, without holding it: how many items, and
    their JSON types (fed one item at a time while the file streams)."""

    size: int = 0
    kinds: set[str] = field(default_factory=set)

    def add(self, item: Any) -> None:
        self.size += 1
        self.kinds.add(json_type(item))

    @classmethod
    def of(cls, value: Any) -> GalleryList:
        summary = cls()
        for item in value if isinstance(value, list) else ():
            summary.add(item)
        return summary


def _check_header(doc: Any, path: str, gallery: GalleryList) -> tuple[dict[str, Any], int | None]:
    rec = Record(path, None, doc, "rank file (at the top level)")
    metadata = rec.req_obj("metadata")
    rec.req_list("samples")
    listed = rec.data.get("gallery_paths")
    if listed is not None and not isinstance(listed, list):
        rec.fail("gallery_paths", f"expected a list of strings, got {json_type(listed)}")
    if gallery.kinds - {"string"}:
        rec.fail("gallery_paths", f"expected a list of strings, got list of {'/'.join(sorted(gallery.kinds))}")
    k = rec.nested("metadata", metadata, "metadata object").opt_int("k")
    if k is not None and k < 1:
        rec.fail("metadata.k", f"must be an integer >= 1, got {k}")
    return metadata, k


def _sample_ranks(rec: Record) -> dict[str, Any]:
    ranks = rec.nested("ranks", rec.req_obj("ranks"), "ranks object")
    values: dict[str, Any] = {}
    for modality, short in RANK_KEYS.items():
        value = check_rank_value(ranks, modality)
        values[short] = best_of(value)
        values[short + "_all"] = value if isinstance(value, list) else []
    return values


def _sample_top(rec: Record, n_gallery: int) -> list[int]:
    retrievals = rec.opt_obj("retrievals")
    if retrievals is None or retrievals.get("multimodal") is None:
        return []
    top = rec.nested("retrievals", retrievals, "retrievals object").req_int_list("multimodal")
    for i in top:
        if not 0 <= i < n_gallery:
            rec.fail("retrievals.multimodal", f"{i!r} is not a gallery index (the file lists {n_gallery} paths)")
    return top


def _aggregation(sample: SampleRanks, rec: Record) -> None:
    if rec.data.get("aggregation") is None:
        rec.fail("aggregation", "missing in an aggregated file")
    agg = rec.nested("aggregation", rec.req_obj("aggregation"), "aggregation object")
    sample.label = agg.opt_str("label")
    sample.detail_label = agg.opt_str("detail_label")
    support = agg.opt_obj("retriever_support_at_k")
    if support is not None:
        sample.support = {key: v for key, v in support.items() if is_int(v)}


def _sample(rec: Record, n_gallery: int, aggregated: bool, seen: dict[int, int]) -> SampleRanks:
    idx = rec.req_int("query_idx")
    if idx < 0:
        rec.fail("query_idx", f"expected an integer >= 0, got {idx}")
    if idx in seen:
        rec.fail("query_idx", f"{idx} appears twice (first in sample {seen[idx]})")
    seen[idx] = rec.index
    sample = SampleRanks(
        query_idx=idx, query_text=rec.opt_str("query_text"), top_mm=_sample_top(rec, n_gallery), **_sample_ranks(rec)
    )
    if aggregated:
        _aggregation(sample, rec)
    return sample


def parse_rank_document(doc: Any, path: str = "<input>", keep: Callable[[str], Any] | None = None) -> RankFile:
    """Validate a loaded rank-file document and return its ranks.

    Each of ``ranks.multimodal``, ``ranks.text_only`` and ``ranks.image_only`` is one rank
    (the best positive's), ``null``, or the list of the ranks of every positive target.
    Fields are read through :class:`retrieval.validation.Record`; a malformed document
    raises :class:`RankFileError` naming the file, the sample and the field. ``keep``: see
    :func:`read_rank_file`.
    """
    if not isinstance(doc, dict):
        return _parse_rank_samples(doc, iter(()), path, GalleryList(), dict)
    listed = doc.get("gallery_paths")
    return _parse_rank_samples(
        doc,
        enumerate(doc.get("samples") or []),
        path,
        GalleryList.of(listed),
        lambda wanted: _kept(((i, listed[i]) for i in sorted(wanted)), keep),
    )


def _parse_rank_samples(
    header: Any,
    samples: Iterable[tuple[int, Any]],
    path: str,
    gallery: GalleryList,
    pick: Callable[[set[int]], dict[int, str]],
) -> RankFile:
    """The rank file from its header (``gallery``: what its ``gallery_paths`` holds) and its
    samples; ``pick`` gives :attr:`RankFile.gallery_paths` for a set of indices (those the top lists name)."""
    try:
        metadata, k = _check_header(header, path, gallery)
        aggregated = isinstance(metadata.get("aggregation"), dict)
        seen: dict[int, int] = {}
        out = [
            _sample(Record(path, n, s, "sample", label=f"sample {n}"), gallery.size, aggregated, seen)
            for n, s in samples
        ]
    except RankFileError:
        raise
    except ParseError as exc:
        raise RankFileError.of(exc) from None
    pool = [str(r) for r in metadata["aggregation"].get("retrievers", []) or []] if aggregated else []
    return RankFile(
        path=str(path),
        aggregated=aggregated,
        retriever=retriever_name(path, metadata),
        dataset=metadata.get("dataset") if isinstance(metadata.get("dataset"), str) else None,
        k=k,
        gallery_size=gallery.size,
        gallery_paths=pick({i for s in out for i in s.top_mm}),
        samples=out,
        pool=pool,
    )


def _streamed_paths(file: str, wanted: set[int]) -> Iterable[tuple[int, str]]:
    """``(index, path)`` for the indices ``wanted`` of the file's ``gallery_paths``, read item by item."""
    left = len(wanted)
    if left:
        for index, item in jsonstream.iter_member(file, "gallery_paths"):
            if index in wanted:
                yield index, item
                left -= 1
                if not left:
                    return


def _kept(paths: Iterable[tuple[int, str]], keep: Callable[[str], Any] | None) -> dict[int, Any]:
    """``index -> path``, or ``index -> keep(path)`` leaving out what ``keep`` makes None."""
    if keep is None:
        return dict(paths)
    return {i: kept for i, path in paths if (kept := keep(path)) is not None}


def read_rank_file(path: str | Path, keep: Callable[[str], Any] | None = None) -> RankFile:
    """Read and validate one CIRCUS rank file (per-retriever or aggregated), streaming.

    The file is first checked with flat memory (:func:`jsonstream.check_bounds`: depth,
    64-bit integers, NUL and lone surrogates); then its header (``metadata``; ``gallery_paths``
    counted and type-checked item by item) is read in one pass, its ``samples`` are streamed
    one by one, and a last pass keeps the gallery paths the samples' top lists name, so memory
    holds the parsed ranks, never the whole document nor the whole gallery. ``keep`` turns each
    path the top lists name into what :attr:`RankFile.gallery_paths` holds (None: left out); by
    default the path."""
    file = str(path)
    try:
        jsonstream.check_bounds(file)
        gallery = GalleryList()
        try:
            header = jsonstream.top_members(file, ("metadata",), stream={"gallery_paths": gallery.add})
        except ParseError as exc:
            if not exc.message.startswith("not valid JSON"):
                raise
            raise jsonstream.diagnose_member(file, "samples", exc, "sample") from None  # which sample, which field
        return _parse_rank_samples(
            header,
            jsonstream.iter_member(file, "samples"),
            file,
            gallery,
            lambda wanted: _kept(_streamed_paths(file, wanted), keep),
        )
    except RankFileError:
        raise
    except ParseError as exc:
        message = exc.message.replace("cannot read file:", "cannot read")
        raise RankFileError(file, exc.record, exc.field, message, record_label=exc.record_label) from None


def path_suffixes(path: str) -> list[str]:
    """``'/a/b/c.jpg'`` -> ``['a/b/c.jpg', 'b/c.jpg', 'c.jpg']`` (longest first)."""
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    return ["/".join(parts[i:]) for i in range(len(parts))]
