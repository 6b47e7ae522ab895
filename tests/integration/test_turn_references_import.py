"""The importers keep each session turn's effective reference and reference checks (issue 26):
read from the turn texts ("turn 2", "the second turn", "Keep the colour in the 1st turn"), or
given by a CIRCLED turn's ``reference_turns``; the loader stores them on the turns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval.importers import circled, mtfiq
from retrieval.importers._common import resolve_turn_references
from retrieval.loader import content_hash, load_parsed
from retrieval.models import Turn
from retrieval.records import QueryRecord, TextRecord, TurnRecord
from retrieval.sessions import KEEP_NAMES_NO_TURN, REF_LATER, REF_NOT_EARLIER


def write(tmp_path: Path, name: str, content) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(content), encoding="utf-8")
    return path


def session(sid: str, captions: list[str], given: dict[int, list] | None = None) -> dict:
    turns = [{"turn": n, "reference_image_id": f"B{n}", "relative_caption": c} for n, c in enumerate(captions, 1)]
    for n, refs in (given or {}).items():
        turns[n - 1]["reference_turns"] = refs
    return {
        "session_id": sid,
        "subset": "fashioniq_dress_val",
        "ground_truth_ids": ["T"],
        "num_turns": len(turns),
        "turns": turns,
    }


FASHIONMT = [
    "is longer and red",
    "has short sleeves",
    "go back to the second turn and make it blue",  # rollback
    "Keep the color in the 1st turn and add a belt",  # combination with itself
    "keep the pattern. As in turn 6",  # a keep claim without a turn; a later turn that does not exist
]


def test_circled_reads_turn_references_from_the_captions(tmp_path):
    ds = circled.parse([write(tmp_path, "fashioniq_dress_val.json", [session("s1", FASHIONMT)])])
    turns = ds.queries[0].turns
    assert [t.reference_turns for t in turns] == [[], [], [2], [1, 4], []]
    assert [t.reference_checks for t in turns] == [[], [], [], [], [REF_NOT_EARLIER, KEEP_NAMES_NO_TURN, REF_LATER]]


def test_circled_keeps_given_reference_turns(tmp_path):
    given = {2: [1], 3: [1, 2], 4: [4, 9]}  # turn 4 names itself and a turn the session lacks
    ds = circled.parse([write(tmp_path, "fashioniq_dress_val.json", [session("s1", ["a", "b", "c", "d"], given)])])
    turns = ds.queries[0].turns
    assert [t.reference_turns for t in turns] == [[], [1], [1, 2], []]
    assert turns[3].reference_turns == [] and turns[3].reference_checks == [REF_NOT_EARLIER]
    bad = session("s2", ["a", "b"], {2: "turn 1"})
    with pytest.raises(Exception, match="reference_turns"):
        circled.parse([write(tmp_path, "fashioniq_dress_val.json", [bad])])


def test_mtfiq_reads_turn_references_from_its_two_captions(tmp_path):
    record = {
        "target": ["http://x/t.jpg", "T"],
        "reference": [
            ["http://x/1.jpg", ["is red", "shorter"], "A1"],
            ["http://x/2.jpg", ["has a belt", "belted"], "A2"],
            ["http://x/3.jpg", ["go back to turn 1", "as in the first turn but blue"], "A3"],
        ],
    }
    ds = mtfiq.parse([write(tmp_path, "dress.val.json", [record])])
    assert [t.reference_turns for t in ds.queries[0].turns] == [[], [], [1]]


@pytest.mark.django_db
def test_the_loader_stores_the_references_on_the_turns(tmp_path):
    ds = circled.parse(
        [write(tmp_path, "fashioniq_dress_val.json", [session("s1", FASHIONMT), session("s2", ["a", "b"])])]
    )
    load_parsed(ds, "fmt")
    rows = {(t.query.external_id, t.index): t for t in Turn.objects.select_related("query")}
    assert rows[("s1", 3)].reference_turns == [2] and rows[("s1", 4)].reference_turns == [1, 4]
    assert rows[("s1", 5)].reference_checks == [REF_NOT_EARLIER, KEEP_NAMES_NO_TURN, REF_LATER]
    assert rows[("s2", 2)].reference_turns == [] and rows[("s2", 2)].reference_checks == []
    # staff read them on the query's page
    from django.contrib.auth.models import Group
    from django.test import Client

    from annotation.roles import RESEARCHER
    from tests.conftest import make_annotator

    user = make_annotator("rita")
    user.groups.add(Group.objects.get_or_create(name=RESEARCHER)[0])
    client = Client()
    client.force_login(user)
    html = client.get(f"/datasets/fmt/queries/{rows[('s1', 5)].query_id}/").content.decode()
    assert 'data-reference-turns="2"' in html and 'data-reference-turns="1,4"' in html
    assert html.count('data-check="refers_to_later_turn"') == 1 and 'data-check="keep_names_no_turn"' in html


def test_a_turn_without_references_keeps_its_digest():
    """Digests written before these fields existed stay valid for turns without references."""
    plain = QueryRecord(
        "q",
        "val",
        0,
        "f",
        targets=[],
        raw={},
        turns=[TurnRecord(1, "a", [TextRecord("x")]), TurnRecord(2, "b", [TextRecord("y")])],
    )
    before = content_hash(plain)
    resolve_turn_references(plain)
    assert [t.reference_turns for t in plain.turns] == [[], []] and content_hash(plain) == before
    retro = QueryRecord(
        "q",
        "val",
        0,
        "f",
        targets=[],
        raw={},
        turns=[TurnRecord(1, "a", [TextRecord("x")]), TurnRecord(2, "b", [TextRecord("go back to turn 1")])],
    )
    digest = content_hash(retro)
    resolve_turn_references(retro)
    assert content_hash(retro) != digest  # the effective reference is content
