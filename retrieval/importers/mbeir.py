"""M-BEIR (UniIR) annotation parser for the composed-retrieval tasks.

Files, recognised by name:

* ``*cand_pool*.jsonl`` – candidate pool rows ``{did, txt, img_path, modality, src_content}``;
* ``*qrels*.txt`` – whitespace-separated ``qid 0 did relevance [task_id]`` lines;
* any other ``*.jsonl`` – queries ``{qid, query_txt, query_img_path, query_modality,
  query_src_content, pos_cand_list, neg_cand_list, task_id}``.

Splits come from the names (``mbeir_cirr_task7_test.jsonl`` -> ``test``,
``mbeir_cirr_task7_test_qrels.txt`` -> ``test``, ``mbeir_union_test_cand_pool.jsonl`` ->
``test``); a pool without a split in its name takes the ``split`` argument, else the split
of the query files when there is exactly one.

Mapping (instruction-free): ``external_id = qid``; turn 1 = query image + ``query_txt``;
targets = ``pos_cand_list`` (role ``pos``, relevance 1, the first primary) then
``neg_cand_list`` (role ``neg``, relevance 0); qrels lines with relevance > 0 add a ``pos``
target (source field ``qrels``) to the query with that qid in the same split unless it is
already there. Pool rows register an image with id = ``did``, path = ``img_path`` and
``extra['src_content']``; text-only rows (no ``img_path``) are skipped with a warning.
The gallery of a split is the list of image dids of its pool(s). The query image has no
did: it takes the did of the pool row with the same ``img_path`` when there is one,
otherwise its normalised path is its external id.

Pools stream with bounded memory: their lines are read and validated :data:`POOL_BATCH` at a
time and handed over through :meth:`retrieval.records.ParsedDataset.add_streamed_images`
(the loader writes each batch at once); what the queries look up later (a did's path, a
path's did, duplicates, gallery membership) lives in a scratch index on disk
(:mod:`retrieval.importers.poolindex`), not in Python.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from retrieval.importers._common import (
    PathLike,
    Record,
    add_target,
    as_paths,
    check_str_list,
    collect,
    iter_jsonl,
    match_name,
    read_lines,
    register,
)
from retrieval.importers.poolindex import PoolIndex, stream_images
from retrieval.records import (
    ImageRecord,
    ParsedDataset,
    ParseError,
    QueryRecord,
    TargetRecord,
    TextRecord,
    TurnRecord,
    record_name,
    safe_relpath,
)

FORMAT = "mbeir"
SPLITS = ("train", "val", "test", "dev")
#: Pool lines validated and handed over together (Python holds one such batch at a time).
POOL_BATCH = 2000

_PATTERNS = [
    ("pool", re.compile(r"^.*cand_pool.*\.jsonl$")),
    ("qrels", re.compile(r"^.*qrels.*\.txt$")),
    ("queries", re.compile(r"^.*\.jsonl$")),
]


def _split_from_name(name: str, role: str) -> str | None:
    """The split token of an M-BEIR file name, or None when the name has none."""
    stem = name.rsplit(".", 1)[0].removesuffix(".sample")
    tokens = stem.split("_")
    if role == "queries":
        return tokens[-1] if tokens[-1] in SPLITS else None
    if role == "qrels":
        if "qrels" in tokens:
            before = tokens[: tokens.index("qrels")]
            if before and before[-1] in SPLITS:
                return before[-1]
        return None
    found = [t for t in tokens if t in SPLITS]
    return found[-1] if found else None


def parse(paths: Iterable[PathLike], split: str | None = None, subset: str | None = None) -> ParsedDataset:
    """Parse M-BEIR query, candidate-pool and qrels files into a ParsedDataset."""
    return collect(stream, FORMAT, paths, split=split)


def _files(paths: Iterable[PathLike], split: str | None) -> dict[str, list[tuple[Path, str]]]:
    """Files by role with their split: their own, else ``split``, else the query files' only split."""
    files: dict[str, list[tuple[Path, str | None]]] = {"pool": [], "queries": [], "qrels": []}
    for path in as_paths(paths):
        role, _ = match_name(path, _PATTERNS, FORMAT)
        files[role].append((path, split or _split_from_name(path.name, role)))
    query_splits = {name for _, name in files["queries"] if name is not None}
    only = next(iter(query_splits)) if len(query_splits) == 1 else None
    resolved: dict[str, list[tuple[Path, str]]] = {}
    for role, found in files.items():
        for path, name in found:
            name = name or (only if role != "queries" else None)
            if name is None:
                raise ParseError(
                    str(path),
                    None,
                    None,
                    "cannot tell the split from the file name (expected ..._<train|val|test>...); pass --split",
                )
            resolved.setdefault(role, []).append((path, name))
    return resolved


