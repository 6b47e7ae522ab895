"""Re-analysis of the CIRCUS agreement study: every published figure of
annotations/agreement_report.json is reproduced from the raw annotation files.

Fixtures (tests/fixtures/circus, see its README): the published report and the 7
agreement_users files. annotator_03 and annotator_08 have no file; their labels come from
the report's item_level_rows signatures (FORMATS.md §1.3).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter
from itertools import combinations
from pathlib import Path

import pytest

from annotation.agreement.circus_files import (
    CircusFormatError,
    load_agreement_report,
    parse_assignment_data,
    parse_assignment_file,
)
from annotation.agreement.maths import (
    FLAGS,
    agreement_report,
    binary_valid_ratings,
    flag_ratings,
    pairwise_cohen_kappa,
    validity_ratings,
    validity_signature,
)
from tests.circus_triples import relabel_pairs, triples_from_annotations, triples_from_item_level_rows
from tests.reference_impl import pairwise_cohen_kappa_sklearn

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "circus"
REPORT = FIXTURES / "agreement_report.json"
USERS_DIR = FIXTURES / "agreement_users"
TOL = 1e-9


@pytest.fixture(scope="module")
def published() -> dict:
    return load_agreement_report(REPORT)


@pytest.fixture(scope="module")
def files() -> dict:
    return {p.stem: parse_assignment_file(p) for p in sorted(USERS_DIR.glob("annotator_*.json"))}


@pytest.fixture(scope="module")
def blind_triples(files) -> list:
    return [t for f in files.values() for t in triples_from_annotations(f.annotations)]


@pytest.fixture(scope="module")
def all_triples(published, blind_triples) -> list:
    extra = triples_from_item_level_rows(published["item_level_rows"], ["annotator_03", "annotator_08"])
    return blind_triples + extra


def test_fixture_files_parse(files, published) -> None:
    assert sorted(files) == sorted(published["blind_users"])
    for name, f in files.items():
        assert f.username == name
        assert f.study_name == "multimodal_validity_agreement"
        assert f.seed == 20260423 and f.source_user == "annotator_03"
        assert len(f.annotations) == 50
        assert [a.presentation_order for a in f.annotations] == list(range(1, 51))
        assert all(a.validated is not None for a in f.annotations)
    # every blind user got the same 50 items (individually shuffled)
    item_sets = {frozenset(a.item_key for a in f.annotations) for f in files.values()}
    assert len(item_sets) == 1
    rows = {f"{r['dataset']}::{r['query_idx']}" for r in published["item_level_rows"]}
    assert item_sets.pop() == rows
    counts = Counter(a.hidden_category for a in files["annotator_01"].annotations)
    assert counts == published["sample_summary"]["hidden_category_counts"]


def test_file_labels_agree_with_item_level_rows(files, published) -> None:
    rows = {f"{r['dataset']}::{r['query_idx']}": r for r in published["item_level_rows"]}
    cells = 0
    for name, f in files.items():
        for a in f.annotations:
            row = rows[a.item_key]
            assert validity_signature(a.label) == row["signatures"][name], (name, a.item_key)
            assert a.hidden_category == row["hidden_category"]
            cells += 1
    assert cells == 350
    # valid_votes / invalid_votes are the per-item counts of VALID over the 9 raters
    for row in published["item_level_rows"]:
        valid = sum(s == "VALID" for s in row["signatures"].values())
        assert (valid, 9 - valid) == (row["valid_votes"], row["invalid_votes"])


def test_triples_from_item_level_rows(published) -> None:
    triples = triples_from_item_level_rows(published["item_level_rows"], ["annotator_08"])
    assert len(triples) == 50 and {t[1] for t in triples} == {"annotator_08"}
    unspecified = [t for t in triples if t[2] == []]
    assert len(unspecified) == 1  # FORMATS.md: seen once, from annotator_08
    all_rows = triples_from_item_level_rows(published["item_level_rows"])
    assert len(all_rows) == 450
    # the signature round-trips
    sig = {(t[0], t[1]): validity_signature(t[2]) for t in all_rows}
    for r in published["item_level_rows"]:
        for ann, s in r["signatures"].items():
            assert sig[(f"{r['dataset']}::{r['query_idx']}", ann)] == s


def assert_summary(mine: dict, theirs: dict) -> None:
    assert mine["count"] == theirs["count"]
    for key in ("mean", "median", "min", "max"):
        assert mine[key] == pytest.approx(theirs[key], abs=TOL), key


def check_block(report: dict, expected: dict, raters: list[str]) -> None:
    """Compare the validity blocks of ``report`` with a published block, to 1e-9."""
    mine = report["binary_valid_invalid"]
    theirs = expected["binary_valid_invalid"]
    assert mine["n_items"] == theirs["n_items"] == 50
    assert mine["n_raters"] == theirs["n_raters"] == len(raters)
    for key in (
        "exact_agreement_rate",
        "exact_invalid_signature_rate",
        "unanimous_valid_invalid_rate",
        "fleiss_kappa",
        "krippendorff_alpha_nominal",
    ):
        assert mine[key] == pytest.approx(theirs[key], abs=TOL), key
    assert_summary(mine["pairwise_cohen"], theirs["pairwise_cohen"])
    # by_pair: published values are in pair order over ``raters``; their keys are wrong.
    published_values = [v for _, v in theirs["pairwise_cohen_by_pair"]]
    assert list(mine["pairwise_cohen_by_pair"]) == [f"{a}__{b}" for a, b in combinations(raters, 2)]
    assert list(mine["pairwise_cohen_by_pair"].values()) == pytest.approx(published_values, abs=TOL)
    assert mine["pairwise_cohen_by_pair"] == pytest.approx(relabel_pairs(published_values, raters), abs=TOL)
    for flag in FLAGS:
        m, t = report["per_flag_agreement"][flag], expected["per_flag_agreement"][flag]
        for key in ("fleiss_kappa", "krippendorff_alpha_nominal", "positive_rate"):
            assert m[key] == pytest.approx(t[key], abs=TOL), (flag, key)
        assert_summary(m["pairwise_cohen"], t["pairwise_cohen"])
    assert report["signature_alpha_nominal"] == pytest.approx(expected["signature_alpha_nominal"], abs=TOL)


def test_all_annotators_block_reproduced(published, all_triples) -> None:
    raters = published["all_annotators"]
    assert raters == [
        "annotator_01",
        "annotator_02",
        "annotator_03",
        "annotator_04",
        "annotator_05",
        "annotator_06",
        "annotator_10",
        "annotator_07",
        "annotator_08",
    ]
    report = agreement_report(all_triples, rubric="validity", raters=raters, n_boot=0, constant_pairs="one")
    assert report["n_items"] == 50 and report["n_annotators"] == 9 and report["n_judgements"] == 450
    check_block(report, published, raters)
    # The published figures quoted in FORMATS.md, explicitly.
    b = report["binary_valid_invalid"]
    assert b["exact_agreement_rate"] == pytest.approx(11 / 50)
    assert b["unanimous_valid_invalid_rate"] == pytest.approx(22 / 50)
    assert b["exact_invalid_signature_rate"] == pytest.approx(6 / 17)
    assert report["per_flag_agreement"]["INVALID_TEXT_QUERY"]["positive_rate"] == pytest.approx(24 / 450)
    # INVALID_IMAGE_QUERY: 28 of 36 pairs are constant-identical (kappa 1.0 by convention), 8 are 0.
    image = pairwise_cohen_kappa(
        flag_ratings(validity_ratings(all_triples, raters=raters), "INVALID_IMAGE_QUERY"), None, "one"
    )
    assert sum(p.constant_identical for p in image) == 28
    assert sorted({round(p.kappa, 12) for p in image}) == [0.0, 1.0]
    json.dumps(report, allow_nan=False)


def test_blind_only_block_reproduced(published, blind_triples) -> None:
    expected = published["blind_only_summary"]
    raters = expected["users"]
    assert raters == published["blind_users"]
    report = agreement_report(blind_triples, rubric="validity", raters=raters, n_boot=0, constant_pairs="one")
    check_block(report, expected, raters)
    b = report["binary_valid_invalid"]
    assert b["exact_agreement_rate"] == pytest.approx(12 / 50)
    assert b["unanimous_valid_invalid_rate"] == pytest.approx(25 / 50)
    assert b["exact_invalid_signature_rate"] == pytest.approx(7 / 20)


def test_published_pair_keys_are_mislabelled(published) -> None:
    pairs = published["binary_valid_invalid"]["pairwise_cohen_by_pair"]
    assert len(pairs) == 36
    keys = [k for k, _ in pairs]
    assert len(set(keys)) < 36  # duplicates such as annotator_01__annotator_10
    assert keys[1] == "annotator_01__annotator_04" and pairs[1][1] == pytest.approx(0.326750448833034)
    assert keys[30] == "annotator_10__annotator_10" and pairs[30][1] == pytest.approx(0.7564935064935064)
    fixed = relabel_pairs([v for _, v in pairs], published["all_annotators"])
    assert fixed["annotator_01__annotator_03"] == pytest.approx(0.326750448833034)
    assert fixed["annotator_06__annotator_10"] == pytest.approx(0.7564935064935064)
    assert len(published["blind_only_summary"]["binary_valid_invalid"]["pairwise_cohen_by_pair"]) == 21
    with pytest.raises(ValueError):
        relabel_pairs([0.1, 0.2], ["a", "b", "c"])


def test_numpy_kappa_equals_sklearn_on_circus(published, all_triples) -> None:
    sig = validity_ratings(all_triples, raters=published["all_annotators"])
    for ratings in [binary_valid_ratings(sig), sig] + [flag_ratings(sig, f) for f in FLAGS]:
        fast = pairwise_cohen_kappa(ratings, None, "one")
        ref = pairwise_cohen_kappa_sklearn(ratings, None, "one")
        assert [p.kappa for p in fast] == pytest.approx([p.kappa for p in ref], abs=1e-12)


def test_report_bootstrap_on_circus(published, all_triples) -> None:
    report = agreement_report(
        all_triples, rubric="validity", raters=published["all_annotators"], n_boot=200, seed=1, constant_pairs="one"
    )
    ci = report["confidence_intervals"]
    assert ci["n_boot"] == 200 and ci["seed"] == 1 and ci["confidence"] == 0.95
    alpha = ci["intervals"]["binary_valid_invalid.krippendorff_alpha_nominal"]
    assert alpha["low"] < report["binary_valid_invalid"]["krippendorff_alpha_nominal"] < alpha["high"]
    again = agreement_report(
        all_triples, rubric="validity", raters=published["all_annotators"], n_boot=200, seed=1, constant_pairs="one"
    )
    assert again["confidence_intervals"] == ci


# --------------------------------------------------------------------------- parser errors


def load_raw(name: str = "annotator_01") -> dict:
    return json.loads((USERS_DIR / f"{name}.json").read_text())


def test_checksum_is_the_ids_in_presentation_order() -> None:
    raw = load_raw()
    ids = "\n".join(a["assignment_id"] for a in sorted(raw["assignments"], key=lambda a: a["presentation_order"]))
    assert hashlib.sha256(ids.encode()).hexdigest() == raw["assignment_ids_sha256"]


def _mutations() -> list[tuple[str, object, str]]:
    def set_in(path: list, value):
        def apply(d: dict) -> None:
            node = d
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value

        return apply

    def delete(path: list):
        def apply(d: dict) -> None:
            node = d
            for key in path[:-1]:
                node = node[key]
            del node[path[-1]]

        return apply

    def duplicate_first(d: dict) -> None:
        d["assignments"].append(copy.deepcopy(d["assignments"][0]))
        d["assignments"][-1]["presentation_order"] = 51

    return [
        ("missing username", delete(["username"]), "field 'username': missing"),
        ("assignments not a list", set_in(["assignments"], {}), "field 'assignments'"),
        ("missing annotation", delete(["assignments", 3, "annotation"]), "assignments[3], field 'annotation': missing"),
        (
            "flag not bool",
            set_in(["assignments", 2, "annotation", "QUERY_TOO_BROAD"], "yes"),
            "field 'annotation.QUERY_TOO_BROAD'",
        ),
        ("validated not bool", set_in(["assignments", 0, "annotation", "validated"], 1), "annotation.validated"),
        ("query_idx a string", set_in(["assignments", 5, "query_idx"], "12"), "assignments[5], field 'query_idx'"),
        ("id mismatch", set_in(["assignments", 4, "assignment_id"], "cirr::1"), "field 'assignment_id'"),
        ("wrong assignee", set_in(["assignments", 1, "assigned_user"], "annotator_99"), "assigned_user"),
        ("count mismatch", set_in(["assignment_count"], 49), "assignment_count"),
        ("checksum mismatch", set_in(["assignment_ids_sha256"], "0" * 64), "SHA-256"),
        ("duplicate assignment", duplicate_first, "duplicate assignment"),
        ("order below 1", set_in(["assignments", 0, "presentation_order"], 0), "presentation_order"),
    ]


@pytest.mark.parametrize(("name", "mutate", "message"), _mutations(), ids=[m[0] for m in _mutations()])
def test_malformed_files_are_rejected(tmp_path, name, mutate, message) -> None:
    raw = load_raw()
    mutate(raw)
    path = tmp_path / "annotator_01.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(CircusFormatError) as info:
        parse_assignment_file(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_unreadable_files(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CircusFormatError, match="invalid JSON"):
        parse_assignment_file(bad)
    with pytest.raises(CircusFormatError, match="cannot read"):
        parse_assignment_file(tmp_path / "absent.json")
    with pytest.raises(CircusFormatError, match="one JSON object"):
        parse_assignment_data([1, 2])


def test_unlabelled_assignments_are_missing() -> None:
    raw = load_raw()
    raw["assignments"][0]["annotation"]["validated"] = None
    parsed = parse_assignment_data(raw)
    first = [a for a in parsed.annotations if a.presentation_order == 1][0]
    assert first.validated is None and first.label is None
    triples = triples_from_annotations(parsed.annotations)
    assert len(triples) == 49 and first.item_key not in {t[0] for t in triples}
    # a record carries the fields the brief asks for
    a = parsed.annotations[1]
    assert (a.username, a.assignment_id, a.dataset, a.query_idx, a.presentation_order) == (
        "annotator_01",
        "cirr::3775",
        "cirr",
        3775,
        2,
    )
    assert a.hidden_category == "composition_required" and a.validated is True and a.flags == ()
    assert a.other == "" and a.updated_at == "2026-04-24T15:40:07+00:00"


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (
            ["assignments", 2, "annotation", "validated"],
            1,
            "assignments[2], field 'annotation.validated': expected true or false, got number",
        ),
        (["assignments", 0, "annotation", "other"], 5, "assignments[0], field 'annotation.other': expected a string"),
        (["assignments", 7], [], "assignments[7]: expected a JSON object for this assignment, got list"),
        (["assignments"], {}, "field 'assignments': expected a list, got object"),
        (["assignment_count"], "50", "field 'assignment_count': expected an integer, got string"),
    ],
)
def test_fields_are_read_through_records_naming_entry_and_field(tmp_path, path, value, where) -> None:
    raw = load_raw()
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    file = tmp_path / "annotator_01.json"
    file.write_text(json.dumps(raw))
    with pytest.raises(CircusFormatError) as info:
        parse_assignment_file(file)
    assert str(info.value).startswith(f"{file}, ") and where in str(info.value)
    assert info.value.entry == info.value.record == (path[1] if len(path) > 1 else None)
