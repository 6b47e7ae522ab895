"""Issue 38: the adjudication queue's one SQL prefilter
(:func:`annotation.verdicts.readmodel.adjudication_candidates`) against the rule in Python
(:func:`annotation.verdicts.readmodel.decide_row`), on generated studies: random votes, flags,
late judgements, revisions and adjudications, under every fixed quorum and the majority and
unanimous policies. For a fixed rule the prefilter finds exactly the items the rule sends to
adjudication plus the adjudicated ones; for an adaptive rule, a superset of them.

Also: the read model's kept rows follow every change (a new judgement, a revision, an
adjudication) with no stale read."""

from __future__ import annotations

import random

import pytest

from annotation.models import Adjudication, Assignment, Judgement, StudyItem
from annotation.verdicts.readmodel import (
    Verdicts,
    adjudication_candidates,
    decide_row,
    iter_rows,
    study_rows,
)
from annotation.verdicts.state import study_counts
from tests.integration.test_item_state import _study

pytestmark = pytest.mark.django_db

ANNOTATORS = [f"gen{i}" for i in range(5)]


def _generate(seed: int):
    """A study of 40 items with random judgements (some flagged, late or revised) and adjudications."""
    rng = random.Random(seed)
    study, users = _study(f"prefilter-{seed}", 3, 40, ANNOTATORS)
    items = list(StudyItem.objects.filter(study=study).order_by("id"))
    for item in items:
        for user in rng.sample(users, rng.randint(0, len(users))):
            a = Assignment.objects.create(
                study=study, item=item, annotator=user, status=Assignment.Status.DONE, position=1
            )
            for revision in range(1, rng.choice((2, 2, 2, 3)) if rng.random() < 0.2 else 2):
                valid = rng.choice((True, False, None)) if rng.random() < 0.1 else rng.random() < 0.6
                Judgement.objects.filter(assignment=a, is_current=True).update(is_current=False)
                Judgement.objects.create(
                    assignment=a,
                    rubric=study.rubric,
                    revision=revision,
                    is_current=True,
                    validated=valid,
                    category="VALIDATED" if valid else "INVALID_TEXT_QUERY",
                    flagged=rng.random() < 0.08,
                    late=rng.random() < 0.08,
                )
        if rng.random() < 0.1:
            Adjudication.objects.create(
                study=study, item=item, decision=rng.choice(("validated", "rejected")), is_current=True
            )
    return study


def _needing(study, verdicts: Verdicts) -> set[int]:
    return {
        row.item_id
        for row in iter_rows(study)
        if decide_row(row, verdicts, with_adjudication=False).needs_adjudication or row.adjudication is not None
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_sql_prefilter_is_the_python_rule(seed):
    study = _generate(seed)
    for policy in ("majority", "unanimous"):
        for quorum in (1, 2, 3):
            verdicts = Verdicts(quorum=quorum, policy=policy)
            found = set(adjudication_candidates(study, verdicts))
            assert found == _needing(study, verdicts), (policy, quorum)
    study.adaptive_max = 4  # an adaptive rule: the prefilter reads its base quorum, a superset
    verdicts = Verdicts.of(study)
    assert set(adjudication_candidates(study, verdicts)) >= _needing(study, verdicts)


def test_kept_rows_follow_every_change():
    study = _generate(7)
    first = study_rows(study)
    before = study_counts(study)
    assert study_rows(study) is first  # nothing changed: the kept rows, no read
    item = StudyItem.objects.filter(study=study).order_by("id").first()
    a = Assignment.objects.filter(item=item).first() or Assignment.objects.create(
        study=study, item=item, annotator=study.annotators.first(), status=Assignment.Status.DONE, position=1
    )
    Judgement.objects.filter(assignment=a, is_current=True).update(is_current=False)
    Judgement.objects.create(
        assignment=a,
        rubric=study.rubric,
        revision=9,
        is_current=True,
        validated=True,
        category="VALIDATED",
        flagged=True,
    )
    Adjudication.objects.create(study=study, item=item, decision="validated", is_current=True)
    after = study_rows(study)
    assert after is not first and after.stamp != first.stamp
    fresh = {r.item_id: r for r in iter_rows(study)}
    row = fresh[item.pk]
    assert any(v.flagged and v.revision == 9 for v in row.votes) and row.adjudication is not None
    assert study_counts(study) != before
    # the incremental read equals a read of the whole study from the database
    from annotation.verdicts import readmodel

    readmodel.forget_rows()
    again = study_rows(study)
    assert [(r.item_id, r.votes, r.adjudication) for r in again.rows] == [
        (r.item_id, r.votes, r.adjudication) for r in after.rows
    ]
