"""Which images a query searches: THE gallery rule (one function for every caller).

Each benchmark defines its own search space, and the importers store it as gallery entries
under a *gallery key* (``GalleryEntry.split``):

* CIRR, LaSCo, M-BEIR, CIRCO (once its COCO gallery is imported): the split, e.g. ``val``;
* FashionIQ and Multi-turn FashionIQ: one gallery per category, ``"<category>/<split>"``
  (``dress/val`` holds dress's 3,817 val images, not the 15,415 of the three categories),
  which is CLIP4Cir's protocol (``split.<category>.<split>.json``).

:func:`search_key` is the rule: a query searches the gallery its importer named
(``Query.extra['gallery']``), else ``"<category>/<split>"``, else its split, the first of
these that holds entries; when none does, it searches every image of its dataset (the key
is then ``None``). The audit's planning and ranking, the on-demand ranking of the candidate
panels, the panels' padding and the session scoring all call :func:`query_gallery_keys` and
:func:`gallery_image_ids`; nothing else decides it.

Audit *scopes* (``run_audit --split``) use the same keys: ``val`` (every category of the
split), ``dress/val`` (one category of it) or ``dress`` (one category, of the dataset's only
split): :func:`parse_scope`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from .models import Dataset, GalleryEntry, Image, Query

#: The key of "every image of the dataset" (the query's split and category have no gallery).
ALL_IMAGES = None


def search_key(split: str, category: str = "", named: str | None = None, keys: Collection[str] = ()) -> str | None:
    """The gallery key a query of ``split``/``category`` searches, given the dataset's stored
    gallery ``keys`` and the key its importer ``named`` (pure: the rule itself)."""
    for key in (named, f"{category}/{split}" if category and split else None, split or None):
        if key and key in keys:
            return key
    return ALL_IMAGES


def gallery_keys(dataset_id: int) -> set[str]:
    """The gallery keys the dataset has entries for."""
    return set(GalleryEntry.objects.filter(dataset_id=dataset_id).order_by().values_list("split", flat=True).distinct())


#: Formats whose benchmark searches one gallery for every split (CIRCO: COCO unlabeled2017 for
#: val and test), so that their splits sharing every image of the dataset is the protocol.
SHARED_GALLERY_FORMATS = frozenset({"circo"})


def mixed_fallback(dataset_id: int, queries: Any) -> list[str]:
    """The scopes (:func:`scope_text`) among ``queries`` whose queries have no gallery of their
    own (:func:`search_key` gives :data:`ALL_IMAGES`: they search every image of the dataset),
    when the dataset's queries span several scopes, so that such a search mixes the other
    scopes' images in (FashionIQ's categories imported without their split files, CIRCLED's
    subsets); ``[]`` otherwise, and for :data:`SHARED_GALLERY_FORMATS`."""
    if Dataset.objects.filter(pk=dataset_id, format__in=SHARED_GALLERY_FORMATS).exists():
        return []
    scopes = Query.objects.filter(dataset_id=dataset_id).order_by().values_list("split", "category").distinct()
    if len(scopes[:2]) < 2:
        return []
    rows = set(queries.order_by().values_list("split", "category", "extra__gallery").distinct())
    keys = gallery_keys(dataset_id)
    return sorted(
        {
            scope_text(split, category)
            for split, category, named in rows
            if search_key(split, category, named if isinstance(named, str) else None, keys) is ALL_IMAGES
        }
    )


def mixed_fallback_text(scopes: Collection[str]) -> str:
    """What :func:`mixed_fallback`'s scopes mean, and what to do about it."""
    shown = ", ".join(list(scopes)[:6]) + ("…" if len(scopes) > 6 else "")
    return (
        f"the queries of {shown} have no gallery of their own and search every image of the dataset, "
        f"the other scopes' images included; the benchmark ranks each against its own gallery: import it "
        f"(the split file, e.g. split.<category>.<split>.json, or import_gallery --split <category>/<split>)"
    )


