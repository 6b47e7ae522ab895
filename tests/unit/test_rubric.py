"""annotation.core.rubric: rubric definitions as data, judgement validation, signatures."""

from __future__ import annotations

import copy
import json

import pytest

from annotation.core.rubric import (
    CIRCUS_FLAG_ORDER,
    NOTE_MAX_CHARS,
    RESERVED_KEYS,
    SESSION_RUBRIC_V1,
    SESSION_RUBRIC_V2,
    TIME_SPENT_MAX_MS,
    VALIDITY_RUBRIC_V1,
    JudgementError,
    Rubric,
    builtin_rubric,
    builtin_rubrics,
    most_severe,
    signature,
    validate_judgement,
)


@pytest.fixture
def validity() -> Rubric:
    return builtin_rubrics()["validity"]


@pytest.fixture
def session() -> Rubric:
    return builtin_rubric("session", 1)  # the v1 payloads (v2: tests/unit/test_turn_verdicts.py)


def judged(rubric: Rubric, **payload):
    payload.setdefault("time_spent_ms", 30_000)
    return validate_judgement(rubric, payload)


# --------------------------------------------------------------------------- definitions


def test_builtins_load_and_round_trip_through_json():
    rubrics = builtin_rubrics()
    assert set(rubrics) == {"validity", "session"}
    for rubric, source in (
        (rubrics["validity"], VALIDITY_RUBRIC_V1),
        (rubrics["session"], SESSION_RUBRIC_V2),
        (builtin_rubric("session", 1), SESSION_RUBRIC_V1),
    ):
        assert rubric.version == source["version"]
        data = rubric.to_dict()
        assert data == source
        again = Rubric.from_dict(json.loads(json.dumps(data)))
        assert again == rubric
        assert again.to_dict() == data
    assert rubrics["validity"].kind == "category"
    assert rubrics["session"].kind == "session"


def test_builtin_rubrics_are_fresh_and_constants_untouched():
    a = builtin_rubrics()["validity"]
    snapshot = copy.deepcopy(VALIDITY_RUBRIC_V1)
    a.to_dict()["categories"].clear()
    assert VALIDITY_RUBRIC_V1 == snapshot
    assert builtin_rubrics()["validity"] == a


def test_validity_categories_and_sub_reasons_as_design(validity):
    cats = {c.key: c for c in validity.categories}
    assert [c.key for c in validity.categories] == [
        "INVALID_TEXT_QUERY",
        "INVALID_IMAGE_QUERY",
        "INVALID_TARGET_IMAGE",
        "QUERY_TOO_BROAD",
        "VALIDATED",
    ]
    subs = {k: [(s.key, s.requires_note) for s in c.sub_reasons] for k, c in cats.items()}
    assert subs == {
        "INVALID_TEXT_QUERY": [("ungrammatical_nonsensical", False), ("underspecified", False), ("other", True)],
        "INVALID_IMAGE_QUERY": [("cropped", False), ("low_resolution", False), ("other", True)],
        "INVALID_TARGET_IMAGE": [
            ("cropped", False),
            ("low_resolution", False),
            ("mismatch", False),
            ("identical_to_reference", False),
            ("contradicts_text", False),
            ("other", True),
        ],
        "QUERY_TOO_BROAD": [],
        "VALIDATED": [],
    }
    assert [c.key for c in validity.categories if c.valid] == ["VALIDATED"]
    assert validity.valid_category.key == "VALIDATED"
    assert validity.flags.order == CIRCUS_FLAG_ORDER
    assert (validity.flags.validated_field, validity.flags.note_field) == ("validated", "other")


def test_verdict_label_words_an_answer_as_the_rubric_does(validity):
    target = validity.category("INVALID_TARGET_IMAGE")
    assert validity.verdict_label("INVALID_TARGET_IMAGE", "low_resolution") == f"{target.label} / Low resolution"
    assert validity.verdict_label("VALIDATED") == validity.valid_category.label
    assert validity.verdict_label("GONE", "what") == "GONE / what"  # keys this rubric does not define stay keys


def test_severity_order_exactly_as_design(validity):
    assert [c.key for c in validity.by_severity()] == [
        "INVALID_TARGET_IMAGE",
        "INVALID_IMAGE_QUERY",
        "INVALID_TEXT_QUERY",
        "QUERY_TOO_BROAD",
        "VALIDATED",
    ]


