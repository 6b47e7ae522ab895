"""Retrospective turns (turn references read from texts, effective references) and the session
consistency checks (issue 26), pure: no Django."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from retrieval.demo import check_reference_turns, check_session_flags
from retrieval.sessions import (
    CIRCLE,
    CONFLICT,
    DUPLICATE,
    KEEP_NAMES_NO_TURN,
    NOOP,
    NOOP_COSINE,
    REF_LATER,
    REF_NOT_EARLIER,
    ConsistencyThresholds,
    change_directions,
    describe_reference,
    effective_reference_turns,
    effective_references,
    parse_turn_references,
    session_consistency,
    session_turn_references,
    text_directions,
    turn_reference_checks,
)


@pytest.mark.parametrize(
    "text,turns,keep",
    [
        ("Turn 2", (2,), ()),
        ("go back to turn 2 and make it red", (2,), ()),
        ("Go back to the second turn, then add a star", (2,), ()),
        ("like the 3rd turn but blue", (3,), ()),
        ("the first and third turns together", (1, 3), ()),
        ("as in turns 1 and 3", (1, 3), ()),
        ("Keep the color in the second turn", (2,), (("color", (2,)),)),
        ("Keep the sleeve length in the 1st turn and make it red", (1,), (("sleeve length", (1,)),)),
        ("Keep the pattern from turn 1. Make it longer", (1,), (("pattern", (1,)),)),
        ("keep the colour", (), (("colour", ()),)),
        ("turn the circle red", (), ()),  # "turn" as a verb names no turn
        ("make two circles", (), ()),
        ("", (), ()),
    ],
)
def test_parse_turn_references(text, turns, keep):
    refs = parse_turn_references(text)
    assert refs.turns == turns and refs.keep == keep and not refs.later


def test_previous_and_later_turns():
    assert parse_turn_references("go back to the previous turn", 4).turns == (3,)
    assert parse_turn_references("go back to the previous turn").turns == ()  # no index: not resolved
    assert parse_turn_references("we fix it in the next turn").later
    assert parse_turn_references("as in later turns").later


@pytest.mark.parametrize(
    "turn,text,effective",
    [
        (3, "go back to turn 2 and make it red", [2]),  # rollback
        (4, "Keep the color in the second turn and make it longer", [2, 4]),  # combination with itself
        (4, "combine the first and third turns", [1, 3]),  # combination of two earlier turns
        (4, "Go back to turn 1 and keep the colour in turn 3", [1, 3]),  # rollback + keep
        (3, "make it red", []),
        (3, "go back to turn 3", []),  # itself: not earlier
        (3, "go back to turn 5", []),  # later: not a reference
    ],
)
def test_effective_reference_turns(turn, text, effective):
    assert effective_reference_turns(turn, parse_turn_references(text, turn)) == effective


def test_reference_checks():
    def checks(turn, n, text):
        return turn_reference_checks(turn, n, parse_turn_references(text, turn))

    assert checks(3, 4, "go back to turn 2") == []
    assert checks(3, 4, "go back to turn 3") == [REF_NOT_EARLIER]  # itself
    assert checks(3, 4, "go back to turn 4") == [REF_NOT_EARLIER, REF_LATER]  # exists, later
    assert checks(3, 4, "go back to turn 9") == [REF_NOT_EARLIER, REF_LATER]  # does not exist
    assert checks(3, 4, "keep the colour and make it long") == [KEEP_NAMES_NO_TURN]
    assert checks(1, 4, "keep the colour and make it long") == []  # turn 1: about its reference
    assert checks(3, 4, "keep the colour in turn 1") == []
    assert checks(2, 4, "we fix the rest in the next turn") == [REF_LATER]
    assert session_turn_references(
        ["add a star", "go back to turn 1 and make it blue", "keep the colour of turn 2 and the size in turn 5"]
    ) == [([], []), ([1], []), ([2, 3], [REF_NOT_EARLIER, REF_LATER])]


def test_describe_reference():
    assert describe_reference(3, []) == ""
    assert describe_reference(3, [2]) == "refers back to turn 2"
    assert describe_reference(4, [2, 4]) == "keeps from turn 2"
    assert describe_reference(4, [1, 3]) == "combines turn 1 and turn 3"


def test_effective_references_numpy_and_torch():
    own = np.array([[2.0, 0, 0], [0, 3.0, 0], [0, 0, 1.0], [1.0, 1.0, 0]])
    eff = effective_references(own, [[], [1], [1, 2], []])
    assert np.allclose(eff[0], own[0]) and np.allclose(eff[3], own[3])  # unchanged rows as given
    assert np.allclose(eff[1], [1, 0, 0])  # rollback: turn 1's image, normalised
    assert np.allclose(eff[2], np.array([1, 1, 0]) / np.sqrt(2))  # mean of the normalised images
    t = effective_references(torch.from_numpy(own).float(), [[], [1], [1, 2], []])
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and np.allclose(t.numpy(), eff, atol=1e-6)
    assert effective_references(own, [[]] * 4) is own
    with pytest.raises(ValueError):
        effective_references(own, [[], [5], [], []])


def _unit(*rows):
    a = np.array(rows, dtype=float)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def test_consistency_checks_by_hand():
    # images: I0 = a, turn 1 -> b, turn 2 -> b (no-op), turn 3 -> a (circle), turn 4 -> c
    a, b, c, d = np.eye(4)
    start = a
    targets = np.vstack([b, b, a, c])
    effective = np.vstack([a, b, b, a])  # turn 4 rolls back to turn 1's image
    flags = session_consistency(start, targets, effective, None)
    assert flags == [{}, {NOOP: 2}, {CIRCLE: 1}, {}]
    # a rollback whose target repeats the previous target: duplicate, not a no-op
    flags = session_consistency(a, np.vstack([b, c, c]), np.vstack([a, b, b]), None)
    assert flags == [{}, {}, {DUPLICATE: 2}]
    # thresholds are inclusive; an unknown target (NaN) skips the image checks
    near = _unit([1, 0.05, 0, 0])[0]  # cos with a = 0.9988
    assert NOOP_COSINE <= float(near @ a) < 1
    assert session_consistency(a, np.vstack([near]), np.vstack([a]), None) == [{NOOP: 1}]
    th = ConsistencyThresholds(noop=0.999)
    assert session_consistency(a, np.vstack([near]), np.vstack([a]), None, th) == [{}]
    assert session_consistency(a, np.vstack([np.full(4, np.nan), a]), np.vstack([a, a]), None) == [{}, {NOOP: 2}]


def test_conflict_from_text_directions():
    # centred directions: turn 3 asks the opposite of turn 1
    d = np.array([[1.0, 0, 0], [0, 1.0, 0], [-1.0, 0.1, 0], [0, 0, 1.0]])
    imgs = np.eye(5, 3) + 0.0
    targets = np.array([[0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 1]], dtype=float)
    flags = session_consistency(np.array([1.0, 0, 0]), targets, np.vstack([imgs[0], targets[:3]]), d)
    assert flags[2] == {CONFLICT: 1} and CONFLICT not in flags[1] and CONFLICT not in flags[3]
    # exactly at -threshold counts
    th = ConsistencyThresholds(conflict=1.0)
    d2 = np.array([[1.0, 0], [-1.0, 0]])
    assert session_consistency(
        np.array([1.0, 0]), np.array([[0, 1.0], [1.0, 1.0]]), np.array([[1.0, 0], [0, 1.0]]), d2, th
    )[1] == {CONFLICT: 1}
    # directions are centred on the rows' mean (or a given centre)
    t = np.array([[1.0, 1.0], [1.0, -1.0]])
    assert np.allclose(text_directions(t).sum(axis=0), 0)
    assert np.allclose(text_directions(t, centre=[0, 0]), t / np.sqrt(2))


def test_precision_recall_of_the_session_checks():
    truth = {
        "s1": {"flaw": "noop", "flaw_turn": 2},
        "s2": {"flaw": "circle", "flaw_turn": 3},
        "s3": {"flaw": None, "flaw_turn": None},
        "s4": {"flaw": "redundant", "flaw_turn": 2},
    }
    flags = {
        ("s1", 2): {"noop": 2},
        ("s2", 3): {"circle": 1, "conflict": 2},
        ("s3", 1): {"noop": 1},
        ("s9", 2): {"noop": 2},
    }  # s9 is not among the checked sessions
    got = check_session_flags(truth, flags)
    assert got["noop"] == {"planted": 2, "found": 2, "hits": 1, "precision": 0.5, "recall": 0.5}
    assert got["circle"]["precision"] == got["circle"]["recall"] == 1.0
    assert got["conflict"] == {"planted": 1, "found": 1, "hits": 1, "precision": 1.0, "recall": 1.0}
    assert got["duplicate"] == {"planted": 0, "found": 0, "hits": 0, "precision": None, "recall": None}
    refs = check_reference_turns(
        {"s1": {"reference_turns": [[], [1], [1, 3]]}, "s2": {"reference_turns": [[], []]}},
        {"s1": [[], [1], [1]], "s2": [[], [1]]},
    )
    assert refs == {"planted": 2, "read": 1, "spurious": 1}


def test_conflict_from_image_changes():
    # turn 1 a -> b, turn 2 b -> c, turn 3 c -> c - (b - a): undoes turn 1's change
    a, b, c = np.array([1.0, 0, 0]), np.array([0.6, 0.8, 0]), np.array([0.6, 0.0, 0.8])
    undo = c - (b - a)
    targets, effective = np.vstack([b, c, undo]), np.vstack([a, b, c])
    d = change_directions(targets, effective)
    assert np.allclose(d[0], b - a) and float(d[0] @ d[2] / np.linalg.norm(d[0]) / np.linalg.norm(d[2])) < -0.8
    flags = session_consistency(a, targets, effective, d, ConsistencyThresholds(conflict=0.8))
    assert flags[2] == {CONFLICT: 1} and flags[1] == {}
    # an unknown target gives no direction
    assert np.allclose(change_directions(np.vstack([np.full(3, np.nan)]), np.vstack([a])), 0)
