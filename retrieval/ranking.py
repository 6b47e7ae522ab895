"""Ranking of query embeddings against a gallery (torch; no Django).

Scores are dot products ``query . gallery_item`` (cosine when the caller L2-normalises
both sides). Work happens on the device of the inputs, in blocks of queries times
blocks of gallery items, so memory stays bounded whatever the gallery size, and the
gallery is never sorted:

* **Rank rule.** The rank of a positive with score ``s`` is
  ``1 + #{gallery items (not excluded) with a score strictly greater than s}``.
  Ties are therefore resolved in the query's favour (optimistic): a positive that ties
  with other items is ranked before all of them. The rank of a query is that of its
  best-scoring positive, i.e. the best rank over its positives.
* **Exclusion.** An optional gallery index per query (typically the reference image) is
  removed from that query's gallery: it never counts in ranks, never appears in the
  top-K list, and if it is also listed as a positive it is ignored as a positive.
* **No positive** (empty list, or its only positives excluded) gives rank ``None``.
* **Top-K** indices come from ``torch.topk`` per gallery block, merged across blocks.
  Among items with exactly equal scores their order (and which of them fill the last
  slots) is unspecified. When fewer than ``top_k`` items are available the row is
  padded with index ``-1`` and score ``-inf``.
* **Precision.** float16/bfloat16 inputs are upcast to float32 before the products;
  float64 stays float64. NaN scores give undefined results.

A gallery block holding a positive is needed twice (first to read the positives'
scores, then to count and select). It is kept between the two passes when the query
block's scores fit in ``max_cache_bytes`` (or the gallery is one block); otherwise it
is recomputed with identical inputs and shapes, which relies on a matrix product being
deterministic for identical inputs on one device.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class RankResult:
    """Output of :func:`rank_queries` / :func:`naive_rank`.

    ``best_rank[q]``: 1-based rank of the best positive of query ``q`` or ``None``.
    ``topk``: LongTensor ``[Q, top_k]`` of gallery indices (on the CPU), best first,
    ``-1`` padding. ``topk_scores``: the matching scores (float, ``-inf`` padding).
    ``per_positive_ranks[q][i]``: rank of ``positives[q][i]`` (``None`` when it is the
    excluded item), only when requested.
    """

    best_rank: list[int | None]
    topk: torch.Tensor
    topk_scores: torch.Tensor
    per_positive_ranks: list[list[int | None]] | None = None


def _score_dtype(queries: torch.Tensor, gallery: torch.Tensor) -> torch.dtype:
    """float64 if either side is float64, else float32 (half precisions are upcast)."""
    if torch.float64 in (queries.dtype, gallery.dtype):
        return torch.float64
    return torch.float32


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
        raise ValueError(
            f"embedding sizes differ: queries {queries.shape[1]}, gallery {gallery.shape[1]}"
        )
    if queries.device != gallery.device:
        raise ValueError("queries and gallery must be on the same device")
    if not (queries.is_floating_point() and gallery.is_floating_point()):
        raise ValueError("embeddings must be floating point")
    n_q, n_g = queries.shape[0], gallery.shape[0]
    if len(positives) != n_q:
        raise ValueError(f"positives has {len(positives)} entries for {n_q} queries")
    for q, pos in enumerate(positives):
        for p in pos:
            if not 0 <= int(p) < n_g:
                raise ValueError(f"query {q}: positive {p} outside the gallery [0, {n_g})")
    if exclude is not None:
        if len(exclude) != n_q:
            raise ValueError(f"exclude has {len(exclude)} entries for {n_q} queries")
        for q, e in enumerate(exclude):
            if e is not None and not 0 <= int(e) < n_g:
                raise ValueError(f"query {q}: excluded index {e} outside the gallery")
    if top_k < 0:
        raise ValueError("top_k must be >= 0")
    return n_q, n_g


def rank_queries(
    queries: torch.Tensor,
    gallery: torch.Tensor,
    positives: Sequence[Sequence[int]],
    exclude: Sequence[int | None] | None = None,
    top_k: int = 10,
    chunk_size: int = 4096,
    query_chunk_size: int = 1024,
    return_per_positive: bool = False,
    max_cache_bytes: int = 256 * 2**20,
) -> RankResult:
    """Rank every query against the gallery without sorting it (see the module notes).

    ``queries [Q, D]`` and ``gallery [G, D]`` share a device; ``positives[q]`` lists the
    gallery indices of query ``q``'s ground truths; ``exclude[q]`` is a gallery index to
    remove for query ``q`` (or ``None``). ``chunk_size`` gallery items and
    ``query_chunk_size`` queries are scored per matrix product. When one query block's
    scores against the whole gallery fit in ``max_cache_bytes``, the blocks read for
    the positives are kept and not recomputed.
    """
    n_q, n_g = _validate(queries, gallery, positives, exclude, top_k)
    if chunk_size < 1 or query_chunk_size < 1:
        raise ValueError("chunk sizes must be >= 1")
    device = queries.device
    dtype = _score_dtype(queries, gallery)
    elem_bytes = torch.finfo(dtype).bits // 8
    k_out = int(top_k)
    n_chunks = (n_g + chunk_size - 1) // chunk_size

    best_rank: list[int | None] = []
    per_positive: list[list[int | None]] | None = [] if return_per_positive else None
    topk_idx_rows: list[torch.Tensor] = []
    topk_val_rows: list[torch.Tensor] = []

    for qs in range(0, n_q, query_chunk_size):
        qe = min(qs + query_chunk_size, n_q)
        nb = qe - qs
        qb = queries[qs:qe].to(dtype)
        block_pos = [list(map(int, positives[q])) for q in range(qs, qe)]
        block_excl = [
            -1 if exclude is None or exclude[q] is None else int(exclude[q])
            for q in range(qs, qe)
        ]
        width = max([len(p) for p in block_pos] + [1])
        pos_idx = torch.full((nb, width), -1, dtype=torch.long)
        for i, pos in enumerate(block_pos):
            if pos:
                pos_idx[i, : len(pos)] = torch.tensor(pos, dtype=torch.long)
        excl = torch.tensor(block_excl, dtype=torch.long)
        pos_valid = (pos_idx >= 0) & (pos_idx != excl[:, None])
        pos_idx = pos_idx.to(device)
        pos_valid = pos_valid.to(device)
        excl = excl.to(device)

        cache: dict[int, torch.Tensor] = {}
        keep_scores = n_chunks == 1 or nb * n_g * elem_bytes <= max_cache_bytes

        def chunk_scores(c: int) -> torch.Tensor:
            if c in cache:
                return cache.pop(c)  # each cached block is read once more, in pass B
            s = c * chunk_size
            return qb @ gallery[s : s + chunk_size].to(dtype).T

        # Pass A: the positives' own scores, read from the block products.
        pos_scores = torch.full((nb, width), float("-inf"), dtype=dtype, device=device)
        chunks_with_pos = torch.unique(pos_idx[pos_valid] // chunk_size).tolist()
        for c in chunks_with_pos:
            s = c * chunk_size
            scores = chunk_scores(c)
            if keep_scores:
                cache[c] = scores
            inside = pos_valid & (pos_idx >= s) & (pos_idx < s + scores.shape[1])
            local = (pos_idx - s).clamp(0, scores.shape[1] - 1)
            pos_scores = torch.where(inside, scores.gather(1, local), pos_scores)

        has_pos = pos_valid.any(dim=1)
        best = pos_scores.max(dim=1).values
        thresholds = pos_scores if return_per_positive else best[:, None]
        counts = torch.zeros(thresholds.shape, dtype=torch.long, device=device)
        run_val = torch.empty((nb, 0), dtype=dtype, device=device)
        run_idx = torch.empty((nb, 0), dtype=torch.long, device=device)

        # Pass B: count strictly better items and keep the running top-K.
        for c in range(n_chunks):
            s = c * chunk_size
            scores = chunk_scores(c)
            gc = scores.shape[1]
            rows = ((excl >= s) & (excl < s + gc)).nonzero(as_tuple=True)[0]
            if rows.numel():  # the block is not used after this pass: edit in place
                scores[rows, excl[rows] - s] = float("-inf")
            for j in range(thresholds.shape[1]):
                counts[:, j] += (scores > thresholds[:, j : j + 1]).sum(dim=1)
            if k_out:
                cv, ci = scores.topk(min(k_out, gc), dim=1)
                run_val = torch.cat([run_val, cv], dim=1)
                run_idx = torch.cat([run_idx, ci + s], dim=1)
                if run_val.shape[1] > k_out:
                    run_val, sel = run_val.topk(k_out, dim=1)
                    run_idx = run_idx.gather(1, sel)

        if run_val.shape[1] < k_out:
            pad = k_out - run_val.shape[1]
            run_val = torch.cat(
                [run_val, torch.full((nb, pad), float("-inf"), dtype=dtype, device=device)], 1
            )
            run_idx = torch.cat(
                [run_idx, torch.full((nb, pad), -1, dtype=torch.long, device=device)], 1
            )
        run_idx = torch.where(torch.isneginf(run_val), torch.full_like(run_idx, -1), run_idx)
        topk_val_rows.append(run_val.cpu())
        topk_idx_rows.append(run_idx.cpu())

        counts_cpu = counts.cpu()
        valid_cpu = pos_valid.cpu()
        has_pos_cpu = has_pos.cpu().tolist()
        if return_per_positive:
            # The best positive has the fewest strictly better items.
            masked = torch.where(valid_cpu, counts_cpu, torch.full_like(counts_cpu, n_g + 1))
            best_counts = masked.min(dim=1).values.tolist()
        else:
            best_counts = counts_cpu[:, 0].tolist()
        for i in range(nb):
            best_rank.append(best_counts[i] + 1 if has_pos_cpu[i] else None)
            if per_positive is not None:
                n_pos = len(block_pos[i])
                per_positive.append(
                    [
                        int(counts_cpu[i, j]) + 1 if bool(valid_cpu[i, j]) else None
                        for j in range(n_pos)
                    ]
                )

    if topk_idx_rows:
        topk = torch.cat(topk_idx_rows, dim=0)
        topk_scores = torch.cat(topk_val_rows, dim=0)
    else:
        topk = torch.empty((0, k_out), dtype=torch.long)
        topk_scores = torch.empty((0, k_out), dtype=dtype)
    return RankResult(best_rank, topk, topk_scores, per_positive)


def naive_rank(
    queries: torch.Tensor,
    gallery: torch.Tensor,
    positives: Sequence[Sequence[int]],
    exclude: Sequence[int | None] | None = None,
    top_k: int = 10,
    return_per_positive: bool = False,
) -> RankResult:
    """Reference implementation: full score matrix and a full sort per query.

    Same conventions as :func:`rank_queries`: among equal scores a positive is placed
    first (optimistic ties); the top-K order breaks ties by the lower gallery index.
    For tests and benchmarks only (memory ``Q x G``, time ``Q G log G``).
    """
    n_q, n_g = _validate(queries, gallery, positives, exclude, top_k)
    dtype = _score_dtype(queries, gallery)
    scores = (queries.to(dtype) @ gallery.to(dtype).T).cpu().numpy()
    index = np.arange(n_g)
    best_rank: list[int | None] = []
    per_positive: list[list[int | None]] | None = [] if return_per_positive else None
    topk = torch.full((n_q, top_k), -1, dtype=torch.long)
    topk_scores = torch.full((n_q, top_k), float("-inf"), dtype=dtype)
    for q in range(n_q):
        ex = None if exclude is None or exclude[q] is None else int(exclude[q])
        keep = index != ex if ex is not None else np.ones(n_g, dtype=bool)
        s, idx = scores[q][keep], index[keep]
        pos_set = {int(p) for p in positives[q]} - ({ex} if ex is not None else set())
        is_pos = np.isin(idx, list(pos_set))
        order = np.lexsort((idx, ~is_pos, -s))  # score desc, positives first, index asc
        hits = np.flatnonzero(is_pos[order])
        best_rank.append(int(hits[0]) + 1 if hits.size else None)
        if per_positive is not None:
            row: list[int | None] = []
            for p in positives[q]:
                if int(p) not in pos_set:
                    row.append(None)
                    continue
                this = idx == int(p)
                order_p = np.lexsort((idx, ~this, -s))
                row.append(int(np.flatnonzero(this[order_p])[0]) + 1)
            per_positive.append(row)
        plain = np.lexsort((idx, -s))[:top_k]
        topk[q, : plain.size] = torch.from_numpy(idx[plain].astype(np.int64))
        topk_scores[q, : plain.size] = torch.from_numpy(s[plain])
    return RankResult(best_rank, topk, topk_scores, per_positive)
