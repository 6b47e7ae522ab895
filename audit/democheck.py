"""What the audit should say about the demo world's planted query kinds (pure: no Django).

The demo (:mod:`retrieval.demo`) plants queries of known kinds and writes them to a truth
file only; ``manage.py demo_check`` compares the newest audit's labels with it here. The
expectations are stated with the label names of :mod:`audit.labels`, the audit rule.
"""
from __future__ import annotations

from typing import Any

from retrieval.demo import HUMAN_EXPECTED, PLANTED_SHARES, precision_recall

from .suspicion import TOP_SHARE, queue_precision
from .labels import BOTH_UNIMODAL, COMPOSITION_REQUIRED, IMAGE_ONLY, SHORTCUT_SOLVABLE, TEXT_ONLY, UNRESOLVED

#: What the audit should say about each planted kind: ``(label, details)``; a query of
#: the kind is *found* when its label is ``label`` and (if given) its detail is among ``details``.
AUDIT_EXPECTED: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "composition": (COMPOSITION_REQUIRED, None),
    "text_only": (SHORTCUT_SOLVABLE, (TEXT_ONLY, BOTH_UNIMODAL)),
    "image_only": (SHORTCUT_SOLVABLE, (IMAGE_ONLY, BOTH_UNIMODAL)),
    "vague": (UNRESOLVED, None),
    "wrong_target": (UNRESOLVED, None),
}


def check_audit(kinds: dict[Any, str], labels: dict[Any, str], details: dict[Any, str]) -> dict[str, dict[str, Any]]:
    """Per planted kind of :data:`AUDIT_EXPECTED`: precision and recall of the audit's labels.

    ``kinds`` maps query -> planted kind; ``labels``/``details`` the audit's label and
    detail label per query. Only queries the audit labelled take part.
    """
    out = {}
    for kind, (label, wanted) in AUDIT_EXPECTED.items():
        found = {q for q in labels if labels[q] == label and (wanted is None or details.get(q) in wanted)}
        out[kind] = precision_recall({q for q in labels if kinds.get(q) == kind}, found)
    return out


#: The planted defects the suspicion queue is measured on: every planted kind (the flawed
#: queries, and the shortcut ones the audit let through), and those a human should flag.
SUSPICION_DEFECTS: dict[str, frozenset[str]] = {
    "planted": frozenset(PLANTED_SHARES),
    "human": frozenset(HUMAN_EXPECTED),
}


def check_suspicion(kinds: dict[Any, str], scores: dict[Any, float | None],
                    share: float = TOP_SHARE) -> dict[str, dict[str, Any]]:
    """Precision and recall of the top ``share`` of the suspicion queue (``scores``: query ->
    score, the queries of the queue) against each set of :data:`SUSPICION_DEFECTS`."""
    return {name: queue_precision(scores, {q for q in scores if kinds.get(q) in wanted}, share)
            for name, wanted in SUSPICION_DEFECTS.items()}
