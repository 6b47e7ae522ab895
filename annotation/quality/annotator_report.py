"""Per-annotator quality signals for staff: time, too-fast, straight-lining, disagreement
with the consensus, gold accuracy. Never part of what an annotator's browser receives."""

from __future__ import annotations

from statistics import median

from django.core.cache import cache

from annotation.models import Study
from annotation.quality.gold import gold_scores
from annotation.quality.signals import disagreement, straight_runs, too_fast
from annotation.verdicts.readmodel import counted_judgements, study_pass


def _answer(category: str, scales: dict, reject_flags: list) -> object:
    """What straight-lining compares: the category, or a session's ratings and rejects."""
    return category or (tuple(sorted((scales or {}).items())), tuple(sorted(reject_flags or [])))


def _consensus(study: Study) -> tuple[dict[int, bool], dict[str, dict[int, bool]]]:
    """Decided items' consensus (the study's rule and quorum, adjudication first) and every annotator's votes."""
    state = study_pass(study, decide_all=True)
    consensus: dict[int, bool] = {}
    votes: dict[str, dict[int, bool]] = {}
    for row in state.rows:
        d = state.decisions[row.item_id]
        if d.decided:  # the eventual consensus: the quorum was reached, or an adjudicator decided
            consensus[row.item_id] = d.validated
        for v in row.votes:
            if v.validated is not None:
                votes.setdefault(v.annotator, {})[row.item_id] = bool(v.validated)
    return consensus, votes


CACHE_SECONDS = 20  # the progress page refreshes itself; a big study is not re-read every time


def quality_signals(study: Study, *, fresh: bool = False) -> dict[str, dict]:
    """username -> signals (cached briefly; ``fresh`` recomputes)."""
    key = f"cirval:quality:{study.pk}:{study.created_at.timestamp()}"
    if not fresh:
        hit = cache.get(key)
        if hit is not None:
            return hit
    out = _quality_signals(study)
    cache.set(key, out, CACHE_SECONDS)
    return out


def _quality_signals(study: Study) -> dict[str, dict]:
    """username -> signals. Straight-lining reads judgements in the order they were made."""
    rows = (
        counted_judgements(study)
        .order_by("assignment__annotator__username", "created_at", "id")
        .values_list("assignment__annotator__username", "time_spent_ms", "category", "scales", "reject_flags")
    )
    per: dict[str, dict[str, list]] = {}
    for user, ms, category, scales, rejects in rows:
        p = per.setdefault(user, {"times": [], "answers": []})
        p["times"].append(ms)
        p["answers"].append(_answer(category, scales, rejects))
    consensus, votes = _consensus(study)
    gold = gold_scores(study)
    out: dict[str, dict] = {}
    for user, p in per.items():
        runs = straight_runs(p["answers"], max(2, study.straight_run))
        disagree, compared = disagreement(votes.get(user, {}), consensus)
        out[user] = {
            "n": len(p["times"]),
            "median_seconds": round(median(p["times"]) / 1000, 1),
            "too_fast": too_fast(p["times"], study.too_fast_seconds),
            "straight_runs": runs.runs,
            "longest_run": runs.longest,
            "straight_items": runs.items,
            "disagree": disagree,
            "compared": compared,
            "disagree_rate": (disagree / compared) if compared else None,
            "gold": gold.get(user),
        }
    return out
