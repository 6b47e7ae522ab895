"""Ranking of query embeddings against a gallery (torch; no Django).

Scores are dot products ``query . gallery_item`` (cosine when the caller L2-normalises
both sides). Work happens on the device of the queries, in blocks of queries times
blocks of gallery items (a CPU gallery, for example a ``numpy.memmap`` of the embedding
cache, is moved to that device one block at a time), so memory stays bounded whatever
the gallery size: the gallery is never sorted and the score matrix is never held whole.

* **Rank rule (pessimistic ties).** The rank of a positive ``p`` with score ``s`` is
  ``1 + #{other gallery items (not excluded) with a score >= s}``: a positive tied with
  other items is placed after all of them. The count is accumulated over the gallery
  blocks in one pass. The rank of a query is that of its best positive (the minimum
  over its positives); :attr:`RankResult.per_positive_ranks` holds every positive's.
* **Scores of the positives** (and of the group members and references) are taken, once
  per query block and before the counting pass, from the very matrix products the pass
  uses: the gallery chunks that hold them (at most :data:`KEEP_CHUNKS` of them) are scored
  first, kept, and folded into the counts when the pass reaches them, so nothing is scored
  twice and a positive's score is the pass's own, bit for bit (exact ties, for example
  duplicate images, stay ties and are pessimistic). When they lie in more chunks than
  that (a large gallery), their rows are stacked into blocks of a chunk's width and
  scored by the same product instead, a small cost next to the pass there.
* **Exclusion.** An optional gallery index per query (typically the reference image) is
  removed from that query's gallery for ranking: it never counts in ranks, and if it is
  also listed as a positive it is ignored as a positive (rank ``None``). It is *not*
  removed from the top-K list (the candidate panel filters what it must not show).
* **No positive** (empty list, or its only positives excluded) gives rank ``None``.
* **Group ranks.** With ``groups[q]`` (gallery indices, e.g. CIRR's ``img_set``
  members), :attr:`RankResult.group_rank` is the best positive's rank within that group:
  ``1 + #{members other than that positive and the excluded item scoring >= it}``.
* **Reference ahead.** With ``references[q]`` (a gallery index, typically the reference
  image, whether or not it is excluded), :attr:`RankResult.reference_ahead` says for each
  positive whether that item scores ``>=`` it (it is not the positive itself): the rank a
  protocol that keeps the reference gives is the excluded rank plus this (and the one
  that removes it, the kept rank minus this), by the same pessimistic rule.
* **Top-K** indices come from a top-k per gallery block (:func:`top_k_rows`), merged across blocks
  (a running top-K). Among items with exactly equal scores their order is unspecified.
  When fewer than ``top_k`` items exist the row is padded with index ``-1``, score ``-inf``.
* **Precision.** float16/bfloat16 inputs are upcast to float32 before the products;
  float64 stays float64. NaN scores give undefined results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

NEG_INF = float("-inf")


@dataclass
class RankResult:
    """Output of :func:`rank_queries` (and of the tests' reference ``naive_rank``).

    ``best_rank[q]``: 1-based rank of the best positive of query ``q`` or ``None``.
    ``topk``: LongTensor ``[Q, top_k]`` of gallery indices (on the CPU), best first,
    ``-1`` padding. ``topk_scores``: the matching scores (float, ``-inf`` padding).
    ``per_positive_ranks[q][i]``: rank of ``positives[q][i]`` (``None`` when it is the
    excluded item). ``group_rank[q]``: rank within ``groups[q]`` (``None`` without groups
    or without a positive). ``extra_ranks[q][i]``: rank of ``extra[q][i]`` (targets
    ranked by the same rule that never count as positives, e.g. CIRR's soft targets).
    ``reference_ahead[q][i]``: whether ``references[q]`` scores >= ``positives[q][i]``.
    """

    best_rank: list[int | None]
    topk: torch.Tensor
    topk_scores: torch.Tensor
    per_positive_ranks: list[list[int | None]] | None = None
    group_rank: list[int | None] | None = None
    extra_ranks: list[list[int | None]] | None = None
    reference_ahead: list[list[bool]] | None = None


def _score_dtype(queries: torch.Tensor, gallery: torch.Tensor) -> torch.dtype:
    """float64 if either side is float64, else float32 (half precisions are upcast)."""
    if torch.float64 in (queries.dtype, gallery.dtype):
        return torch.float64
    return torch.float32


def _flat(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(every row's length, the rows' indices concatenated) as int64 arrays: one pass in C,
    not a Python step per index."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    flat = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
    return lengths, flat


def _check_indices(rows: Sequence[Sequence[int]] | None, n_q: int, n_g: int, name: str) -> None:
    if rows is None:
        return
    if len(rows) != n_q:
        raise ValueError(f"{name} has {len(rows)} entries for {n_q} queries")
    lengths, flat = _flat(rows)
    bad = np.flatnonzero((flat < 0) | (flat >= n_g))
    if bad.size:
        q = int(np.searchsorted(np.cumsum(lengths), bad[0], side="right"))
        raise ValueError(f"query {q}: {name} index {int(flat[bad[0]])} outside the gallery [0, {n_g})")


def _validate(
    queries: torch.Tensor,
    gallery: torch.Tensor,
    positives: Sequence[Sequence[int]],
    exclude: Sequence[int | None] | None,
    top_k: int,
) -> tuple[int, int]:
    if queries.dim() != 2 or gallery.dim() != 2:
        raise ValueError("queries and gallery must be 2-D tensors [N, D]")
    if queries.shape[1] != gallery.shape[1]:
        raise ValueError(f"embedding sizes differ: queries {queries.shape[1]}, gallery {gallery.shape[1]}")
    if not (queries.is_floating_point() and gallery.is_floating_point()):
        raise ValueError("embeddings must be floating point")
    n_q, n_g = queries.shape[0], gallery.shape[0]
    _check_indices(positives, n_q, n_g, "positives")
    if exclude is not None:
        _check_indices([[] if e is None else [e] for e in exclude], n_q, n_g, "exclude")
    if top_k < 0:
        raise ValueError("top_k must be >= 0")
    return n_q, n_g


def _padded(rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """``[n, max len]`` LongTensor of the rows, padded with -1."""
    lengths, flat = _flat(rows)
    width = max(int(lengths.max(initial=0)), 1)
    out = np.full((len(rows), width), -1, dtype=np.int64)
    out[np.arange(width)[None, :] < lengths[:, None]] = flat  # row-major: the rows' order
    return torch.from_numpy(out)


def _scores_of(qb: torch.Tensor, gallery: torch.Tensor, idx: torch.Tensor, width: int) -> torch.Tensor:
    """``score[i, j] = qb[i] . gallery[idx[i, j]]`` (padding -1 gives -inf).

    The needed gallery rows are stacked into blocks of exactly ``width`` rows (the
    width of a gallery chunk) and scored by the same matrix product as the gallery
    chunks, so a positive's score equals the one the pass over the gallery sees, bit
    for bit: exact ties (duplicate images) stay exact ties.
    """
    uniq, inv = torch.unique(idx.clamp_min(0), return_inverse=True)
    out = torch.full(idx.shape, NEG_INF, dtype=qb.dtype, device=qb.device)
    uniq_cpu = uniq.cpu()
    for s in range(0, uniq.numel(), width):
        rows = uniq_cpu[s : s + width]
        block = torch.zeros((width, qb.shape[1]), dtype=qb.dtype, device=qb.device)
        block[: rows.numel()] = gallery[rows].to(device=qb.device, dtype=qb.dtype)
        scores = qb @ block.T
        inside = (inv >= s) & (inv < s + rows.numel())
        out = torch.where(inside, scores.gather(1, (inv - s).clamp(0, width - 1)), out)
    return torch.where(idx >= 0, out, torch.full_like(out, NEG_INF))


#: Most gallery chunks whose scores a query block keeps from before the counting pass
#: until the pass reaches them (see the module notes): peak memory grows by this many
#: ``query_chunk_size x chunk_size`` score blocks.
KEEP_CHUNKS = 4


def _chunk_product(qb: torch.Tensor, gallery: torch.Tensor, start: int, chunk_size: int) -> torch.Tensor:
    """Scores of the query block against gallery items ``start..start+chunk_size``: the one
    product every score of the ranking comes from."""
    part = gallery[start : start + chunk_size].to(device=qb.device, dtype=qb.dtype)
    return qb @ part.T


def _kept_products(
    qb: torch.Tensor, gallery: torch.Tensor, needed: Sequence[torch.Tensor], chunk_size: int
) -> dict[int, torch.Tensor] | None:
    """Start -> product of the gallery chunks that hold the ``needed`` indices (``-1``:
    none), or ``None`` when they lie in more than :data:`KEEP_CHUNKS` chunks."""
    flat = torch.cat([t.reshape(-1) for t in needed]).cpu()
    starts = torch.unique(flat[flat >= 0] // chunk_size).tolist()
    if len(starts) > KEEP_CHUNKS:
        return None
    return {int(c) * chunk_size: _chunk_product(qb, gallery, int(c) * chunk_size, chunk_size) for c in starts}


def _gathered(kept: dict[int, torch.Tensor], idx: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``score[i, j]`` of gallery item ``idx[i, j]`` read from the kept products (``-1``: -inf)."""
    out = torch.full(idx.shape, NEG_INF, dtype=like.dtype, device=like.device)
    for start, scores in kept.items():
        gc = scores.shape[1]
        inside = (idx >= start) & (idx < start + gc)
        out = torch.where(inside, scores.gather(1, (idx - start).clamp(0, gc - 1)), out)
    return out


def top_k_rows(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``scores.topk(k, dim=1)``: the ``k`` best scores of each row, best first, and their
    columns. On the CPU numpy's partial sort (``argpartition``, then a sort of the ``k`` kept)
    does it in about half of ``torch.topk``'s time for a panel's ``k`` (tens) over a gallery
    block; among exactly equal scores the order is unspecified either way (module notes)."""
    if (
        scores.device.type != "cpu"
        or scores.dtype not in (torch.float32, torch.float64)
        or k >= scores.shape[1]
        or k < 1
    ):
        return scores.topk(k, dim=1)
    values = scores.numpy()
    kept = np.argpartition(-values, k - 1, axis=1)[:, :k]
    kept_values = np.take_along_axis(values, kept, axis=1)
    order = np.argsort(-kept_values, axis=1, kind="stable")
    return (
        torch.from_numpy(np.take_along_axis(kept_values, order, axis=1)),
        torch.from_numpy(np.take_along_axis(kept, order, axis=1)),
    )


class _Block:
    """One block of queries: positives, thresholds, counts and the running top-K."""

    def __init__(self, qb, gallery, positives, extra, excl, top_k, chunk_size, groups=None, refs=None):
        device = qb.device
        self.qb, self.top_k, self.chunk_size = qb, top_k, chunk_size
        self.n_pos = [len(p) for p in positives]
        rows = [[*p, *e] for p, e in zip(positives, extra)]
        self.pos = _padded(rows).to(device)
        self.excl = torch.as_tensor(excl, dtype=torch.long).to(device)
        self.valid = (self.pos >= 0) & (self.pos != self.excl[:, None])
        cols = torch.arange(self.pos.shape[1], device=device)[None, :]
        self.is_pos = self.valid & (cols < torch.as_tensor(self.n_pos, device=device)[:, None])
        self.members = _padded(groups).to(device) if groups is not None else None
        self.ref = None if refs is None else torch.as_tensor(refs, dtype=torch.long).to(device)[:, None]
        needed = [t for t in (self.pos, self.members, self.ref) if t is not None]
        self.kept = _kept_products(qb, gallery, needed, chunk_size)
        width = min(chunk_size, gallery.shape[0]) or 1

        def score(idx: torch.Tensor | None) -> torch.Tensor | None:
            if idx is None:
                return None
            return _gathered(self.kept, idx, qb) if self.kept is not None else _scores_of(qb, gallery, idx, width)

        scores = score(self.pos)
        self.member_scores, self.ref_scores = score(self.members), score(self.ref)
        # invalid slots get +inf: nothing scores >= +inf, so their count stays 0
        self.thr = torch.where(self.valid, scores, torch.full_like(scores, float("inf")))
        self.counts = torch.zeros(self.pos.shape, dtype=torch.long, device=device)
        self.run_val = torch.empty((qb.shape[0], 0), dtype=qb.dtype, device=device)
        self.run_idx = torch.empty((qb.shape[0], 0), dtype=torch.long, device=device)

    def chunk_scores(self, gallery: torch.Tensor, start: int) -> torch.Tensor:
        """The product of gallery chunk ``start``: the kept one if any (handed over once)."""
        kept = self.kept.pop(start, None) if self.kept else None
        return kept if kept is not None else _chunk_product(self.qb, gallery, start, self.chunk_size)

    def add_chunk(self, scores: torch.Tensor, start: int) -> None:
        """Fold the scores of gallery items ``start..start+gc`` into the counts and top-K."""
        gc = scores.shape[1]
        if self.top_k:
            cv, ci = top_k_rows(scores, min(self.top_k, gc))
            self.run_val = torch.cat([self.run_val, cv], dim=1)
            self.run_idx = torch.cat([self.run_idx, ci + start], dim=1)
            if self.run_val.shape[1] > self.top_k:
                self.run_val, sel = top_k_rows(self.run_val, self.top_k)
                self.run_idx = self.run_idx.gather(1, sel)
        rows = ((self.excl >= start) & (self.excl < start + gc)).nonzero(as_tuple=True)[0]
        if rows.numel():  # the block is not used after this: edit in place
            scores[rows, self.excl[rows] - start] = NEG_INF
        for j in range(self.thr.shape[1]):
            self.counts[:, j] += (scores >= self.thr[:, j : j + 1]).sum(dim=1)
        # a positive never counts against itself
        inside = self.valid & (self.pos >= start) & (self.pos < start + gc)
        own = scores.gather(1, (self.pos - start).clamp(0, gc - 1))
        self.counts -= (inside & (own >= self.thr)).long()

    def group_ranks(self) -> list[int | None]:
        """Rank of the best positive within each query's group (see the module notes)."""
        members, scores = self.members, self.member_scores
        masked = torch.where(self.is_pos, self.counts, torch.full_like(self.counts, 2**62))
        best_slot = masked.argmin(dim=1)
        best_idx = self.pos.gather(1, best_slot[:, None])
        best_thr = self.thr.gather(1, best_slot[:, None])
        other = (members >= 0) & (members != best_idx) & (members != self.excl[:, None])
        above = (other & (scores >= best_thr)).sum(dim=1).cpu().tolist()
        has = self.is_pos.any(dim=1).cpu().tolist()
        return [int(a) + 1 if h else None for a, h in zip(above, has)]

    def reference_ahead(self) -> list[list[bool]]:
        """Per positive: whether the query's reference item (``-1``: none) scores >= it."""
        ref, score = self.ref, self.ref_scores
        ahead = self.is_pos & (ref >= 0) & (self.pos != ref) & (score >= self.thr)
        rows = ahead.cpu().tolist()
        return [row[:n] for row, n in zip(rows, self.n_pos)]

    def top(self) -> tuple[torch.Tensor, torch.Tensor]:
        nb, pad = self.qb.shape[0], self.top_k - self.run_val.shape[1]
        val, idx = self.run_val, self.run_idx
        if pad > 0:
            val = torch.cat([val, torch.full((nb, pad), NEG_INF, dtype=val.dtype, device=val.device)], 1)
            idx = torch.cat([idx, torch.full((nb, pad), -1, dtype=torch.long, device=idx.device)], 1)
        idx = torch.where(torch.isneginf(val), torch.full_like(idx, -1), idx)
        return val.cpu(), idx.cpu()

    def ranks(self, n_all: Sequence[int]) -> tuple[list[int | None], list[list[int | None]], list[list[int | None]]]:
        """Best ranks, the positives' ranks and the extra targets' ranks."""
        ranks = torch.where(self.valid, self.counts + 1, torch.zeros_like(self.counts)).cpu().tolist()
        rows = [[r or None for r in row[:n]] for row, n in zip(ranks, n_all)]  # rank 0: not valid
        per = [row[:n] for row, n in zip(rows, self.n_pos)]
        extra = [row[n:] for row, n in zip(rows, self.n_pos)]
        return self.best_ranks(), per, extra

    def best_ranks(self) -> list[int | None]:
        """The best (smallest) valid positive rank of each query, ``None`` when it has none."""
        width = self.counts.shape[1]
        is_positive = self.valid & (
            torch.arange(width, device=self.counts.device)[None, :]
            < torch.as_tensor(self.n_pos, device=self.counts.device)[:, None]
        )
        best = torch.where(is_positive, self.counts, torch.full_like(self.counts, 2**62)).min(dim=1).values + 1
        return [b if has else None for b, has in zip(best.cpu().tolist(), is_positive.any(dim=1).cpu().tolist())]


def _validate_extras(queries, gallery, positives, exclude, top_k, groups, extra, references) -> tuple[int, int]:
    """:func:`_validate`, and the optional per-query index lists."""
    n_q, n_g = _validate(queries, gallery, positives, exclude, top_k)
    _check_indices(groups, n_q, n_g, "groups")
    _check_indices(extra, n_q, n_g, "extra")
    if references is not None:
        _check_indices([[] if r is None else [r] for r in references], n_q, n_g, "references")
    return n_q, n_g


def _block_extras(block: _Block, group_rank: list | None, ahead: list | None) -> None:
    """Append the block's group ranks and reference-ahead flags (when asked for)."""
    if group_rank is not None:
        group_rank.extend(block.group_ranks())
    if ahead is not None:
        ahead.extend(block.reference_ahead())


def rank_queries(
    queries: torch.Tensor,
    gallery: torch.Tensor,
    positives: Sequence[Sequence[int]],
    exclude: Sequence[int | None] | None = None,
    top_k: int = 10,
    chunk_size: int = 4096,
    query_chunk_size: int = 1024,
    return_per_positive: bool = False,
    groups: Sequence[Sequence[int]] | None = None,
    extra: Sequence[Sequence[int]] | None = None,
    references: Sequence[int | None] | None = None,
) -> RankResult:
    """Rank every query against the gallery in one pass over it (see the module notes).

    ``queries [Q, D]`` live on the compute device; ``gallery [G, D]`` on the same device
    or on the CPU (possibly memory-mapped), read ``chunk_size`` rows at a time.
    ``positives[q]`` lists the gallery indices of query ``q``'s positive targets;
    ``exclude[q]`` is a gallery index to remove for query ``q`` (or ``None``);
    ``groups[q]`` optional gallery indices for :attr:`RankResult.group_rank`;
    ``extra[q]`` optional targets ranked for :attr:`RankResult.extra_ranks` only;
    ``references[q]`` optional gallery index for :attr:`RankResult.reference_ahead`.
    Peak memory: ``query_chunk_size x chunk_size`` scores plus ``top_k`` per query.
    """
    n_q, n_g = _validate_extras(queries, gallery, positives, exclude, top_k, groups, extra, references)
    extra = extra if extra is not None else [[] for _ in range(n_q)]
    if chunk_size < 1 or query_chunk_size < 1:
        raise ValueError("chunk sizes must be >= 1")
    device = queries.device
    dtype = _score_dtype(queries, gallery)
    best: list[int | None] = []
    per: list[list[int | None]] = []
    extra_ranks: list[list[int | None]] = []
    group_rank: list[int | None] | None = [] if groups is not None else None
    ahead: list[list[bool]] | None = [] if references is not None else None
    vals: list[torch.Tensor] = []
    idxs: list[torch.Tensor] = []
    for qs in range(0, n_q, query_chunk_size):
        qe = min(qs + query_chunk_size, n_q)
        excl = [-1 if exclude is None or exclude[q] is None else int(exclude[q]) for q in range(qs, qe)]
        refs = None if references is None else [-1 if r is None else int(r) for r in references[qs:qe]]
        block = _Block(
            queries[qs:qe].to(device=device, dtype=dtype),
            gallery,
            positives[qs:qe],
            extra[qs:qe],
            excl,
            int(top_k),
            chunk_size,
            None if groups is None else groups[qs:qe],
            refs,
        )
        for s in range(0, n_g, chunk_size):
            block.add_chunk(block.chunk_scores(gallery, s), s)
        b, p, e = block.ranks([len(x) + len(y) for x, y in zip(positives[qs:qe], extra[qs:qe])])
        best.extend(b)
        per.extend(p)
        extra_ranks.extend(e)
        _block_extras(block, group_rank, ahead)
        val, idx = block.top()
        vals.append(val)
        idxs.append(idx)
    topk = torch.cat(idxs) if idxs else torch.empty((0, int(top_k)), dtype=torch.long)
    topk_scores = torch.cat(vals) if vals else torch.empty((0, int(top_k)), dtype=dtype)
    return RankResult(best, topk, topk_scores, per if return_per_positive else None, group_rank, extra_ranks, ahead)