def test_decision_order_and_category_keys(validity):
    steps = [s.category for s in validity.decision_order]
    assert steps == [
        "INVALID_TEXT_QUERY",
        "INVALID_IMAGE_QUERY",
        "INVALID_TARGET_IMAGE",
        "QUERY_TOO_BROAD",
        "VALIDATED",
    ]
    assert [validity.category(k).shortcut_key for k in steps] == ["1", "2", "3", "4", "5"]
    assert "understandable" in validity.decision_order[0].question


def test_shortcut_keys_unique_per_level_and_never_reserved(validity, session):
    reserved = {k.casefold() for k in RESERVED_KEYS}
    assert reserved == {"n", "enter", "s", "f", "b", "?"}
    first = [c.shortcut_key for c in validity.categories]
    assert len(set(first)) == len(first)
    for c in validity.categories:
        keys = [s.shortcut_key for s in c.sub_reasons]
        assert len(set(keys)) == len(keys)
        assert not set(keys) & set(first)
        assert not {k.casefold() for k in keys} & reserved
        assert all(s.shortcut_key == "o" for s in c.sub_reasons if s.key == "other")
    assert not {k.casefold() for k in first} & reserved
    sess = (
        [s.shortcut_key for s in session.scales]
        + [c.shortcut_key for c in session.per_turn_checks]
        + [c.shortcut_key for c in session.reject_flags]
    )
    assert len(set(sess)) == len(sess)
    assert not {k.casefold() for k in sess} & reserved
    assert not any(k.isdigit() for k in sess)


def test_session_rubric_contents(session):
    assert [(s.key, s.min, s.max) for s in session.scales] == [
        ("naturalness", 1, 5),
        ("coherence", 1, 5),
        ("goal_progress", 1, 5),
        ("low_redundancy", 1, 5),
        ("overall", 1, 5),
    ]
    assert [c.key for c in session.per_turn_checks] == ["real_difference_toward_target", "consistent_with_history"]
    assert [c.key for c in session.reject_flags] == ["duplicate", "inconsistency", "conflict", "circle"]
    assert session.categories == () and session.flags is None


def _broken(mutate) -> dict:
    data = copy.deepcopy(VALIDITY_RUBRIC_V1)
    mutate(data)
    return data


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["categories"][0].__setitem__("shortcut_key", "n"), "categories[0].shortcut_key"),
        (lambda d: d["categories"][0].__setitem__("shortcut_key", "?"), "reserved"),
        (lambda d: d["categories"][1].__setitem__("shortcut_key", "1"), "categories[1].shortcut_key"),
        (lambda d: d["categories"][0]["sub_reasons"][1].__setitem__("shortcut_key", "Q"), "sub_reasons[1]"),
        (lambda d: d["categories"][0]["sub_reasons"][0].__setitem__("shortcut_key", "3"), "first-level"),
        (lambda d: d["categories"][0].__setitem__("shortcut_key", "12"), "single printable character"),
        (lambda d: d["categories"][4].__setitem__("valid", False), "exactly one category"),
        (lambda d: d["categories"][4].__setitem__("severity", 5), "least severe"),
        (lambda d: d["categories"][3].__setitem__("severity", 2), "duplicate severity"),
        (lambda d: d["categories"][1].__setitem__("key", "INVALID_TEXT_QUERY"), "duplicate category key"),
        (lambda d: d["categories"][2]["sub_reasons"][5].__setitem__("key", "cropped"), "duplicate sub-reason"),
        (lambda d: d.__setitem__("version", 0), "version"),
        (lambda d: d.__setitem__("version", "1"), "version"),
        (lambda d: d.__setitem__("kind", "survey"), "kind"),
        (lambda d: d.__setitem__("title", "  "), "title"),
        (lambda d: d.__setitem__("colour", "red"), "colour"),
        (lambda d: d["decision_order"].pop(), "decision_order"),
        (lambda d: d["decision_order"][0].__setitem__("category", "NOPE"), "decision_order[0].category"),
        (lambda d: d["flags"]["order"].pop(), "flags.order"),
        (lambda d: d["categories"][0]["sub_reasons"][2].__setitem__("requires_note", "yes"), "requires_note"),
    ],
)
def test_invalid_definitions_name_the_problem(mutate, needle):
    with pytest.raises(ValueError, match="^rubric 'validity' v") as err:
        Rubric.from_dict(_broken(mutate))
    assert needle in str(err.value)


