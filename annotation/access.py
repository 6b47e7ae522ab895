"""Which images an account may fetch: staff and researchers all; an annotator the images of
items served to them (references, targets, turn targets, the item's candidate panel),
the prefetched next item, and the example images of their studies' guidelines; and only
while they hold the annotator role and belong to that study
(:func:`annotation.permissions.membership`): a grant names its study and ends with it.

The image view (``retrieval``) calls :func:`may_fetch_image` through the hook of
:mod:`retrieval.access`, which :meth:`annotation.apps.AnnotationConfig.ready` fills in, so the
corpus app imports nothing from this one."""
from __future__ import annotations

import re
from collections.abc import Iterable

from django.core.cache import cache
from django.db.models import Exists, OuterRef, Q

from annotation import roles
from annotation.models import Assignment, Study
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


def _served(user, image_id: int) -> bool:
    from retrieval.models import Target, Turn

    queries = _member_assignments(user).values("item__query_id")
    if Turn.objects.filter(Q(reference_image_id=image_id) | Q(turn_target_id=image_id), query_id__in=queries).exists():
        return True
    return Target.objects.filter(image_id=image_id, query_id__in=queries).exists()


def _in_guidelines(user, image_id: int) -> bool:
    for text in Study.objects.filter(Exists(membership(user, OuterRef("pk")))).values_list("guidelines", flat=True):
        if str(image_id) in GUIDELINE_IMAGE.findall(text or ""):
            return True
    return False


def _in_open_panel(user, image_id: int) -> bool:
    """The stored candidate panels of the items the user holds now (when the grant was lost)."""
    held = _member_assignments(user).filter(status=Assignment.Status.RESERVED).values_list(
        "item__candidates", flat=True)[:2]
    return any(image_id in (panel or []) for panel in held)


def _member_assignments(user):
    """The user's assignments in the studies they still annotate."""
    return Assignment.objects.filter(annotator=user).filter(Exists(membership(user, OuterRef("study_id"))))


def may_fetch_image(user, image_id: int) -> bool:
    if roles.is_admin(user) or roles.is_researcher(user):
        return True
    if not (user.is_active and roles.is_annotator(user)):
        return False  # the role is gone: so are the grants
    granted = cache.get(_key(user.pk, image_id))
    if granted and membership(user, granted).exists():
        return True
    return _served(user, image_id) or _in_guidelines(user, image_id) or _in_open_panel(user, image_id)
