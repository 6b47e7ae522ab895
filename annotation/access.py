"""Which images an account may fetch: staff and researchers all; an annotator the images of
items served to them (references, targets, turn targets, the item's candidate panel),
the prefetched next item, and the example images of their studies' guidelines; and only
while they hold the annotator role and belong to that study
(:func:`annotation.permissions.membership`): a grant names its study and ends with it.

An interactive study that describes the target instead of showing it
(:func:`annotation.core.rounds.hides_target`) keeps its items' targets (and turn
targets) from their annotators: only the start reference and the candidates its rounds
showed are theirs to fetch. A target the annotator was shown legitimately elsewhere (among a
round's candidates, or in another study that shows it) stays fetchable.

The image view (``retrieval``) calls :func:`may_fetch_image` through the hook of
:mod:`retrieval.access`, which :meth:`annotation.apps.AnnotationConfig.ready` fills in, so the
corpus app imports nothing from this one."""

from __future__ import annotations

import re
from collections.abc import Iterable

from django.core.cache import cache
from django.db.models import Exists, OuterRef

from annotation import roles
from annotation.core.rounds import hides_target
from annotation.models import Assignment, InteractiveRound, Study
from annotation.permissions import membership

GRANT_SECONDS = 24 * 3600
GUIDELINE_IMAGE = re.compile(r"/images/(\d+)/")


def _key(user_id: int, image_id: int) -> str:
    return f"cirval:img:{user_id}:{image_id}"


def grant_images(user_id: int, image_ids: Iterable[int | None], study_id: int) -> None:
    """Remember that these images were shown to the user in ``study_id`` (served item, prefetch);
    the grant holds while the user is still an annotator of that study."""
    cache.set_many({_key(user_id, i): study_id for i in image_ids if i}, GRANT_SECONDS)


def payload_image_ids(payload: dict) -> list[int]:
    """Every image id an item payload shows."""
    q = payload.get("query") or {}
    refs = [t.get("reference") for t in q.get("turns", [])] + [t.get("next") for t in q.get("turns", [])]
    refs += list(q.get("targets") or []) + list(payload.get("panel") or [])
    return [r["id"] for r in refs if r]


def _served(user, image_id: int, blind: list[int]) -> bool:
    """An image of a query the user was given: any turn's reference, and its targets and turn
    targets outside the studies in ``blind`` (those that hide the target)."""
    from retrieval.models import Target, Turn

    assignments = _member_assignments(user)
    if Turn.objects.filter(reference_image_id=image_id, query_id__in=assignments.values("item__query_id")).exists():
        return True
    shown = assignments.exclude(study_id__in=blind).values("item__query_id")
    if Turn.objects.filter(turn_target_id=image_id, query_id__in=shown).exists():
        return True
    return Target.objects.filter(image_id=image_id, query_id__in=shown).exists()


def _blind_studies(user) -> list[int]:
    """The studies the user annotates that describe the target instead of showing it."""
    rows = Study.objects.filter(Exists(membership(user, OuterRef("pk")))).values_list("pk", "interactive")
    return [pk for pk, config in rows if hides_target(config)]


def _in_rounds(user, image_id: int) -> bool:
    """A candidate one of the user's interactive rounds showed them, or the one they picked."""
    rounds = InteractiveRound.objects.filter(session__assignment__in=_member_assignments(user))
    if rounds.filter(reference_id=image_id).exists():
        return True
    return any(
        image_id in (shown or [])
        for shown in rounds.filter(status=InteractiveRound.DONE).values_list("shown", flat=True).iterator()
    )


def _withheld(user, image_id: int, study_id: int) -> bool:
    """Whether the image is a target or turn target of an item the user plays in ``study_id``
    (a study hiding its targets) that no round of theirs showed them."""
    from retrieval.models import Target, Turn

    queries = _member_assignments(user).filter(study_id=study_id).values("item__query_id")
    target = (
        Target.objects.filter(image_id=image_id, query_id__in=queries).exists()
        or Turn.objects.filter(turn_target_id=image_id, query_id__in=queries).exists()
    )
    return target and not _in_rounds(user, image_id)


def _grant_holds(user, image_id: int, study_id: int) -> bool:
    """A remembered grant counts while the user annotates its study, unless that study hides
    this image from them (:func:`_withheld`); one query in the common case."""
    config = list(
        Study.objects.filter(pk=study_id)
        .filter(Exists(membership(user, OuterRef("pk"))))
        .values_list("interactive", flat=True)[:1]
    )
    return bool(config) and not (hides_target(config[0]) and _withheld(user, image_id, study_id))


def _in_guidelines(user, image_id: int) -> bool:
    for text in Study.objects.filter(Exists(membership(user, OuterRef("pk")))).values_list("guidelines", flat=True):
        if str(image_id) in GUIDELINE_IMAGE.findall(text or ""):
            return True
    return False


def _in_open_panel(user, image_id: int, blind: list[int]) -> bool:
    """The stored candidate panels of the items the user holds now (when the grant was lost),
    outside the studies that hide the target (their panels are never shown)."""
    held = _member_assignments(user).filter(status=Assignment.Status.RESERVED).exclude(study_id__in=blind)
    return any(image_id in (panel or []) for panel in held.values_list("item__candidates", flat=True)[:2])


def _member_assignments(user):
    """The user's assignments in the studies they still annotate."""
    return Assignment.objects.filter(annotator=user).filter(Exists(membership(user, OuterRef("study_id"))))


def may_fetch_image(user, image_id: int) -> bool:
    if roles.is_admin(user) or roles.is_researcher(user):
        return True
    if not (user.is_active and roles.is_annotator(user)):
        return False  # the role is gone: so are the grants
    granted = cache.get(_key(user.pk, image_id))
    if granted and _grant_holds(user, image_id, granted):
        return True
    blind = _blind_studies(user)
    return (
        _served(user, image_id, blind)
        or _in_rounds(user, image_id)
        or _in_guidelines(user, image_id)
        or _in_open_panel(user, image_id, blind)
    )
