"""A deterministic synthetic CIR "demo world": coloured shapes on plain backgrounds.

Pure Python (Pillow, stdlib; no Django). :func:`build_demo` writes a gallery of PNG
images and returns normalised records (format ``"demo"``) with single-turn queries and
multi-turn sessions whose targets are known exactly, so the whole pipeline (import,
audit, annotation, export) can be exercised without any public dataset.

A *scene* is a JSON-serialisable dict::

    {"background": "white",
     "objects": [{"shape": "circle", "colour": "red", "size": "large", "count": 2}, ...]}

with 1-4 objects, at most one object per shape (so "the circle" is never ambiguous),
objects kept in the fixed order of :data:`SHAPES`, and at most :data:`MAX_INSTANCES`
drawn shapes in all. An *edit* is a dict ``{"type", "object", "from", "to"}``:

==========  ===================  ==========================  ==========================
type        object               from                        to
==========  ===================  ==========================  ==========================
colour      shape edited         old colour                  new colour
shape       old shape            old shape                   new shape
count       shape edited         old count                   new count
size        shape edited         old size                    new size
background  ``None``             old background              new background
remove      shape removed        the removed object (dict)   ``None``
add         shape added          ``None``                    the added object (dict)
==========  ===================  ==========================  ==========================

A colour edit described by a colour family ("make the circle a warm colour") also has
``"alternatives"``: the other colours of the family, each the colour of one more
ground-truth image. :func:`apply_edit` applies an edit; every unflawed query's target
scene is ``apply_edit(reference scene, extra["edit"])``.

About 10% of single-turn queries and a few sessions are deliberately flawed, for human
validation to find; the flaw is named in ``QueryRecord.extra["demo_flaw"]`` (absent on
clean queries), never in the text or ``raw``:

* ``"vague"``: the text says nothing concrete ("make it better");
* ``"mismatch"``: the text describes another edit (``extra["text_edit"]``) than the one
  that leads to the target (``extra["edit"]``);
* ``"identical"``: the target is the reference image itself (``extra["edit"]`` is None);
* ``"circle"`` (session): the turn ``extra["demo_flaw_turn"]`` returns to an earlier image;
* ``"redundant"`` (session): the turn ``extra["demo_flaw_turn"]`` repeats the previous
  turn's text verbatim and changes nothing (its turn target is its reference);
* ``"noop"``, ``"duplicate"``, ``"conflict"`` (session): see :data:`SESSION_FLAWS`.

A few clean sessions also have a FashionMT-style retrospective turn (:data:`RETRO_KINDS`):
"go back to turn 2 and ..." (rollback) or "keep the background in the first turn and ..."
(combination); the truth names each turn's effective reference turns.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from retrieval.records import ImageRecord, ParsedDataset, QueryRecord, TargetRecord, TextRecord, TurnRecord

Scene = dict[str, Any]
Edit = dict[str, Any]

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "diamond", "cross")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 165, 70),
    "blue": (40, 90, 220),
    "yellow": (250, 210, 40),
    "purple": (140, 60, 190),
    "orange": (250, 135, 30),
    "black": (25, 25, 25),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "white": (250, 250, 250),
    "grey": (165, 165, 165),
    "sky blue": (150, 200, 245),
    "sand": (232, 208, 160),
    "dark green": (30, 90, 50),
    "pink": (245, 190, 205),
}
SIZES: tuple[str, ...] = ("small", "large")
MAX_COUNT = 3
MAX_OBJECTS = 4
MAX_INSTANCES = 8
#: (object colour, background) pairs too close to read; no scene uses them.
LOW_CONTRAST: frozenset[tuple[str, str]] = frozenset(
    {("black", "dark green"), ("green", "dark green"), ("yellow", "sand"), ("orange", "sand")}
)
#: Colour families used by the multi-target colour edits.
COLOUR_FAMILIES: dict[str, tuple[str, ...]] = {
    "warm": ("red", "orange", "yellow"),
    "cool": ("blue", "green", "purple"),
}
EDIT_TYPES: tuple[str, ...] = ("colour", "shape", "count", "size", "background", "remove", "add")

_PLURALS = {"cross": "crosses"}
_NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}
_SUPERSAMPLE = 4
_FLAW_SHARE = 0.10
DEFAULT_GALLERY = 900


# ---------------------------------------------------------------------------- scenes


def scene_key(scene: Scene) -> str:
    """Canonical JSON text of a scene: equal scenes have equal keys."""
    return json.dumps(scene, sort_keys=True, separators=(",", ":"))


def _canonical(scene: Scene) -> Scene:
    objects = sorted((dict(o) for o in scene["objects"]), key=lambda o: SHAPES.index(o["shape"]))
    return {"background": scene["background"], "objects": objects}


def scene_ok(scene: Scene) -> bool:
    """True when a scene obeys the world's rules (shapes unique, readable, not crowded)."""
    objects = scene["objects"]
    shapes = [o["shape"] for o in objects]
    if not 1 <= len(objects) <= MAX_OBJECTS or len(set(shapes)) != len(shapes):
        return False
    if sum(o["count"] for o in objects) > MAX_INSTANCES:
        return False
    for o in objects:
        if not 1 <= o["count"] <= MAX_COUNT or (o["colour"], scene["background"]) in LOW_CONTRAST:
            return False
    return True


def _plural(shape: str) -> str:
    return _PLURALS.get(shape, shape + "s")


def _noun(shape: str, count: int) -> str:
    return shape if count == 1 else _plural(shape)


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def describe_object(obj: dict[str, Any]) -> str:
    """'a large red circle', 'two small blue stars'."""
    words = f"{obj['size']} {obj['colour']} {_noun(obj['shape'], obj['count'])}"
    return _a(words) if obj["count"] == 1 else f"{_NUMBER_WORDS[obj['count']]} {words}"


def describe_scene(scene: Scene) -> str:
    """Plain English description, e.g. 'two large red circles and a small blue star on a white background'."""
    parts = [describe_object(o) for o in scene["objects"]]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"{listed} on {_a(scene['background'])} background"


def _random_object(rng: random.Random, shape: str) -> dict[str, Any]:
    return {
        "shape": shape,
        "colour": rng.choice(list(COLOURS)),
        "size": rng.choice(SIZES),
        "count": rng.choices((1, 2, 3), weights=(6, 3, 1))[0],
    }


def random_scene(rng: random.Random) -> Scene:
    """A random valid scene."""
    while True:
        n = rng.choices((1, 2, 3, 4), weights=(3, 4, 3, 1))[0]
        shapes = rng.sample(SHAPES, n)
        scene = _canonical(
            {"background": rng.choice(list(BACKGROUNDS)), "objects": [_random_object(rng, s) for s in shapes]}
        )
        if scene_ok(scene):
            return scene


