"""Multi-turn session maths: history aggregation, metrics and filters (pure; no Django).

A session with ``L`` turns is scored turn by turn on its cumulative history: the query
embedding of turn ``l`` is aggregated with turns ``1..l`` (:func:`aggregate_history`),
ranked against the gallery, and gives ``r_l``, the 1-based rank of the best ground
truth (``None`` = not retrieved). The metrics and filters below work on those ranks.

Metrics with cut-off ``K`` (default 10), ``L_max`` = longest session:

* ``Hits@K(l)``, ``l = 1..L_max``: share of sessions whose target was within ``K`` at
  some turn ``<= l`` (cumulative, sticky). A session shorter than ``l`` carries its
  state at its own last turn forward.
* ``Final Recall@K``: share of sessions within ``K`` at their own last turn.
* ``AUC``: trapezoid rule over the Hits curve with unit spacing, normalised by the
  span: ``sum_{l=1}^{L_max-1} (Hits(l) + Hits(l+1)) / 2 / (L_max - 1)``; when
  ``L_max == 1`` the AUC is defined as ``Hits(1)``. (CIRCLED's own script instead
  averages the curve without the trapezoid; this module follows the CIRVal spec.)

Filters, applied in order success -> multi-turn -> epsilon-consistency ->
tau-diversity (see :func:`apply_filters`):

* success: within ``K`` at some turn;
* multi-turn: not within ``K`` at turn 1;
* epsilon-consistency: every consecutive pair satisfies ``r_{l+1} <= r_l + epsilon``
  (a worsening of exactly ``epsilon`` passes). ``None`` is treated as rank +infinity:
  going from a rank to ``None`` violates, ``None -> None`` and ``None -> rank`` do not;
* tau-diversity: every pair of the session's texts has cosine ``< tau`` (a pair at
  ``>= tau`` removes the session). The caller supplies the text embeddings.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from retrieval.metrics import Rank, check_k, check_rank


def _torch_of(x: Any) -> Any:
    """torch, when ``x`` is a torch tensor; else None. torch is never imported here: a caller
    holding a tensor has imported it already, and the web tier (which plans audits with this
    module's defaults) must not load it."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(x, torch.Tensor) else None


ArrayT = TypeVar("ArrayT")

STRATEGIES: tuple[str, str, str] = ("latest", "average", "weighted")
FILTER_ORDER: tuple[str, str, str, str] = (
    "success",
    "multi_turn",
    "epsilon_consistency",
    "tau_diversity",
)
DEFAULT_ALPHA = 0.8
DEFAULT_EPSILON = 30
DEFAULT_TAU = 0.8


# --------------------------------------------------------------------------- aggregation


def history_weights(n_turns: int, strategy: str, alpha: float = DEFAULT_ALPHA) -> np.ndarray:
    """Lower-triangular ``[L, L]`` weight matrix; row ``l`` weighs turns ``1..l``.

    latest: identity; average: ``1/l`` on turns ``1..l``; weighted: ``alpha^(l - l')``
    on turn ``l' <= l``. Each row sums to 1 (the later L2 normalisation makes the row
    scale irrelevant, but normalised weights keep the intermediate sums well scaled).
    """
    if n_turns < 0:
        raise ValueError("n_turns must be >= 0")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}")
    if not math.isfinite(alpha) or alpha < 0:
        raise ValueError("alpha must be finite and >= 0")
    w = np.zeros((n_turns, n_turns), dtype=np.float64)
    for l in range(n_turns):
        if strategy == "latest":
            w[l, l] = 1.0
        elif strategy == "average":
            w[l, : l + 1] = 1.0 / (l + 1)
        else:
            row = np.array([alpha ** (l - j) for j in range(l + 1)], dtype=np.float64)
            w[l, : l + 1] = row / row.sum()
    return w


