"""Estimate studies (issue 40, item 2): the benchmark's defect rate from a stratified sample.

The maths (strata, Neyman plan, estimator, stop rule) is :mod:`annotation.studies.estimate`;
this module stores and reads it:

* :func:`plan_estimate` (when the study is built): scores every item (``refresh_suspicion``),
  draws the strata from the scores, fixes each item's ``estimate_stratum`` and writes the
  serving plan into the items' ``order_key`` (the queue serves by it: a study in random order
  serves the lowest key first).
* :func:`replan` (after every :data:`REPLAN_EVERY` completed judgements, and from the staff's
  page): the planning rates (the priors, or with the study's ``reallocate`` the decided items'
  rates), and a new plan for the items not yet served; then the stop rule: once the overall rate's interval is narrow enough, no fresh item is
  served (``Study.estimate_stopped``; items already served are finished).
* :func:`running_estimate`: what the staff page and the release card show.

An item's verdict is the study's one decision (:func:`annotation.verdicts.readmodel.decide_row`):
a rejected item is defective; its defect kinds are the rubric flags that at least half of
its counted invalid votes raised (:func:`defect_kinds`). Only decided items count as judged.
Annotators see none of it: no score, stratum or estimate is in their pages or API.
"""

from __future__ import annotations

import statistics
from typing import Any

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from annotation.core.study_settings import EstimateSettings, SettingsError
from annotation.models import Study, StudyItem
from annotation.studies.estimate import (
    PRIOR_WEIGHT,
    Estimate,
    StratumCount,
    bernoulli_sd,
    cum_sqrt_f_bounds,
    plan_items,
    planning_rates,
    stop_reached,
    stratified_estimate,
    stratum_of,
    stratum_order,
)
from annotation.verdicts.readmodel import ItemRow, Verdicts, decide_row, iter_item_batches
from config.figures import fixed, percent

#: Completed judgements between two automatic re-plans.
REPLAN_EVERY = 10
OVERALL = "any"
UNSPECIFIED = "unspecified"

METHOD = (
    "Stratified sample by suspicion score (strata by the cumulative sqrt(f) rule), Neyman allocation "
    "(stratum SDs from the stratum's mean suspicion score as a prior; re-planned from the observed rates when "
    "the study says so), items served "
    "in a seeded random order within each stratum; stratified estimator p_st = sum W_h p_h with Cochran's "
    "variance (5.47, finite population correction) and a 95% Wilson interval at the design's effective "
    "sample size; stop rule: the overall rate's half-width at most the target."
)


class EstimateError(ValueError):
    pass


def check_settings(data: dict | None) -> dict:
    """The estimate settings to store (:class:`annotation.core.study_settings.EstimateSettings`):
    ``target_half_width`` in (0, 0.5], ``strata`` 1-8 and ``reallocate`` (re-plan from the
    observed rates; default off: bench/estimate.py measured its intervals at 86 % coverage on
    the demo scored by the tests' small retrievers, whose strata are sampled nearly in full, where
    the prior's plan covers 95 %; on a large benchmark it saves 5-12 % of the items)."""
    try:
        return EstimateSettings.parse(data).validate().to_dict()
    except SettingsError as exc:
        raise EstimateError(str(exc)) from None


def plan_estimate(study: Study, score: bool = True) -> dict:
    """Score the items (``score``; else read the stored scores), draw the strata, fix each
    item's stratum and write the first plan. Refused once an item was served: the strata of a
    sample are fixed."""
    from annotation.studies.suspicion_scores import refresh_suspicion

    if StudyItem.objects.filter(study=study, taken__gt=0).exists():
        raise EstimateError("items were served already: the strata of this sample are fixed")
    if score:
        refresh_suspicion(study.pk)
    items = list(StudyItem.objects.filter(study=study).only("pk", "suspicion"))
    scores = [i.suspicion for i in items]
    bounds = cum_sqrt_f_bounds(scores, study.estimate["strata"])
    for item in items:
        item.estimate_stratum = stratum_of(item.suspicion, bounds)
    StudyItem.objects.bulk_update(items, ["estimate_stratum"], batch_size=2000)
    priors = [statistics.fmean([s for s in scores if stratum_of(s, bounds) == h] or [0.0]) for h in range(len(bounds))]
    state = {**study.estimate, "bounds": bounds, "priors": priors, "scored": sum(1 for s in scores if s > 0)}
    Study.objects.filter(pk=study.pk).update(estimate=state)
    study.estimate = state
    return replan(study)


