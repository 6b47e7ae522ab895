"""Which gallery images fit a demo query, and how many of them a candidate pool holds.

Pure: no Django (:mod:`retrieval.demo` only). The demo world (:mod:`retrieval.demo`) knows
every image's scene and every query's edit, so "fits" is exact there:

* ``composition`` and ``image_only``: the scene the edit gives (``apply_edit(reference,
  edit)``); a colour edit named by a family ("a warm colour") fits with every colour of the
  family but the object's own;
* ``too_broad``: the text leaves the new colour (or background) open, so every scene that is
  the reference with *that object's colour* (or the background) changed to any other value fits;
  the demo's planted ones leave the object open too (:func:`retrieval.demo.broad_options`):
  every scene with any one object recoloured fits;
* ``wrong_target``: the text describes another edit than the labelled one: the scene of the
  text's edit fits (the labelled target does not);
* ``text_only``: the text describes the whole target scene: that scene;
* ``vague``: the text asks for nothing concrete: nothing fits.

An image fits when its scene equals one of those scenes. :func:`pool_recall` then counts, per
planted kind and in all, how many of the fitting images *other than the labelled targets and
the reference* (the ones a candidate panel may show: it never shows those) the pool holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from retrieval.demo import BACKGROUNDS, COLOUR_FAMILIES, COLOURS, apply_edit, broad_options, scene_key

Scene = dict[str, Any]


def fitting_scene_keys(truth: Mapping[str, Any], scenes: Mapping[str, Scene]) -> set[str]:
    """The scene keys (:func:`retrieval.demo.scene_key`) that fit one single-turn demo query.

    ``truth``: the query's entry in the demo's truth file (``kind``, ``edit``, ``reference``,
    ``targets``, ``text_edit``); ``scenes``: image external id -> scene (the images'
    ``extra["scene"]``), read for the reference and the targets."""
    kind = truth.get("kind")
    ref = scenes.get(truth.get("reference"))
    edit = truth.get("edit")
    if kind == "text_only":
        return {scene_key(scenes[t]) for t in truth.get("targets", [])[:1] if t in scenes}
    if ref is None or kind not in ("composition", "image_only", "too_broad", "wrong_target"):
        return set()  # vague, sessions, unknown kinds: nothing concrete is asked for
    if kind == "wrong_target":
        edit = truth.get("text_edit")
    if not edit:
        return set()
    if kind == "too_broad" and edit.get("any_object"):  # which object and its colour both left open
        return {scene_key(s) for s in broad_options(ref, edit)}
    if kind == "too_broad":
        values = BACKGROUNDS if edit["type"] == "background" else COLOURS
        return {scene_key(apply_edit(ref, {**edit, "to": v})) for v in values if v != edit["from"]}
    if edit["type"] == "colour" and edit.get("family"):
        return {
            scene_key(apply_edit(ref, {**edit, "to": c})) for c in COLOUR_FAMILIES[edit["family"]] if c != edit["from"]
        }
    return {scene_key(apply_edit(ref, edit))}


def fitting_images(truth: Mapping[str, Any], scenes: Mapping[str, Scene]) -> set[str]:
    """Every gallery image (external id, a key of ``scenes``) that fits the query:
    :func:`fitting_scene_keys`, matched by scene."""
    wanted = fitting_scene_keys(truth, scenes)
    return {image for image, scene in scenes.items() if scene_key(scene) in wanted} if wanted else set()


def other_fitting_images(truth: Mapping[str, Any], scenes: Mapping[str, Scene]) -> set[str]:
    """:func:`fitting_images` minus the labelled targets and the reference: the fitting images a
    candidate panel can show (it never shows those)."""
    return fitting_images(truth, scenes) - set(truth.get("targets", [])) - {truth.get("reference")}


def _ratio(hits: int, total: int) -> float | None:
    return hits / total if total else None


def pool_recall(
    truth_queries: Mapping[str, Mapping[str, Any]], scenes: Mapping[str, Scene], pools: Mapping[str, Iterable[str]]
) -> dict[str, Any]:
    """How many of the other fitting images (:func:`other_fitting_images`) the pools hold.

    ``pools``: query external id -> the image external ids of its candidate pool; only those
    queries take part. Returns ``{"fitting", "found", "recall", "queries", "by_kind": {kind:
    {"queries", "fitting", "found", "recall"}}}``; ``recall`` = found / fitting summed over the
    queries (``None`` when nothing fits)."""
    by_kind: dict[str, dict[str, Any]] = {}
    for qid, pool in pools.items():
        truth = truth_queries.get(qid)
        if truth is None:
            continue
        fits = other_fitting_images(truth, scenes)
        row = by_kind.setdefault(truth.get("kind", "?"), {"queries": 0, "fitting": 0, "found": 0})
        row["queries"] += 1
        row["fitting"] += len(fits)
        row["found"] += len(fits & set(pool))
    for row in by_kind.values():
        row["recall"] = _ratio(row["found"], row["fitting"])
    fitting = sum(r["fitting"] for r in by_kind.values())
    found = sum(r["found"] for r in by_kind.values())
    return {
        "queries": sum(r["queries"] for r in by_kind.values()),
        "fitting": fitting,
        "found": found,
        "recall": _ratio(found, fitting),
        "by_kind": dict(sorted(by_kind.items())),
    }
