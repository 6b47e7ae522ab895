"""manage.py audit_labels over hand-made JSONL rank files (no database needed)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from audit.labels import audit_json, label_queries

# Hand-checked with K = 10, M = 1:
#   q1  A text 10 (a hit: rank == K)                   -> shortcut_solvable / text_only
#   q2  A mm 10, text/image 11; B nothing retrieved     -> composition_required
#   q3  mm 11 and 11, text 12, image 30 / 11           -> unresolved
#   q4  A text 5 and image 4                            -> shortcut_solvable / both_unimodal
#   q5  A image 10                                      -> shortcut_solvable / image_only
#   q6  only A has a row (mm 1); B counts as not retrieved -> composition_required
LINES = [
    {"query": "q1", "retriever": "A", "mm": 3, "text": 10, "image": 50},
    {"query": "q1", "retriever": "B", "mm": 1, "text": 11, "image": None},
    {"query": "q2", "retriever": "A", "mm": 10, "text": 11, "image": 11},
    {"query": "q2", "retriever": "B", "mm": None, "text": None, "image": None},
    {"query": "q3", "retriever": "A", "mm": 11, "text": 12, "image": 30},
    {"query": "q3", "retriever": "B", "mm": 11, "text": None, "image": 11},
    {"query": "q4", "retriever": "A", "mm": 2, "text": 5, "image": 4},
    {"query": "q4", "retriever": "B", "mm": 1, "text": 30, "image": 2},
    {"query": "q5", "retriever": "A", "mm": 20, "text": 40, "image": 10},
    {"query": "q5", "retriever": "B", "mm": 5, "text": 20, "image": 30},
    {"query": "q6", "retriever": "A", "mm": 1, "text": 11, "image": 11},
]


@pytest.fixture
def ranks_file(tmp_path):
    path = tmp_path / "ranks.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in LINES) + "\n\n")  # a trailing blank line is fine
    return path


def run(*args) -> dict:
    out = StringIO()
    call_command("audit_labels", *map(str, args), "--format", "json", stdout=out)
    return json.loads(out.getvalue())


def test_labels_and_counts_at_k_10(ranks_file):
    doc = run(ranks_file)
    assert doc["labels"] == {
        "q1": "shortcut_solvable",
        "q2": "composition_required",
        "q3": "unresolved",
        "q4": "shortcut_solvable",
        "q5": "shortcut_solvable",
        "q6": "composition_required",
    }
    assert doc["counts"] == {"composition_required": 2, "unresolved": 1, "shortcut_solvable": 3, "shortcut_free": 3}
    assert doc["detail_counts"] == {
        "both_unimodal": 1,
        "text_only": 1,
        "image_only": 1,
        "composition_required": 2,
        "unresolved": 1,
    }
    a, b = doc["retrievers"]["A"], doc["retrievers"]["B"]
    # A's multimodal ranks 3, 10, 11, 2, 20, 1: four within K = 10
    assert a["recall_at_k"]["multimodal"] == pytest.approx(4 / 6)
    assert a["mrr"]["multimodal"] == pytest.approx((1 / 3 + 1 / 10 + 1 / 11 + 1 / 2 + 1 / 20 + 1) / 6)
    # B's: 1, null, 11, 1, 5 and no row for q6 (= null): three hits
    assert b["recall_at_k"]["multimodal"] == pytest.approx(3 / 6)
    assert b["recall_at_k"]["text_only"] == 0.0
    # the command prints exactly the library's document
    rows = [tuple(x[f] for f in ("query", "retriever", "mm", "text", "image")) for x in LINES]
    assert doc == json.loads(json.dumps(audit_json(label_queries(rows))))


def test_k_boundary(ranks_file):
    nine = run(ranks_file, "--k", "9")["labels"]
    assert nine["q1"] == "composition_required"  # text 10 is no longer a hit, mm 3 is
    assert nine["q2"] == "unresolved"  # mm 10 > 9
    assert nine["q5"] == "composition_required"  # image 10 > 9; B's mm 5
    eleven = run(ranks_file, "--k", "11")
    # K = 11: q2 and q6 (text 11, image 11) and q4 both; q1 text 10 only; q3 (B image 11)
    # and q5 (A image 10) image only
    assert eleven["labels"]["q2"] == eleven["labels"]["q3"] == "shortcut_solvable"
    assert eleven["detail_counts"] == {
        "both_unimodal": 3,
        "text_only": 1,
        "image_only": 2,
        "composition_required": 0,
        "unresolved": 0,
    }


def test_min_mm_retrievers(ranks_file):
    doc = run(ranks_file, "--min-mm-retrievers", "2")
    # q2 and q6 have one retriever within K multimodally: not enough any more
    assert doc["labels"]["q2"] == doc["labels"]["q6"] == "unresolved"
    assert doc["counts"]["composition_required"] == 0 and doc["counts"]["unresolved"] == 3


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"query": "q", "retriever": "A", "mm": 1, "text": 2}', "bad.jsonl, line 2, field 'image': missing field"),
        ('{"query": "q", "retriever": "A", "mm": 0, "text": 2, "image": 3}', "line 2, field 'mm'"),
        ('{"query": "q", "retriever": "A", "mm": 1, "text": "2", "image": 3}', "line 2, field 'text'"),
        ('{"query": "q", "retriever": "A", "mm": 1, "text": 2, "image": true}', "line 2, field 'image'"),
        ('{"query": "q", "retriever": "A", "mm": 1.5, "text": 2, "image": 3}', "line 2, field 'mm'"),
        ('{"query": null, "retriever": "A", "mm": 1, "text": 2, "image": 3}', "line 2, field 'query'"),
        ('{"query": "q", "retriever": "A", "mm": 1, ', "line 2: not valid JSON"),
        ("[1, 2, 3]", "line 2: expected a JSON object"),
    ],
)
def test_malformed_lines_name_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(LINES[0]) + "\n" + line + "\n")
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        run(path)


def test_ids_that_print_the_same_are_refused(tmp_path):
    from django.core.management import CommandError

    path = tmp_path / "ids.jsonl"
    path.write_text(
        '{"query": 1, "retriever": "A", "mm": 1, "text": 5, "image": 5}\n'
        '{"query": "1", "retriever": "A", "mm": 2, "text": 5, "image": 5}\n'
    )
    with pytest.raises(CommandError, match=r"query ids 1 and '1' differ but print the same"):
        run(path)
    path.write_text(
        '{"query": 1, "retriever": "A", "mm": 1, "text": 5, "image": 5}\n'
        '{"query": 1, "retriever": "B", "mm": 2, "text": 5, "image": 5}\n'
    )
    assert list(run(path)["labels"]) == ["1"]  # the same id, one way: fine
