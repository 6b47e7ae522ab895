"""Entering a method on a leaderboard (Django; thin): from the benchmark's prediction files, a
CIRCUS rank file or an audit's retriever, each turned into per-query ranks of the split's
labelled positives (:func:`retrieval.targets.positive_targets`) and of the accepted
alternatives (targets of role ``alternative``), then stored on a :class:`LeaderboardEntry`.

* Prediction files: a positive's rank is its place in the query's list (``None`` past its
  end; the lists are at least as long as the protocol's largest cut-off, so every figure up
  to it is exact); CIRR's ``recall_subset`` file gives the rank within the ``img_set`` group.
* Audit retrievers: :func:`audit.protocol.run_query_ranks`, the reading the audit's protocol
  table makes (so the scores equal the audit's protocol figures); the alternatives' ranks are
  the audit's own when it counted them, else their place in the stored multimodal top list.
* Rank files: :func:`audit.rankfiles.read_rank_file`, matched by ``query_idx`` = the query's
  ordinal in the split; alternatives from the file's ``retrievals.multimodal`` top list.

A file is checked whole before anything is stored (:mod:`audit.leaderboard.files`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import transaction

from retrieval.evaltargets import facts_by_query
from retrieval.models import Image, Query, Turn
from retrieval.protocols import Protocol, QueryRanks, protocol_for
from retrieval.targets import ALTERNATIVE, positive_targets

from ..imports import GalleryMapper
from ..models import AuditRank, AuditRun, Leaderboard, LeaderboardEntry
from ..protocol import run_query_ranks
from ..rankfiles import RankFileError, read_rank_file
from .files import (
    PredictionFileError,
    Predictions,
    SplitFacts,
    check_complete,
    check_predictions,
    positions,
    read_predictions,
)
from .scoring import GENERIC, EntryRanks


class EntryError(ValueError):
    """A method that cannot be entered (the message names the file, line and id, or the reason)."""


def protocol_of(board: Leaderboard) -> Protocol:
    """The dataset's protocol (:data:`retrieval.protocols.PROTOCOLS`), or :data:`GENERIC`."""
    return protocol_for(board.dataset.format) or GENERIC


@dataclass
class SplitTargets:
    """The split's single-turn queries (ordinal order) and each one's labelled positives,
    accepted alternatives (image ids), primary index and category."""

    queries: list[Query]
    labelled: dict[int, list[int]]
    alternatives: dict[int, list[int]]
    primary: dict[int, int | None]


def split_targets(board: Leaderboard) -> SplitTargets:
    queries = list(Query.objects.filter(dataset=board.dataset, split=board.split, n_turns=1).order_by("ordinal", "id"))
    fmt = board.dataset.format
    labelled, alternatives, primary = {}, {}, {}
    for qid, facts in facts_by_query([q.pk for q in queries]).items():
        positives = positive_targets(fmt, facts)
        labelled[qid] = [t.image for t in positives if t.role != ALTERNATIVE]
        alternatives[qid] = [t.image for t in positives if t.role == ALTERNATIVE]
        primary[qid] = next((n for n, t in enumerate(positives) if t.is_primary and t.role != ALTERNATIVE), None)
    return SplitTargets(queries, labelled, alternatives, primary)


def _primary(protocol: Protocol, targets: SplitTargets, qid: int) -> int | None:
    return targets.primary.get(qid) if protocol.recall_of_primary else 0


def dump_ranks(entry: EntryRanks) -> dict[str, Any]:
    """The JSON stored on an entry (query ids as strings; ``alternatives`` null: not known)."""
    rows = {}
    for qid, q in entry.queries.items():
        rows[str(qid)] = [
            list(q.positives),
            list(q.ahead),
            q.primary,
            q.subset,
            q.category,
            q.every_positive,
            q.subset_known,
            entry.alternatives.get(qid),
            None if entry.text is None else entry.text.get(qid),
            None if entry.image is None else entry.image.get(qid),
        ]
    return {
        "audited_removed": entry.audited_removed,
        "unimodal": entry.text is not None,
        "alternatives_known": entry.alternatives_known,
        "rows": rows,
    }


