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
  ``L_max == 1`` the AUC is defined as ``Hits(1)``: the CIRCLED paper's AUC, as issue 6
  specifies it. CIRCLED's released code (``print_statistics``) reports the plain mean of
  the curve instead, ``sum_l Hits(l) / L_max`` (:func:`curve_mean`, CIR-FORMATS.md 7.5);
  pages show both, each named.

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
import re
import sys
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from config.defaults import SESSION_EPSILON, SESSION_TAU
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
DEFAULT_EPSILON = SESSION_EPSILON  # the settings' defaults too (config/defaults.py)
DEFAULT_TAU = SESSION_TAU


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
    for turn in range(n_turns):
        if strategy == "latest":
            w[turn, turn] = 1.0
        elif strategy == "average":
            w[turn, : turn + 1] = 1.0 / (turn + 1)
        else:
            row = np.array([alpha ** (turn - j) for j in range(turn + 1)], dtype=np.float64)
            w[turn, : turn + 1] = row / row.sum()
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
    return [sum(1 for f in firsts if f is not None and f <= turn) / n for turn in range(1, l_max + 1)]


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


def curve_mean(hits: Sequence[float]) -> float | None:
    """The mean of a Hits curve over turns ``1..L_max`` (unit spacing, no trapezoid): the AUC
    that CIRCLED's released code prints (``print_statistics``). ``None`` for an empty curve."""
    if not hits:
        return None
    return sum(float(h) for h in hits) / len(hits)


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
    for turn in range(l_max):
        values = [math.inf if r[turn] is None else float(r[turn]) for r in checked.values() if len(r) > turn]
        median = float(np.median(values))
        out.append(None if math.isinf(median) or math.isnan(median) else median)
    return out


# --------------------------------------------------------------------------- retrospective turns
#
# A turn may name earlier turns (FashionMT's rollback and combination turns): "go back to
# turn 2", "the second turn", "the 2nd turn", "Keep the colour in the first turn". *Turn k's
# image* is turn k's reference image (the image shown when turn k was written; turn 1's is the
# session's first reference). :func:`parse_turn_references` reads the names from a text,
# :func:`effective_reference_turns` turns them into the turn's *effective reference*, and
# :func:`turn_reference_checks` runs the automatic checks on them.

#: Automatic checks on the turns a text names (flag codes stored on the turn).
REF_NOT_EARLIER = "reference_not_earlier"  # a named turn does not exist or is not earlier
KEEP_NAMES_NO_TURN = "keep_names_no_turn"  # a "keep the <attribute>" claim names no turn
REF_LATER = "refers_to_later_turn"  # the text refers to a later turn
REFERENCE_CHECKS: tuple[str, str, str] = (REF_NOT_EARLIER, KEEP_NAMES_NO_TURN, REF_LATER)

_ORDINAL_WORDS = {
    "first": 1,
    "second": 2,
    "third": 3,
    "fourth": 4,
    "fifth": 5,
    "sixth": 6,
    "seventh": 7,
    "eighth": 8,
    "ninth": 9,
    "tenth": 10,
    "eleventh": 11,
    "twelfth": 12,
}
_NUMBER_WORDS = {
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
}
_ORD = r"(?:\d+(?:st|nd|rd|th)?|" + "|".join(_ORDINAL_WORDS) + ")"
_CARD = r"(?:\d+|" + "|".join(_NUMBER_WORDS) + ")"
_JOIN = r"(?:\s*(?:,|and|&|or)\s*(?:the\s+)?)"
#: "turn 2", "turns 1 and 3", "turn #2"
_TURN_THEN_NUMBER = re.compile(rf"\bturns?\s*#?\s*({_CARD}(?:{_JOIN}{_CARD})*)\b", re.I)
#: "the second turn", "2nd turn", "first and third turns", "{ID} turn" with ID an ordinal or number
_NUMBER_THEN_TURN = re.compile(rf"\b({_ORD}(?:{_JOIN}{_ORD})*)\s+turns?\b", re.I)
_PREVIOUS_TURN = re.compile(r"\b(?:previous|prior|preceding|last)\s+turn\b", re.I)
_LATER_TURN = re.compile(r"\b(?:next|following|later|subsequent|future|upcoming)\s+turns?\b", re.I)
_KEEP = re.compile(r"\bkeep(?:s|ing)?\b", re.I)
_CLAUSE_END = re.compile(r"[.;!?\n]")
_KEEP_ATTRIBUTE = re.compile(r"^\s*(?:the\s+|its\s+|their\s+)?(.+?)(?:\s+(?:in|from|as|at|like|of)\b|,|$)", re.I)


