"""The stored reliability fit that serving reads under reliability-weighted adaptive overlap,
refitted in a worker so that a submit stays O(1) whatever the study's size.

A submit decides its one item by the study's last stored Dawid-Skene fit
(``Study.reliability_fit``, read by :func:`annotation.verdicts.readmodel.reliability_of`;
none yet: a split opens a further slot). The fit on all the study's judgements and every item's
slots under it (:func:`refit_study`) run in the Celery task :data:`REFIT_TASK` (queue
``celery``), at most one pending or running per study: ``Study.refit_requested_at`` (when the
pending refit is due) is taken by a conditional UPDATE and cleared when the task ends; one due
more than :data:`REFIT_STALE_SECONDS` ago counts as lost with its worker. Once a submit commits
it asks for a refit (:func:`request_refit`): at once when the stored fit is missing,
``RELIABILITY_REFIT_SECONDS`` old or ``RELIABILITY_REFIT_JUDGEMENTS`` judgements behind
(settings), else with a countdown to that age, so the last judgements of a study are fitted
too; a delayed refit is brought forward once the fit falls that many judgements behind. A
broker outage leaves the submit stored; the flag then frees itself after
``RELIABILITY_REFIT_SECONDS`` and a later submit asks again. The task asks once more when
judgements came while it ran. While a refit is pending, an annotator with nothing left is told
to wait for it (:func:`refit_pending`), since it may reopen a split.

Pages and exports decide by the exact fit (``reliability_of(study, exact=True)``); an export
refits first (:func:`refit_study`, it runs in a worker), so the items' slots agree with the
verdicts it publishes. The staff page says how far serving is behind that fit
(:func:`serving_lag`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db.models import Q
from django.utils import timezone

from annotation.models import Judgement, Study
from annotation.verdicts.readmodel import fits_reliability, judgement_state, quorum_rule_of, reliability_of
from annotation.verdicts.state import refresh_slots, slot_changes

REFIT_TASK = "annotation.refit_reliability"

#: A refit requested this long ago and not done is taken as lost (its worker died, its message
#: was dropped): the next submit may ask for another. Short: a refit takes seconds.
REFIT_STALE_SECONDS = 600


def refit_study(study: Study) -> int:
    """Fit the study's reliability model on all its judgements now, store it
    (``Study.reliability_fit``: the model, the judgements it saw, when) and set every item's
    slots under it (:func:`~annotation.verdicts.state.refresh_slots`). Returns the items whose
    slots changed; other studies, or one without judgements: nothing (0)."""
    if not fits_reliability(study):
        return 0
    seen = judgement_state(study)  # read before the fit: the fit sees at least these
    if not seen["n"]:
        return 0
    model = reliability_of(study, exact=True)
    fit = {
        "model": model.to_dict(),
        "judgements": seen["n"],
        "last": seen["last"],
        "fitted_at": timezone.now().isoformat(),
    }
    Study.objects.filter(pk=study.pk).update(reliability_fit=fit)
    study.reliability_fit = fit
    return refresh_slots(study)


def run_refit(study_id: int, due: str | None = None) -> int:
    """The task's work: :func:`refit_study`, then the study's refit flag is cleared and, when
    judgements came while it ran, another refit is asked for. ``due``: the flag the task was
    sent for (ISO time); a flag that differs belongs to a refit asked for since (a delayed one
    brought forward, or the next one) and stays. Returns the items changed."""
    study = Study.objects.select_related("rubric").filter(pk=study_id).first()
    if study is None:
        return 0
    try:
        changed = refit_study(study)
    finally:
        mine = Q(refit_requested_at=datetime.fromisoformat(due)) if due else Q()
        Study.objects.filter(mine, pk=study_id).update(refit_requested_at=None)
        study.refit_requested_at = None
    last = (study.reliability_fit or {}).get("last")
    if last is not None and Judgement.objects.filter(assignment__study_id=study_id, pk__gt=last).exists():
        request_refit(study)
    return changed


def refit_countdown(study: Study, now: datetime) -> float:
    """Seconds until the study's stored fit is due a refit: 0 when none is stored, when it is
    ``RELIABILITY_REFIT_SECONDS`` old or ``RELIABILITY_REFIT_JUDGEMENTS`` judgements behind (one
    bounded query, counting at most that many)."""
    fit = study.reliability_fit or {}
    if not fit.get("model"):
        return 0.0
    wait = settings.RELIABILITY_REFIT_SECONDS - (now - datetime.fromisoformat(fit["fitted_at"])).total_seconds()
    if wait <= 0:
        return 0.0
    return 0.0 if _behind(study) else wait


def refit_pending(study: Study) -> bool:
    """Whether the study's reliability model waits for a refit asked for (and not lost): until it
    runs, items whose split the stored fit settles may reopen, so an annotator with nothing
    left is told to wait, not that they are done (read off the study row: no query)."""
    pending = study.refit_requested_at
    return (
        fits_reliability(study)
        and pending is not None
        and pending > timezone.now() - timedelta(seconds=REFIT_STALE_SECONDS)
    )


def retry_after_seconds() -> int:
    """How long an annotator told to wait for a pending refit waits before asking again (the
    API's ``retry_after`` and the browser page's countdown): the refit period, at least 5 s."""
    return max(5, settings.RELIABILITY_REFIT_SECONDS)


def _behind(study: Study) -> bool:
    """Whether the stored fit is ``RELIABILITY_REFIT_JUDGEMENTS`` judgements behind (one bounded count)."""
    behind = settings.RELIABILITY_REFIT_JUDGEMENTS
    newer = Judgement.objects.filter(
        assignment__study_id=study.pk, pk__gt=(study.reliability_fit or {}).get("last") or 0
    )
    return newer.values("pk")[:behind].count() >= behind


def request_refit(study: Study) -> bool:
    """Ask a worker to refit the study's reliability model (:data:`REFIT_TASK`) unless one is
    pending or running (module docstring); sent after a submit commits. ``Study.refit_requested_at``
    holds when the pending refit is due (now, or at the end of :func:`refit_countdown`): a delayed
    one is brought forward, with a task sent now, once the stored fit is
    ``RELIABILITY_REFIT_JUDGEMENTS`` judgements behind. ``False`` when none was sent: another
    is pending, the study reads no fit, or the broker is down (a submit after
    ``RELIABILITY_REFIT_SECONDS`` asks again; the submit itself is stored)."""
    from retrieval.jobs.sending import send_task

    if not fits_reliability(study):
        return False
    now = timezone.now()
    stale = now - timedelta(seconds=REFIT_STALE_SECONDS)
    pending = study.refit_requested_at
    if pending is not None and pending > stale:  # as read with the study: no query
        if pending <= now or not _behind(study):
            return False
        free = Q(refit_requested_at=pending)  # a delayed refit, and the fit is far behind: now
        countdown = 0.0
    else:
        free = Q(refit_requested_at__isnull=True) | Q(refit_requested_at__lt=stale)
        countdown = refit_countdown(study, now)
    due = now + timedelta(seconds=countdown)
    if not Study.objects.filter(pk=study.pk).filter(free).update(refit_requested_at=due):
        return False
    study.refit_requested_at = due
    if send_task(REFIT_TASK, study.pk, due.isoformat(), countdown=countdown or None):
        return True
    # the broker is down: the flag goes stale in RELIABILITY_REFIT_SECONDS, when a submit tries again
    # (so one submit per study and period waits on the broker's short retry, not every one)
    retry = now - timedelta(seconds=REFIT_STALE_SECONDS - settings.RELIABILITY_REFIT_SECONDS)
    Study.objects.filter(pk=study.pk, refit_requested_at=due).update(refit_requested_at=retry)
    study.refit_requested_at = retry
    return False


SERVING_LAG_CACHE_SECONDS = 60  # keyed by the judgements and the stored fit: a change makes a new key


def serving_lag(study: Study) -> dict | None:
    """For the staff page: how far serving (the stored fit) is behind the exact fit the page
    decides by, under reliability-weighted adaptive overlap (else ``None``). ``stored``: whether
    a fit is stored; ``judgements``: the judgements it saw, ``newer``: those since; ``fitted_at``;
    ``pending``: a refit is asked for; items whose slots the exact fit would change
    (:func:`~annotation.verdicts.state.slot_changes`: what the next refit writes): ``to_close``,
    still open to a further annotator although the exact fit settles their split, and
    ``to_open``, closed although it leaves their split uncertain;
    ``every_seconds`` / ``every_judgements``: when a refit is due."""
    if not fits_reliability(study):
        return None
    fit = study.reliability_fit or {}
    seen = judgement_state(study)
    key = (
        f"cirval:serving-lag:{study.pk}:{study.created_at.timestamp()}:{seen['n']}:{seen['last']}:"
        f"{fit.get('fitted_at')}:{study.overlap}:{study.adaptive_max}:{study.adaptive_confidence}"
    )
    steps = cache.get(key) if seen["n"] else (0, 0)
    if steps is None:
        exact = quorum_rule_of(study, reliability_of(study, exact=True))
        changes = [(before or 0, extra) for _, before, extra in slot_changes(study, exact)]
        steps = (sum(1 for b, e in changes if e < b), sum(1 for b, e in changes if e > b))
        cache.set(key, steps, SERVING_LAG_CACHE_SECONDS)
    return {
        "stored": bool(fit.get("model")),
        "judgements": fit.get("judgements", 0),
        "newer": max(0, (seen["n"] or 0) - fit.get("judgements", 0)),
        "fitted_at": datetime.fromisoformat(fit["fitted_at"]) if fit.get("fitted_at") else None,
        "pending": study.refit_requested_at is not None,
        "to_close": steps[0],
        "to_open": steps[1],
        "every_seconds": settings.RELIABILITY_REFIT_SECONDS,
        "every_judgements": settings.RELIABILITY_REFIT_JUDGEMENTS,
    }