def load_ranks(data: dict[str, Any]) -> EntryRanks:
    """:func:`dump_ranks` read back (query ids as integers)."""
    out = EntryRanks(
        {},
        {},
        {} if data.get("unimodal") else None,
        {} if data.get("unimodal") else None,
        bool(data.get("audited_removed", True)),
        bool(data.get("alternatives_known", True)),
    )
    for key, (pos, ahead, primary, subset, category, every, known, alts, text, image) in data.get("rows", {}).items():
        qid = int(key)
        out.queries[qid] = QueryRanks(pos, ahead, primary, subset, category, every, known)
        if alts is not None:
            out.alternatives[qid] = alts
        if out.text is not None and out.image is not None:
            out.text[qid], out.image[qid] = text, image
    return out


def _store(board: Leaderboard, name: str, paper: str, source: str, detail: str, ranks: EntryRanks) -> LeaderboardEntry:
    if not name.strip():
        raise EntryError("a method needs a name")
    if LeaderboardEntry.objects.filter(leaderboard=board, name=name).exists():
        raise EntryError(f"leaderboard {board.name!r} already has a method named {name!r}")
    with transaction.atomic():
        return LeaderboardEntry.objects.create(
            leaderboard=board,
            name=name,
            paper=paper,
            source=source,
            source_detail=detail[:1000],
            ranks=dump_ranks(ranks),
        )


# ----------------------------------------------------------------------------- prediction files


def split_facts(board: Leaderboard, targets: SplitTargets, protocol: Protocol) -> tuple[SplitFacts, dict[int, str]]:
    """What a prediction file is checked against, and image id -> external id of the dataset."""
    names = dict(Image.objects.filter(dataset=board.dataset).values_list("pk", "external_id"))
    others = {
        ext: split
        for ext, split in Query.objects.filter(dataset=board.dataset)
        .exclude(split=board.split)
        .values_list("external_id", "split")
    }
    refs = dict(
        Turn.objects.filter(query__in=targets.queries, index=1).values_list(
            "query__external_id", "reference_image__external_id"
        )
    )
    cut = max((*protocol.recall_ks, *protocol.map_ks), default=1)
    keys = [q.external_id for q in targets.queries]
    return SplitFacts(
        board.split,
        keys,
        {k: v for k, v in others.items() if k not in set(keys)},
        set(names.values()),
        {k: v for k, v in refs.items() if v},
        min(cut, max(1, len(names) - 1)),
    ), names


def _prediction_ranks(
    files: list[Predictions], targets: SplitTargets, names: dict[int, str], protocol: Protocol
) -> EntryRanks:
    lists = {k: v for f in files if f.metric == "recall" for k, v in f.lists.items()}
    subsets = {k: v for f in files if f.metric == "recall_subset" for k, v in f.lists.items()}
    out = EntryRanks({}, audited_removed=True)
    for q in targets.queries:
        labelled = [names[i] for i in targets.labelled.get(q.pk, [])]
        ranked = lists.get(q.external_id, [])
        subset = positions(subsets[q.external_id], labelled[:1])[0] if q.external_id in subsets and labelled else None
        out.queries[q.pk] = QueryRanks(
            positions(ranked, labelled), (), _primary(protocol, targets, q.pk), subset, q.category, True, bool(subsets)
        )
        out.alternatives[q.pk] = positions(ranked, [names[i] for i in targets.alternatives.get(q.pk, [])])
    return out


