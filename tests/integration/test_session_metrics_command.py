"""session_metrics over a JSONL of per-turn ranks, checked by hand."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command


def run(tmp_path, lines, *args) -> dict:
    path = tmp_path / "ranks.jsonl"
    path.write_text("\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines) + "\n")
    out = StringIO()
    call_command("session_metrics", str(path), *args, "--format", "json", stdout=out)
    return json.loads(out.getvalue())


def test_hand_computed_sessions(tmp_path):
    # a: hit at turn 2; b: never (3 turns); c: hit at turn 1 (1 turn, carried forward);
    # d: rank worsens by exactly 30 (passes), then by 31 (violates)
    lines = [
        {"session": "a", "ranks": [40, 10]},
        {"session": "b", "ranks": [50, 20, None]},
        {"session": "c", "ranks": [3]},
        {"session": "d", "ranks": [12, 42, 73]},
    ]
    r = run(tmp_path, lines)
    assert r["n_sessions"] == 4
    assert r["hits_at_k"] == [0.25, 0.5, 0.5]
    assert r["final_recall_at_k"] == 0.5  # a and c are within 10 at their own last turn
    assert r["auc"] == pytest.approx(((0.25 + 0.5) / 2 + (0.5 + 0.5) / 2) / 2)
    # b goes from 20 to not-retrieved (a violation), d from 42 to 73 (+31)
    assert r["epsilon_violations"] == ["b", "d"] and r["epsilon_consistent"] == 2


def test_k_boundary_and_epsilon_option(tmp_path):
    r = run(
        tmp_path, [{"session": 1, "ranks": [11, 10]}, {"session": 2, "ranks": [10, 50]}], "--k", "10", "--epsilon", "40"
    )
    assert r["hits_at_k"] == [0.5, 1.0] and r["epsilon_violations"] == []


@pytest.mark.parametrize(
    "line,fragment",
    [
        ('{"session": "a", "ranks": [1,', "line 1: not JSON"),
        ('{"session": "a"}', "field 'ranks': missing"),
        ('{"session": "a", "ranks": [0]}', "ranks[0]"),
        ('{"session": true, "ranks": [1]}', "field 'session'"),
    ],
)
def test_malformed_lines(tmp_path, line, fragment):
    with pytest.raises(CommandError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        run(tmp_path, [line])
