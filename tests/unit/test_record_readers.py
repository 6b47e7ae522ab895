"""The JSONL readers of the agreement, audit_labels and session_metrics commands read their
lines through retrieval.validation.Record.

Every error is a ParseError naming the file, the line (``line N``, 1-based, blank lines
counted) and the field; ``record`` is the 0-based line index, as the importers' JSONL records.
"""

from __future__ import annotations

import pytest

from annotation.management.commands.agreement import JudgementChecker, read_jsonl
from audit.management.commands.audit_labels import parse_rank_line
from audit.management.commands.session_metrics import read_sessions
from retrieval.records import ParseError


def read(text: str, level: str = "nominal", rubric: str | None = None) -> list:
    return read_jsonl(text.splitlines(keepends=True), JudgementChecker(level, rubric, source="in.jsonl"))


def error(text: str, **kwargs) -> ParseError:
    with pytest.raises(ParseError) as info:
        read(text, **kwargs)
    return info.value


@pytest.mark.parametrize(
    "text, line, field, message",
    [
        ('{"item": 1, "annotator": "A", "label": "x"}\n\n{"item": 2, "annotator": "A"}\n', 3, "label", "missing field"),
        (
            '{"item": true, "annotator": "A", "label": "x"}\n',
            1,
            "item",
            "expected a string or an integer, got boolean (True)",
        ),
        ('{"item": 1, "annotator": "", "label": "x"}\n', 1, "annotator", "must not be empty"),
        ("\n\n[1]\n", 3, None, "expected a JSON object for this judgement, got list"),
        (
            '{"item": 1, "annotator": "A", "label": "x"}\n{"item": 1, "annotator": "A", "label": "y"}\n',
            2,
            "annotator",
            "annotator 'A' already judged item 1 at line 1",
        ),
        ('{"item": 1, "annotator": "A", "label": Infinity}\n', 1, "label", "inf is not a finite number"),
    ],
)
def test_errors_name_file_line_and_field(text, line, field, message):
    err = error(text)
    assert (err.file, err.record, err.field, err.message) == ("in.jsonl", line - 1, field, message)
    where = f"in.jsonl, line {line}" + (f", field '{field}'" if field else "")
    assert str(err) == f"{where}: {message}"


def test_invalid_json_names_the_line_and_an_empty_input_the_file():
    err = error('{"item": 1, "annotator": "A", "label": "x"}\n{"item": 2,\n')
    assert (err.record, err.field) == (1, None) and str(err).startswith("in.jsonl, line 2: invalid JSON: ")
    assert str(error("\n \n")) == "in.jsonl: no judgements (the input is empty)"


def test_validity_labels_are_checked_per_line():
    err = error(
        '{"item": 1, "annotator": "A", "label": "VALIDATED"}\n{"item": 1, "annotator": "B", "label": ["NOPE"]}\n',
        rubric="validity",
    )
    assert (err.record, err.field) == (1, "label") and "unknown flag 'NOPE'" in err.message
    assert read('{"item": "q", "annotator": 3, "label": []}\n', rubric="validity") == [("q", 3, [])]


def test_audit_labels_lines_name_the_source_line_and_field():
    with pytest.raises(ParseError) as info:
        parse_rank_line('{"query": "q", "retriever": "", "mm": 1, "text": 2, "image": 3}', 4, "ranks.jsonl")
    assert str(info.value) == "ranks.jsonl, line 4, field 'retriever': must not be empty"
    with pytest.raises(ParseError) as info:
        parse_rank_line('{"query": "q", "retriever": "A", "mm": [2, 0], "text": 2, "image": 3}', 4, "ranks.jsonl")
    assert (info.value.record, info.value.field) == (3, "mm[1]")
    assert parse_rank_line('{"query": 7, "retriever": "A", "mm": [2, null], "text": null, "image": 3}', 1) == (
        7,
        "A",
        [2, None],
        None,
        3,
    )


def test_session_lines_name_the_file_line_and_field(tmp_path):
    path = tmp_path / "sessions.jsonl"
    path.write_text('{"session": "a", "ranks": [1, null]}\n\n{"session": "b", "ranks": [2, 0]}\n')
    with pytest.raises(ParseError) as info:
        read_sessions(path)
    assert str(info.value) == f"{path}, line 3, field 'ranks[1]': expected a rank >= 1 or null, got 0"
    path.write_text('{"session": "a", "ranks": [1]}\n{"session": "a", "ranks": [2]}\n')
    with pytest.raises(ParseError, match=r"line 2, field 'session': 'a' already given on line 1"):
        read_sessions(path)
    path.write_text('{"session": 4, "ranks": [3, null]}\n')
    assert read_sessions(path) == {4: [3, None]}
