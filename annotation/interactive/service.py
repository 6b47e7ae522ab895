"""Interactive sessions in the database: starting one, taking a round, ranking it (worker),
and the blind state the annotator's page polls.

The web tier never ranks: :func:`submit_round` stores the round as ``pending`` and sends
:data:`RANK_TASK` once the transaction commits, to its own queue (:func:`rank_queue`: a
round never waits behind audit chunks, imports or exports); a worker runs :func:`rank_round`, which
stores the shown candidates and the target's rank and ends the session when the stopping
rule of :mod:`annotation.core.rounds` says so (the assignment is then done, as a
submitted judgement makes it). The page polls :func:`session_state` until the round is
ranked, and says when no live worker consumes that queue. The annotator's state never holds the target's rank (blind studies): only the
candidates shown and, at the end, whether the target was found.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from annotation.access import grant_images
from annotation.assignment.queue import mark_done
from annotation.core.rounds import FOUND, InteractiveSettings, clean_text, hides_target, outcome
from annotation.judging.payloads import image_ref
from annotation.models import Assignment, InteractiveRound, InteractiveSession
from retrieval.jobs.sending import send_task
from retrieval.jobs.workers import no_worker_message
from retrieval.models import Image, Target
from retrieval.targets import positive_targets

logger = logging.getLogger(__name__)

RANK_TASK = "annotation.rank_interactive_round"


def rank_queue() -> str:
    """The Celery queue :data:`RANK_TASK` is routed to (``settings.CELERY_TASK_ROUTES``:
    ``interactive``); the one the page checks for a live worker."""
    route = settings.CELERY_TASK_ROUTES.get(RANK_TASK) or {}
    return route.get("queue") or settings.CELERY_TASK_DEFAULT_QUEUE


class RoundError(ValueError):
    """A round that cannot be taken (the page shows the message)."""


def study_settings(study) -> InteractiveSettings:
    return InteractiveSettings.from_dict(study.interactive)


def positives(query) -> list[int]:
    """The image ids of the query's targets that count (:func:`retrieval.targets.positive_targets`)."""
    targets = list(Target.objects.filter(query=query).order_by("-is_primary", "id"))
    return [t.image_id for t in positive_targets(query.dataset.format, targets)]


def start_reference(query) -> int:
    """The image round 1's feedback is about: the query's first turn's reference."""
    turn = query.turns.order_by("index").first()
    if turn is None or turn.reference_image_id is None:
        raise RoundError("this query has no reference image to start from")
    return turn.reference_image_id


def session_for(assignment: Assignment) -> InteractiveSession:
    """The assignment's session, begun on first use with the study's settings of that moment."""
    session = InteractiveSession.objects.filter(assignment=assignment).first()
    if session is not None:
        return session
    session, _ = InteractiveSession.objects.get_or_create(
        assignment=assignment,
        defaults={
            "study_id": assignment.study_id,
            "item_id": assignment.item_id,
            "annotator_id": assignment.annotator_id,
            "config": dict(assignment.study.interactive),
        },
    )
    return session


def submit_round(
    session: InteractiveSession, text: str, reference_id: int | None, time_spent_ms: int = 0
) -> InteractiveRound:
    """Store the next round (pending) and send it to a worker. The reference must be the
    query's reference in round 1 and one of the candidates shown after the last round later."""
    try:
        text = clean_text(text)
    except ValueError as exc:
        raise RoundError(str(exc)) from None
    with transaction.atomic():
        session = InteractiveSession.objects.select_for_update().get(pk=session.pk)
        if session.outcome:
            raise RoundError("this session has ended")
        rounds = list(session.rounds.order_by("index"))
        if rounds and rounds[-1].status == InteractiveRound.PENDING:
            raise RoundError("the last round is still being ranked")
        query = session.item.query
        allowed = [start_reference(query)] if not rounds else list(rounds[-1].shown)
        if reference_id is None:
            reference_id = allowed[0] if allowed else None
        if reference_id not in allowed:
            raise RoundError("pick one of the candidates shown")
        new = InteractiveRound.objects.create(
            session=session,
            index=len(rounds) + 1,
            text=text,
            reference_id=reference_id,
            time_spent_ms=max(0, int(time_spent_ms)),
        )
        transaction.on_commit(lambda: send_round(new.pk))
    return new


def send_round(round_id: int) -> bool:
    """Send a pending round to a worker (False when the broker is down: the sweep sends it later)."""
    InteractiveRound.objects.filter(pk=round_id).update(sent_at=timezone.now())
    ok = send_task(RANK_TASK, round_id)
    if not ok:
        logger.warning("could not queue interactive round %s", round_id)
        InteractiveRound.objects.filter(pk=round_id).update(sent_at=None)
    return ok