def enter_predictions(
    board: Leaderboard,
    name: str,
    files: Sequence[tuple[str | Path, str]],
    paper: str = "",
    texts: Sequence[str] | None = None,
) -> LeaderboardEntry:
    """Enter a method from its prediction files (``(path, format)``; ``texts``: their contents
    when already read, as an upload gives them). Refused whole on the first bad line."""
    protocol, targets = protocol_of(board), split_targets(board)
    facts, names = split_facts(board, targets, protocol)
    read = []
    try:
        for n, (path, fmt) in enumerate(files):
            allowed = _allowed_formats(board)
            if fmt not in allowed:
                raise EntryError(
                    f"{path}: a {board.dataset.format} leaderboard takes {' or '.join(allowed)} files, not {fmt}"
                )
            text = texts[n] if texts is not None else Path(path).read_text(encoding="utf-8")
            own = board.dataset.format == fmt
            read.append(check_predictions(read_predictions(text, fmt, str(path), own_ids=own), facts))
        check_complete(read, facts)
    except (PredictionFileError, OSError, UnicodeDecodeError) as exc:
        raise EntryError(str(exc)) from None
    detail = ", ".join(f"{Path(p).name} ({fmt})" for p, fmt in files)
    return _store(
        board,
        name,
        paper,
        LeaderboardEntry.Source.PREDICTIONS,
        detail,
        _prediction_ranks(read, targets, names, protocol),
    )


def _allowed_formats(board: Leaderboard) -> tuple[str, ...]:
    """A benchmark takes its own submission format; a dataset without one (the demo) any."""
    fmt = board.dataset.format
    return (fmt,) if fmt in ("cirr", "circo", "fashioniq") else ("cirr", "circo", "fashioniq")


# ----------------------------------------------------------------------------- audit retrievers


def _best(ranks: Sequence[int | None]) -> int | None:
    return min((r for r in ranks if r is not None), default=None)


def _top_places(top: Sequence[int], reference: int | None, removed: bool, wanted: Sequence[int]) -> list[int | None]:
    """Rank of each wanted image in an audit's stored multimodal top list (the reference, which
    the list may hold, skipped when the audit removed it)."""
    ranked = [i for i in top if not (removed and i == reference)]
    place = {image: n for n, image in enumerate(ranked, 1)}
    return [place.get(w) for w in wanted]


def audit_entry_ranks(run: AuditRun, retriever: str, board: Leaderboard) -> EntryRanks:
    """The ranks of one audit retriever on the board's split (:func:`audit.protocol.run_query_ranks`)."""
    if retriever not in run.retrievers:
        raise EntryError(f"audit {run.pk} has no retriever {retriever!r} (its pool: {', '.join(run.retrievers)})")
    protocol, targets = protocol_of(board), split_targets(board)
    per_row = run_query_ranks(run, protocol)
    mm, text, image = (per_row.get((retriever, m), {}) for m in ("multimodal", "text_only", "image_only"))
    wanted = {q.pk for q in targets.queries}
    tops = dict(
        AuditRank.objects.filter(run=run, retriever=retriever, query_id__in=wanted).values_list("query_id", "top_mm")
    )
    refs = dict(Turn.objects.filter(query_id__in=wanted, index=1).values_list("query_id", "reference_image_id"))
    out = EntryRanks({}, {}, {}, {}, run.exclude_reference)
    for q in targets.queries:
        if q.pk not in mm:
            continue
        n, alts = len(targets.labelled.get(q.pk, [])), targets.alternatives.get(q.pk, [])
        ranks = mm[q.pk]
        labelled = QueryRanks(
            list(ranks.positives)[:n] if alts else ranks.positives,
            list(ranks.ahead)[:n] if alts and ranks.ahead else ranks.ahead,
            ranks.primary,
            ranks.subset,
            ranks.category,
            ranks.every_positive,
            ranks.subset_known,
        )
        out.queries[q.pk] = labelled
        counted = len(ranks.positives) == n + len(alts)
        out.alternatives[q.pk] = (
            list(ranks.positives)[n:]
            if counted
            else _top_places(tops.get(q.pk) or [], refs.get(q.pk), run.exclude_reference, alts)
        )
        out.text[q.pk] = _best(text[q.pk].positives[:n]) if q.pk in text else None
        out.image[q.pk] = _best(image[q.pk].positives[:n]) if q.pk in image else None
    if not out.queries:
        raise EntryError(f"audit {run.pk} ranked no query of split {board.split!r}")
    return _misses(out, targets)


