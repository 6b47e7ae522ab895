"""THE keepers of a study's sizes: the columns ``Study.n_items``, ``n_agreement``,
``n_extra_slots`` and ``n_annotators`` (read by :func:`annotation.verdicts.state.study_sizes`).

"Next item" reads them with the study row it loads anyway, so no request counts a study's
items (issue 30: at a million items that count was a 120 ms scan, the 11th query of a
request once its cache expired). Every change keeps them in the transaction that makes it:

* items added: :func:`add_items` (``bulk_create``; study building, imports, benches); one item
  saved or deleted through the ORM (the admin): :func:`item_saved`, :func:`item_deleted`
  (signals, connected in ``annotation.apps``);
* an item's extra slots (adaptive overlap): :func:`shift` by the change, with the item row
  locked (:func:`annotation.verdicts.state.reopen_slots`);
* annotators added or removed, either side of the relation, or a member's account deleted:
  :func:`annotators_changed`, :func:`user_deleting`, :func:`user_deleted` (signals);
* anything written around the ORM (``QuerySet.update`` of ``agreement``, raw SQL):
  :func:`recount`, also ``manage.py recount_study_sizes``.

Increments are ``F()`` updates, so two writers never lose one another's; a recount locks the
study row first, so it sees every change committed before it (and later ones queue behind it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import transaction
from django.db.models import Count, F, Q, Sum

from annotation.models import Study, StudyItem

Members = Study.annotators.through


def fresh_sizes(study_id: int) -> dict[str, int]:
    """The sizes counted from the rows now (what the columns must equal)."""
    items = StudyItem.objects.filter(study_id=study_id).aggregate(
        n_items=Count("id"), n_agreement=Count("id", filter=Q(agreement=True)), n_extra_slots=Sum("extra_slots")
    )
    return {
        "n_items": items["n_items"],
        "n_agreement": items["n_agreement"],
        "n_extra_slots": items["n_extra_slots"] or 0,
        "n_annotators": Members.objects.filter(study_id=study_id).count(),
    }


def stored_sizes(study_id: int) -> dict[str, int]:
    """The sizes as the study row keeps them."""
    return Study.objects.filter(pk=study_id).values(*Study.SIZE_FIELDS).get()


def recount(study: Study | int, fields: Sequence[str] = Study.SIZE_FIELDS) -> dict[str, int]:
    """Count the study's sizes again from its rows and store them (the repair path). The study
    row is locked first, so the count sees every change committed before it. Returns the sizes;
    a ``Study`` given has them set too."""
    study_id = getattr(study, "pk", study)
    with transaction.atomic():
        if not list(Study.objects.select_for_update().filter(pk=study_id).values_list("pk", flat=True)):
            return {}
        sizes = {k: v for k, v in fresh_sizes(study_id).items() if k in fields}
        Study.objects.filter(pk=study_id).update(**sizes)
    if isinstance(study, Study):
        for name, value in sizes.items():
            setattr(study, name, value)
    return sizes


def shift(study: Study | int, items: int = 0, agreement: int = 0, extra: int = 0) -> None:
    """Add these changes to the study's sizes (``F()``: concurrent shifts all count); a
    ``Study`` given has them added in memory too."""
    by = {name: n for name, n in (("n_items", items), ("n_agreement", agreement), ("n_extra_slots", extra)) if n}
    if by:
        Study.objects.filter(pk=getattr(study, "pk", study)).update(**{name: F(name) + n for name, n in by.items()})
    if isinstance(study, Study):
        for name, n in by.items():
            setattr(study, name, getattr(study, name) + n)


def add_items(study: Study, items: Iterable[StudyItem], batch_size: int | None = None) -> list[StudyItem]:
    """``bulk_create`` the study's new items and count them, in one transaction."""
    items = list(items)
    with transaction.atomic():
        made = StudyItem.objects.bulk_create(items, batch_size=batch_size)
        shift(
            study, items=len(items), agreement=sum(i.agreement for i in items), extra=sum(i.extra_slots for i in items)
        )
    return made


# ------------------------------------------------------------------ signal receivers


def item_saved(sender, instance: StudyItem, created: bool, raw: bool = False, update_fields=None, **kwargs) -> None:
    """One item saved through the ORM: a new one is counted; a change that may touch its
    agreement flag or extra slots recounts those."""
    if raw:
        return
    if created:
        shift(instance.study_id, items=1, agreement=int(instance.agreement), extra=instance.extra_slots)
    elif update_fields is None or {"agreement", "extra_slots"} & set(update_fields):
        recount(instance.study_id, ("n_agreement", "n_extra_slots"))


def item_deleted(sender, instance: StudyItem, origin=None, **kwargs) -> None:
    """One item deleted through the ORM, unless with its study (nothing left to count)."""
    if isinstance(origin, Study) or getattr(origin, "model", None) is Study:
        return
    shift(instance.study_id, items=-1, agreement=-int(instance.agreement), extra=-instance.extra_slots)


def annotators_changed(sender, instance, action: str, reverse: bool, pk_set=None, **kwargs) -> None:
    """Annotators added, removed or cleared, from the study's side or the user's
    (``user.studies``): the studies touched count their annotators again."""
    if not action.startswith("post_"):
        if action == "pre_clear" and reverse:  # the user's studies, before they are gone
            instance._cirval_cleared_studies = list(
                Members.objects.filter(user_id=instance.pk).values_list("study_id", flat=True)
            )
        return
    if not reverse:
        studies = [instance]  # the copy in memory follows too
    elif action == "post_clear":
        studies = getattr(instance, "_cirval_cleared_studies", [])
    else:
        studies = sorted(pk_set or ())
    for study in studies:
        recount(study, ("n_annotators",))


def user_deleting(sender, instance, **kwargs) -> None:
    """A user about to be deleted: remember their studies (the membership rows go with them
    and send no signal)."""
    instance._cirval_member_of = list(Members.objects.filter(user_id=instance.pk).values_list("study_id", flat=True))


def user_deleted(sender, instance, **kwargs) -> None:
    for study_id in getattr(instance, "_cirval_member_of", []):
        recount(study_id, ("n_annotators",))
