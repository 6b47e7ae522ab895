"""The suspicion score of a query: how likely it is flawed, from what the audit already has (pure: no Django).

Every *part* lies in [0, 1], higher meaning more suspicious; a part that cannot be
computed is ``None`` and is left out. The score is the weighted mean of the parts that
are there (:data:`WEIGHTS`), so it lies in [0, 1] too. Nothing here reads the audit's
label (:mod:`audit.labels`): only ranks, top lists, embeddings' cosines and votes.

With ``N`` the gallery size and, per retriever ``r`` of the audit's pool, ``mm_r``,
``text_r``, ``image_r`` the 1-based rank of the best positive target for the multimodal,
text-only and image-only query (``None``, not retrieved, counts as ``N + 1``):

* ``margin`` (unimodal margin): per retriever ``log(mm_r) / log(max(2, min(text_r,
  image_r)))``, clipped to [0, 1]: 0 when the multimodal query puts the target first, 1
  when it ranks it no better than the better unimodal query does. The part is the
  *smallest* over retrievers (one retriever that needs the composition is evidence
  enough).
* ``retrievers`` (the pool's disagreement with the labelled target): the mean over
  retrievers of ``log(mm_r) / log(N + 1)``: 0 when every retriever ranks the target first,
  1 when none retrieves it.
* ``spread`` (how far the retrievers' multimodal ranks differ from each other):
  ``(max_r log(mm_r) - min_r log(mm_r)) / log(N + 1)``. Shown to staff, weight 0: on the
  demo a retriever that reads captions only fails on sound compositions, so a wide spread
  marks the *sound* items (measured in docs/benchmarks/suspicion.md).
* ``gap`` (how much better another image fits the query than the target does): per
  retriever, the multimodal query's score of the best gallery image that is neither a
  target nor the reference, less the best target's score, in standard deviations of the
  scores over the gallery; the part is ``clip(min_r gap_r / GAP_SCALE, 0, 1)`` (the
  retriever most in favour of the target decides).
* ``breadth``: ``1 - exp(-n / BREADTH_SCALE)``, ``n`` = the pool images that *every*
  retriever ranks above the target in its multimodal top list (the reference and the
  targets left out): other images that fit the query at least as well, by consensus.
* ``consistency`` (text-image): per retriever ``d_r = cos(text, best target) - cos(text,
  reference)`` in its embedding space (does the text point at the target rather than at
  the reference?); the part is ``clip(0.5 - max_r d_r, 0, 1)``.
* ``lead_rank`` and ``lead_gap``: the ``retrievers`` and ``gap`` measures read from the
  *lead* retriever alone (``Signals.lead``: the retriever of the audit's pool with the best
  mean reciprocal rank of the labelled targets over the whole audit, :func:`lead_index`):
  ``log(mm_lead) / log(N + 1)`` and ``clip(gap_lead / GAP_SCALE, 0, 1)``. A pool that
  holds a weak retriever (on the demo, one that never learnt compositions) blurs every
  min/mean over retrievers; the retriever the audit itself finds best does not.
* ``votes`` (annotators' disagreement), once at least two counted judgements say
  validated or not: ``2 * min(p, 1 - p)`` with ``p`` the share saying validated (0:
  unanimous, 1: an even split).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from retrieval.demo import precision_recall

Rank = int | None
#: The parts, in the order pages show them.
PARTS: tuple[str, ...] = (
    "lead_rank",
    "lead_gap",
    "margin",
    "retrievers",
    "spread",
    "gap",
    "breadth",
    "consistency",
    "votes",
)
#: Each part's weight in the score: the lead retriever's two parts and the votes; the others
#: are shown, not counted (chosen by the mean over demo seeds: docs/benchmarks/suspicion.md).
WEIGHTS: dict[str, float] = {
    "lead_rank": 1.0,
    "lead_gap": 1.0,
    "margin": 0.0,
    "retrievers": 0.0,
    "spread": 0.0,
    "gap": 0.0,
    "breadth": 0.0,
    "consistency": 0.0,
    "votes": 1.0,
}
#: Standard deviations of the rival gap at which ``gap`` reaches 1.
GAP_SCALE = 2.0
#: Consensus rivals at which ``breadth`` reaches 1 - 1/e.
BREADTH_SCALE = 10.0
#: The share of the queue whose precision the goal is stated for (the top 20 %).
TOP_SHARE = 0.2


@dataclass(frozen=True)
class Signals:
    """What the score reads of one query.

    ``ranks``: per retriever ``(mm, text, image)``; ``n_gallery``: N; ``rivals``: the
    consensus rivals (:func:`consensus_rivals`), ``None`` when no top list was stored;
    ``consistency``: per retriever ``cos(text, best target) - cos(text, reference)`` (empty
    when no embedding was available); ``gaps``: per retriever, the rival gap in standard
    deviations (:func:`gap_part`); ``votes``: counted judgements, validated or not.
    ``lead``: the lead retriever's index into ``ranks`` (:func:`lead_index`), ``None`` when
    unknown; ``lead_gap``: its rival gap (``None`` when not computed).
    """

    ranks: tuple[tuple[Rank, Rank, Rank], ...]
    n_gallery: int
    rivals: int | None = None
    consistency: tuple[float, ...] = ()
    gaps: tuple[float, ...] = ()
    votes: tuple[bool, ...] = field(default=())
    lead: int | None = None
    lead_gap: float | None = None


def _clip(x: float) -> float:
    return min(1.0, max(0.0, x))


def _rank(r: Rank, n_gallery: int) -> int:
    if r is None:
        return n_gallery + 1
    if isinstance(r, bool) or int(r) < 1:
        raise ValueError(f"a rank is an int >= 1 or None, got {r!r}")
    return int(r)


def margin_part(ranks: Sequence[tuple[Rank, Rank, Rank]], n_gallery: int) -> float | None:
    """``min_r clip(log(mm_r) / log(max(2, min(text_r, image_r))))``; None without a retriever."""
    if not ranks:
        return None
    out = []
    for mm, text, image in ranks:
        m = _rank(mm, n_gallery)
        uni = min(_rank(text, n_gallery), _rank(image, n_gallery))
        out.append(_clip(math.log(m) / math.log(max(2, uni))))
    return min(out)


def retrievers_part(ranks: Sequence[tuple[Rank, Rank, Rank]], n_gallery: int) -> float | None:
    """Mean over retrievers of ``log(mm_r) / log(N + 1)``; None without a retriever."""
    if not ranks:
        return None
    scale = math.log(n_gallery + 1) if n_gallery >= 1 else 1.0
    return _clip(sum(math.log(_rank(r[0], n_gallery)) for r in ranks) / len(ranks) / scale)


def spread_part(ranks: Sequence[tuple[Rank, Rank, Rank]], n_gallery: int) -> float | None:
    """``(max - min) of log(mm_r) / log(N + 1)``; None with fewer than two retrievers."""
    if len(ranks) < 2:
        return None
    logs = [math.log(_rank(r[0], n_gallery)) for r in ranks]
    scale = math.log(n_gallery + 1) if n_gallery >= 1 else 1.0
    return _clip((max(logs) - min(logs)) / scale)


def gap_part(gaps: Sequence[float], scale: float = GAP_SCALE) -> float | None:
    """``clip(min(gaps) / scale)``; None without any."""
    if not gaps:
        return None
    return _clip(min(gaps) / scale)


def breadth_part(rivals: int | None, scale: float = BREADTH_SCALE) -> float | None:
    """``1 - exp(-rivals / scale)``; None when unknown."""
    if rivals is None:
        return None
    if rivals < 0:
        raise ValueError("rivals must be >= 0")
    return 1.0 - math.exp(-rivals / scale)


def consistency_part(deltas: Sequence[float]) -> float | None:
    """``clip(0.5 - max(deltas))``; None without any."""
    if not deltas:
        return None
    return _clip(0.5 - max(deltas))


def votes_part(votes: Sequence[bool]) -> float | None:
    """``2 min(p, 1 - p)`` over at least two votes (p: share validated); None below two."""
    if len(votes) < 2:
        return None
    p = sum(bool(v) for v in votes) / len(votes)
    return 2.0 * min(p, 1.0 - p)


def lead_index(mm_ranks: Sequence[Sequence[Rank]]) -> int | None:
    """The retriever with the best mean reciprocal rank (a target not retrieved: 0) over an
    audit's queries; ``mm_ranks``: per query, each retriever's multimodal rank (same order).
    Ties: the first. None without any query or retriever."""
    rows = [r for r in mm_ranks if r]
    if not rows:
        return None
    k = min(len(r) for r in rows)
    mrr = [sum(1.0 / _rank(r[j], 0) if r[j] is not None else 0.0 for r in rows) for j in range(k)]
    return max(range(k), key=lambda j: (mrr[j], -j)) if k else None


def lead_rank_part(s: Signals) -> float | None:
    """``log(mm_lead) / log(N + 1)``; None without a lead retriever."""
    if s.lead is None or not 0 <= s.lead < len(s.ranks):
        return None
    return retrievers_part([s.ranks[s.lead]], s.n_gallery)


def item_parts(s: Signals) -> dict[str, float | None]:
    """Every part of one query (see the module notes), in :data:`PARTS` order."""
    return {
        "lead_rank": lead_rank_part(s),
        "lead_gap": gap_part([] if s.lead_gap is None else [s.lead_gap]),
        "margin": margin_part(s.ranks, s.n_gallery),
        "retrievers": retrievers_part(s.ranks, s.n_gallery),
        "spread": spread_part(s.ranks, s.n_gallery),
        "gap": gap_part(s.gaps),
        "breadth": breadth_part(s.rivals),
        "consistency": consistency_part(s.consistency),
        "votes": votes_part(s.votes),
    }


def combine(parts: Mapping[str, float | None], weights: Mapping[str, float] = WEIGHTS) -> float | None:
    """The weighted mean of the parts present (weight > 0); None when none is."""
    num = den = 0.0
    for name, value in parts.items():
        w = float(weights.get(name, 0.0))
        if value is None or w <= 0:
            continue
        num += w * value
        den += w
    return num / den if den else None


def score(s: Signals, weights: Mapping[str, float] = WEIGHTS) -> tuple[float | None, dict[str, float | None]]:
    """(score, parts) of one query."""
    parts = item_parts(s)
    return combine(parts, weights), parts


def consensus_rivals(
    top_lists: Sequence[Sequence[Hashable]], ranks: Sequence[Rank], exclude: Iterable[Hashable]
) -> int | None:
    """Images every retriever ranks above the target: the intersection over retrievers of
    ``top_list[: mm_r - 1]`` (a target not retrieved: the whole list), less ``exclude``
    (the targets and the reference). Retrievers without a stored list take no part; None
    when none has one."""
    pairs = [(list(top), r) for top, r in zip(top_lists, ranks) if top]
    if not pairs:
        return None
    banned = set(exclude)
    above = [set(top[: (r - 1 if r is not None else len(top))]) - banned for top, r in pairs]
    return len(set.intersection(*above))


def queue_order(scores: Mapping[Hashable, float | None]) -> list[Hashable]:
    """Queries by score, highest first (None last; ties by the query key, as a string)."""
    return sorted(scores, key=lambda q: (scores[q] is None, -(scores[q] or 0.0), str(q)))


def top_count(n: int, share: float = TOP_SHARE) -> int:
    """How many items the top ``share`` of a queue of ``n`` holds: ``ceil(share * n)`` (at least 1 when n > 0)."""
    if not 0 < share <= 1:
        raise ValueError("share must lie in (0, 1]")
    return min(n, max(1 if n else 0, math.ceil(share * n - 1e-9)))


def queue_precision(
    scores: Mapping[Hashable, float | None], defects: Iterable[Hashable], share: float = TOP_SHARE
) -> dict[str, Any]:
    """Precision and recall (:func:`retrieval.demo.precision_recall`) of the top ``share`` of
    the suspicion queue against the known ``defects`` (only scored queries take part), with
    ``share`` and ``queue`` (the number of queries in the queue)."""
    order = queue_order(scores)
    top = set(order[: top_count(len(order), share)])
    planted = set(defects) & set(scores)
    return {**precision_recall(planted, top), "share": share, "queue": len(order)}