def stream(
    paths: Iterable[PathLike], dataset: ParsedDataset, split: str | None = None, subset: str | None = None
) -> Iterator[QueryRecord]:
    """Read the pools (streaming, a batch of lines at a time) and qrels, then yield the queries one by one."""
    files = _files(paths, split)
    with PoolIndex() as index:
        for path, name in files.get("pool", []):
            _parse_pool(path, name, dataset, index)
        positives: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for path, name in files.get("qrels", []):
            _parse_qrels(path, name, positives)
        missing: set[str] = set()
        seen: set[tuple[str, str]] = set()  # (split, qid) across the query files
        for path, name in files.get("queries", []):
            for query in _parse_queries(path, name, dataset, index, positives, seen):
                missing.update(
                    t.image
                    for t in query.targets
                    if (image := dataset.images.get(t.image)) is not None and image.path is None
                )
                yield query
    _warn_unmatched(positives, dataset)
    if files.get("pool") and missing:
        dataset.warnings.append(f"{len(missing)} target did(s) are in no candidate pool, e.g. {sorted(missing)[0]!r}")


def _parse_pool(path: Path, split: str, dataset: ParsedDataset, index: PoolIndex) -> None:
    """Register the image rows of a candidate pool and add them to the split's gallery, a batch
    at a time: :meth:`ParsedDataset.add_streamed_images` takes each batch, ``index`` what later
    lookups need, so nothing per row stays in memory."""
    dataset.galleries.setdefault(split, [])
    index.start_file()
    text_only = 0
    lines = iter_jsonl(path)
    while batch := list(itertools.islice(lines, POOL_BATCH)):
        rows = _pool_rows(path, batch, index)
        images = [image for _, image in rows if image is not None]
        text_only += len(rows) - len(images)
        _add_pool_images(split, images, dataset, index)
    if text_only:
        dataset.warnings.append(f"{path.name}: skipped {text_only} text-only candidate(s) (no img_path)")


def _pool_rows(path: Path, batch: list[tuple[int, Any]], index: PoolIndex) -> list[tuple[str, ImageRecord | None]]:
    """Validate a batch of pool lines in file order: ``(did, image)``, image None for a text-only row."""
    earlier = index.first_lines(
        raw["did"] for _, raw in batch if isinstance(raw, dict) and isinstance(raw.get("did"), str)
    )
    rows: list[tuple[str, ImageRecord | None]] = []
    for line, raw in batch:
        rec = Record(path, line, raw, "candidate")
        did = rec.req_str("did")
        if did in earlier:
            rec.fail("did", f"duplicate did {did!r} (first at {record_name(path, earlier[did])})")
        earlier[did] = line
        rows.append((did, _pool_image(rec, did)))
    index.mark_seen((did, line) for (did, _), (line, _) in zip(rows, batch))
    return rows


def _pool_image(rec: Record, did: str) -> ImageRecord | None:
    """The image of one pool row (``img_path``, ``extra``), or None for a text-only row."""
    img_path = rec.nullable_str("img_path")
    txt = rec.opt_str("txt")
    modality = rec.opt_str("modality")
    src_content = rec.opt_str("src_content")
    if img_path is None:
        return None
    rel = safe_relpath(img_path, rec.file, rec.index, "img_path")
    extra: dict[str, Any] = {"src_content": src_content}
    if modality is not None:
        extra["modality"] = modality
    if txt is not None:
        extra["txt"] = txt
    return ImageRecord(did, path=rel, extra=extra)


def _add_pool_images(split: str, images: list[ImageRecord], dataset: ParsedDataset, index: PoolIndex) -> None:
    """Register one batch of pool images (a did seen in an earlier pool completes its first
    values) and add them to the gallery of ``split``."""
    index.add_paths((image.path, image.external_id) for image in images)
    stream_images(split, images, dataset, index)


def _target_image(dataset: ParsedDataset, index: PoolIndex, did: str) -> None:
    """Register a target did that no pool row registered (it has no path: warned as missing)."""
    if not index.has(did):
        register(dataset, did)


