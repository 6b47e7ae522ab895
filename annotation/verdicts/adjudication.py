"""The adjudication of a study's items: the queue of items that need (or got) an adjudicator,
and recording a staff decision.

Which items need one is the read model's (:mod:`annotation.verdicts.readmodel`): its one SQL
prefilter (:func:`~annotation.verdicts.readmodel.adjudication_candidates`) and its one decision
(:func:`~annotation.verdicts.readmodel.decide_row`).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from annotation.core.consensus import Decision
from annotation.models import Adjudication, Study, StudyItem
from annotation.verdicts.readmodel import ItemRow, Verdicts, adjudication_candidates, decide_row, iter_rows


@dataclass(frozen=True)
class QueueEntry:
    row: ItemRow
    decision: Decision  # under the policy, before any adjudication

    @property
    def adjudicated(self) -> bool:
        return self.row.adjudication is not None


def adjudication_queue(study: Study, verdicts: Verdicts | None = None) -> list[QueueEntry]:
    """Items that need (or got) an adjudicator: ties, flagged items, and any item already
    adjudicated. Waiting items first, each group in item id order. ``verdicts``: default
    the study's own rule (:meth:`Verdicts.of`: its consensus policy)."""
    verdicts = verdicts or Verdicts.of(study)
    entries: list[QueueEntry] = []
    for row in iter_rows(study, adjudication_candidates(study, verdicts)):
        decision = decide_row(row, verdicts, with_adjudication=False)
        if decision.needs_adjudication or row.adjudication is not None:
            entries.append(QueueEntry(row, decision))
    return sorted(entries, key=lambda e: (e.adjudicated, e.row.item_id))


def adjudicate(study: Study, item: StudyItem, validated: bool, note: str, user) -> Adjudication:
    """Record a staff decision on an item; the previous one (if any) stays, not current."""
    if item.study_id != study.pk:
        raise ValueError("the item belongs to another study")
    decision = Adjudication.Decision.VALIDATED if validated else Adjudication.Decision.REJECTED
    with transaction.atomic():
        StudyItem.objects.select_for_update().filter(pk=item.pk).first()  # serialises racing adjudicators
        Adjudication.objects.filter(item=item, is_current=True).update(is_current=False)
        return Adjudication.objects.create(
            study=study, item=item, decision=decision, note=(note or "").strip(), decided_by=user, is_current=True
        )
