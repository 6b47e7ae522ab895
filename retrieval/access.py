"""Who may fetch an image: a hook the corpus app defines and an app above it fills in.

The image view (:func:`retrieval.views.image`) asks :func:`may_fetch`. The rule itself
belongs to the annotation app (annotators see only the images of what they were served:
:func:`annotation.access.may_fetch_image`), which registers it with :func:`set_image_access`
when it is ready (:meth:`annotation.apps.AnnotationConfig.ready`). Imports thus keep
running ``annotation -> retrieval``, where ``lint-imports`` (``.importlinter``) sees them; no
setting names a function by string. Without a registered rule (the corpus app on its own,
whose pages are for staff and researchers) every image may be fetched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ImageAccessRule = Callable[[Any, int], bool]

_rule: ImageAccessRule | None = None


def set_image_access(rule: ImageAccessRule | None) -> None:
    """Register the rule ``rule(user, image_id) -> bool`` (None removes it)."""
    global _rule
    _rule = rule


def image_access() -> ImageAccessRule | None:
    """The registered rule, or None."""
    return _rule


def may_fetch(user: Any, image_id: int) -> bool:
    """Whether ``user`` may fetch the image ``image_id`` under the registered rule."""
    return _rule(user, image_id) if _rule is not None else True