def _parse_queries(
    path: Path,
    split: str,
    dataset: ParsedDataset,
    index: PoolIndex,
    positives: dict[tuple[str, str], list[tuple[str, str]]],
    seen: set[tuple[str, str]],
) -> Iterator[QueryRecord]:
    """Validate and map every query line of a query jsonl file, adding its qrels positives."""
    for line, raw in iter_jsonl(path):
        rec = Record(path, line, raw, "query")
        qid = rec.req_str("qid")
        if (split, qid) in seen:
            rec.fail("qid", f"duplicate qid {qid!r} in split {split!r}")
        seen.add((split, qid))
        text = rec.nullable_str("query_txt")
        img_path = rec.nullable_str("query_img_path")
        modality = rec.opt_str("query_modality")
        src_content = rec.opt_str("query_src_content")
        task_id = rec.opt_int("task_id")
        pos = rec.req_str_list("pos_cand_list")
        neg = check_str_list(rec, "neg_cand_list", rec.data.get("neg_cand_list") or [])

        reference: str | None = None
        if img_path is not None:
            rel = safe_relpath(img_path, rec.file, line, "query_img_path")
            reference = index.did_for_path(rel) or register(dataset, rel, path=rel, extra={"src_content": src_content})
        where = f"{path.name} {record_name(path, line)}"
        targets: list[TargetRecord] = []
        for did in pos:
            _target_image(dataset, index, did)
            add_target(targets, TargetRecord(did, 1.0, not targets, "pos", "pos_cand_list"), dataset, where)
        for did in neg:
            _target_image(dataset, index, did)
            add_target(targets, TargetRecord(did, 0.0, False, "neg", "neg_cand_list"), dataset, where)

        extra: dict[str, Any] = {"task_id": task_id, "query_modality": modality, "query_src_content": src_content}
        if split in dataset.galleries:
            extra["gallery"] = split
        texts = [TextRecord(text, "caption")] if text is not None else []
        query = QueryRecord(
            external_id=qid,
            split=split,
            ordinal=line,
            source_file=path.name,
            turns=[TurnRecord(1, reference, texts)],
            targets=targets,
            raw=raw,
            extra=extra,
        )
        _add_qrels(query, positives.pop((split, qid), []), dataset, index)
        yield query


def _parse_qrels(path: Path, split: str, positives: dict[tuple[str, str], list[tuple[str, str]]]) -> None:
    """Gather the positives of a qrels file (``qid 0 did relevance [task_id]``) by (split, qid)."""
    for index, line in read_lines(path):
        cols = line.split()
        if not cols:
            continue
        if len(cols) not in (4, 5):
            raise ParseError(
                str(path),
                index,
                None,
                f"expected 'qid 0 did relevance [task_id]', got {len(cols)} columns",
                record_label=f"line {index + 1}",
            )
        qid, _, did, rel_text = cols[:4]
        try:
            relevance = float(rel_text)
        except ValueError:
            relevance = math.nan
        if not math.isfinite(relevance):
            raise ParseError(
                str(path),
                index,
                "relevance",
                f"relevance {rel_text!r} is not a finite number",
                record_label=f"line {index + 1}",
            )
        if len(cols) == 5 and not cols[4].lstrip("-").isdigit():
            raise ParseError(
                str(path), index, "task_id", f"task id {cols[4]!r} is not an integer", record_label=f"line {index + 1}"
            )
        if relevance > 0:
            positives.setdefault((split, qid), []).append((did, f"{path.name} line {index + 1}"))


def _add_qrels(query: QueryRecord, found: list[tuple[str, str]], dataset: ParsedDataset, index: PoolIndex) -> None:
    """Add qrels positives to ``query`` unless already targets (a negative made positive is warned)."""
    for did, where in found:
        existing = next((t for t in query.targets if t.image == did), None)
        if existing is not None:
            if existing.role == "neg":
                dataset.warnings.append(f"{where}: {did!r} is positive here but a negative of {query.external_id!r}")
            continue
        _target_image(dataset, index, did)
        query.targets.append(TargetRecord(did, 1.0, not any(t.is_primary for t in query.targets), "pos", "qrels"))


def _warn_unmatched(positives: dict[tuple[str, str], list[tuple[str, str]]], dataset: ParsedDataset) -> None:
    """Warn, per qrels file, about the qids whose positives matched no query."""
    by_file: dict[str, set[str]] = {}
    for (_, qid), found in positives.items():
        for _did, where in found:
            by_file.setdefault(where.split(" line ")[0], set()).add(qid)
    for name, unknown in by_file.items():
        dataset.warnings.append(
            f"{name}: {len(unknown)} qid(s) with positives match no query, e.g. {sorted(unknown)[0]!r}"
        )
