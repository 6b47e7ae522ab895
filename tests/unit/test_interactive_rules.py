"""The interactive study's pure rules: settings, the stopping rule, the feedback text; and the
session report's rank curve (retrieval.sessions.rank_curve)."""

from __future__ import annotations

import pytest

from annotation.core.rounds import FOUND, OUT_OF_ROUNDS, InteractiveSettings, clean_text, hides_target, outcome
from retrieval.sessions import rank_curve


def test_defaults_are_n_10_and_r_5():
    s = InteractiveSettings(retriever="openclip:cirval-tiny-vit")
    assert (s.top_n, s.max_rounds, s.strategy, s.target_view) == (10, 5, "average", "image")
    assert InteractiveSettings.from_dict(s.to_dict()) == s


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"top_n": 0}, "top_n"),
        ({"top_n": True}, "top_n"),
        ({"max_rounds": 21}, "max_rounds"),
        ({"strategy": "mean"}, "strategy"),
        ({"target_view": "sketch"}, "target_view"),
        ({"alpha": 2}, "alpha"),
        ({"retriever": " "}, "retriever"),
    ],
)
def test_bad_settings_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        InteractiveSettings.from_dict({"retriever": "openclip:x", **bad})
    with pytest.raises(ValueError, match="unknown"):
        InteractiveSettings.from_dict({"retriever": "openclip:x", "rounds": 3})


def test_the_session_ends_at_the_top_n_or_after_r_rounds():
    s = InteractiveSettings(retriever="openclip:x", top_n=10, max_rounds=3)
    assert outcome(10, 1, s) == FOUND and outcome(1, 3, s) == FOUND
    assert outcome(11, 1, s) == "" and outcome(None, 2, s) == ""
    assert outcome(11, 3, s) == OUT_OF_ROUNDS and outcome(None, 3, s) == OUT_OF_ROUNDS


def test_feedback_is_one_trimmed_line():
    assert clean_text("  make it\n red  ") == "make it red"
    for bad in ("", "   ", None, "x" * 501):
        with pytest.raises(ValueError):
            clean_text(bad)


def test_rank_curve_is_the_median_per_turn_over_sessions_that_reach_it():
    # turn 1: 3, 5, inf -> 5; turn 2: 1, inf -> (1 + inf) / 2 = inf -> None; turn 3: 2
    assert rank_curve({"a": [3, 1, 2], "b": [5, None], "c": [None]}) == [5.0, None, 2.0]
    assert rank_curve({"a": [4, 2], "b": [2, 4]}) == [3.0, 3.0]
    assert rank_curve({}) == []


def test_only_a_described_target_is_hidden():
    described = InteractiveSettings(retriever="openclip:x", target_view="description").to_dict()
    assert hides_target(described)
    assert not hides_target(InteractiveSettings(retriever="openclip:x").to_dict())
    assert not hides_target({}) and not hides_target(None)  # not an interactive study