def _number(token: str) -> int:
    token = token.lower()
    if token in _ORDINAL_WORDS:
        return _ORDINAL_WORDS[token]
    if token in _NUMBER_WORDS:
        return _NUMBER_WORDS[token]
    return int(re.match(r"\d+", token).group(0))  # type: ignore[union-attr]


def _named_turns(text: str) -> list[tuple[int, int]]:
    """``(position in text, turn number)`` of every explicitly numbered turn, in text order."""
    found: list[tuple[int, int]] = []
    for pattern, item in ((_TURN_THEN_NUMBER, _CARD), (_NUMBER_THEN_TURN, _ORD)):
        for m in pattern.finditer(text):
            for tok in re.finditer(rf"\b{item}\b", m.group(1), re.I):
                found.append((m.start(), _number(tok.group(0))))
    return sorted(set(found))


@dataclass(frozen=True)
class TurnReferences:
    """What a turn's text says about other turns (see :func:`parse_turn_references`).

    ``turns``: the turns it names, in text order, each once (``previous`` counts as the
    turn before); ``keep``: ``(attribute, turns named in that claim)`` per "keep the
    <attribute> ..." claim; ``later``: it speaks of a "next"/"later" turn.
    """

    turns: tuple[int, ...] = ()
    keep: tuple[tuple[str, tuple[int, ...]], ...] = ()
    later: bool = False

    @property
    def keep_turns(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(t for _, ts in self.keep for t in ts))


def parse_turn_references(text: str, turn_index: int | None = None) -> TurnReferences:
    """The turns ``text`` names: "Turn 2", "turns 1 and 3", "the second turn", "the 2nd turn",
    "{ID} turn" (an ordinal or a number before "turn"), "the previous turn" (``turn_index - 1``,
    only when ``turn_index`` is given), and its "Keep the {attribute} in the {ID} turn" claims.

    Pure string work: whether the named turns exist is :func:`turn_reference_checks`' job.
    """
    text = text or ""
    positions = _named_turns(text)
    if turn_index is not None:
        positions = sorted(positions + [(m.start(), turn_index - 1) for m in _PREVIOUS_TURN.finditer(text)])
    turns = tuple(dict.fromkeys(t for _, t in positions))
    keep: list[tuple[str, tuple[int, ...]]] = []
    for m in _KEEP.finditer(text):
        end_m = _CLAUSE_END.search(text, m.end())
        nxt = _KEEP.search(text, m.end())
        end = min(x for x in (end_m.start() if end_m else len(text), nxt.start() if nxt else len(text)))
        clause = text[m.end() : end]
        attr = _KEEP_ATTRIBUTE.match(clause)
        named = tuple(dict.fromkeys(t for p, t in positions if m.end() <= p < end))
        keep.append(((attr.group(1).strip() if attr else ""), named))
    return TurnReferences(turns, tuple(keep), bool(_LATER_TURN.search(text)))


def turn_reference_checks(turn_index: int, n_turns: int, refs: TurnReferences) -> list[str]:
    """The automatic checks a turn fails, in :data:`REFERENCE_CHECKS` order.

    * :data:`REF_NOT_EARLIER`: a named turn does not exist (outside ``1..n_turns``) or is not
      earlier than ``turn_index`` (the turn itself or a later one);
    * :data:`KEEP_NAMES_NO_TURN`: a "keep the <attribute>" claim names no turn (turn 1
      exempt: it has no earlier turn to keep from, its "keep" is about its reference);
    * :data:`REF_LATER`: a named turn is later than ``turn_index``, or the text speaks of a
      next/later turn.
    """
    flags = []
    if any(not (1 <= t < turn_index and t <= n_turns) for t in refs.turns):
        flags.append(REF_NOT_EARLIER)
    if turn_index > 1 and any(not ts for _, ts in refs.keep):
        flags.append(KEEP_NAMES_NO_TURN)
    if refs.later or any(t > turn_index for t in refs.turns):
        flags.append(REF_LATER)
    return flags