def _strata(study: Study) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """Per stratum: the served items and the items still fresh (each in its seeded order), and N_h."""
    n = len(study.estimate["bounds"])
    served: list[list[int]] = [[] for _ in range(n)]
    fresh: list[list[int]] = [[] for _ in range(n)]
    sizes = [0] * n
    rows = StudyItem.objects.filter(study=study).values_list("pk", "estimate_stratum", "taken", "completed", "gold")
    for pk, h, taken, completed, gold in rows:
        sizes[h] += 1
        if not gold:
            (served if taken or completed else fresh)[h].append(pk)
    order = [{pk: k for k, pk in enumerate(stratum_order(served[h] + fresh[h], study.seed, h))} for h in range(n)]
    return (
        [sorted(served[h], key=order[h].get) for h in range(n)],
        [sorted(fresh[h], key=order[h].get) for h in range(n)],
        sizes,
    )


def replan(study: Study, counts: dict | None = None) -> dict:
    """Plan the fresh items from the decided ones, check the stop rule, store the state."""
    counts = counts if counts is not None else judged_counts(study)
    served, fresh, _ = _strata(study)
    rates = planning_rates(
        study.estimate["priors"], counts["defects"], counts["judged"], bool(study.estimate.get("reallocate"))
    )
    order = plan_items(
        [s + f for s, f in zip(served, fresh)], [len(s) for s in served], [bernoulli_sd(r) for r in rates]
    )
    keys = {pk: k for k, pk in enumerate(order)}
    items = [StudyItem(pk=pk, order_key=k) for pk, k in keys.items()]
    overall = counts["estimates"][OVERALL]
    completed = StudyItem.objects.filter(study=study).aggregate(n=Sum("completed"))["n"] or 0
    state = {
        **study.estimate,
        "planning_rates": rates,
        "planned_completed": completed,
        "planned_at": timezone.now().isoformat(timespec="seconds"),
    }
    if stop_reached(overall, study.estimate["target_half_width"]) and not state.get("stopped"):
        state["stopped"] = {"at": state["planned_at"], "judged": overall.judged, "half_width": overall.half_width}
    with transaction.atomic():
        StudyItem.objects.bulk_update(items, ["order_key"], batch_size=2000)
        Study.objects.filter(pk=study.pk).update(estimate=state)
    study.estimate = state
    return state


def after_submit(study_id: int) -> None:
    """Re-plan once :data:`REPLAN_EVERY` judgements were completed since the last plan."""
    study = Study.objects.filter(pk=study_id).first()
    if study is None or not study.estimate or "bounds" not in study.estimate:
        return
    completed = StudyItem.objects.filter(study=study).aggregate(n=Sum("completed"))["n"] or 0
    if completed - study.estimate.get("planned_completed", 0) >= REPLAN_EVERY:
        replan(study)


def defect_kinds(row: ItemRow, flags: tuple[str, ...]) -> list[str]:
    """The defect kinds of a rejected item: the flags raised by at least half of its counted
    invalid votes (:data:`UNSPECIFIED` when none is)."""
    invalid = [v for v in row.votes if v.validated is False]
    kinds = [f for f in flags if invalid and 2 * sum(1 for v in invalid if v.flags.get(f)) >= len(invalid)]
    return kinds or [UNSPECIFIED]


def _flags(study: Study) -> tuple[str, ...]:
    spec = study.rubric.rubric.flags
    return tuple(spec.order) if spec is not None else ()


def judged_counts(study: Study) -> dict[str, Any]:
    """Per stratum: N_h, the decided items (``judged``), the defective ones (``defects``), each
    kind's count (``kinds``), the items served but undecided (``open``); and the estimates."""
    n = len(study.estimate["bounds"])
    sizes, open_, judged, defects = [0] * n, [0] * n, [0] * n, [0] * n
    flags = _flags(study)
    kinds = {k: [0] * n for k in (*flags, UNSPECIFIED)}
    stratum: dict[int, int] = {}
    for pk, h, taken, completed, gold in StudyItem.objects.filter(study=study).values_list(
        "pk", "estimate_stratum", "taken", "completed", "gold"
    ):
        sizes[h] += 1
        if not gold and (taken or completed):
            stratum[pk] = h
    verdicts = Verdicts.of(study)
    for batch in iter_item_batches(study, item_ids=sorted(stratum)) if stratum else ():
        for row in batch:
            h = stratum[row.item_id]
            decision = decide_row(row, verdicts)
            if not decision.decided:
                open_[h] += 1
                continue
            judged[h] += 1
            if not decision.validated:
                defects[h] += 1
                for kind in defect_kinds(row, flags):
                    kinds[kind][h] += 1
    estimates = {OVERALL: stratified_estimate([StratumCount(*c) for c in zip(sizes, judged, defects)])}
    for kind, hits in kinds.items():
        estimates[kind] = stratified_estimate([StratumCount(*c) for c in zip(sizes, judged, hits)])
    return {"sizes": sizes, "judged": judged, "defects": defects, "kinds": kinds, "open": open_, "estimates": estimates}