# ---------------------------------------------------------------------------- edits


def _find(scene: Scene, shape: str) -> dict[str, Any]:
    for o in scene["objects"]:
        if o["shape"] == shape:
            return o
    raise KeyError(f"no {shape} in scene")


def apply_edit(scene: Scene, edit: Edit) -> Scene:
    """Return the scene with the edit applied (the input is not changed)."""
    new = copy.deepcopy(scene)
    kind = edit["type"]
    if kind == "background":
        new["background"] = edit["to"]
    elif kind == "remove":
        new["objects"] = [o for o in new["objects"] if o["shape"] != edit["object"]]
    elif kind == "add":
        new["objects"].append(dict(edit["to"]))
    else:
        obj = _find(new, edit["object"])
        field = {"colour": "colour", "shape": "shape", "count": "count", "size": "size"}[kind]
        obj[field] = edit["to"]
    return _canonical(new)


def invert_edit(scene: Scene, edit: Edit) -> Edit:
    """The edit that undoes ``edit`` applied to ``scene``."""
    kind = edit["type"]
    if kind == "remove":
        return {"type": "add", "object": edit["object"], "from": None, "to": dict(edit["from"])}
    if kind == "add":
        return {"type": "remove", "object": edit["object"], "from": dict(edit["to"]), "to": None}
    obj = None if kind == "background" else (edit["to"] if kind == "shape" else edit["object"])
    return {"type": kind, "object": obj, "from": edit["to"], "to": edit["from"]}


def _colour_candidates(scene: Scene, rng: random.Random) -> list[Edit]:
    bg = scene["background"]
    return [
        {"type": "colour", "object": o["shape"], "from": o["colour"], "to": c}
        for o in scene["objects"]
        for c in COLOURS
        if c != o["colour"] and (c, bg) not in LOW_CONTRAST
    ]


def _shape_candidates(scene: Scene, rng: random.Random) -> list[Edit]:
    shapes = [o["shape"] for o in scene["objects"]]
    return [
        {"type": "shape", "object": o["shape"], "from": o["shape"], "to": s}
        for o in scene["objects"]
        for s in SHAPES
        if s not in shapes
    ]


def _count_candidates(scene: Scene, rng: random.Random) -> list[Edit]:
    total = sum(o["count"] for o in scene["objects"])
    return [
        {"type": "count", "object": o["shape"], "from": o["count"], "to": n}
        for o in scene["objects"]
        for n in range(1, MAX_COUNT + 1)
        if n != o["count"] and total - o["count"] + n <= MAX_INSTANCES
    ]


def _size_candidates(scene: Scene, rng: random.Random) -> list[Edit]:
    return [
        {"type": "size", "object": o["shape"], "from": o["size"], "to": "small" if o["size"] == "large" else "large"}
        for o in scene["objects"]
    ]


def _background_candidates(scene: Scene, rng: random.Random) -> list[Edit]:
    bg = scene["background"]
    colours = {o["colour"] for o in scene["objects"]}
    return [
        {"type": "background", "object": None, "from": bg, "to": b}
        for b in BACKGROUNDS
        if b != bg and not any((c, b) in LOW_CONTRAST for c in colours)
    ]


def _remove_candidates(scene: Scene, rng: random.Random) -> list[Edit]:
    objects = scene["objects"]
    if len(objects) <= 1:
        return []
    return [{"type": "remove", "object": o["shape"], "from": dict(o), "to": None} for o in objects]


def _add_candidates(scene: Scene, rng: random.Random) -> list[Edit]:
    """One fitting random object per missing shape (three tries each)."""
    objects = scene["objects"]
    if len(objects) >= MAX_OBJECTS:
        return []
    shapes = [o["shape"] for o in objects]
    total = sum(o["count"] for o in objects)
    candidates: list[Edit] = []
    for s in SHAPES:
        if s in shapes:
            continue
        for _ in range(3):
            obj = _random_object(rng, s)
            if total + obj["count"] <= MAX_INSTANCES and (obj["colour"], scene["background"]) not in LOW_CONTRAST:
                candidates.append({"type": "add", "object": s, "from": None, "to": obj})
                break
    return candidates


_EDIT_CANDIDATES = {
    "colour": _colour_candidates,
    "shape": _shape_candidates,
    "count": _count_candidates,
    "size": _size_candidates,
    "background": _background_candidates,
    "remove": _remove_candidates,
    "add": _add_candidates,
}


def propose_edit(scene: Scene, kind: str, rng: random.Random) -> Edit | None:
    """A random edit of the given type that keeps the scene valid, or None if none fits."""
    if kind not in _EDIT_CANDIDATES:
        raise ValueError(f"unknown edit type {kind!r}")
    candidates = _EDIT_CANDIDATES[kind](scene, rng)
    return rng.choice(candidates) if candidates else None


def _family_edit(scene: Scene, rng: random.Random) -> tuple[Edit, list[str]] | None:
    """A colour edit named by a colour family, and every colour of the family that fits."""
    options = []
    for o in scene["objects"]:
        for family, members in COLOUR_FAMILIES.items():
            fits = [c for c in members if c != o["colour"] and (c, scene["background"]) not in LOW_CONTRAST]
            if o["colour"] not in members and len(fits) >= 2:
                options.append((o, family, fits))
    if not options:
        return None
    o, family, fits = rng.choice(options)
    fits = list(fits)
    rng.shuffle(fits)
    edit = {
        "type": "colour",
        "object": o["shape"],
        "from": o["colour"],
        "to": fits[0],
        "family": family,
        "alternatives": fits[1:],
    }
    return edit, fits


# ---------------------------------------------------------------------------- texts


def _the(obj: dict[str, Any], rng: random.Random) -> str:
    """'the red circle', 'the circles' (shapes are unique, so the shape alone is enough)."""
    noun = _noun(obj["shape"], obj["count"])
    return f"the {obj['colour']} {noun}" if rng.random() < 0.7 else f"the {noun}"