def aggregate_history(
    embeddings: ArrayT, strategy: str = "latest", alpha: float = DEFAULT_ALPHA, eps: float = 1e-12
) -> ArrayT:
    """History-aggregated, L2-normalised embeddings of one session.

    ``embeddings`` is a numpy array or torch tensor ``[L, D]`` of the turns' query
    embeddings ``q_1..q_L`` (used as given, not re-normalised); row ``l`` of the result
    is ``normalise(sum_{l' <= l} w[l, l'] q_l')`` with :func:`history_weights`. Returns
    the same kind of array, same dtype and device. A zero aggregate stays zero
    (its norm is clamped at ``eps``).
    """
    torch = _torch_of(embeddings)
    if torch is not None:
        if embeddings.dim() != 2:
            raise ValueError("embeddings must be [L, D]")
        work = torch.float64 if embeddings.dtype == torch.float64 else torch.float32
        w = torch.from_numpy(history_weights(embeddings.shape[0], strategy, alpha))
        agg = w.to(device=embeddings.device, dtype=work) @ embeddings.to(work)
        norms = agg.norm(dim=1, keepdim=True).clamp_min(eps)
        return (agg / norms).to(embeddings.dtype)  # type: ignore[return-value]
    arr = np.asarray(embeddings)
    if arr.ndim != 2:
        raise ValueError("embeddings must be [L, D]")
    agg = history_weights(arr.shape[0], strategy, alpha) @ arr.astype(np.float64)
    norms = np.maximum(np.linalg.norm(agg, axis=1, keepdims=True), eps)
    out = agg / norms
    dtype = arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.float64
    return out.astype(dtype)  # type: ignore[return-value]


def aggregate_latest(embeddings: ArrayT) -> ArrayT:
    """``normalise(q_l)`` for every turn ``l``."""
    return aggregate_history(embeddings, "latest")


def aggregate_average(embeddings: ArrayT) -> ArrayT:
    """``normalise(mean(q_1..q_l))`` for every turn ``l``."""
    return aggregate_history(embeddings, "average")


def aggregate_weighted(embeddings: ArrayT, alpha: float = DEFAULT_ALPHA) -> ArrayT:
    """``normalise(sum_{l'<=l} alpha^(l-l') q_l')`` for every turn ``l``."""
    return aggregate_history(embeddings, "weighted", alpha)


# --------------------------------------------------------------------------- metrics


def _check_sessions(sessions: Mapping[Hashable, Sequence[Rank]]) -> dict[Hashable, list[Rank]]:
    checked: dict[Hashable, list[Rank]] = {}
    for sid, ranks in sessions.items():
        turns = [check_rank(r) for r in ranks]
        if not turns:
            raise ValueError(f"session {sid!r} has no turns")
        checked[sid] = turns
    return checked


def _hit(rank: Rank, k: int) -> bool:
    return rank is not None and rank <= k


def _check_epsilon(epsilon: float) -> float:
    if isinstance(epsilon, bool) or not math.isfinite(epsilon) or epsilon < 0:
        raise ValueError("epsilon must be a finite number >= 0")
    return epsilon


def first_hit_turn(ranks: Sequence[Rank], k: int = 10) -> int | None:
    """1-based turn at which the target first entered the top ``k``, or ``None``."""
    k = check_k(k)
    for turn, r in enumerate(ranks, start=1):
        if _hit(check_rank(r), k):
            return turn
    return None


def hits_at_k_curve(sessions: Mapping[Hashable, Sequence[Rank]], k: int = 10) -> list[float]:
    """Cumulative Hits@K(l) for ``l = 1..L_max`` (empty list for no sessions)."""
    k = check_k(k)
    checked = _check_sessions(sessions)
    if not checked:
        return []
    l_max = max(len(r) for r in checked.values())
    firsts = [first_hit_turn(r, k) for r in checked.values()]
    n = len(firsts)
    return [sum(1 for f in firsts if f is not None and f <= l) / n for l in range(1, l_max + 1)]


