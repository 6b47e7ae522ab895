"""Extra ground truths of a study's items: the ticked candidates its consensus accepts
(:mod:`annotation.alternatives.decisions`), adjudicators' decisions on candidates, and the
per-candidate agreement report (:mod:`annotation.alternatives.agreement`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from annotation.alternatives.agreement import CONVENTIONS, candidate_units, distribution, per_candidate, unit_agreement
from annotation.alternatives.decisions import Alternative, decide_alternatives
from annotation.alternatives.paging import PAGE_SIZE
from annotation.models import AlternativeDecision, Study, StudyItem
from annotation.verdicts.state import counted_judgements


def item_ticks(
    study: Study, item_ids: Iterable[int] | None = None
) -> tuple[dict[int, list[int]], dict[int, dict[str, list[int]]]]:
    """(item -> candidate panel, item -> annotator username -> ticked ids) over the current
    judgements (:func:`~annotation.verdicts.state.counted_judgements`) of the items that have a panel."""
    items = StudyItem.objects.filter(study=study).exclude(candidates=[])
    if item_ids is not None:
        items = items.filter(pk__in=list(item_ids))
    panels = {pk: list(c) for pk, c in items.values_list("pk", "candidates")}
    ticks: dict[int, dict[str, list[int]]] = defaultdict(dict)
    for item, user, alts in (
        counted_judgements(study)
        .filter(assignment__item_id__in=list(panels))
        .values_list("assignment__item_id", "assignment__annotator__username", "alternatives")
    ):
        ticks[item][user] = list(alts or [])
    return panels, dict(ticks)


def adjudicated_candidates(study: Study, item_ids: Iterable[int] | None = None) -> dict[int, dict[int, bool]]:
    """item -> image -> accepted, the latest adjudicator decision per candidate."""
    qs = AlternativeDecision.objects.filter(study=study)
    if item_ids is not None:
        qs = qs.filter(item_id__in=list(item_ids))
    out: dict[int, dict[int, bool]] = defaultdict(dict)
    for item, image, accepted in qs.order_by("item_id", "image_id", "-decided_at", "-id").values_list(
        "item_id", "image_id", "accepted"
    ):
        out[item].setdefault(image, accepted)
    return dict(out)


def study_alternatives(study: Study, item_ids: Iterable[int] | None = None) -> dict[int, list[Alternative]]:
    """item -> every ticked or adjudicated candidate with its outcome under the study's rule."""
    ids = None if item_ids is None else list(item_ids)
    panels, ticks = item_ticks(study, ids)
    adjudicated = adjudicated_candidates(study, ids)
    return {
        item: decide_alternatives(panel, ticks.get(item, {}), study.alternatives_rule, adjudicated.get(item))
        for item, panel in panels.items()
        if item in ticks or item in adjudicated
    }


def decide_candidate(
    study: Study, item: StudyItem, image_id: int, accepted: bool, user, note: str = ""
) -> AlternativeDecision:
    """An adjudicator accepts (or refuses) one candidate of an item as an extra ground truth."""
    if image_id not in set(item.candidates):
        raise ValueError(f"image {image_id} is not a candidate of this item")
    return AlternativeDecision.objects.create(
        study=study, item=item, image_id=image_id, accepted=accepted, note=note, decided_by=user
    )


def alternatives_report(
    study: Study, names: dict[str, str] | None = None, n_boot: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Per-candidate agreement (binary units), the distribution of accepted alternatives per
    query and the most-ticked candidates; annotators renamed by ``names`` (pseudonyms)."""
    names = names or {}
    panels, ticks = item_ticks(study)
    judged = {i: t for i, t in ticks.items() if t}
    renamed = {i: {names.get(a, a): t for a, t in by.items()} for i, by in judged.items()}
    decided = study_alternatives(study)
    accepted_per_item = [sum(1 for a in decided.get(i, []) if a.accepted) for i in judged]
    rows = sorted(per_candidate(panels, renamed), key=lambda r: (-r["votes"], r["item"], r["image"]))
    return {
        "rule": study.alternatives_rule,
        "candidates_per_item": study.candidates,
        "too_broad_threshold": study.rubric.rubric.too_broad_threshold,
        "agreement": unit_agreement(candidate_units(panels, renamed, PAGE_SIZE), n_boot=n_boot, seed=seed),
        "accepted_per_query": distribution(accepted_per_item),
        "ticked": rows[:200],
        "conventions": list(CONVENTIONS),
    }


def apply_alternatives(study: Study) -> dict[str, int]:
    """Write every accepted alternative of the study's validated-or-not items into its dataset as
    a :class:`retrieval.models.Target` (role ``alternative``, relevance 1, never primary), so a
    re-audit scores them. Existing targets are left alone; returns counts."""
    from audit.alternatives import ALTERNATIVE_ROLE
    from retrieval.models import Target

    items = dict(StudyItem.objects.filter(study=study).values_list("pk", "query_id"))
    created = existing = 0
    for item, alts in study_alternatives(study).items():
        for alt in alts:
            if not alt.accepted:
                continue
            _, made = Target.objects.get_or_create(
                query_id=items[item],
                image_id=alt.image,
                defaults={
                    "relevance": 1.0,
                    "is_primary": False,
                    "role": ALTERNATIVE_ROLE,
                    "source_field": f"study {study.pk}: {alt.rule}, {alt.votes} of {alt.n_annotators} votes"[:100],
                },
            )
            created += made
            existing += not made
    return {"created": created, "already_targets": existing}