def test_session_definition_checks():
    data = copy.deepcopy(SESSION_RUBRIC_V1)
    data["scales"][0]["shortcut_key"] = "3"
    with pytest.raises(ValueError, match=r"scales\[0\]\.shortcut_key.*digit"):
        Rubric.from_dict(data)
    data = copy.deepcopy(SESSION_RUBRIC_V1)
    data["scales"][1]["max"] = 1
    with pytest.raises(ValueError, match=r"scales\[1\]\.max"):
        Rubric.from_dict(data)
    data = copy.deepcopy(SESSION_RUBRIC_V1)
    data["scales"] = []
    with pytest.raises(ValueError, match="scales"):
        Rubric.from_dict(data)
    data = copy.deepcopy(SESSION_RUBRIC_V1)
    data["reject_flags"][0]["shortcut_key"] = "q"  # naturalness already uses q
    with pytest.raises(ValueError, match=r"reject_flags\[0\]\.shortcut_key"):
        Rubric.from_dict(data)


def test_minimal_definition_gets_defaults():
    r = Rubric.from_dict(
        {
            "key": "mini",
            "version": 2,
            "title": "Mini",
            "kind": "category",
            "decision_order": [{"question": "Bad?", "category": "BAD"}, {"question": "Else", "category": "OK"}],
            "categories": [
                {"key": "BAD", "label": "Bad", "shortcut_key": "1", "severity": 1, "valid": False},
                {"key": "OK", "label": "Ok", "shortcut_key": "2", "severity": 0, "valid": True},
            ],
        }
    )
    assert r.flags.order == ("BAD",)
    assert Rubric.from_dict(r.to_dict()) == r
    j = validate_judgement(r, {"category": "BAD", "time_spent_ms": 1})
    assert j.flags == {"BAD": True} and j.signature == "BAD"


# --------------------------------------------------------------------------- category judgements


def test_clean_validated_judgement(validity):
    j = judged(validity, category="VALIDATED", note="  fine  ", flagged=False, time_spent_ms=42_000)
    assert j.category == "VALIDATED" and j.sub_reason is None and j.validated is True
    assert j.note == "fine" and j.time_spent_ms == 42_000 and j.flagged is False
    assert j.flags == {
        "INVALID_TEXT_QUERY": False,
        "INVALID_IMAGE_QUERY": False,
        "INVALID_TARGET_IMAGE": False,
        "QUERY_TOO_BROAD": False,
    }
    assert j.signature == "VALID"
    assert j.circus_annotation() == {
        "validated": True,
        "INVALID_TEXT_QUERY": False,
        "INVALID_IMAGE_QUERY": False,
        "INVALID_TARGET_IMAGE": False,
        "QUERY_TOO_BROAD": False,
        "other": "fine",
    }
    assert json.loads(json.dumps(j.to_dict()))["signature"] == "VALID"


def test_clean_invalid_judgement_with_sub_reason(validity):
    j = judged(validity, category="INVALID_IMAGE_QUERY", sub_reason="cropped", flagged=True)
    assert (j.category, j.sub_reason, j.validated, j.flagged) == ("INVALID_IMAGE_QUERY", "cropped", False, True)
    assert j.flags["INVALID_IMAGE_QUERY"] is True and sum(j.flags.values()) == 1
    assert j.signature == "INVALID_IMAGE_QUERY"


