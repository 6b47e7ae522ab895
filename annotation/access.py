"""Which images an account may fetch: staff and researchers all; an annotator the images of
items served to them (references, targets, turn targets, the item's candidate panel),
the prefetched next item, and the example images of their studies' guidelines.

The image view (``retrieval``) calls :func:`may_fetch_image` through the hook of
:mod:`retrieval.access`, which :meth:`annotation.apps.AnnotationConfig.ready` fills in, so the
corpus app imports nothing from this one."""
from __future__ import annotations

import re
from collections.abc import Iterable

from django.core.cache import cache
from django.db.models import Q

from annotation import roles
from annotation.models import Assignment, Study

GRANT_SECONDS = 24 * 3600
GUIDELINE_IMAGE = re.compile(r"/images/(\d+)/")


def _key(user_id: int, image_id: int) -> str:
    return f"cirval:img:{user_id}:{image_id}"


def grant_images(user_id: int, image_ids: Iterable[int | None]) -> None:
    """Remember that these images were shown to the user (served item, prefetch)."""
    cache.set_many({_key(user_id, i): 1 for i in image_ids if i}, GRANT_SECONDS)


def payload_image_ids(payload: dict) -> list[int]:
    """Every image id an item payload shows."""
    q = payload.get("query") or {}
    refs = [t.get("reference") for t in q.get("turns", [])] + [t.get("next") for t in q.get("turns", [])]
    refs += list(q.get("targets") or []) + list(payload.get("panel") or [])
    return [r["id"] for r in refs if r]


def _served(user, image_id: int) -> bool:
    from retrieval.models import Target, Turn

    queries = Assignment.objects.filter(annotator=user).values("item__query_id")
    if Turn.objects.filter(Q(reference_image_id=image_id) | Q(turn_target_id=image_id), query_id__in=queries).exists():
        return True
    return Target.objects.filter(image_id=image_id, query_id__in=queries).exists()


def _in_guidelines(user, image_id: int) -> bool:
    for text in Study.objects.filter(annotators=user).values_list("guidelines", flat=True):
        if str(image_id) in GUIDELINE_IMAGE.findall(text or ""):
            return True
    return False


def _in_open_panel(user, image_id: int) -> bool:
    """The stored candidate panels of the items the user holds now (when the grant was lost)."""
    held = Assignment.objects.filter(annotator=user, status=Assignment.Status.RESERVED).values_list(
        "item__candidates", flat=True)[:2]
    return any(image_id in (panel or []) for panel in held)


def may_fetch_image(user, image_id: int) -> bool:
    if roles.is_admin(user) or roles.is_researcher(user):
        return True
    if cache.get(_key(user.pk, image_id)):
        return True
    return _served(user, image_id) or _in_guidelines(user, image_id) or _in_open_panel(user, image_id)
