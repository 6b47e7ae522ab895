"""Rubric definitions and judgement payloads are read through retrieval.validation.Record:
unknown fields, wrong types (a boolean or a float where an integer belongs) and blank
strings are refused, and the error names the field by its path."""

from __future__ import annotations

import copy

import pytest

from annotation.core.rubric import (
    SESSION_RUBRIC_V1,
    VALIDITY_RUBRIC_V1,
    JudgementError,
    Rubric,
    builtin_rubrics,
    validate_judgement,
)
from retrieval.records import ParseError


def _set(path: tuple, value):
    """A mutation setting ``data[path...] = value``."""

    def mutate(data):
        for step in path[:-1]:
            data = data[step]
        data[path[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("source", "mutate", "field", "message"),
    [
        # unknown fields, at any depth
        (VALIDITY_RUBRIC_V1, _set(("colour",), "red"), "rubric.colour", "unknown field; allowed: "),
        (
            VALIDITY_RUBRIC_V1,
            _set(("categories", 2, "colour"), "red"),
            "rubric.categories[2].colour",
            "unknown field; allowed: ['description', 'key', 'label', 'severity', 'shortcut_key', 'sub_reasons', 'valid']",
        ),
        (
            VALIDITY_RUBRIC_V1,
            _set(("categories", 0, "sub_reasons", 1, "hint"), "x"),
            "rubric.categories[0].sub_reasons[1].hint",
            "unknown field; allowed: ",
        ),
        (VALIDITY_RUBRIC_V1, _set(("flags", "extra"), 1), "rubric.flags.extra", "unknown field; allowed: "),
        (SESSION_RUBRIC_V1, _set(("scales", 3, "step"), 1), "rubric.scales[3].step", "unknown field; allowed: "),
        (
            SESSION_RUBRIC_V1,
            _set(("reject_flags", 1, "colour"), "red"),
            "rubric.reject_flags[1].colour",
            "unknown field; allowed: ",
        ),
        # a boolean or a float where an integer belongs
        (VALIDITY_RUBRIC_V1, _set(("version",), True), "rubric.version", "expected an integer, got boolean (True)"),
        (VALIDITY_RUBRIC_V1, _set(("version",), 1.0), "rubric.version", "expected an integer, got number (1.0)"),
        (
            VALIDITY_RUBRIC_V1,
            _set(("categories", 3, "severity"), 1.0),
            "rubric.categories[3].severity",
            "expected an integer, got number (1.0)",
        ),
        (
            SESSION_RUBRIC_V1,
            _set(("scales", 0, "max"), True),
            "rubric.scales[0].max",
            "expected an integer, got boolean (True)",
        ),
        (
            VALIDITY_RUBRIC_V1,
            _set(("categories", 4, "valid"), 1),
            "rubric.categories[4].valid",
            "expected true or false, got number",
        ),
        # blank strings
        (VALIDITY_RUBRIC_V1, _set(("categories", 2, "label"), "  "), "rubric.categories[2].label", "must not be blank"),
        (VALIDITY_RUBRIC_V1, _set(("categories", 2, "key"), ""), "rubric.categories[2].key", "must not be blank"),
        (
            VALIDITY_RUBRIC_V1,
            _set(("decision_order", 1, "question"), "\t"),
            "rubric.decision_order[1].question",
            "must not be blank",
        ),
        (
            SESSION_RUBRIC_V1,
            _set(("per_turn_checks", 1, "label"), " "),
            "rubric.per_turn_checks[1].label",
            "must not be blank",
        ),
        # other types
        (
            VALIDITY_RUBRIC_V1,
            _set(("categories", 1), "INVALID_IMAGE_QUERY"),
            "rubric.categories[1]",
            "expected a JSON object for this category, got string",
        ),
        (VALIDITY_RUBRIC_V1, _set(("categories",), {}), "rubric.categories", "expected a list, got object"),
        (
            SESSION_RUBRIC_V1,
            _set(("scales", 0, "anchors", "3"), 3),
            "rubric.scales[0].anchors.3",
            "expected a string, got number",
        ),
    ],
)
def test_definition_refusals_name_the_path(source, mutate, field, message):
    data = copy.deepcopy(source)
    mutate(data)
    with pytest.raises(ParseError) as err:
        Rubric.from_dict(data)
    assert err.value.field == field
    assert err.value.message.startswith(message)
    assert str(err.value).startswith(f"rubric {source['key']!r} v")  # the raw version, even a bad one
    assert f", field '{field}': {err.value.message}" in str(err.value)
    assert isinstance(err.value, ValueError)  # what Rubric.from_dict's callers catch


def test_a_definition_that_is_not_an_object_is_refused():
    with pytest.raises(ParseError) as err:
        Rubric.from_dict(["validity"])  # type: ignore[arg-type]
    assert (err.value.field, err.value.message) == ("rubric", "expected a JSON object for this rubric, got list")


# --------------------------------------------------------------------------- payloads

VALID = {"category": "VALIDATED", "time_spent_ms": 1000}
SESSION_OK = {
    "scales": {"naturalness": 4, "coherence": 5, "goal_progress": 3, "low_redundancy": 1, "overall": 4},
    "per_turn_checks": [{"real_difference_toward_target": True, "consistent_with_history": True, "valid": True}] * 2,
    "time_spent_ms": 1000,
}


def _refused(rubric_key: str, payload, n_turns=None) -> JudgementError:
    with pytest.raises(JudgementError) as err:
        validate_judgement(builtin_rubrics()[rubric_key], payload, n_turns=n_turns)
    return err.value


@pytest.mark.parametrize(
    ("rubric_key", "payload", "field", "message"),
    [
        # unknown fields inside nested objects (unknown top-level fields are ignored: see below)
        (
            "validity",
            {**VALID, "category": "QUERY_TOO_BROAD", "also": [{"category": "VALIDATED", "why": "x"}]},
            "also[0].why",
            "also[0].why: unknown field; allowed: ['category', 'sub_reason']",
        ),
        (
            "session",
            {**SESSION_OK, "scales": {**SESSION_OK["scales"], "beauty": 3}},
            "scales.beauty",
            "scales.beauty: unknown field; allowed: ",
        ),
        (
            "session",
            {**SESSION_OK, "per_turn_checks": [SESSION_OK["per_turn_checks"][0], {"funny": True}]},
            "per_turn_checks[1].funny",
            "per_turn_checks[1].funny: unknown field; allowed: ",
        ),
        # a boolean or a fractional number where an integer belongs
        (
            "validity",
            {**VALID, "time_spent_ms": 1000.5},
            "time_spent_ms",
            "time_spent_ms: expected an integer, got number (1000.5)",
        ),
        (
            "session",
            {**SESSION_OK, "scales": {**SESSION_OK["scales"], "overall": 4.5}},
            "scales.overall",
            "scales.overall: ",
        ),
        (
            "validity",
            {**VALID, "time_spent_ms": True},
            "time_spent_ms",
            "time_spent_ms: expected an integer, got boolean (True)",
        ),
        (
            "session",
            {**SESSION_OK, "scales": {**SESSION_OK["scales"], "overall": False}},
            "scales.overall",
            "scales.overall: expected an integer, got boolean (False)",
        ),
        (
            "session",
            {
                **SESSION_OK,
                "per_turn_checks": [{"real_difference_toward_target": 1, "consistent_with_history": True}] * 2,
            },
            "per_turn_checks[0].real_difference_toward_target",
            "per_turn_checks[0].real_difference_toward_target: expected true or false, got number",
        ),
        # blank strings
        ("validity", {**VALID, "category": " \t"}, "category", "category: required: pick exactly one of "),
        (
            "validity",
            {**VALID, "category": "INVALID_TARGET_IMAGE", "sub_reason": "  "},
            "sub_reason",
            "sub_reason: required for category INVALID_TARGET_IMAGE: one of ",
        ),
        (
            "validity",
            {**VALID, "category": "QUERY_TOO_BROAD", "also": [" "]},
            "also[0]",
            "also[0]: required: pick exactly one of ",
        ),
        (
            "validity",
            {**VALID, "category": "QUERY_TOO_BROAD", "also": [{"category": "INVALID_IMAGE_QUERY", "sub_reason": ""}]},
            "also[0].sub_reason",
            "also[0].sub_reason: required for category INVALID_IMAGE_QUERY: one of ",
        ),
        (
            "session",
            {**SESSION_OK, "scales": {**SESSION_OK["scales"], "coherence": " "}},
            "scales.coherence",
            "scales.coherence: required (1-5)",
        ),
        # other types
        ("validity", {**VALID, "note": ["x"]}, "note", "note: expected a string, got list"),
        (
            "validity",
            {**VALID, "category": "QUERY_TOO_BROAD", "also": [["VALIDATED"]]},
            "also[0]",
            "also[0]: expected exactly one category key, got list",
        ),
        ("session", {**SESSION_OK, "scales": [4, 5]}, "scales", "scales: expected an object, got list"),
        (
            "session",
            {**SESSION_OK, "per_turn_checks": [True, True]},
            "per_turn_checks[0]",
            "per_turn_checks[0]: expected a JSON object for this turn",
        ),
    ],
)
def test_payload_refusals_name_the_path(rubric_key, payload, field, message):
    err = _refused(rubric_key, payload, n_turns=2 if rubric_key == "session" else None)
    assert err.field == field
    assert err.message.startswith(message)
    assert str(err) == err.message  # the field leads the message once, as the API shows it
    assert isinstance(err, ParseError) and err.file == "judgement payload" and err.record is None


def test_every_field_the_annotation_page_sends_is_allowed():
    """What annotate.js posts (after the API took client_token and base_revision)."""
    rubrics = builtin_rubrics()
    j = validate_judgement(
        rubrics["validity"],
        {
            "note": "",
            "flagged": False,
            "alternatives": [],
            "category": "VALIDATED",
            "sub_reason": None,
            "time_spent_ms": 9,
        },
    )
    assert j.category == "VALIDATED"
    s = validate_judgement(
        rubrics["session"], {**SESSION_OK, "note": "", "flagged": True, "reject_flags": []}, n_turns=2
    )
    assert s.flagged is True and s.reject_flags == ()


def test_unknown_top_level_fields_are_ignored_and_integral_numbers_accepted():
    """As the API always did: a client's own bookkeeping fields do not refuse a judgement,
    and a JavaScript client's 1500.0 is the integer 1500."""
    rubrics = builtin_rubrics()
    j = validate_judgement(rubrics["validity"], {**VALID, "client_version": "2.1", "time_spent_ms": 1500.0})
    assert j.category == VALID["category"] and j.time_spent_ms == 1500
    s = validate_judgement(
        rubrics["session"], {**SESSION_OK, "scales": {**SESSION_OK["scales"], "overall": 4.0}}, n_turns=2
    )
    assert s.scales["overall"] == 4


def test_judgement_errors_built_by_hand_keep_field_and_message():
    err = JudgementError("alternatives", "must be a list of candidate image ids")
    assert (err.field, err.message) == ("alternatives", "must be a list of candidate image ids")
    assert str(err) == "alternatives: must be a list of candidate image ids"
    assert str(JudgementError("base_revision", "base_revision must be a number")) == "base_revision must be a number"
