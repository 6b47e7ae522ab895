"""Gold items: marking them (by hand, from adjudications, by promoting unanimous items)
and scoring annotators on them with a Wilson interval."""

from __future__ import annotations

from django.db import transaction
from django.urls import reverse
from django.utils.html import format_html

from annotation.core.consensus import UNANIMOUS, UNANIMOUS_MIN_VOTERS
from annotation.core.serving import TRAINING_ITEM
from annotation.models import Adjudication, Assignment, Judgement, Study, StudyItem
from annotation.quality.signals import gold_correct, wilson_interval
from annotation.verdicts.readmodel import Verdicts, counted_judgements, decide_row, iter_rows

HAND, ADJUDICATED, PROMOTED = "hand", "adjudicated", "unanimous"


def mark_gold(
    item: StudyItem, validated: bool, source: str = HAND, category: str = "", made_by: list[str] | None = None
) -> StudyItem:
    """Make ``item`` gold. ``category``: the expected category key, when known (then a
    judgement must name it to be right, and training feedback names it). ``made_by``: the
    usernames whose decision made the answer (the voters of a unanimous item, the
    adjudicator): their own accuracy is not scored on it."""
    answer = {
        "validated": bool(validated),
        **({"category": category} if category else {}),
        **({"made_by": sorted(made_by)} if made_by else {}),
    }
    item.gold, item.gold_answer, item.gold_source = True, answer, source
    item.save(update_fields=["gold", "gold_answer", "gold_source"])
    return item


def unmark_gold(item: StudyItem) -> None:
    item.gold, item.gold_answer, item.gold_source = False, {}, ""
    item.save(update_fields=["gold", "gold_answer", "gold_source"])


@transaction.atomic
def gold_from_adjudications(study: Study) -> int:
    """Every item with a current adjudication becomes gold with the adjudicated answer."""
    n = 0
    for adj in Adjudication.objects.filter(study=study, is_current=True).select_related("item", "decided_by"):
        mark_gold(adj.item, adj.validated, ADJUDICATED, made_by=[adj.decided_by.username] if adj.decided_by else None)
        n += 1
    return n


@transaction.atomic
def promote_unanimous(study: Study, min_votes: int | None = None) -> int:
    """Items on which at least ``min_votes`` (default: the study's quorum; never fewer than
    two: one vote is not unanimous) annotators all agreed become gold with that answer (the
    unanimous consensus of :func:`decide_row`)."""
    verdicts = Verdicts(quorum=max(UNANIMOUS_MIN_VOTERS, min_votes or study.decision_quorum), policy="unanimous")
    made: dict[int, tuple[bool, list[str]]] = {}
    for row in iter_rows(study):
        d = decide_row(row, verdicts, with_adjudication=False)
        if d.decided and d.provenance == UNANIMOUS:
            made[row.item_id] = (d.validated, sorted(v.annotator for v in row.votes))
    for item in StudyItem.objects.filter(pk__in=list(made)):
        mark_gold(item, made[item.pk][0], PROMOTED, made_by=made[item.pk][1])
    return len(made)


def gold_scores(study: Study) -> dict[str, dict]:
    """Per annotator: gold items judged (counted judgements), how many right, accuracy and its
    95 % Wilson interval. An annotator is never scored on a gold item they made (``made_by``:
    their vote made a unanimous item gold, or they adjudicated it)."""
    rows = (
        counted_judgements(study)
        .filter(assignment__item__gold=True)
        .values_list("assignment__annotator__username", "validated", "category", "assignment__item__gold_answer")
    )
    tally: dict[str, list[int]] = {}
    for user, validated, category, gold in rows:
        if user in (gold or {}).get("made_by", ()):
            continue
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


def expected_answer(rubric, gold: dict) -> str:
    """The gold answer in the rubric's words: the expected category's label when the gold
    answer names one (or when only one category is valid and the item is valid), else
    "not valid (any invalid category)". Never more than the gold answer itself holds."""
    category = rubric.category(gold.get("category") or "")
    if category is not None:
        return category.label
    valid = [c for c in rubric.categories if c.valid]
    if gold.get("validated"):
        return valid[0].label if len(valid) == 1 else "valid"
    return "not valid (any invalid category)"


def training_feedback(assignment: Assignment, judgement: Judgement) -> dict | None:
    """The feedback on a training item (served by the training rule), else None: whether
    the answer was right, the expected category, the annotator's own answer, and the item's
    page (``url``) to look at it again. Only the gold answer is told: never the audit's
    label nor other annotators' answers."""
    if assignment.served_by != TRAINING_ITEM or not assignment.item.gold:
        return None
    gold = assignment.item.gold_answer
    ok = gold_correct({"validated": judgement.validated, "category": judgement.category}, gold)
    if ok is None:
        return None
    rubric = assignment.study.rubric.rubric
    mine = rubric.category(judgement.category)
    return {
        "correct": ok,
        "expected": expected_answer(rubric, gold),
        "yours": mine.label if mine else "",
        "position": assignment.position,
        "url": reverse("annotation:item", args=[assignment.study_id, assignment.pk]),
    }


def feedback_message(feedback: dict) -> str:
    """The training feedback as the one-line message shown on the next page, with a link
    back to the item."""
    head = "correct" if feedback["correct"] else "not quite"
    tail = "" if feedback["correct"] else " Read the guidelines (press ?) before going on."
    return format_html(
        'Training item #{}: {} — expected “{}”, you answered “{}”. <a href="{}" class="training-item">Look at '
        "item #{} again</a>.{}",
        feedback["position"],
        head,
        feedback["expected"],
        feedback["yours"],
        feedback["url"],
        feedback["position"],
        tail,
    )