def query_gallery_keys(query_ids: Iterable[int] | Any, dataset_id: int | None = None) -> dict[int, str | None]:
    """Query id -> :func:`search_key` of each query (``None``: every image of its dataset)."""
    rows = list(Query.objects.filter(pk__in=query_ids).values_list("pk", "dataset_id", "split", "category", "extra"))
    keys_of: dict[int, set[str]] = {}
    out: dict[int, str | None] = {}
    for qid, ds, split, category, extra in rows:
        if ds not in keys_of:
            keys_of[ds] = gallery_keys(ds)
        out[qid] = search_key(split, category, (extra or {}).get("gallery"), keys_of[ds])
    return out


def gallery_image_ids(dataset_id: int, key: str | None, order: str = "ordinal", readable: bool = False) -> list[int]:
    """The image ids of gallery ``key`` (every image of the dataset for ``None``), in gallery
    order (``order="id"``: by image id), each once; ``readable``: only images with a file
    (not missing, with a path and a sha256), the ones an audit can encode."""
    if key is ALL_IMAGES:
        images = Image.objects.filter(dataset_id=dataset_id)
        if readable:
            images = images.filter(missing=False).exclude(sha256="").exclude(path="")
        return list(images.order_by("id").values_list("id", flat=True))
    entries = GalleryEntry.objects.filter(dataset_id=dataset_id, split=key)
    if readable:
        entries = entries.filter(image__missing=False).exclude(image__sha256="").exclude(image__path="")
    ordering = ("image_id",) if order == "id" else ("ordinal", "image_id")
    return list(dict.fromkeys(entries.order_by(*ordering).values_list("image_id", flat=True)))


def query_gallery(query: Query) -> list[int]:
    """The image ids the query searches, by image id (the panels' padding and the on-demand
    ranking): its gallery's entries, or the dataset's images not marked missing when it has none."""
    key = query_gallery_keys([query.pk])[query.pk]
    if key is ALL_IMAGES:
        return list(
            Image.objects.filter(dataset_id=query.dataset_id, missing=False).order_by("id").values_list("id", flat=True)
        )
    return gallery_image_ids(query.dataset_id, key, order="id")


# ---------------------------------------------------------------------------- audit scopes


class ScopeError(ValueError):
    """An audit scope that names no split or category of the dataset."""


def parse_scope(scope: str | None, splits: Collection[str], categories: Collection[str]) -> tuple[str, str]:
    """``(split, category)`` of an audit scope: ``"val"``, ``"dress/val"`` or ``"dress"``
    (``category`` empty: every category). ``splits`` and ``categories`` are the dataset's."""
    text = (scope or "").strip()
    shown = ", ".join(sorted(splits)) or "none"
    if "/" in text:
        category, _, split = text.partition("/")
        if split not in splits:
            raise ScopeError(f"no split {split!r} (splits: {shown})")
        if category not in categories:
            raise ScopeError(
                f"no category {category!r} (categories: {', '.join(sorted(c for c in categories if c)) or 'none'})"
            )
        return split, category
    if text in splits:
        return text, ""
    if text and text in categories:
        if len(splits) != 1:
            raise ScopeError(
                f"category {text!r} is in several splits ({shown}); name one, e.g. {text}/{sorted(splits)[0]}"
            )
        return next(iter(splits)), text
    if text:
        raise ScopeError(f"no split or category {text!r} (splits: {shown})")
    if len(splits) != 1:
        raise ScopeError(f"several splits ({shown}); choose one")
    return next(iter(splits)), ""


def scope_text(split: str, category: str) -> str:
    """The stored form of a scope (``AuditRun.split``): ``val`` or ``dress/val``."""
    return f"{category}/{split}" if category else split


def split_of_scope(scope: str) -> tuple[str, str]:
    """``(split, category)`` of a stored scope (:func:`scope_text`)."""
    category, _, split = scope.rpartition("/")
    return split, category