def final_recall_at_k(sessions: Mapping[Hashable, Sequence[Rank]], k: int = 10) -> float | None:
    """Share of sessions within ``k`` at their own last turn; ``None`` for no sessions."""
    k = check_k(k)
    checked = _check_sessions(sessions)
    if not checked:
        return None
    return sum(_hit(r[-1], k) for r in checked.values()) / len(checked)


def curve_auc(hits: Sequence[float]) -> float | None:
    """Normalised trapezoid area under a Hits curve (``Hits(1)`` when it has one point)."""
    if not hits:
        return None
    if len(hits) == 1:
        return float(hits[0])
    area = sum((hits[i] + hits[i + 1]) / 2 for i in range(len(hits) - 1))
    return area / (len(hits) - 1)


def epsilon_consistent(ranks: Sequence[Rank], epsilon: float = DEFAULT_EPSILON) -> bool:
    """True when no consecutive turn worsens by more than ``epsilon`` (None = +inf)."""
    eps = _check_epsilon(epsilon)
    values = [math.inf if r is None else r for r in (check_rank(x) for x in ranks)]
    return all(b <= a + eps for a, b in zip(values, values[1:]))


def session_metrics(
    sessions: Mapping[Hashable, Sequence[Rank]], k: int = 10, epsilon: float = DEFAULT_EPSILON
) -> dict[str, Any]:
    """Session report, exactly::

        {"n_sessions": int, "hits_at_k": [Hits@K(1), ..., Hits@K(L_max)],
         "final_recall_at_k": float|None, "auc": float|None,
         "epsilon_consistent": int, "epsilon_violations": [ids in input order]}

    ``sessions`` maps a session id to its ranks ``r_1..r_L`` (best ground truth per
    turn, ``None`` = not retrieved). Undefined values (no sessions) are ``None``.
    """
    k = check_k(k)
    checked = _check_sessions(sessions)
    hits = hits_at_k_curve(checked, k)
    violations = [sid for sid, r in checked.items() if not epsilon_consistent(r, epsilon)]
    return {
        "n_sessions": len(checked),
        "hits_at_k": hits,
        "final_recall_at_k": final_recall_at_k(checked, k),
        "auc": curve_auc(hits),
        "epsilon_consistent": len(checked) - len(violations),
        "epsilon_violations": violations,
    }


# --------------------------------------------------------------------------- filters


def passes_success(ranks: Sequence[Rank], k: int = 10) -> bool:
    """Target within ``k`` at some turn."""
    return first_hit_turn(ranks, k) is not None


def passes_multi_turn(ranks: Sequence[Rank], k: int = 10) -> bool:
    """Target not within ``k`` at turn 1 (the session needed more than one turn)."""
    if not ranks:
        raise ValueError("a session needs at least one turn")
    return not _hit(check_rank(ranks[0]), check_k(k))