def describe_edit(scene: Scene, edit: Edit, rng: random.Random) -> str:
    """A natural English modification text for an edit of ``scene`` (several templates a type)."""
    kind = edit["type"]
    obj = None if kind in ("background", "add") else _find(scene, edit["object"])
    if kind == "colour" and "family" in edit:
        the = _the(obj, rng)
        fam = edit["family"]
        return rng.choice(
            [
                f"make {the} a {fam} colour",
                f"give {the} a {fam} colour instead",
                f"{the} should be in a {fam} colour",
                f"recolour {the} with any {fam} colour",
            ]
        )
    if kind == "colour":
        the, to = _the(obj, rng), edit["to"]
        verb = "is" if obj["count"] == 1 else "are"
        return rng.choice(
            [
                f"make {the} {to}",
                f"change the colour of {the} to {to}",
                f"turn {the} {to}",
                f"{the} should be {to}",
                f"paint {the} {to} instead",
                f"same picture but {the} {verb} {to}",
            ]
        )
    if kind == "shape":
        the, n = _the(obj, rng), obj["count"]
        new = _noun(edit["to"], n)
        new_a = _a(new) if n == 1 else new
        coloured = _a(f"{obj['colour']} {new}") if n == 1 else f"{obj['colour']} {new}"
        return rng.choice(
            [
                f"change {the} to {new_a}",
                f"replace {the} with {coloured}",
                f"turn {the} into {new_a}",
                f"use {new} instead of {_noun(edit['from'], n)}",
                f"swap {the} for {new_a} of the same colour",
            ]
        )
    if kind == "count":
        shape, old, n = obj["shape"], edit["from"], edit["to"]
        options = [
            f"make it {_NUMBER_WORDS[n]} {_noun(shape, n)}",
            f"there should be {'only one ' + shape if n == 1 else _NUMBER_WORDS[n] + ' ' + _plural(shape)}",
            f"change the number of {_plural(shape)} to {_NUMBER_WORDS[n]}",
        ]
        if n == old + 1:
            options += [f"add one more {shape}", f"add another {obj['colour']} {shape}", f"put one more {shape} in"]
        if n == old - 1:
            options += [f"remove one of the {_plural(shape)}", f"take away one {shape}", f"one {shape} fewer"]
        return rng.choice(options)
    if kind == "size":
        the = _the(obj, rng)
        verb = "is" if obj["count"] == 1 else "are"
        if edit["to"] == "large":
            return rng.choice([f"make {the} bigger", f"enlarge {the}", f"{the} should be larger", f"make {the} large"])
        return rng.choice(
            [f"make {the} smaller", f"shrink {the}", f"{the} should be small", f"same picture but {the} {verb} tiny"]
        )
    if kind == "background":
        to = edit["to"]
        return rng.choice(
            [
                f"put it on {_a(to)} background",
                f"change the background to {to}",
                f"make the background {to}",
                f"use {_a(to)} background instead of the {edit['from']} one",
                f"same shapes, but on {to}",
            ]
        )
    if kind == "remove":
        the = _the(obj, rng)
        return rng.choice(
            [
                f"remove {the}",
                f"take away {the}",
                f"get rid of {the}",
                f"delete {the}",
                f"the same picture without {the}",
            ]
        )
    if kind == "add":
        phrase = describe_object(edit["to"])
        return rng.choice(
            [
                f"add {phrase}",
                f"put {phrase} in the picture",
                f"also include {phrase}",
                f"there should also be {phrase}",
            ]
        )
    raise ValueError(f"unknown edit type {kind!r}")


_VAGUE_TEXTS = (
    "make it better",
    "change it a bit",
    "something different please",
    "make it look nicer",
    "improve it",
    "not quite, try again",
)
_FOLLOW_UPS = ("now ", "also ", "and then ", "next, ", "", "")


# ---------------------------------------------------------------------------- rendering


def _shape_points(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    if shape == "square":
        h = r * 0.82
        return [(cx - h, cy - h), (cx + h, cy - h), (cx + h, cy + h), (cx - h, cy + h)]
    if shape == "triangle":
        cy += r * 0.15
        return [
            (cx + r * 1.1 * math.cos(a), cy + r * 1.1 * math.sin(a))
            for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)
        ]
    if shape == "star":
        pts = []
        for i in range(10):
            rad = r if i % 2 == 0 else r * 0.45
            a = -math.pi / 2 + i * math.pi / 5
            pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a) + r * 0.05))
        return pts
    if shape == "diamond":
        return [(cx, cy - r), (cx + r * 0.72, cy), (cx, cy + r), (cx - r * 0.72, cy)]
    if shape == "cross":
        a, w = r * 0.9, r * 0.32
        return [
            (cx - w, cy - a),
            (cx + w, cy - a),
            (cx + w, cy - w),
            (cx + a, cy - w),
            (cx + a, cy + w),
            (cx + w, cy + w),
            (cx + w, cy + a),
            (cx - w, cy + a),
            (cx - w, cy + w),
            (cx - a, cy + w),
            (cx - a, cy - w),
            (cx - w, cy - w),
        ]
    raise ValueError(f"unknown shape {shape!r}")


def layout_key(scene: Scene) -> str:
    """What decides where the shapes sit: the shapes and their counts, in scene order."""
    return json.dumps([[o["shape"], o["count"]] for o in scene["objects"]], separators=(",", ":"))


def render_scene(scene: Scene, size: int = 128, seed: int = 7) -> Image.Image:
    """Draw a scene as an RGB image of ``size`` x ``size``.

    The instances sit in distinct cells of a 3x3 grid (so they never overlap); which
    cells, and small shapes' offsets inside their cells, come from a random generator
    seeded by ``seed`` and the scene's shapes and counts (:func:`layout_key`), so the same
    scene always gives the same pixels and a colour, size or background edit keeps
    every shape where it was.
    Drawn at 4x and box-downsampled, for smooth edges.
    """
    big = size * _SUPERSAMPLE
    img = Image.new("RGB", (big, big), BACKGROUNDS[scene["background"]])
    draw = ImageDraw.Draw(img)
    rng = random.Random(f"demo-layout:{seed}:{layout_key(scene)}")
    cells = list(range(9))
    rng.shuffle(cells)
    cell = big / 3
    outline_w = max(1, round(_SUPERSAMPLE * 1.2))
    slot = 0
    for obj in scene["objects"]:
        fill = COLOURS[obj["colour"]]
        outline = tuple(int(v * 0.55) for v in fill)
        r = cell * (0.40 if obj["size"] == "large" else 0.24)
        for _ in range(obj["count"]):
            row, col = divmod(cells[slot], 3)
            slot += 1
            slack = cell / 2 - r * 1.12
            cx = (col + 0.5) * cell + rng.uniform(-slack, slack)
            cy = (row + 0.5) * cell + rng.uniform(-slack, slack)
            if obj["shape"] == "circle":
                draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill, outline=outline, width=outline_w)
            else:
                draw.polygon(_shape_points(obj["shape"], cx, cy, r), fill=fill, outline=outline, width=outline_w)
    return img.reduce(_SUPERSAMPLE)


# ---------------------------------------------------------------------------- the world