def effective_reference_turns(turn_index: int, refs: TurnReferences) -> list[int]:
    """The turns whose images form the turn's effective reference; ``[]``: its own reference.

    Only named turns that are earlier count (``1 <= k < turn_index``). The turns named in
    "keep" claims are *kept from*; the others are *gone back to*. Rollback: the gone-back-to
    turns replace the turn's own image. Combination: the kept-from turns are added to the
    base (the gone-back-to turns, else the turn itself). The result is sorted; one turn =
    a rollback, several = a combination, ``[]`` = no retrospective reference.
    """
    valid = [t for t in refs.turns if 1 <= t < turn_index]
    if not valid:
        return []
    kept = {t for t in refs.keep_turns if t in valid}
    back = [t for t in valid if t not in kept]
    base = set(back) if back else {turn_index}
    out = sorted(base | kept)
    return [] if out == [turn_index] else out


def session_turn_references(texts: Sequence[str]) -> list[tuple[list[int], list[str]]]:
    """Per turn of a session (texts in turn order): ``(effective reference turns, failed checks)``."""
    n = len(texts)
    out = []
    for index, text in enumerate(texts, start=1):
        refs = parse_turn_references(text, index)
        out.append((effective_reference_turns(index, refs), turn_reference_checks(index, n, refs)))
    return out


def describe_reference(turn_index: int, reference_turns: Sequence[int]) -> str:
    """How the filmstrip names a turn's effective reference ('' when it is the turn's own)."""
    refs = [t for t in reference_turns]
    if not refs:
        return ""
    others = [t for t in refs if t != turn_index]
    names = " and ".join(f"turn {t}" for t in others)
    if len(refs) == 1:
        return f"refers back to {names}"
    if turn_index in refs:
        return f"keeps from {names}"
    return f"combines {names}"


def effective_references(image_emb: ArrayT, reference_turns: Sequence[Sequence[int]], eps: float = 1e-12) -> ArrayT:
    """Each turn's effective reference embedding, ``[L, D]`` from the turns' own reference
    embeddings ``image_emb [L, D]`` (numpy or torch, same kind back).

    Row ``l`` is ``image_emb[l]`` when ``reference_turns[l]`` is empty, else the combination
    rule: ``normalise(mean_k normalise(image_emb[k - 1]))`` over its turns ``k`` (1-based); a
    rollback (one turn) is that turn's normalised embedding. Turns outside ``1..L`` are a
    ``ValueError`` (the caller keeps only valid earlier turns).
    """
    torch = _torch_of(image_emb)
    arr = (
        image_emb.detach().to("cpu", torch.float64).numpy()
        if torch is not None
        else np.asarray(image_emb, dtype=np.float64)
    )
    if arr.ndim != 2 or len(reference_turns) != arr.shape[0]:
        raise ValueError("image embeddings must be [L, D] with one reference list per turn")
    if not any(reference_turns):
        return image_emb
    unit = arr / np.maximum(np.linalg.norm(arr, axis=1, keepdims=True), eps)
    out = arr.copy()
    for row, turns in enumerate(reference_turns):
        if not turns:
            continue
        if any(not 1 <= t <= arr.shape[0] for t in turns):
            raise ValueError(f"turn {row + 1}: reference turns {list(turns)} outside 1..{arr.shape[0]}")
        mean = unit[[t - 1 for t in turns]].mean(axis=0)
        out[row] = mean / max(float(np.linalg.norm(mean)), eps)
    if torch is not None:
        return torch.from_numpy(out).to(device=image_emb.device, dtype=image_emb.dtype)  # type: ignore[return-value]
    dtype = np.asarray(image_emb).dtype
    return out.astype(dtype if np.issubdtype(dtype, np.floating) else np.float64)  # type: ignore[return-value]


# --------------------------------------------------------------------------- consistency checks
#
# Computed by the audit from embeddings (never shown to annotators before they answer). The
# session's images: ``I_0`` = turn 1's reference, ``I_l`` = turn ``l``'s target (its
# intermediate target; the final target for the last turn); ``E_l`` = turn ``l``'s effective
# reference. Cosines of L2-normalised embeddings; each turn gets at most one of no-op,
# duplicate, circle (in that priority), and conflict independently.

