"""Reading CIRCUS's published files back as rating triples, for the tests that compare CIRVal's
agreement figures with CIRCUS's own (tests/unit/test_circus_report.py,
tests/integration/test_agreement_command.py). Test helpers: the product reads CIRCUS files
through :mod:`annotation.agreement.circus_files` and imports them as judgements."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import Any

from annotation.agreement.circus_files import CircusAnnotation
from annotation.agreement.maths import label_from_signature


def triples_from_annotations(annotations: Iterable[CircusAnnotation]) -> list[tuple[str, str, Any]]:
    """``(item_key, username, label)`` for every labelled annotation (unlabelled ones skipped)."""
    return [(a.item_key, a.username, a.label) for a in annotations if a.validated is not None]


def triples_from_item_level_rows(
    rows: Iterable[Mapping[str, Any]], annotators: Sequence[str] | None = None
) -> list[tuple[str, str, Any]]:
    """Triples from the ``item_level_rows`` of ``agreement_report.json``.

    Each signature string becomes a validity label (``"VALID"`` -> ``"VALIDATED"``,
    ``"INVALID_UNSPECIFIED"`` -> ``[]``, else its list of flags). ``annotators`` keeps
    only those annotators (e.g. ``["annotator_03", "annotator_08"]``).
    """
    wanted = None if annotators is None else set(annotators)
    out: list[tuple[str, str, Any]] = []
    for i, row in enumerate(rows):
        try:
            key = f"{row['dataset']}::{int(row['query_idx'])}"
            signatures = row["signatures"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"item_level_rows[{i}] lacks dataset, query_idx or signatures: {exc}") from None
        for annotator, signature in signatures.items():
            if wanted is not None and annotator not in wanted:
                continue
            try:
                label = label_from_signature(signature)
            except ValueError as exc:
                raise ValueError(f"item_level_rows[{i}], {annotator}: {exc}") from None
            out.append((key, annotator, label))
    return out


def relabel_pairs(values: Sequence[float], raters: Sequence[str]) -> dict[str, float]:
    """Map published pair values (in file order) to ``"a__b"`` keys by position.

    The values are listed in the order of all pairs (i < j) over ``raters``.
    """
    pairs = list(combinations(raters, 2))
    if len(pairs) != len(values):
        raise ValueError(f"{len(values)} values for {len(pairs)} pairs of {len(raters)} raters")
    return {f"{a}__{b}": float(v) for (a, b), v in zip(pairs, values)}