def _row(key: str, label: str, e: Estimate | None) -> dict[str, Any]:
    return {"key": key, "label": label, "estimate": e.to_dict() if e is not None else None}


def running_estimate(study: Study) -> dict[str, Any] | None:
    """What the staff page shows: the strata (bounds, N_h, served, decided, defects, rate,
    design weight N_h/n_h, prior and planning rate), each defect kind's estimate with its
    interval, the target and the stop. None for a study that is not an estimate study."""
    state = study.estimate or {}
    if "bounds" not in state:
        return None
    counts = judged_counts(study)
    bounds = state["bounds"]
    served, _, _ = _strata(study)
    strata = []
    for h, upper in enumerate(bounds):
        s = StratumCount(counts["sizes"][h], counts["judged"][h], counts["defects"][h])
        strata.append(
            {
                "index": h,
                "low": bounds[h - 1] if h else None,
                "high": upper,
                "size": s.size,
                "served": len(served[h]),
                "judged": s.judged,
                "open": counts["open"][h],
                "defects": s.hits,
                "rate": s.rate,
                "weight": s.weight,
                "prior": state["priors"][h],
                "planning_rate": (state.get("planning_rates") or state["priors"])[h],
            }
        )
    rubric = study.rubric.rubric
    kinds = [_row(OVERALL, "Any defect (rejected by the consensus)", counts["estimates"][OVERALL])]
    for kind in (*_flags(study), UNSPECIFIED):
        if kind == UNSPECIFIED and not sum(counts["kinds"][kind]):
            continue
        category = rubric.category(kind)
        kinds.append(
            _row(
                kind,
                category.label if category else "Rejected, no kind raised by half its invalid votes",
                counts["estimates"][kind],
            )
        )
    overall = counts["estimates"][OVERALL]
    return {
        "target": state["target_half_width"],
        "strata": strata,
        "kinds": kinds,
        "overall": kinds[0]["estimate"],
        "stopped": state.get("stopped"),
        "reached": stop_reached(overall, state["target_half_width"]),
        "size": sum(counts["sizes"]),
        "judged": sum(counts["judged"]),
        "open": sum(counts["open"]),
        "planned_at": state.get("planned_at"),
        "prior_weight": PRIOR_WEIGHT,
        "method": METHOD,
        "scored": state.get("scored"),
    }


def card_lines(study: Study) -> list[str]:
    """The release card's lines on an estimate study (empty for others): each defect kind's
    estimated prevalence in the whole benchmark with its 95% interval, and the method."""
    est = running_estimate(study)
    if est is None:
        return []

    lines = [
        f"#### Defect rate of the whole benchmark (estimate study `{study.name}`)",
        "",
        f"{est['judged']} of {est['size']} items judged and decided; target half-width "
        f"{percent(est['target'])}{', reached' if est['reached'] else ', not reached'}.",
        "",
    ]
    for row in est["kinds"]:
        e = row["estimate"]
        lines.append(
            f"* {row['label']}: "
            + (
                "not estimable yet"
                if e is None
                else f"{percent(e['value'])} (95% interval {percent(e['low'])} to {percent(e['high'])})"
            )
        )
    weights = ", ".join(
        f"stratum {s['index'] + 1} (score <= {fixed(s['high'], 3)}): N={s['size']}, n={s['judged']}, "
        f"weight {fixed(s['weight'], 2)}"
        if s["weight"]
        else f"stratum {s['index'] + 1}: N={s['size']}, n=0"
        for s in est["strata"]
    )
    return lines + ["", f"Method: {est['method']} Design weights N_h/n_h: {weights}.", ""]