class _Gallery:
    """Scenes by canonical key, in order of first use."""

    def __init__(self) -> None:
        self.scenes: dict[str, Scene] = {}

    def add(self, scene: Scene) -> str:
        key = scene_key(scene)
        self.scenes.setdefault(key, scene)
        return key

    def __len__(self) -> int:
        return len(self.scenes)


def _edit_types_cycle(n: int, rng: random.Random) -> list[str]:
    kinds = [EDIT_TYPES[i % len(EDIT_TYPES)] for i in range(n)]
    rng.shuffle(kinds)
    return kinds


def pick_edit(
    scene: Scene, kind: str, rng: random.Random, avoid: frozenset[str] | set[str] = frozenset()
) -> tuple[Edit, Scene] | None:
    """An edit of ``kind`` whose result is valid and not among ``avoid`` keys."""
    for _ in range(12):
        edit = propose_edit(scene, kind, rng)
        if edit is None:
            return None
        new = apply_edit(scene, edit)
        if scene_ok(new) and scene_key(new) not in avoid and new != scene:
            return edit, new
    return None


#: Planted single-turn query kinds, in the order :func:`plan_kinds` hands them out, with
#: their share of the single-turn queries (``composition`` takes what is left).
PLANTED_SHARES: dict[str, float] = {
    "text_only": 0.10,
    "image_only": 0.10,
    "vague": 0.0625,
    "wrong_target": 0.0625,
    "too_broad": 0.075,
}
QUERY_KINDS: tuple[str, ...] = ("composition", *PLANTED_SHARES)
_N_SIBLINGS = 8  # near misses of a shared reference added per query (defeat the image-only shortcut)
_WHOLE_SCENE_TEMPLATES = ("I want {}", "show me {}", "replace it with {}", "instead: {}")
_BROAD_TEXTS = {
    "colour": ("change the colour of {the}", "give {the} another colour", "recolour {the}"),
    "background": ("change the background", "use another background", "put it on a different background"),
}


def plan_kinds(n_single: int, rng: random.Random) -> list[str]:
    """The kind of each single-turn query: planted kinds by :data:`PLANTED_SHARES`, shuffled."""
    kinds: list[str] = []
    for kind, share in PLANTED_SHARES.items():
        kinds += [kind] * round(n_single * share)
    kinds = kinds[:n_single]
    kinds += ["composition"] * (n_single - len(kinds))
    rng.shuffle(kinds)
    return kinds


#: Edits that keep every shape in place (:func:`layout_key`): the closest near misses.
_IN_PLACE_EDITS = ("colour", "size", "background")


def _siblings(ref: Scene, gallery: _Gallery, rng: random.Random, n: int = _N_SIBLINGS) -> None:
    """Add up to ``n`` one-edit variants of ``ref`` to the gallery (hard negatives for its queries).

    Mostly in-place edits, which look closest to the reference.
    """
    for _ in range(n):
        picked = pick_edit(ref, rng.choice(_IN_PLACE_EDITS if rng.random() < 0.75 else EDIT_TYPES), rng)
        if picked is not None:
            gallery.add(picked[1])


def broad_edit(ref: Scene, rng: random.Random) -> tuple[Edit, str, list[Scene]] | None:
    """A too-broad query: the text leaves the new colour / background open; every option fits."""
    kind = rng.choice(("colour", "background"))
    options = []
    for _ in range(30):
        edit = propose_edit(ref, kind, rng)
        if edit is None:
            return None
        new = apply_edit(ref, edit)
        if scene_ok(new) and new not in [o[1] for o in options]:
            options.append((edit, new))
    if len(options) < 4:
        return None
    edit = options[0][0]
    obj = None if kind == "background" else _find(ref, edit["object"])
    text = rng.choice(_BROAD_TEXTS[kind]).format(the=_the(obj, rng) if obj else "")
    return edit, text, [o[1] for o in options]


def _build_single(
    kind: str, edit_kind: str, refs: list[Scene], gallery: _Gallery, rng: random.Random
) -> dict[str, Any]:
    """One single-turn query of a planted ``kind`` as scene keys, edits and text.

    Every kind but ``image_only`` draws its reference from the shared ``refs`` and adds
    near misses of it, so the target is not the reference's nearest image; an
    ``image_only`` query gets a fresh reference that nothing else uses and a one-edit
    target, its nearest image.
    """
    while True:
        ref = random_scene(rng) if kind == "image_only" else rng.choice(refs)
        if kind == "image_only" and scene_key(ref) in gallery.scenes:
            continue
        out = _single_of_kind(kind, edit_kind, ref, gallery, rng)
        if out is None:
            edit_kind = rng.choice(EDIT_TYPES)  # rare: no such edit fits this scene
            continue
        if kind not in ("image_only", "too_broad"):  # a too-broad query brings eleven variants of its own
            _siblings(ref, gallery, rng)
        return out


def _build_lonely(edit_kind: str, gallery: _Gallery, rng: random.Random) -> dict[str, Any]:
    """An image-only query whose reference and target are more than one edit from every other image."""
    while True:
        out = _build_single("image_only", edit_kind, [], _Gallery(), rng)
        ref, target = json.loads(out["ref"]), json.loads(out["targets"][0])
        if _far_from(ref, set(gallery.scenes), gallery) and _far_from(target, set(gallery.scenes), gallery):
            gallery.add(ref)
            gallery.add(target)
            return out


def _build_text_only(refs: list[Scene], gallery: _Gallery, rng: random.Random) -> dict[str, Any]:
    """A text-only query: the text describes the whole target, a scene no other image comes near."""
    ref = rng.choice(refs)
    while True:
        target = random_scene(rng)
        if len(target["objects"]) > 1 and _far_from(target, set(gallery.scenes), gallery):
            break
    text = rng.choice(_WHOLE_SCENE_TEMPLATES).format(describe_scene(target))
    return {
        "ref": gallery.add(ref),
        "text": text,
        "edit": None,
        "targets": [gallery.add(target)],
        "kind": "text_only",
        "text_edit": None,
    }


#: How many gallery images a planted too-broad query gets that fit it besides its labelled
#: target: CIRCUS's rule of thumb (QUERY_TOO_BROAD when 10 or more images fit) must be able
#: to fire on them (issue 39, item 3).
TOO_BROAD_FITTING = 10
_WIDE_BROAD_TEXTS = (
    "give one of the shapes another colour",
    "change the colour of one of the shapes",
    "recolour any one of the shapes",
)