def _misses(out: EntryRanks, targets: SplitTargets) -> EntryRanks:
    """A query of the split the method did not rank counts as a miss (in its own category)."""
    for q in targets.queries:
        if q.pk not in out.queries:
            out.queries[q.pk] = QueryRanks([None], category=q.category)
            if out.text is not None and out.image is not None:
                out.text[q.pk] = out.image[q.pk] = None
    return out


def enter_audit(board: Leaderboard, run: AuditRun, retriever: str, name: str = "", paper: str = "") -> LeaderboardEntry:
    """Enter one retriever of an audit of the board's dataset."""
    if run.dataset_id != board.dataset_id:
        raise EntryError(f"audit {run.pk} is of another dataset than leaderboard {board.name!r}")
    if run.status != AuditRun.Status.DONE:
        raise EntryError(f"audit {run.pk} has not finished")
    ranks = audit_entry_ranks(run, retriever, board)
    return _store(board, name or retriever, paper, LeaderboardEntry.Source.AUDIT, f"audit {run.pk}: {retriever}", ranks)


# ----------------------------------------------------------------------------- rank files


def _rank_file_ranks(board: Leaderboard, path: str | Path) -> EntryRanks:
    try:
        f = read_rank_file(path)
    except RankFileError as exc:
        raise EntryError(str(exc)) from None
    protocol, targets = protocol_of(board), split_targets(board)
    by_ordinal: dict[int, Query] = {}
    for q in targets.queries:
        if q.ordinal in by_ordinal:
            raise EntryError(
                f"query ordinals repeat in split {board.split!r} (several source files): a rank "
                f"file's query_idx cannot be matched; make a leaderboard per category"
            )
        by_ordinal.setdefault(q.ordinal, q)
    mapper = GalleryMapper(board.dataset)
    out = EntryRanks({}, {}, {}, {}, True)
    for n, s in enumerate(f.samples):
        q = by_ordinal.get(s.query_idx)
        if q is None:
            raise EntryError(
                f"{path}, sample {n}, query_idx {s.query_idx}: no query of split {board.split!r} has that ordinal"
            )
        every = bool(s.mm_all)
        out.queries[q.pk] = QueryRanks(
            list(s.mm_all) if every else [s.mm], (), _primary(protocol, targets, q.pk), None, q.category, every, False
        )
        out.text[q.pk], out.image[q.pk] = s.text, s.image
        if s.top_mm:
            top = [mapper(f.gallery_paths[i]) for i in s.top_mm]
            place = {image: r for r, image in enumerate(top, 1) if image is not None}
            out.alternatives[q.pk] = [place.get(a) for a in targets.alternatives.get(q.pk, [])]
        elif targets.alternatives.get(q.pk):
            out.alternatives_known = False  # no top list: the alternatives' places are not known
    return _misses(out, targets)


def enter_rank_file(board: Leaderboard, path: str | Path, name: str = "", paper: str = "") -> LeaderboardEntry:
    """Enter the retriever of a CIRCUS per-retriever rank file."""
    ranks = _rank_file_ranks(board, path)
    return _store(board, name or Path(path).stem, paper, LeaderboardEntry.Source.RANK_FILE, Path(path).name, ranks)


def entry_ranks(entry: LeaderboardEntry) -> EntryRanks:
    return load_ranks(entry.ranks)


def keys_of(entries: Sequence[LeaderboardEntry]) -> list[Hashable]:
    return [e.name for e in entries]