def resend_stale_rounds(now=None) -> int:
    """Send again the rounds still pending ``JOB_STALE_SECONDS`` after they were last sent (a
    worker died on them, the message was lost) or never sent (broker down); every worker's
    sweep calls it. A round ranked twice is stored once (:func:`rank_round`)."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=float(settings.JOB_STALE_SECONDS))
    rows = InteractiveRound.unfinished().filter(
        Q(sent_at__isnull=True, created_at__lt=now - timedelta(seconds=1)) | Q(sent_at__lt=stale)
    )
    return sum(send_round(pk) for pk in rows.values_list("pk", flat=True)[:100])


def rank_round(round_id: int) -> str:
    """Rank a pending round (worker side: loads the retriever) and end the session when the
    stopping rule says so. A round ranked already is left as it is (redelivery)."""
    from audit.runs.ondemand import rank_turns

    rnd = InteractiveRound.objects.select_related("session__item__query__dataset").filter(pk=round_id).first()
    if rnd is None or rnd.status != InteractiveRound.PENDING:
        return "missing" if rnd is None else rnd.status
    session = rnd.session
    rules = InteractiveSettings.from_dict(session.config)
    query = session.item.query
    history = list(session.rounds.filter(index__lte=rnd.index).order_by("index").values_list("reference_id", "text"))
    started = time.perf_counter()
    try:
        shown, rank = rank_turns(
            query, rules.retriever, history, positives(query), rules.strategy, rules.alpha, rules.top_n
        )
    except Exception as exc:  # stored on the round: the page says it, the annotator may retry
        logger.exception("interactive round %s failed", round_id)
        InteractiveRound.objects.filter(pk=round_id).update(status=InteractiveRound.FAILED, error=str(exc)[:2000])
        return InteractiveRound.FAILED
    took = (time.perf_counter() - started) * 1000
    with transaction.atomic():
        session = InteractiveSession.objects.select_for_update().get(pk=session.pk)
        done = InteractiveRound.objects.filter(pk=round_id, status=InteractiveRound.PENDING).update(
            status=InteractiveRound.DONE, shown=shown, target_rank=rank, rank_ms=took, ranked_at=timezone.now()
        )
        if done:
            ended = outcome(rank, rnd.index, rules)
            if ended:
                session.outcome = ended
                session.finished_at = timezone.now()
                session.save(update_fields=["outcome", "finished_at"])
                mark_done(Assignment.objects.select_related("study", "item").get(pk=session.assignment_id))
    return InteractiveRound.DONE


def retry_round(session: InteractiveSession) -> bool:
    """Send a failed last round again (the page's retry)."""
    last = session.rounds.order_by("-index").first()
    if last is None or last.status != InteractiveRound.FAILED:
        return False
    InteractiveRound.objects.filter(pk=last.pk).update(status=InteractiveRound.PENDING, error="")
    return send_round(last.pk)


def _target_view(image: Image | None, described: bool) -> dict:
    if image is None:
        return {}
    if described:
        extra = image.extra if isinstance(image.extra, dict) else {}
        return {"description": str(extra.get("description") or extra.get("caption") or "")}
    return {"image": image_ref(image)}


def session_state(session: InteractiveSession, user_id: int) -> dict:
    """What the annotator's page shows (blind: no rank, no label), and the images it may fetch."""
    rules = InteractiveSettings.from_dict(session.config)
    query = session.item.query
    rounds = list(session.rounds.order_by("index"))
    first = start_reference(query)
    wanted = positives(query)[:1]
    shown = {first, *(r.reference_id for r in rounds)}
    for r in rounds:
        shown.update(r.shown)
    images = Image.objects.in_bulk([*shown, *wanted])
    target = images.get(wanted[0]) if wanted else None
    data = {
        "session": session.pk,
        "top_n": rules.top_n,
        "max_rounds": rules.max_rounds,
        "target_view": rules.target_view,
        "target": _target_view(target, hides_target(session.config)),
        "start": image_ref(images.get(first)),
        "rounds": [
            {
                "index": r.index,
                "text": r.text,
                "reference": image_ref(images.get(r.reference_id), 256),
                "status": r.status,
                "error": r.error if r.status == InteractiveRound.FAILED else "",
                "shown": [image_ref(images.get(i), 256) for i in r.shown if i in images],
            }
            for r in rounds
        ],
        "ended": bool(session.outcome),
        "found": session.outcome == FOUND if session.outcome else None,
        # a pending round with no live worker on its queue waits for nothing: the page says so
        "no_worker": no_worker_message(rank_queue())
        if rounds and rounds[-1].status == InteractiveRound.PENDING
        else "",
    }
    if target is not None and not hides_target(session.config):
        shown.add(target.pk)
    grant_images(user_id, shown, session.study_id)
    return data


def session_summary(study) -> dict:
    """Staff's figures of an interactive study: sessions ended, found, going on; rounds ranked
    and their median re-ranking time on the workers."""
    import statistics

    sessions = InteractiveSession.objects.filter(study=study)
    times = list(
        InteractiveRound.objects.filter(session__study=study, status=InteractiveRound.DONE).values_list(
            "rank_ms", flat=True
        )
    )
    return {
        "ended": sessions.exclude(outcome="").count(),
        "found": sessions.filter(outcome=FOUND).count(),
        "open": sessions.filter(outcome="").count(),
        "rounds": len(times),
        "rank_ms": statistics.median(times) if times else None,
        "top_n": study.interactive.get("top_n"),
    }