def broad_options(ref: Scene, edit: Edit | None = None) -> list[Scene]:
    """Every valid scene a wide too-broad text (:func:`_wide_broad`) allows: ``ref`` with any
    one of its objects recoloured, to any other colour (``edit`` is not read: the text names
    no object)."""
    out = []
    for obj in ref["objects"]:
        for colour in COLOURS:
            if colour != obj["colour"]:
                new = apply_edit(ref, {"type": "colour", "object": obj["shape"], "from": obj["colour"], "to": colour})
                if scene_ok(new):
                    out.append(new)
    return out


def _wide_broad(ref: Scene, rng: random.Random, n: int = TOO_BROAD_FITTING + 1) -> tuple[Edit, str, list[Scene]] | None:
    """A too-broad query whose text leaves open both which object is recoloured and its new
    colour, and ``n`` of the scenes it allows (the first is the labelled target); None when
    ``ref`` allows fewer (one object, or too few readable colours). A text that names the
    object (:func:`broad_edit`, what the demo retrievers train on) allows at most six scenes, too
    few for the 10-image rule."""
    options = broad_options(ref)
    if len(options) < n:
        return None
    chosen = rng.sample(options, n)
    first = chosen[0]
    changed = next(o for o, f in zip(ref["objects"], first["objects"]) if o["colour"] != f["colour"])
    edit = {
        "type": "colour",
        "object": changed["shape"],
        "from": changed["colour"],
        "to": _find(first, changed["shape"])["colour"],
        "any_object": True,
    }
    return edit, rng.choice(_WIDE_BROAD_TEXTS), chosen


def _too_broad_query(ref: Scene, gallery: _Gallery, rng: random.Random) -> dict[str, Any] | None:
    broad = _wide_broad(ref, rng)
    if broad is None:
        return None
    edit, text, options = broad
    for option in options:
        gallery.add(option)
    return {
        "ref": gallery.add(ref),
        "text": text,
        "edit": edit,
        "targets": [scene_key(options[0])],
        "kind": "too_broad",
        "text_edit": None,
        "alternatives": len(options),
    }


def family_composition(ref: Scene, rng: random.Random) -> tuple[Edit, list[Scene]] | None:
    """A colour edit of ``ref`` named by a colour family and its targets, one per colour of the
    family that fits (None when no family edit fits, or a target is not a valid scene): what the
    demo's family queries ask for, and what the demo compose model learns them from
    (:mod:`retrieval.demo_training`)."""
    fam = _family_edit(ref, rng)
    if fam is None:
        return None
    edit, colours = fam
    targets = [apply_edit(ref, {**edit, "to": c}) for c in colours]
    return (edit, targets) if all(scene_ok(t) for t in targets) else None


def _family_query(ref: Scene, gallery: _Gallery, rng: random.Random) -> dict[str, Any] | None:
    """A composition query whose colour is named by family: one target per colour of the family."""
    drawn = family_composition(ref, rng)
    if drawn is None:
        return None
    edit, targets = drawn
    return {
        "ref": gallery.add(ref),
        "text": describe_edit(ref, edit, rng),
        "edit": edit,
        "targets": [gallery.add(t) for t in targets],
        "kind": "composition",
        "text_edit": None,
    }


def _single_of_kind(
    kind: str, edit_kind: str, ref: Scene, gallery: _Gallery, rng: random.Random
) -> dict[str, Any] | None:
    if kind == "too_broad":
        return _too_broad_query(ref, gallery, rng)
    if kind == "composition" and edit_kind == "colour" and rng.random() < 0.3:
        family = _family_query(ref, gallery, rng)
        if family is not None:
            return family
    edit_kind = "size" if kind == "image_only" and rng.random() < 0.5 else edit_kind
    if kind == "image_only" and edit_kind == "shape":  # a new shape is two attributes away: not the nearest image
        edit_kind = "size"
    picked = pick_edit(ref, edit_kind, rng, avoid=set(gallery.scenes) if kind == "image_only" else frozenset())
    if picked is None:
        return None
    edit, target = picked
    text_edit = None
    if kind == "vague":
        text = rng.choice(_VAGUE_TEXTS)
    elif kind == "wrong_target":
        other = pick_edit(ref, rng.choice([k for k in EDIT_TYPES if k != edit["type"]]), rng, avoid={scene_key(target)})
        if other is None:
            return None
        text_edit = other[0]
        text = describe_edit(ref, text_edit, rng)
        gallery.add(other[1])  # what the text asks for is in the gallery, but not labelled
    else:
        text = describe_edit(ref, edit, rng)
    return {
        "ref": gallery.add(ref),
        "text": text,
        "edit": edit,
        "targets": [gallery.add(target)],
        "kind": kind,
        "text_edit": text_edit,
    }


def _build_session(
    length: int, flaw: str | None, pool: list[Scene], gallery: _Gallery, rng: random.Random, retro: str | None = None
) -> dict[str, Any]:
    """One session: a chain of ``length + 1`` scene keys, one edit and text per turn.

    ``flaw``: a planted flaw (:data:`SESSION_FLAWS`) at a turn that is never the first or the
    last; ``retro``: a clean retrospective turn (:data:`RETRO_KINDS`) at a turn >= 2.
    """
    flaw_turn = rng.randint(3 if flaw in _LATE_FLAWS else 2, length - 1) if flaw else None  # 1-based
    retro_turn = rng.randint(2, length) if retro else None
    while True:
        chain = [rng.choice(pool)]
        edits: list[Edit | None] = []
        texts: list[str] = []
        reference_turns: list[list[int]] = []
        kinds = list(EDIT_TYPES)
        rng.shuffle(kinds)
        ok = True
        for turn in range(1, length + 1):
            cur = chain[-1]
            refs: list[int] = []
            if turn == flaw_turn and flaw == "circle":
                edit = invert_edit(chain[-2], edits[-1])
                nxt = apply_edit(cur, edit)
                text = rng.choice(_FOLLOW_UPS) + describe_edit(cur, edit, rng)
            elif turn == flaw_turn and flaw == "redundant":
                edit, nxt, text = None, cur, texts[-1]
            elif (turn == flaw_turn and flaw in _STEP_FLAWS) or turn == retro_turn:
                step = _special_step(flaw if turn == flaw_turn else retro, turn, chain, edits, kinds, rng)
                if step is None:
                    ok = False
                    break
                edit, nxt, text, refs = step
            else:
                picked = _next_edit(cur, chain, kinds, rng)
                if picked is None:
                    ok = False
                    break
                edit, nxt = picked
                text = describe_edit(cur, edit, rng)
                if turn > 1:
                    text = rng.choice(_FOLLOW_UPS) + text
            chain.append(nxt)
            edits.append(edit)
            texts.append(text)
            reference_turns.append(refs)
        if ok:
            return {
                "chain": [gallery.add(s) for s in chain],
                "edits": edits,
                "texts": texts,
                "flaw": flaw,
                "flaw_turn": flaw_turn,
                "retro": retro,
                "retro_turn": retro_turn,
                "reference_turns": reference_turns,
            }


