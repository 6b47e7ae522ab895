"""Tests for the synthetic CIR demo world (retrieval.demo)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from audit.democheck import check_audit
from retrieval.demo import (
    COLOURS,
    LOW_CONTRAST,
    SESSION_FLAWS,
    SHAPES,
    apply_edit,
    build_demo,
    check_judgements,
    describe_scene,
    invert_edit,
    precision_recall,
    render_scene,
    scene_key,
    scene_ok,
)
from retrieval.records import ParsedDataset, QueryRecord

VAGUE_WORDS = set(COLOURS) | set(SHAPES) | {s + "s" for s in SHAPES} | {"crosses", "background", "small", "large"}


@pytest.fixture(scope="module")
def built_world(built_demo_world: tuple[Path, ParsedDataset, dict]) -> tuple[Path, ParsedDataset, dict]:
    return built_demo_world  # drawn once for the unit tests (tests/unit/conftest.py)


@pytest.fixture(scope="module")
def built(built_world: tuple[Path, ParsedDataset, dict]) -> tuple[Path, ParsedDataset]:
    return built_world[0], built_world[1]


@pytest.fixture(scope="module")
def built_again(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ParsedDataset]:
    out = tmp_path_factory.mktemp("demo_b")
    return out, build_demo(out)


def _singles(ds: ParsedDataset) -> list[QueryRecord]:
    return [q for q in ds.queries if q.external_id.startswith("demo-s-")]


def _sessions(ds: ParsedDataset) -> list[QueryRecord]:
    return [q for q in ds.queries if q.external_id.startswith("demo-m-")]


def _scene(ds: ParsedDataset, image_id: str) -> dict:
    return ds.images[image_id].extra["scene"]


def _file_hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _check_edit(ref: dict, target: dict, edit: dict) -> None:
    """Check an edit against the two scenes without using apply_edit."""
    kind = edit["type"]
    ref_objs = {o["shape"]: o for o in ref["objects"]}
    tgt_objs = {o["shape"]: o for o in target["objects"]}
    if kind == "background":
        assert ref["background"] == edit["from"] and target["background"] == edit["to"] != edit["from"]
        assert ref_objs == tgt_objs
        return
    assert ref["background"] == target["background"]
    shape = edit["object"]
    if kind == "remove":
        assert ref_objs[shape] == edit["from"] and shape not in tgt_objs
        assert {k: v for k, v in ref_objs.items() if k != shape} == tgt_objs
        return
    if kind == "add":
        assert shape not in ref_objs and tgt_objs[shape] == edit["to"]
        assert {k: v for k, v in tgt_objs.items() if k != shape} == ref_objs
        return
    if kind == "shape":
        assert shape == edit["from"] and shape in ref_objs and shape not in tgt_objs
        new = tgt_objs[edit["to"]]
        assert edit["to"] not in ref_objs
        old = ref_objs[shape]
        assert (new["colour"], new["size"], new["count"]) == (old["colour"], old["size"], old["count"])
        assert {k: v for k, v in ref_objs.items() if k != shape} == {
            k: v for k, v in tgt_objs.items() if k != edit["to"]
        }
        return
    field = {"colour": "colour", "count": "count", "size": "size"}[kind]
    assert set(ref_objs) == set(tgt_objs)
    assert ref_objs[shape][field] == edit["from"] and tgt_objs[shape][field] == edit["to"] != edit["from"]
    for key in ("shape", "colour", "size", "count"):
        if key != field:
            assert ref_objs[shape][key] == tgt_objs[shape][key]
    assert {k: v for k, v in ref_objs.items() if k != shape} == {k: v for k, v in tgt_objs.items() if k != shape}


# ---------------------------------------------------------------- scene helpers


def test_apply_edit_hand_examples() -> None:
    scene = {
        "background": "white",
        "objects": [
            {"shape": "circle", "colour": "red", "size": "large", "count": 1},
            {"shape": "star", "colour": "blue", "size": "small", "count": 2},
        ],
    }
    before = json.loads(json.dumps(scene))
    recoloured = apply_edit(scene, {"type": "colour", "object": "circle", "from": "red", "to": "green"})
    assert recoloured["objects"][0] == {"shape": "circle", "colour": "green", "size": "large", "count": 1}
    assert scene == before  # input untouched
    # A square is added between circle and star (objects are kept in SHAPES order).
    added = apply_edit(
        scene,
        {
            "type": "add",
            "object": "square",
            "from": None,
            "to": {"shape": "square", "colour": "black", "size": "small", "count": 3},
        },
    )
    assert [o["shape"] for o in added["objects"]] == ["circle", "square", "star"]
    # Circle -> diamond moves the object after the star.
    reshaped = apply_edit(scene, {"type": "shape", "object": "circle", "from": "circle", "to": "diamond"})
    assert reshaped["objects"] == [
        {"shape": "star", "colour": "blue", "size": "small", "count": 2},
        {"shape": "diamond", "colour": "red", "size": "large", "count": 1},
    ]
    removed = apply_edit(scene, {"type": "remove", "object": "star", "from": scene["objects"][1], "to": None})
    assert removed == {"background": "white", "objects": [scene["objects"][0]]}
    counted = apply_edit(scene, {"type": "count", "object": "star", "from": 2, "to": 3})
    assert counted["objects"][1]["count"] == 3
    sized = apply_edit(scene, {"type": "size", "object": "star", "from": "small", "to": "large"})
    assert sized["objects"][1]["size"] == "large"
    assert (
        apply_edit(scene, {"type": "background", "object": None, "from": "white", "to": "pink"})["background"] == "pink"
    )


def test_invert_edit_round_trips() -> None:
    scene = {
        "background": "grey",
        "objects": [
            {"shape": "square", "colour": "yellow", "size": "large", "count": 2},
            {"shape": "cross", "colour": "purple", "size": "small", "count": 1},
        ],
    }
    edits = [
        {"type": "colour", "object": "square", "from": "yellow", "to": "red"},
        {"type": "shape", "object": "cross", "from": "cross", "to": "triangle"},
        {"type": "count", "object": "square", "from": 2, "to": 1},
        {"type": "size", "object": "cross", "from": "small", "to": "large"},
        {"type": "background", "object": None, "from": "grey", "to": "sand"},
        {"type": "remove", "object": "cross", "from": scene["objects"][1], "to": None},
        {
            "type": "add",
            "object": "star",
            "from": None,
            "to": {"shape": "star", "colour": "red", "size": "small", "count": 1},
        },
    ]
    for edit in edits:
        changed = apply_edit(scene, edit)
        assert changed != scene
        assert apply_edit(changed, invert_edit(scene, edit)) == scene, edit["type"]


def test_describe_scene() -> None:
    scene = {
        "background": "sky blue",
        "objects": [
            {"shape": "circle", "colour": "red", "size": "large", "count": 1},
            {"shape": "triangle", "colour": "orange", "size": "small", "count": 3},
            {"shape": "cross", "colour": "blue", "size": "small", "count": 2},
        ],
    }
    assert describe_scene(scene) == (
        "a large red circle, three small orange triangles and two small blue crosses on a sky blue background"
    )


def test_scene_ok_rules() -> None:
    ok = {"background": "white", "objects": [{"shape": "star", "colour": "red", "size": "small", "count": 3}]}
    assert scene_ok(ok)
    dup = {"background": "white", "objects": [ok["objects"][0], dict(ok["objects"][0], colour="blue")]}
    assert not scene_ok(dup)  # two stars: "the star" would be ambiguous
    assert not scene_ok({"background": "dark green", "objects": [dict(ok["objects"][0], colour="black")]})
    crowded = {
        "background": "white",
        "objects": [{"shape": s, "colour": "red", "size": "small", "count": 3} for s in ("circle", "square", "star")],
    }
    assert not scene_ok(crowded)  # 9 shapes > 8
    assert not scene_ok({"background": "white", "objects": []})


def test_render_scene_area_and_background() -> None:
    # One large circle: radius 0.40 of a third of the side, so the red share of the
    # image is pi * (0.4 / 3)^2 = 0.0559; red-dominant pixels (fill and its dark-red
    # outline) should cover that share, up to anti-aliasing at the rim.
    scene = {"background": "white", "objects": [{"shape": "circle", "colour": "red", "size": "large", "count": 1}]}
    img = render_scene(scene, 128, seed=7)
    assert img.size == (128, 128) and img.mode == "RGB"
    px = np.asarray(img).astype(int)
    reddish = px[..., 0] - np.maximum(px[..., 1], px[..., 2]) > 60
    assert abs(reddish.mean() - math.pi * (0.4 / 3) ** 2) < 0.003
    assert tuple(px[0, 0]) == (250, 250, 250)
    assert np.array_equal(np.asarray(render_scene(scene, 128, seed=7)), px)


# ---------------------------------------------------------------- the built world


def test_counts(built: tuple[Path, ParsedDataset]) -> None:
    out, ds = built
    assert ds.format == "demo"
    assert len(ds.images) == 900 and ds.warnings == []
    assert len(list((out / "gallery").glob("*.png"))) == 900
    assert len(_singles(ds)) == 160
    sessions = _sessions(ds)
    assert len(sessions) == 48
    lengths = Counter(len(q.turns) for q in sessions)
    assert set(lengths) == {2, 3, 4, 5}
    assert all(n == 12 for n in lengths.values())
    assert [q.external_id for q in _singles(ds)][:2] == ["demo-s-0001", "demo-s-0002"]
    assert sessions[0].external_id == "demo-m-0001"
    assert {q.split for q in ds.queries} == {"val"}
    assert ds.galleries == {"val": sorted(ds.images)}


def test_deterministic(built: tuple[Path, ParsedDataset], built_again: tuple[Path, ParsedDataset]) -> None:
    (out_a, ds_a), (out_b, ds_b) = built, built_again
    assert dataclasses.asdict(ds_a) == dataclasses.asdict(ds_b)
    hashes = _file_hashes(out_a)
    assert len(hashes) == 901 and "gallery/.rendered" in hashes  # the 900 images and the stamp (STAMP_FILE)
    assert hashes == _file_hashes(out_b)


def test_other_seed_differs(tmp_path: Path) -> None:
    small = dict(n_gallery=200, n_single=20, n_sessions=8)
    ds7 = build_demo(tmp_path / "s7", seed=7, **small)
    ds8 = build_demo(tmp_path / "s8", seed=8, **small)
    assert len(ds8.images) == 200 and len(ds8.queries) == 28
    scenes = [{scene_key(i.extra["scene"]) for i in ds.images.values()} for ds in (ds7, ds8)]
    assert scenes[0] != scenes[1]
    assert [q.turns[0].texts[0].text for q in ds7.queries] != [q.turns[0].texts[0].text for q in ds8.queries]


def test_references_exist(built: tuple[Path, ParsedDataset]) -> None:
    out, ds = built
    for q in ds.queries:
        ids = [t.image for t in q.targets]
        for turn in q.turns:
            ids.append(turn.reference)
            if turn.turn_target is not None:
                ids.append(turn.turn_target)
        for i in ids:
            assert i in ds.images, (q.external_id, i)
            assert (out / ds.images[i].path).is_file()
    for image_id, rec in ds.images.items():
        assert rec.path == f"gallery/{image_id}.png"


def test_images_unique_valid_png(built: tuple[Path, ParsedDataset]) -> None:
    out, ds = built
    keys = [scene_key(r.extra["scene"]) for r in ds.images.values()]
    assert len(set(keys)) == len(keys)
    for rec in ds.images.values():
        scene = rec.extra["scene"]
        json.dumps(scene)
        assert scene_ok(scene)
        assert all((o["colour"], scene["background"]) not in LOW_CONTRAST for o in scene["objects"])
        with Image.open(out / rec.path) as img:
            assert img.format == "PNG" and img.size == (128, 128) and img.mode == "RGB"
            img.verify()


def test_texts_and_targets_well_formed(built: tuple[Path, ParsedDataset]) -> None:
    _, ds = built
    for q in ds.queries:
        assert all(t.texts and t.texts[0].text.strip() for t in q.turns)
        assert [t.index for t in q.turns] == list(range(1, len(q.turns) + 1))
        assert sum(t.is_primary for t in q.targets) == 1 and q.targets[0].is_primary
        assert len({t.image for t in q.targets}) == len(q.targets)
        assert all(t.relevance == 1.0 and t.role == "gt" for t in q.targets)
        assert "demo_flaw" not in json.dumps(q.raw)


def test_single_turn_edits(built_world: tuple[Path, ParsedDataset, dict]) -> None:
    _, ds, truth = built_world
    kinds = {q: t["kind"] for q, t in truth["queries"].items()}
    clean = [q for q in _singles(ds) if kinds[q.external_id] in ("composition", "image_only")]
    assert len(clean) == 96 + 16
    assert set(Counter(q.extra["edit"]["type"] for q in clean)) == {
        "colour",
        "shape",
        "count",
        "size",
        "background",
        "remove",
        "add",
    }
    multi = 0
    for q in clean:
        ref = _scene(ds, q.turns[0].reference)
        edit = q.extra["edit"]
        text = q.turns[0].texts[0].text
        colours = [edit["to"]] + edit.get("alternatives", [])
        assert len(colours) == len(q.targets)
        for target, colour in zip(q.targets, colours):
            _check_edit(ref, _scene(ds, target.image), dict(edit, to=colour))
        assert apply_edit(ref, edit) == _scene(ds, q.targets[0].image)
        if len(q.targets) > 1:
            multi += 1
            assert edit["type"] == "colour" and edit["family"] in text
        elif edit["type"] in ("colour", "background"):
            assert edit["to"] in text
        elif edit["type"] in ("remove", "shape", "add", "count"):
            assert edit["object"] in text or (edit["type"] == "shape" and edit["to"] in text)
    assert multi >= 2


def test_planted_kinds(built_world: tuple[Path, ParsedDataset, dict]) -> None:
    _, ds, truth = built_world
    kinds = Counter(truth["queries"][q.external_id]["kind"] for q in _singles(ds))
    assert kinds == {
        "composition": 96,
        "text_only": 16,
        "image_only": 16,
        "too_broad": 12,
        "vague": 10,
        "wrong_target": 10,
    }
    scenes = {scene_key(r.extra["scene"]) for r in ds.images.values()}
    for q in _singles(ds):
        t = truth["queries"][q.external_id]
        assert "demo_flaw" not in json.dumps(q.extra) and t["kind"] not in json.dumps(q.extra)
        ref_id = q.turns[0].reference
        ref, target = _scene(ds, ref_id), _scene(ds, q.targets[0].image)
        text = q.turns[0].texts[0].text
        assert t["reference"] == ref_id and t["targets"] == [x.image for x in q.targets]
        if t["kind"] == "text_only":  # the text names the whole target scene
            assert describe_scene(target) in text
        elif t["kind"] == "image_only":  # one edit away, and nothing else in the gallery is that close to the reference
            _check_edit(ref, target, t["edit"])
            near = [k for k in scenes if k != scene_key(ref) and _distance(ref, json.loads(k)) <= 1]
            assert near == [scene_key(target)]
        elif t["kind"] == "wrong_target":  # the text asks for another image, which is in the gallery
            _check_edit(ref, target, t["edit"])
            assert t["text_edit"]["type"] != t["edit"]["type"]
            assert scene_key(apply_edit(ref, t["text_edit"])) in scenes
        elif t["kind"] == "vague":
            _check_edit(ref, target, t["edit"])
            assert not set(text.replace(",", " ").split()) & VAGUE_WORDS
        elif t["kind"] == "too_broad":  # every option the text allows is in the gallery
            _check_edit(ref, target, t["edit"])
            assert t["equally_good"] >= 4 and t["edit"]["to"] not in text


def _distance(a: dict, b: dict) -> int:
    objs_a = {o["shape"]: o for o in a["objects"]}
    objs_b = {o["shape"]: o for o in b["objects"]}
    return int(a["background"] != b["background"]) + sum(
        objs_a.get(s) != objs_b.get(s) for s in set(objs_a) | set(objs_b)
    )


def test_sessions(built_world: tuple[Path, ParsedDataset, dict]) -> None:
    _, ds, truth = built_world
    flaws, retros = Counter(), Counter()
    for q in _sessions(ds):
        turns = q.turns
        assert 2 <= len(turns) <= 5
        for prev, cur in zip(turns, turns[1:]):
            assert cur.reference == prev.turn_target
        assert turns[-1].turn_target == q.targets[0].image
        chain = [t.reference for t in turns] + [turns[-1].turn_target]
        assert q.extra["chain"] == chain
        t = truth["queries"][q.external_id]
        flaw, k = t["flaw"], t["flaw_turn"]
        flaws[flaw] += 1
        retros[t["retro"]] += 1
        refs = t["reference_turns"]
        assert len(refs) == len(turns)
        for n, (turn, edit) in enumerate(zip(turns, q.extra["edits"]), start=1):
            # a rollback turn's edit applies to the image of the turn it goes back to
            start = turns[refs[n - 1][0] - 1].reference if len(refs[n - 1]) == 1 else turn.reference
            ref, nxt = _scene(ds, start), _scene(ds, turn.turn_target)
            if flaw in ("redundant", "noop") and n == k:
                assert edit is None and turn.turn_target == turn.reference
                if flaw == "redundant":
                    assert turn.texts[0].text == turns[n - 2].texts[0].text
            else:
                _check_edit(ref, nxt, edit)
        if flaw is None:
            assert len(set(chain)) == len(chain)
        elif flaw == "circle":
            assert turns[k - 1].turn_target == turns[k - 2].reference
        elif flaw == "duplicate":  # back to the previous turn, same change: the previous target again
            assert refs[k - 1] == [k - 1] and turns[k - 1].turn_target == turns[k - 2].turn_target
        elif flaw == "conflict":  # undoes an edit two or more turns back, to a new image
            assert k >= 3 and len(set(chain)) == len(chain)
            assert any(
                q.extra["edits"][k - 1] == invert_edit(_scene(ds, turns[j - 1].reference), q.extra["edits"][j - 1])
                for j in range(1, k - 1)
                if q.extra["edits"][j - 1]
            )
        assert flaw in (None, *SESSION_FLAWS)
        if t["retro"] == "rollback":
            assert len(refs[t["retro_turn"] - 1]) == 1 and "go back to" in turns[t["retro_turn"] - 1].texts[0].text
        elif t["retro"] == "combination":
            assert (
                refs[t["retro_turn"] - 1][-1] == t["retro_turn"]
                and "keep the background" in turns[t["retro_turn"] - 1].texts[0].text
            )
    assert flaws["circle"] >= 2 and flaws["redundant"] >= 2
    assert min(flaws[f] for f in ("noop", "duplicate", "conflict")) >= 1
    assert retros["rollback"] >= 1 and retros["combination"] >= 1


def test_precision_recall_by_hand() -> None:
    assert precision_recall({1, 2, 3, 4}, {3, 4, 5}) == {
        "planted": 4,
        "found": 3,
        "hits": 2,
        "precision": 2 / 3,
        "recall": 0.5,
    }
    assert precision_recall(set(), set())["precision"] is None
    kinds = {"a": "text_only", "b": "text_only", "c": "image_only", "d": "vague", "e": "composition"}
    labels = {
        "a": "shortcut_solvable",
        "b": "unresolved",
        "c": "shortcut_solvable",
        "d": "unresolved",
        "e": "composition_required",
    }
    details = {
        "a": "both_unimodal",
        "b": "unresolved",
        "c": "text_only",
        "d": "unresolved",
        "e": "composition_required",
    }
    got = check_audit(kinds, labels, details)
    assert got["text_only"] == {"planted": 2, "found": 2, "hits": 1, "precision": 0.5, "recall": 0.5}
    assert got["image_only"]["recall"] == 0.0 and got["image_only"]["found"] == 1  # 'a' (both) counts, 'c' does not
    assert got["vague"] == {"planted": 1, "found": 2, "hits": 1, "precision": 0.5, "recall": 1.0}
    assert got["composition"]["precision"] == 1.0
    human = check_judgements(
        {"x": "too_broad", "y": "vague", "z": "composition"},
        {"x": {"QUERY_TOO_BROAD"}, "y": set(), "z": {"QUERY_TOO_BROAD"}},
    )
    assert human["too_broad"] == {"planted": 1, "found": 2, "hits": 1, "precision": 0.5, "recall": 1.0}
    assert human["vague"]["recall"] == 0.0


def test_small_gallery_warns(tmp_path: Path) -> None:
    ds = build_demo(tmp_path, seed=3, n_gallery=10, n_single=12, n_sessions=4, image_size=64)
    assert len(ds.images) > 10 and ds.warnings and "n_gallery=10" in ds.warnings[0]
    with Image.open(tmp_path / next(iter(ds.images.values())).path) as img:
        assert img.size == (64, 64)


def test_drawing_the_same_world_again_renders_nothing(tmp_path: Path) -> None:
    """make_demo run twice, or a test session that draws the world once for many tests: the
    second draw into the same folder returns the same records and leaves the files alone."""
    first = build_demo(tmp_path, seed=3, n_gallery=30, n_single=8, n_sessions=2, image_size=64)
    files = sorted((tmp_path / "gallery").glob("*.png"))
    stamps = {p: p.stat().st_mtime_ns for p in files}
    again = build_demo(tmp_path, seed=3, n_gallery=30, n_single=8, n_sessions=2, image_size=64)
    assert again == first and {p: p.stat().st_mtime_ns for p in files} == stamps
    files[0].unlink()  # a file gone: everything is drawn again, byte for byte
    build_demo(tmp_path, seed=3, n_gallery=30, n_single=8, n_sessions=2, image_size=64)
    assert files[0].is_file() and files[1].stat().st_mtime_ns != stamps[files[1]]
    other = build_demo(tmp_path, seed=4, n_gallery=30, n_single=8, n_sessions=2, image_size=64)
    assert other != first  # another world over the same folder is drawn, not taken from the stamp