def max_pairwise_cosine(text_embeddings: Any) -> float | None:
    """Largest cosine between two different rows of ``[n, D]``; ``None`` when n < 2.

    Rows are L2-normalised here; a zero row has cosine 0 with everything.
    """
    torch = _torch_of(text_embeddings)
    if torch is not None:
        arr = text_embeddings.detach().to("cpu", torch.float64).numpy()
    else:
        arr = np.asarray(text_embeddings, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError("text embeddings must be [n_texts, D]")
    if arr.shape[0] < 2:
        return None
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    unit = arr / np.maximum(norms, 1e-12)
    cos = unit @ unit.T
    upper = cos[np.triu_indices(arr.shape[0], k=1)]
    return float(upper.max())


def passes_tau_diversity(text_embeddings: Any, tau: float = DEFAULT_TAU) -> bool:
    """Every pair of texts has cosine ``< tau`` (sessions with < 2 texts pass)."""
    worst = max_pairwise_cosine(text_embeddings)
    return worst is None or worst < tau


@dataclass
class FilterStep:
    """One filter of :func:`apply_filters`.

    ``removed``/``removed_ids``: sessions this filter removes at its place in the chain;
    ``remaining``: sessions left after it; ``removed_alone``: sessions it would remove
    applied alone to all input sessions; ``skipped``: not run (no text embeddings).
    """

    name: str
    removed: int
    removed_ids: list[Hashable]
    remaining: int
    removed_alone: int
    skipped: bool = False


@dataclass
class FilterReport:
    """Outcome of the filter chain; ``kept`` is in input order."""

    n_sessions: int
    steps: list[FilterStep] = field(default_factory=list)
    kept: list[Hashable] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "n_sessions": self.n_sessions,
            "kept": list(self.kept),
            "n_kept": len(self.kept),
            "steps": [
                {
                    "name": s.name,
                    "removed": s.removed,
                    "removed_ids": list(s.removed_ids),
                    "remaining": s.remaining,
                    "removed_alone": s.removed_alone,
                    "skipped": s.skipped,
                }
                for s in self.steps
            ],
        }


def apply_filters(
    sessions: Mapping[Hashable, Sequence[Rank]],
    text_embeddings: Mapping[Hashable, Any] | None = None,
    k: int = 10,
    epsilon: float = DEFAULT_EPSILON,
    tau: float = DEFAULT_TAU,
) -> FilterReport:
    """Run success -> multi-turn -> epsilon-consistency -> tau-diversity.

    ``text_embeddings`` maps a session id to its texts' embeddings ``[n_texts, D]``
    (from the caller's encoder); when it is ``None`` the tau filter is reported as
    skipped and removes nothing. A session missing from a given mapping raises
    ``KeyError``.
    """
    k = check_k(k)
    _check_epsilon(epsilon)
    checked = _check_sessions(sessions)

    def tau_ok(sid: Hashable) -> bool:
        assert text_embeddings is not None
        if sid not in text_embeddings:
            raise KeyError(f"no text embeddings for session {sid!r}")
        return passes_tau_diversity(text_embeddings[sid], tau)

    predicates = {
        "success": lambda sid: passes_success(checked[sid], k),
        "multi_turn": lambda sid: passes_multi_turn(checked[sid], k),
        "epsilon_consistency": lambda sid: epsilon_consistent(checked[sid], epsilon),
        "tau_diversity": tau_ok,
    }
    report = FilterReport(n_sessions=len(checked))
    remaining = list(checked)
    for name in FILTER_ORDER:
        if name == "tau_diversity" and text_embeddings is None:
            report.steps.append(FilterStep(name, 0, [], len(remaining), 0, skipped=True))
            continue
        ok = predicates[name]
        verdict = {sid: ok(sid) for sid in checked}
        removed_ids = [sid for sid in remaining if not verdict[sid]]
        remaining = [sid for sid in remaining if verdict[sid]]
        alone = sum(1 for v in verdict.values() if not v)
        report.steps.append(FilterStep(name, len(removed_ids), removed_ids, len(remaining), alone))
    report.kept = remaining
    return report


# --------------------------------------------------------------------------- rank curve


def rank_curve(sessions: Mapping[Hashable, Sequence[Rank]]) -> list[float | None]:
    """Median rank of the target after turn ``l``, ``l = 1..L_max``, over the sessions that
    have a turn ``l`` (a rank of ``None``, not retrieved, counts as +infinity; a median that
    falls on +infinity is ``None``). The rank curve of the session report, beside Hits@K."""
    checked = _check_sessions(sessions)
    if not checked:
        return []
    l_max = max(len(r) for r in checked.values())
    out: list[float | None] = []
    for l in range(l_max):
        values = [math.inf if r[l] is None else float(r[l]) for r in checked.values() if len(r) > l]
        median = float(np.median(values))
        out.append(None if math.isinf(median) or math.isnan(median) else median)
    return out