#: no-op: ``cos(I_l, E_l) >= NOOP_COSINE`` (the target is nearly the turn's reference).
NOOP_COSINE = 0.995
#: duplicate: ``cos(I_l, I_{l-1}) >= DUPLICATE_COSINE``, turn l >= 2 and not a no-op (the target
#: repeats the previous turn's target although the turn starts from another image: a rollback
#: that redoes the same change).
DUPLICATE_COSINE = 0.995
#: circle: ``cos(I_l, I_k) >= CIRCLE_COSINE`` for some ``k <= l - 2`` (the session returns to an
#: image it had left), not a no-op or duplicate.
CIRCLE_COSINE = 0.995
#: conflict: ``cos(d_k, d_l) <= -CONFLICT_COSINE`` for an earlier turn ``k``, where ``d`` is the
#: turn's text embedding minus the centre of the texts checked together (see
#: :func:`text_directions`): the two texts point in opposite directions.
CONFLICT_COSINE = 0.3
#: conflict read from the images instead (``directions="image"``): ``d`` is the change the turn
#: made, target minus effective reference (:func:`change_directions`).
CONFLICT_IMAGE_COSINE = 0.9
#: Where the conflict check reads a turn's requested change: its text or its image change.
CONFLICT_DIRECTIONS: tuple[str, str] = ("text", "image")

NOOP, DUPLICATE, CIRCLE, CONFLICT = "noop", "duplicate", "circle", "conflict"
CONSISTENCY_CHECKS: tuple[str, str, str, str] = (DUPLICATE, CIRCLE, CONFLICT, NOOP)


@dataclass(frozen=True)
class ConsistencyThresholds:
    noop: float = NOOP_COSINE
    duplicate: float = DUPLICATE_COSINE
    circle: float = CIRCLE_COSINE
    conflict: float = CONFLICT_COSINE


def _unit(x: Any, eps: float = 1e-12) -> np.ndarray:
    torch = _torch_of(x)
    arr = x.detach().to("cpu", torch.float64).numpy() if torch is not None else np.asarray(x, dtype=np.float64)
    return arr / np.maximum(np.linalg.norm(arr, axis=-1, keepdims=True), eps)


def change_directions(targets: Any, effective: Any) -> np.ndarray:
    """The change each turn made: ``normalise(I_l) - normalise(E_l)`` (a row with an unknown
    target, NaN, gives a zero direction: no conflict)."""
    d = _unit(targets) - _unit(effective)
    return np.nan_to_num(d, nan=0.0)


def text_directions(text_emb: Any, centre: Any = None) -> np.ndarray:
    """What each text asks for, as a direction: ``normalise(t) - centre``, where ``centre``
    defaults to the mean of the normalised rows (texts share a large common component, so raw
    text cosines are nearly always positive; centring leaves what sets them apart)."""
    unit = _unit(text_emb)
    c = unit.mean(axis=0) if centre is None else np.asarray(centre, dtype=np.float64)
    return unit - c


def session_consistency(
    start: Any,
    targets: Any,
    effective: Any,
    directions: Any,
    thresholds: ConsistencyThresholds = ConsistencyThresholds(),
) -> list[dict[str, int]]:
    """The consistency checks one session fails, per turn: ``{check: earlier turn}``.

    ``start`` ``[D]``: ``I_0``; ``targets`` ``[L, D]``: ``I_1..I_L`` (a row of NaN = unknown:
    the image checks skip that turn); ``effective`` ``[L, D]``: ``E_1..E_L``; ``directions``
    ``[L, D]`` (:func:`text_directions`) or ``None`` (no conflict check). The value names the
    earlier turn involved: no-op -> the turn itself, duplicate -> ``l - 1``, circle -> the
    turn whose reference it returns to (``k + 1`` for ``I_k``), conflict -> the most opposite
    earlier turn.
    """
    t = _unit(targets)
    e = _unit(effective)
    imgs = np.vstack([_unit(start)[None, :], t])  # I_0..I_L
    known = ~np.isnan(imgs).any(axis=1)
    d = None if directions is None else np.nan_to_num(_unit(directions), nan=0.0)
    out: list[dict[str, int]] = []
    for turn in range(1, t.shape[0] + 1):
        flags: dict[str, int] = {}
        if known[turn]:
            if float(imgs[turn] @ e[turn - 1]) >= thresholds.noop:
                flags[NOOP] = turn
            elif turn >= 2 and known[turn - 1] and float(imgs[turn] @ imgs[turn - 1]) >= thresholds.duplicate:
                flags[DUPLICATE] = turn - 1
            else:
                back = [k for k in range(turn - 1) if known[k] and float(imgs[turn] @ imgs[k]) >= thresholds.circle]
                if back:
                    flags[CIRCLE] = back[-1] + 1
        if d is not None and turn >= 2:
            cos = d[: turn - 1] @ d[turn - 1]
            k = int(np.argmin(cos))
            if float(cos[k]) <= -thresholds.conflict:
                flags[CONFLICT] = k + 1
        out.append(flags)
    return out
