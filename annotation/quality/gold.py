"""Gold items: marking them (by hand, from adjudications, by promoting unanimous items)
and scoring annotators on them with a Wilson interval."""
from __future__ import annotations

from django.db import transaction

from annotation.assignment.rules import TRAINING_ITEM
from annotation.models import Adjudication, Assignment, Judgement, Study, StudyItem
from annotation.quality.signals import gold_correct, wilson_interval
from annotation.verdicts.adjudication import Verdicts, decide_row, iter_item_batches
from annotation.verdicts.consensus import UNANIMOUS

HAND, ADJUDICATED, PROMOTED = "hand", "adjudicated", "unanimous"


def mark_gold(item: StudyItem, validated: bool, source: str = HAND) -> StudyItem:
    item.gold, item.gold_answer, item.gold_source = True, {"validated": bool(validated)}, source
    item.save(update_fields=["gold", "gold_answer", "gold_source"])
    return item


def unmark_gold(item: StudyItem) -> None:
    item.gold, item.gold_answer, item.gold_source = False, {}, ""
    item.save(update_fields=["gold", "gold_answer", "gold_source"])


@transaction.atomic
def gold_from_adjudications(study: Study) -> int:
    """Every item with a current adjudication becomes gold with the adjudicated answer."""
    n = 0
    for adj in Adjudication.objects.filter(study=study, is_current=True).select_related("item"):
        mark_gold(adj.item, adj.validated, ADJUDICATED)
        n += 1
    return n


@transaction.atomic
def promote_unanimous(study: Study, min_votes: int | None = None) -> int:
    """Items on which at least ``min_votes`` (default: the study's quorum; never fewer than
    two: one vote is not unanimous) annotators all agreed become gold with that answer (the
    unanimous consensus of :func:`decide_row`)."""
    verdicts = Verdicts(quorum=max(2, min_votes or study.decision_quorum), policy="unanimous")
    ids: dict[bool, list[int]] = {True: [], False: []}
    for batch in iter_item_batches(study):
        for row in batch:
            d = decide_row(row, verdicts, with_adjudication=False)
            if d.decided and d.provenance == UNANIMOUS:
                ids[d.validated].append(row.item_id)
    for validated, items in ids.items():
        StudyItem.objects.filter(pk__in=items).update(gold=True, gold_answer={"validated": validated},
                                                      gold_source=PROMOTED)
    return len(ids[True]) + len(ids[False])


def gold_scores(study: Study) -> dict[str, dict]:
    """Per annotator: gold items judged, how many right, accuracy and its 95 % Wilson interval."""
    rows = (Judgement.objects.filter(assignment__study=study, assignment__item__gold=True, is_current=True)
            .values_list("assignment__annotator__username", "validated", "category", "assignment__item__gold_answer"))
    tally: dict[str, list[int]] = {}
    for user, validated, category, gold in rows:
        ok = gold_correct({"validated": validated, "category": category}, gold or {})
        if ok is None:
            continue
        t = tally.setdefault(user, [0, 0])
        t[0] += int(ok)
        t[1] += 1
    out = {}
    for user, (right, n) in tally.items():
        low, high = wilson_interval(right, n)
        out[user] = {"right": right, "n": n, "accuracy": right / n, "low": low, "high": high}
    return out


def training_feedback(assignment: Assignment, judgement: Judgement) -> str | None:
    """The feedback shown after a training item (served by the training rule), else None."""
    if assignment.served_by != TRAINING_ITEM or not assignment.item.gold:
        return None
    ok = gold_correct({"validated": judgement.validated, "category": judgement.category}, assignment.item.gold_answer)
    if ok is None:
        return None
    expected = "valid" if assignment.item.gold_answer.get("validated") else "not valid"
    if ok:
        return f"Training item: correct — this query is {expected}."
    return f"Training item: not quite — this query is {expected}. Read the guidelines (press ?) before going on."