#: Planted session flaws: ``circle`` (a turn undoes the previous one: back to an earlier image),
#: ``redundant`` (a turn repeats the previous text and changes nothing), ``noop`` (a turn asks for
#: a change and its target is its reference), ``duplicate`` (a rollback to the previous turn that
#: redoes that turn's change: its target repeats the previous target), ``conflict`` (a turn undoes
#: the change of a turn at least two turns back, so the two ask for opposite changes).
SESSION_FLAWS: tuple[str, ...] = ("circle", "redundant", "noop", "duplicate", "conflict")
#: Clean FashionMT-style retrospective turns: ``rollback`` ("go back to turn k and ...": the
#: effective reference is turn k's image) and ``combination`` ("keep the background in the k-th
#: turn and ...": turn k's image and the turn's own).
RETRO_KINDS: tuple[str, ...] = ("rollback", "combination")
_STEP_FLAWS = ("noop", "duplicate", "conflict")
_LATE_FLAWS = ("duplicate", "conflict")  # need two earlier turns
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")


def _next_edit(cur: Scene, chain: list[Scene], kinds: list[str], rng: random.Random) -> tuple[Edit, Scene] | None:
    """The next edit of a session: the first edit kind of ``kinds`` that gives a new scene (that
    kind then moves to the back)."""
    avoid = {scene_key(s) for s in chain}
    for k in kinds[:]:
        picked = pick_edit(cur, k, rng, avoid)
        if picked is not None:
            kinds.remove(k)
            kinds.append(k)
            return picked
    return None


def _turn_name(k: int, rng: random.Random) -> str:
    return rng.choice((f"turn {k}", f"the {_ORDINALS[k - 1]} turn"))


def _special_step(
    kind: str | None, turn: int, chain: list[Scene], edits: list[Edit | None], kinds: list[str], rng: random.Random
) -> tuple[Edit | None, Scene, str, list[int]] | None:
    """One planted turn: ``(edit, next scene, text, reference turns)``; None when it cannot be
    planted on this chain (the session is drawn again)."""
    cur = chain[-1]
    if kind == "noop":  # asks for a change, nothing changes
        picked = _next_edit(cur, chain, kinds, rng)
        return None if picked is None else (None, cur, rng.choice(_FOLLOW_UPS) + describe_edit(cur, picked[0], rng), [])
    if kind == "duplicate":  # back to the previous turn's image, the previous turn's change again
        k, done = turn - 1, edits[-1]
        if done is None:
            return None
        return done, cur, f"go back to {_turn_name(k, rng)} and {describe_edit(chain[k - 1], done, rng)}", [k]
    if kind == "conflict":  # undo an edit of two or more turns back
        seen = {scene_key(s) for s in chain}
        for k in rng.sample(range(1, turn - 1), turn - 2):
            if edits[k - 1] is None:
                continue
            undo = invert_edit(chain[k - 1], edits[k - 1])
            try:
                new = apply_edit(cur, undo)
            except KeyError:
                continue
            if scene_ok(new) and scene_key(new) not in seen:
                return undo, new, rng.choice(_FOLLOW_UPS) + describe_edit(cur, undo, rng), []
        return None
    if kind == "rollback":  # "go back to turn k and ...": the edit applies to turn k's image
        k = rng.randint(1, turn - 1)
        picked = _next_edit(chain[k - 1], chain, kinds, rng)
        if picked is None:
            return None
        return (
            picked[0],
            picked[1],
            f"go back to {_turn_name(k, rng)} and {describe_edit(chain[k - 1], picked[0], rng)}",
            [k],
        )
    # combination: "keep the background in turn k and ...", turn k's background being the current one
    same = [k for k in range(1, turn) if chain[k - 1]["background"] == cur["background"]]
    others = [k for k in kinds if k != "background"]
    picked = _next_edit(cur, chain, others, rng) if same else None
    if picked is None:
        return None
    k = rng.choice(same)
    return (
        picked[0],
        picked[1],
        f"keep the background in {_turn_name(k, rng)} and {describe_edit(cur, picked[0], rng)}",
        [k, turn],
    )


def _plant_session_turns(sessions: list[dict[str, Any]], pool: list[Scene], gallery: _Gallery, seed: int) -> None:
    """Redraw a few clean sessions with the flaws and retrospective turns of issue 26 (noop,
    duplicate, conflict; rollback, combination), about one of each per 24 sessions, from a
    random stream of their own (so the rest of the world is drawn as before)."""
    rng = random.Random(seed * 1_000_003 + 26)
    per_kind = max(1, round(len(sessions) / 24)) if sessions else 0
    clean = [i for i, s in enumerate(sessions) if s["flaw"] is None]
    rng.shuffle(clean)
    for kind in ("duplicate", "conflict", "noop", *RETRO_KINDS):
        least = 4 if kind in _LATE_FLAWS else 3
        fits = [i for i in clean if len(sessions[i]["texts"]) >= least][:per_kind]
        for i in fits:
            clean.remove(i)
            flaw, retro = (None, kind) if kind in RETRO_KINDS else (kind, None)
            sessions[i] = _build_session(len(sessions[i]["texts"]), flaw, pool, gallery, rng, retro)


def build_demo(
    out_dir: Path,
    seed: int = 7,
    n_gallery: int = DEFAULT_GALLERY,
    n_single: int = 160,
    n_sessions: int = 48,
    image_size: int = 128,
) -> ParsedDataset:
    """The records of :func:`build_demo_world` (images written the same way), without the truth."""
    return build_demo_world(out_dir, seed, n_gallery, n_single, n_sessions, image_size)[0]


