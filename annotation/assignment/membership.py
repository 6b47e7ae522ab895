"""What a change of a study's annotators does to its leases: an annotator removed from a study
(from either side of the membership, by the room, the API or the admin) gives back every item
they hold at once. A removed annotator can no longer submit, so their lease would only block
the item's slot until it ran out (``Study.lease_minutes``, 10 by default)."""

from __future__ import annotations

from annotation.assignment.queue import release_held
from annotation.models import Study

Members = Study.annotators.through


def members_removed(sender, instance, action: str, reverse: bool, pk_set=None, **kwargs) -> None:
    """``m2m_changed`` of ``Study.annotators``: after a remove or a clear, release the leases of
    each (study, annotator) pair that left. ``reverse``: the change came from the user's side."""
    if action == "pre_clear":  # who is about to go: a clear sends no pk_set
        mine = {"user_id": instance.pk} if reverse else {"study_id": instance.pk}
        instance._cirval_leaving = list(
            Members.objects.filter(**mine).values_list("study_id" if reverse else "user_id", flat=True)
        )
        return
    if action == "post_remove":
        others = sorted(pk_set or ())
    elif action == "post_clear":
        others = getattr(instance, "_cirval_leaving", [])
    else:
        return
    for other in others:
        study_id, user_id = (other, instance.pk) if reverse else (instance.pk, other)
        release_held(study_id, user_id)