def test_other_with_note_and_form_strings(validity):
    j = judged(
        validity,
        category="INVALID_TEXT_QUERY",
        sub_reason="other",
        note="mixes two items",
        flagged="on",
        time_spent_ms="1500",
    )
    assert (j.sub_reason, j.note, j.flagged, j.time_spent_ms) == ("other", "mixes two items", True, 1500)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "category"),
        ({"category": ""}, "category"),
        ({"category": "   "}, "category"),
        ({"category": "INVALID"}, "category"),
        ({"category": ["VALIDATED", "QUERY_TOO_BROAD"]}, "category"),
        ({"category": "VALIDATED", "sub_reason": "cropped"}, "sub_reason"),
        ({"category": "QUERY_TOO_BROAD", "sub_reason": "other", "note": "x"}, "sub_reason"),
        ({"category": "INVALID_IMAGE_QUERY"}, "sub_reason"),
        ({"category": "INVALID_IMAGE_QUERY", "sub_reason": "mismatch"}, "sub_reason"),
        ({"category": "INVALID_TEXT_QUERY", "sub_reason": "other"}, "note"),
        ({"category": "INVALID_TEXT_QUERY", "sub_reason": "other", "note": "   "}, "note"),
        ({"category": "INVALID_TARGET_IMAGE", "sub_reason": "other", "note": "\n\t"}, "note"),
        ({"category": "VALIDATED", "note": "x" * (NOTE_MAX_CHARS + 1)}, "note"),
        ({"category": "VALIDATED", "note": 5}, "note"),
        ({"category": "VALIDATED", "flagged": "maybe"}, "flagged"),
        ({"category": "VALIDATED", "time_spent_ms": -1}, "time_spent_ms"),
        ({"category": "VALIDATED", "time_spent_ms": TIME_SPENT_MAX_MS + 1}, "time_spent_ms"),
        ({"category": "VALIDATED", "time_spent_ms": "abc"}, "time_spent_ms"),
        ({"category": "VALIDATED", "time_spent_ms": 1.5}, "time_spent_ms"),
        ({"category": "VALIDATED", "time_spent_ms": True}, "time_spent_ms"),
        ({"category": "VALIDATED", "time_spent_ms": None}, "time_spent_ms"),
        ({"category": "QUERY_TOO_BROAD", "also": ["BOGUS"]}, "also[0]"),
        ({"category": "QUERY_TOO_BROAD", "also": ["INVALID_IMAGE_QUERY"]}, "also[0].sub_reason"),
        (
            {"category": "QUERY_TOO_BROAD", "also": [{"category": "INVALID_IMAGE_QUERY", "sub_reason": "x"}]},
            "also[0].sub_reason",
        ),
        ({"category": "QUERY_TOO_BROAD", "also": ["QUERY_TOO_BROAD"]}, "also[0]"),
        ({"category": "QUERY_TOO_BROAD", "also": 3}, "also"),
        ({"category": "QUERY_TOO_BROAD", "also": [{"category": "INVALID_TEXT_QUERY", "sub_reason": "other"}]}, "note"),
    ],
)
def test_refusals_name_their_field(validity, payload, field):
    payload = {"time_spent_ms": 1000, **payload}
    if payload.get("time_spent_ms") is None:
        payload.pop("time_spent_ms")
    with pytest.raises(JudgementError) as err:
        validate_judgement(validity, payload)
    assert err.value.field == field
    assert field in str(err.value)
    assert field.split("[")[0].split(".")[0] in err.value.message
    assert isinstance(err.value, ValueError)


def test_time_boundaries_accepted(validity):
    assert judged(validity, category="VALIDATED", time_spent_ms=0).time_spent_ms == 0
    assert judged(validity, category="VALIDATED", time_spent_ms=TIME_SPENT_MAX_MS).time_spent_ms == 86_400_000
    assert judged(validity, category="VALIDATED", note="x" * NOTE_MAX_CHARS).note == "x" * 5000


def test_payload_must_be_a_mapping(validity):
    with pytest.raises(JudgementError) as err:
        validate_judgement(validity, ["VALIDATED"])  # type: ignore[arg-type]
    assert err.value.field == "payload"


def test_most_severe(validity):
    assert (
        most_severe(validity, ["QUERY_TOO_BROAD", "INVALID_TARGET_IMAGE", "INVALID_TEXT_QUERY"])
        == "INVALID_TARGET_IMAGE"
    )
    assert most_severe(validity, ["INVALID_TEXT_QUERY", "INVALID_IMAGE_QUERY"]) == "INVALID_IMAGE_QUERY"
    assert most_severe(validity, ["VALIDATED", "QUERY_TOO_BROAD"]) == "QUERY_TOO_BROAD"
    assert most_severe(validity, ["VALIDATED"]) == "VALIDATED"
    with pytest.raises(ValueError):
        most_severe(validity, [])
    with pytest.raises(ValueError, match="NOPE"):
        most_severe(validity, ["NOPE"])


def test_also_resolves_to_most_severe_and_sets_all_flags(validity):
    j = judged(
        validity,
        category="QUERY_TOO_BROAD",
        also=[
            {"category": "INVALID_TEXT_QUERY", "sub_reason": "underspecified"},
            {"category": "INVALID_TARGET_IMAGE", "sub_reason": "mismatch"},
        ],
    )
    assert j.category == "INVALID_TARGET_IMAGE" and j.sub_reason == "mismatch"
    assert j.categories == ("INVALID_TARGET_IMAGE", "INVALID_TEXT_QUERY", "QUERY_TOO_BROAD")
    assert j.sub_reasons == {
        "INVALID_TARGET_IMAGE": "mismatch",
        "INVALID_TEXT_QUERY": "underspecified",
        "QUERY_TOO_BROAD": None,
    }
    assert j.flags == {
        "INVALID_TEXT_QUERY": True,
        "INVALID_IMAGE_QUERY": False,
        "INVALID_TARGET_IMAGE": True,
        "QUERY_TOO_BROAD": True,
    }
    assert j.validated is False
    assert j.signature == "INVALID_TEXT_QUERY+INVALID_TARGET_IMAGE+QUERY_TOO_BROAD"