def build_demo_world(
    out_dir: Path,
    seed: int = 7,
    n_gallery: int = DEFAULT_GALLERY,
    n_single: int = 160,
    n_sessions: int = 48,
    image_size: int = 128,
) -> tuple[ParsedDataset, dict[str, Any]]:
    """Build the demo world: write PNGs under ``out_dir/gallery``; return its records and its truth.

    The gallery holds every reference, target and session chain image, the near misses
    of the shared references, plus near-miss and random distractors up to ``n_gallery``
    images (more, with a warning, if the queries need more). Same arguments, same
    records and byte-identical files: all randomness comes from ``random.Random(seed)``.
    Existing files are overwritten, unless ``out_dir`` already holds this very gallery
    (:data:`STAMP_FILE`): then nothing is rendered again; nothing else in ``out_dir`` is touched.

    The truth (:func:`demo_truth`) names each query's planted kind; it is kept out of
    the records, so that nothing an annotator can see carries it.
    """
    if image_size < 32:
        raise ValueError("image_size must be at least 32")
    if min(n_gallery, n_single, n_sessions) < 0:
        raise ValueError("counts must not be negative")
    rng = random.Random(seed)
    gallery = _Gallery()
    refs: list[Scene] = []
    while len(refs) < max(n_single // 4, 8 if n_single or n_sessions else 0):
        scene = random_scene(rng)
        if scene_key(scene) not in gallery.scenes:
            gallery.add(scene)
            refs.append(scene)

    singles, sessions, lonely = _build_singles(n_single, refs, gallery, rng, n_sessions, seed)
    n_needed = len(gallery)
    _fill_distractors(gallery, n_gallery, lonely, rng)

    dataset = ParsedDataset(format="demo")
    if n_needed > n_gallery:
        dataset.warnings.append(f"the queries need {n_needed} gallery images, more than n_gallery={n_gallery}")
    ids = _write_gallery(dataset, gallery, Path(out_dir), image_size, seed, rng)
    truth: dict[str, Any] = {"seed": seed, "queries": {}}
    for n, q in enumerate(singles):
        qid = f"demo-s-{n + 1:04d}"
        dataset.queries.append(_single_record(qid, n, q, ids))
        truth["queries"][qid] = _single_truth(q, ids)
    for n, s in enumerate(sessions):
        qid = f"demo-m-{n + 1:04d}"
        dataset.queries.append(_session_record(qid, n, s, ids))
        truth["queries"][qid] = {
            "kind": "session",
            "flaw": s["flaw"],
            "flaw_turn": s["flaw_turn"],
            "retro": s["retro"],
            "retro_turn": s["retro_turn"],
            "reference_turns": s["reference_turns"],
        }
    return dataset, truth


def _build_singles(
    n_single: int, refs: list[Scene], gallery: _Gallery, rng: random.Random, n_sessions: int, seed: int = 7
) -> tuple[list[Any], list[Any], set[str]]:
    """The single-turn queries, the sessions (with their planted turns:
    :func:`_plant_session_turns`), and the keys of the image-only and text-only scenes, drawn
    last so that nothing drawn after them comes near them."""
    kinds = plan_kinds(n_single, rng)
    edit_kinds = _edit_types_cycle(n_single, rng)
    late = ("image_only", "text_only")
    singles: list[Any] = [
        None if kinds[i] in late else _build_single(kinds[i], edit_kinds[i], refs, gallery, rng)
        for i in range(n_single)
    ]

    # Sessions: lengths 2..5 in turn (shuffled); a few sessions of length >= 3 flawed.
    lengths = [2 + i % 4 for i in range(n_sessions)]
    rng.shuffle(lengths)
    eligible = [i for i, n in enumerate(lengths) if n >= 3]
    n_bad = min(len(eligible), max(2, round(n_sessions * _FLAW_SHARE))) if n_sessions else 0
    bad = {s: ("circle", "redundant")[j % 2] for j, s in enumerate(sorted(rng.sample(eligible, n_bad)))}
    sessions = [_build_session(lengths[i], bad.get(i), refs, gallery, rng) for i in range(n_sessions)]
    _plant_session_turns(sessions, refs, gallery, seed)
    # Image-only and text-only queries last, on targets that no other image comes near.
    lonely: set[str] = set()
    for i in range(n_single):
        if kinds[i] == "image_only":
            singles[i] = _build_lonely(edit_kinds[i], gallery, rng)
            lonely |= {singles[i]["ref"], singles[i]["targets"][0]}
        elif kinds[i] == "text_only":
            singles[i] = _build_text_only(refs, gallery, rng)
            lonely.add(singles[i]["targets"][0])
    return singles, sessions, lonely


def _fill_distractors(gallery: _Gallery, n_gallery: int, lonely: set[str], rng: random.Random) -> None:
    """Near misses of used scenes (never near an image-only or text-only scene), then random scenes."""
    used = [s for k, s in gallery.scenes.items() if k not in lonely]
    while len(gallery) < n_gallery:
        if used and rng.random() < 0.5:
            picked = pick_edit(rng.choice(used), rng.choice(EDIT_TYPES), rng, avoid=lonely)
            if picked is not None and _far_from(picked[1], lonely, gallery):
                gallery.add(picked[1])
        else:
            scene = random_scene(rng)
            if _far_from(scene, lonely, gallery):
                gallery.add(scene)


def _far_from(scene: Scene, lonely: set[str], gallery: _Gallery) -> bool:
    """True when ``scene`` is not one edit away from an image-only reference or target."""
    if not lonely:
        return True
    return all(_scene_distance(scene, gallery.scenes[k]) > 1 for k in lonely)


def _scene_distance(a: Scene, b: Scene) -> int:
    """How many attributes differ (background, and shape by shape: presence or any field)."""
    objs_a = {o["shape"]: o for o in a["objects"]}
    objs_b = {o["shape"]: o for o in b["objects"]}
    diff = int(a["background"] != b["background"])
    for shape in set(objs_a) | set(objs_b):
        if objs_a.get(shape) != objs_b.get(shape):
            diff += 1
    return diff


def _write_gallery(
    dataset: ParsedDataset, gallery: _Gallery, out_dir: Path, image_size: int, seed: int, rng: random.Random
) -> dict[str, str]:
    """Render the gallery and add its image records; returns scene key -> image id.

    Ids in a shuffled order, so that neighbouring ids say nothing about query pairs.
    """
    keys = list(gallery.scenes)
    rng.shuffle(keys)
    width = max(4, len(str(len(keys))))
    ids = {key: f"g{n + 1:0{width}d}" for n, key in enumerate(keys)}
    image_dir = out_dir / "gallery"
    image_dir.mkdir(parents=True, exist_ok=True)
    order = sorted(keys, key=ids.__getitem__)
    stamp = _gallery_stamp([(ids[k], gallery.scenes[k]) for k in order], image_size, seed)
    rendered = _already_rendered(image_dir, stamp, [ids[k] for k in order])
    for key in order:
        scene = gallery.scenes[key]
        ext = ids[key]
        if not rendered:
            render_scene(scene, image_size, seed).save(image_dir / f"{ext}.png", format="PNG", compress_level=6)
        dataset.add_image(
            ImageRecord(
                external_id=ext,
                path=f"gallery/{ext}.png",
                extra={
                    "scene": copy.deepcopy(scene),
                    "description": describe_scene(scene),
                    "width": image_size,
                    "height": image_size,
                },
            )
        )
    dataset.galleries["val"] = sorted(ids.values())
    (image_dir / STAMP_FILE).write_text(stamp, encoding="utf-8")
    return ids


#: Written beside a rendered gallery: what was rendered (every image id and scene, the size, the
#: seed and this module's source), so that drawing the same world into the same folder again
#: (``make_demo`` once more, or a test session that draws it once for many tests) renders nothing.
STAMP_FILE = ".rendered"


def _gallery_stamp(images: list[tuple[str, Scene]], image_size: int, seed: int) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps([images, image_size, seed], sort_keys=True, default=str).encode("utf-8"))
    return digest.hexdigest()


