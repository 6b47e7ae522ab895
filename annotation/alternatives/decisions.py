"""Which ticked candidates become extra ground truths of an item. Pure: no Django.

A candidate is accepted when a strict majority of the item's annotators ticked it (rule
``majority``) or every one of at least two did (``unanimous``); an adjudicator's decision on a
candidate overrides the votes either way. Each accepted candidate keeps its provenance: who
ticked it, the votes, and the rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from annotation.core.consensus import UNANIMOUS, unanimous

MAJORITY = "majority"
ADJUDICATED = "adjudicated"
RULES: tuple[str, ...] = (MAJORITY, UNANIMOUS)


@dataclass(frozen=True)
class Alternative:
    """One candidate's outcome. ``votes`` of ``n_annotators`` ticked it (``ticked_by``)."""

    image: int
    votes: int
    n_annotators: int
    ticked_by: list[str] = field(default_factory=list)
    accepted: bool = False
    rule: str = ""

    def provenance(self) -> dict[str, object]:
        return {"votes": self.votes, "of": self.n_annotators, "ticked_by": list(self.ticked_by), "rule": self.rule}


def _passes(votes: int, n: int, rule: str) -> bool:
    if rule == UNANIMOUS:
        return unanimous(votes, n)  # the one definition: at least two, all agreeing
    return 2 * votes > n


def decide_alternatives(
    candidates: Sequence[int],
    ticks: Mapping[str, Sequence[int]],
    rule: str = MAJORITY,
    adjudicated: Mapping[int, bool] | None = None,
) -> list[Alternative]:
    """The outcome of every candidate that was ticked or adjudicated, in panel order.

    ``ticks``: annotator -> the candidates they ticked, one entry per annotator with a
    current judgement (an empty list counts: that annotator saw every candidate and ticked
    none). ``adjudicated``: image -> accepted, from an adjudicator.
    """
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; use one of {', '.join(RULES)}")
    adjudicated = dict(adjudicated or {})
    n = len(ticks)
    out: list[Alternative] = []
    for image in candidates:
        by = sorted(a for a, ticked in ticks.items() if image in set(ticked))
        if not by and image not in adjudicated:
            continue
        if image in adjudicated:
            accepted, how = adjudicated[image], ADJUDICATED
        else:
            accepted, how = _passes(len(by), n, rule), rule
        out.append(
            Alternative(
                image=image,
                votes=len(by),
                n_annotators=n,
                ticked_by=by,
                accepted=accepted,
                rule=how if accepted or image in adjudicated else "",
            )
        )
    return out


def accepted(alternatives: Sequence[Alternative]) -> list[Alternative]:
    return [a for a in alternatives if a.accepted]