def test_also_with_validated_loses_to_the_invalid_category(validity):
    j = judged(validity, category="VALIDATED", also=["QUERY_TOO_BROAD"])
    assert j.category == "QUERY_TOO_BROAD" and j.validated is False
    assert j.signature == "QUERY_TOO_BROAD"


def test_note_required_when_a_lesser_also_category_says_other(validity):
    j = judged(
        validity,
        category="INVALID_TARGET_IMAGE",
        sub_reason="cropped",
        also=[{"category": "INVALID_IMAGE_QUERY", "sub_reason": "other"}],
        note="watermark",
    )
    assert j.category == "INVALID_TARGET_IMAGE" and j.sub_reason == "cropped" and j.note == "watermark"


# --------------------------------------------------------------------------- signatures


@pytest.mark.parametrize(
    ("flags", "validated", "expected"),
    [
        ({}, True, "VALID"),
        ({"QUERY_TOO_BROAD": True}, True, "VALID"),  # CIRCUS: validated wins
        ({"INVALID_TEXT_QUERY": False, "QUERY_TOO_BROAD": False}, False, "INVALID_UNSPECIFIED"),
        ({}, False, "INVALID_UNSPECIFIED"),
        ({"QUERY_TOO_BROAD": True, "INVALID_TARGET_IMAGE": True}, False, "INVALID_TARGET_IMAGE+QUERY_TOO_BROAD"),
        ({"INVALID_IMAGE_QUERY": True, "INVALID_TEXT_QUERY": True}, False, "INVALID_TEXT_QUERY+INVALID_IMAGE_QUERY"),
        (
            ["QUERY_TOO_BROAD", "INVALID_TEXT_QUERY", "INVALID_IMAGE_QUERY", "INVALID_TARGET_IMAGE"],
            False,
            "INVALID_TEXT_QUERY+INVALID_IMAGE_QUERY+INVALID_TARGET_IMAGE+QUERY_TOO_BROAD",
        ),
    ],
)
def test_signature(flags, validated, expected):
    assert signature(flags, validated) == expected


def test_signature_rejects_unknown_flag():
    with pytest.raises(ValueError, match="BOGUS"):
        signature({"BOGUS": True}, False)


# --------------------------------------------------------------------------- session judgements

GOOD_SCALES = {"naturalness": 4, "coherence": 5, "goal_progress": 3, "low_redundancy": 1, "overall": 4}
TURN_OK = {"real_difference_toward_target": True, "consistent_with_history": True}


def session_payload(**over):
    payload = {
        "scales": dict(GOOD_SCALES),
        "per_turn_checks": [dict(TURN_OK), dict(TURN_OK), dict(TURN_OK)],
        "time_spent_ms": 90_000,
    }
    payload.update(over)
    return payload


def test_clean_session_judgement(session):
    turns = [dict(TURN_OK), {"real_difference_toward_target": False, "consistent_with_history": True}]
    j = validate_judgement(
        session,
        session_payload(per_turn_checks=turns, reject_flags=["circle", "duplicate"], note=" loops back "),
        n_turns=2,
    )
    assert j.scales == GOOD_SCALES
    assert j.per_turn_checks == turns
    assert j.reject_flags == ("duplicate", "circle")  # rubric order
    assert j.note == "loops back" and j.validated is None and j.signature is None and j.category is None
    json.dumps(j.to_dict())