def _already_rendered(image_dir: Path, stamp: str, ids: list[str]) -> bool:
    """True when ``image_dir`` holds this very gallery (same stamp, every file present)."""
    stamp_file = image_dir / STAMP_FILE
    if not stamp_file.is_file() or stamp_file.read_text(encoding="utf-8") != stamp:
        return False
    return all((image_dir / f"{ext}.png").is_file() for ext in ids)


_PROVENANCE = "synthetic:demo"


def _single_record(qid: str, n: int, q: dict[str, Any], ids: dict[str, str]) -> QueryRecord:
    ref, targets = ids[q["ref"]], [ids[k] for k in q["targets"]]
    return QueryRecord(
        external_id=qid,
        split="val",
        ordinal=n,
        source_file="demo:single_turn",
        turns=[TurnRecord(index=1, reference=ref, texts=[TextRecord(q["text"])], provenance=_PROVENANCE)],
        targets=[
            TargetRecord(image=t, relevance=1.0, is_primary=j == 0, role="gt", source_field="target")
            for j, t in enumerate(targets)
        ],
        raw={"id": qid, "reference": ref, "text": q["text"], "targets": targets},
        extra={}
        if q["kind"] in ("wrong_target", "vague", "too_broad", "text_only")
        else {"edit": copy.deepcopy(q["edit"])},
    )


def _single_truth(q: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": q["kind"],
        "edit": copy.deepcopy(q["edit"]),
        "reference": ids[q["ref"]],
        "targets": [ids[k] for k in q["targets"]],
    }
    if q["text_edit"] is not None:
        out["text_edit"] = copy.deepcopy(q["text_edit"])
    if "alternatives" in q:
        out["equally_good"] = q["alternatives"]
    return out


def _session_record(qid: str, n: int, s: dict[str, Any], ids: dict[str, str]) -> QueryRecord:
    chain = [ids[k] for k in s["chain"]]
    turns = [
        TurnRecord(
            index=t + 1,
            reference=chain[t],
            texts=[TextRecord(s["texts"][t])],
            turn_target=chain[t + 1],
            provenance=_PROVENANCE,
        )
        for t in range(len(s["texts"]))
    ]
    return QueryRecord(
        external_id=qid,
        split="val",
        ordinal=n,
        source_file="demo:multi_turn",
        turns=turns,
        targets=[TargetRecord(image=chain[-1], relevance=1.0, is_primary=True, role="gt", source_field="target")],
        raw={
            "id": qid,
            "turns": [{"reference": t.reference, "text": t.texts[0].text, "turn_target": t.turn_target} for t in turns],
            "target": chain[-1],
        },
        extra={"edits": copy.deepcopy(s["edits"]), "chain": chain},
    )


# ---------------------------------------------------------------------------- checking against the truth

#: The validity-rubric flag a human should raise for each planted defect.
HUMAN_EXPECTED: dict[str, str] = {
    "vague": "INVALID_TEXT_QUERY",
    "wrong_target": "INVALID_TARGET_IMAGE",
    "too_broad": "QUERY_TOO_BROAD",
}


def precision_recall(planted: set[Any], found: set[Any]) -> dict[str, Any]:
    """Precision and recall of ``found`` against ``planted`` (``None`` where undefined)."""
    hits = len(planted & found)
    return {
        "planted": len(planted),
        "found": len(found),
        "hits": hits,
        "precision": hits / len(found) if found else None,
        "recall": hits / len(planted) if planted else None,
    }


def check_judgements(kinds: dict[Any, str], flags: dict[Any, set[str]]) -> dict[str, dict[str, Any]]:
    """Per planted kind of :data:`HUMAN_EXPECTED`: precision and recall of the humans' flags.

    ``flags`` maps each judged query -> the rubric flags its judges raised (by majority);
    only judged queries take part.
    """
    return {
        kind: precision_recall({q for q in flags if kinds.get(q) == kind}, {q for q in flags if flag in flags[q]})
        for kind, flag in HUMAN_EXPECTED.items()
    }


#: Which planted session flaws each automatic consistency check should find, turn by turn (the
#: flawed turn ``flaw_turn``). A ``redundant`` turn changes nothing, so it is a no-op; a
#: ``circle`` turn undoes the turn before it, so the two ask for opposite changes (a conflict).
SESSION_CHECK_EXPECTED: dict[str, tuple[str, ...]] = {
    "duplicate": ("duplicate",),
    "circle": ("circle",),
    "conflict": ("conflict", "circle"),
    "noop": ("noop", "redundant"),
}


def check_session_flags(
    truth: dict[Any, dict[str, Any]], flags: dict[tuple[Any, int], Any]
) -> dict[str, dict[str, Any]]:
    """Per check of :data:`SESSION_CHECK_EXPECTED`: precision and recall over the flagged turns.

    ``truth`` maps each checked session -> its truth record (``flaw``, ``flaw_turn``); only those
    sessions take part. ``flags`` maps ``(session, turn)`` -> the checks the turn failed.
    """
    out = {}
    for check, kinds in SESSION_CHECK_EXPECTED.items():
        planted = {(q, t["flaw_turn"]) for q, t in truth.items() if t.get("flaw") in kinds}
        found = {(q, n) for (q, n), f in flags.items() if q in truth and check in f}
        out[check] = precision_recall(planted, found)
    return out


def check_reference_turns(truth: dict[Any, dict[str, Any]], stored: dict[Any, list[list[int]]]) -> dict[str, int]:
    """How many of the planted retrospective turns were read with the planted effective reference,
    and how many turns got an effective reference that none was planted for."""
    planted = read = spurious = 0
    for q, t in truth.items():
        want, got = t.get("reference_turns") or [], stored.get(q, [])
        for n, refs in enumerate(want):
            have = got[n] if n < len(got) else []
            planted += bool(refs)
            read += bool(refs) and list(have) == list(refs)
            spurious += bool(have) and not refs
    return {"planted": planted, "read": read, "spurious": spurious}
