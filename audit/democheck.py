"""What the audit should say about the demo world's planted query kinds (pure: no Django).

The demo (:mod:`retrieval.demo`) plants queries of known kinds and writes them to a truth
file only; ``manage.py demo_check`` compares the newest audit's labels with it here. The
expectations are stated with the label names of :mod:`audit.labels`, the audit rule.
"""
from __future__ import annotations

from typing import Any

from retrieval.demo import precision_recall

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