def test_session_alias_and_optional_parts(session):
    payload = session_payload()
    payload["per_turn"] = payload.pop("per_turn_checks")
    j = validate_judgement(session, payload, n_turns=3)
    assert len(j.per_turn_checks) == 3 and j.reject_flags == () and j.note == ""
    # Without n_turns the length is not checked.
    assert len(validate_judgement(session, session_payload()).per_turn_checks) == 3


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"scales": {**GOOD_SCALES, "overall": 6}}, "scales.overall"),
        ({"scales": {**GOOD_SCALES, "naturalness": 0}}, "scales.naturalness"),
        ({"scales": {**GOOD_SCALES, "coherence": 2.5}}, "scales.coherence"),
        ({"scales": {**GOOD_SCALES, "coherence": True}}, "scales.coherence"),
        ({"scales": {k: v for k, v in GOOD_SCALES.items() if k != "goal_progress"}}, "scales.goal_progress"),
        ({"scales": {**GOOD_SCALES, "beauty": 3}}, "scales.beauty"),
        ({"scales": None}, "scales"),
        ({"per_turn_checks": [dict(TURN_OK)] * 2}, "per_turn_checks"),
        ({"per_turn_checks": [dict(TURN_OK)] * 4}, "per_turn_checks"),
        ({"per_turn_checks": None}, "per_turn_checks"),
        (
            {"per_turn_checks": [dict(TURN_OK), {"real_difference_toward_target": True}, dict(TURN_OK)]},
            "per_turn_checks[1].consistent_with_history",
        ),
        (
            {"per_turn_checks": [dict(TURN_OK), dict(TURN_OK), {**TURN_OK, "real_difference_toward_target": "yes"}]},
            "per_turn_checks[2].real_difference_toward_target",
        ),
        ({"per_turn_checks": [dict(TURN_OK), dict(TURN_OK), {**TURN_OK, "funny": True}]}, "per_turn_checks[2].funny"),
        ({"reject_flags": ["duplicate", "loop"]}, "reject_flags[1]"),
        ({"reject_flags": ["conflict", "conflict"]}, "reject_flags[1]"),
        ({"time_spent_ms": -5}, "time_spent_ms"),
    ],
)
def test_session_refusals_name_their_field(session, over, field):
    with pytest.raises(JudgementError) as err:
        validate_judgement(session, session_payload(**over), n_turns=3)
    assert err.value.field == field
    assert field in str(err.value)


def test_signature_matches_published_circus_report(fixtures_dir):
    """Every (blind annotator, item) signature of the CIRCUS agreement report (350 cells)
    is reproduced from the annotator files' booleans."""
    circus = fixtures_dir / "circus"
    report = json.loads((circus / "agreement_report.json").read_text())
    published = {
        (r["dataset"], r["query_idx"], who): sig
        for r in report["item_level_rows"]
        for who, sig in r["signatures"].items()
    }
    checked = 0
    for path in sorted((circus / "agreement_users").glob("annotator_*.json")):
        data = json.loads(path.read_text())
        for a in data["assignments"]:
            ann = a["annotation"]
            flags = {f: ann[f] for f in CIRCUS_FLAG_ORDER}
            assert signature(flags, ann["validated"]) == published[(a["dataset"], a["query_idx"], data["username"])]
            checked += 1
    assert checked == 350


def test_the_too_broad_threshold_is_a_rubric_setting_by_default_circus_10() -> None:
    """Issue 39, item 3: one too-broad rule, the rubric's ``too_broad_threshold`` (CIRCUS's 10
    unless the rubric says otherwise); a stored definition without it keeps its bytes."""
    from annotation.core.rubric import TOO_BROAD_THRESHOLD, builtin_rubric

    rubric = builtin_rubric("validity")
    assert rubric.too_broad_threshold == TOO_BROAD_THRESHOLD == 10 and "too_broad_threshold" not in rubric.to_dict()
    narrow = Rubric.from_dict({**rubric.to_dict(), "too_broad_threshold": 4})
    assert narrow.too_broad_threshold == 4 and Rubric.from_dict(narrow.to_dict()) == narrow
    for bad in (0, 51, "ten"):
        with pytest.raises(ValueError, match="too_broad_threshold"):
            Rubric.from_dict({**rubric.to_dict(), "too_broad_threshold": bad})
    assert rubric.too_broad_rule(20, 20) == {"threshold": 10, "too_small": None}
    assert "gallery is too small" in rubric.too_broad_rule(6, 20)["too_small"]  # the gallery ran short
    assert "panel shows 8 candidates" in rubric.too_broad_rule(8, 8)["too_small"]  # the study asks for fewer


def test_a_huge_integral_number_is_refused_in_a_short_message(validity):
    """1e300 is an integral float: refused as out of range without its 301 digits (an API pass
    found the whole number echoed)."""
    with pytest.raises(JudgementError) as err:
        judged(validity, category="VALIDATED", time_spent_ms=1e300)
    assert err.value.field == "time_spent_ms" and "out of range (1e+300)" in err.value.message
    assert len(str(err.value)) < 120
